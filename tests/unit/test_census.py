"""The live-tensor census (optcheck.pytorch.census): what it counts, what it leaves to the
cycle collector, and that after its first run it walks only the objects made since."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from optcheck.pytorch import census, probe  # noqa: E402


@pytest.fixture
def fresh():
    """A process nobody froze (tests/conftest.py freezes each test's heap: undone here)."""
    census.release()
    gc.unfreeze()
    yield census.CENSUS
    census.release()


def test_counts_tensors_from_before_and_after_the_first_census(fresh):
    old = [torch.ones(256) for _ in range(3)]  # 1 KiB each, alive at the freeze
    n0, b0 = probe.tensor_census()
    assert gc.get_freeze_count() > 0  # the first census froze what was alive
    new = [torch.ones(512) for _ in range(4)]
    view = new[0][:10]  # a view: one more tensor, no more bytes
    n1, b1 = probe.tensor_census()
    assert (n1 - n0, b1 - b0) == (5, 4 * 2048)
    del old[0]  # a tensor from before the freeze dies by refcount: counted out
    n2, b2 = probe.tensor_census()
    assert (n1 - n2, b1 - b2) == (1, 1024)
    del new, view
    assert probe.tensor_census() == (n0 - 1, b0 - 1024)


def test_tensors_only_waiting_for_the_cycle_collector_are_not_counted(fresh):
    n0, _ = probe.tensor_census()

    class Holder:
        pass

    for _ in range(5):  # five cycles, each holding a tensor, unreachable
        h = Holder()
        h.me, h.t = h, torch.zeros(100)
    del h
    assert probe.tensor_census()[0] == n0  # commit 70eccfc: GC debt is not a leak
    kept = []
    for _ in range(5):
        h = Holder()
        h.me, h.t = h, torch.zeros(100)
        kept.append(h)
    assert probe.tensor_census()[0] == n0 + 5


def test_walk_skips_what_was_alive_at_the_first_census(fresh):
    unrelated = [{"i": i} for i in range(50_000)]
    probe.tensor_census()
    walked = gc.get_objects()  # what every later census walks
    assert len(walked) < 10_000 and not any(o is unrelated for o in walked)


def test_an_unfreeze_by_someone_else_starts_again(fresh):
    n0, b0 = probe.tensor_census()
    t = torch.ones(8)
    gc.unfreeze()  # e.g. the user's own code
    assert probe.tensor_census() == (n0 + 1, b0 + 32)
    assert gc.get_freeze_count() > 0
    del t


def test_release_unfreezes(fresh):
    probe.tensor_census()
    assert gc.get_freeze_count() > 0
    census.release()
    assert gc.get_freeze_count() == 0
    census.release()  # idempotent


def test_meta_and_fake_tensors_are_counted_without_bytes_and_without_a_warning(fresh, recwarn):
    """A FakeTensor alive in the process (torch.compile leaves them in its caches) has meta
    storage: reading its data pointer warns "deprecated and will error" (seen on the first
    GPU run, docs/gpu.md); the census counts it and no bytes for it, and warns nothing."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # (the test makes one as Dynamo would)

    n0, b0 = probe.tensor_census()
    with FakeTensorMode():
        fake = torch.empty(1000)
    meta = torch.empty(1000, device="meta")
    real = torch.ones(256)
    n1, b1 = probe.tensor_census()
    assert (n1 - n0, b1 - b0) == (3, 1024)
    assert not [w for w in recwarn if "data pointer" in str(w.message)]
    del fake, meta, real


def test_a_programs_own_freeze_is_left_as_it_is_and_what_it_made_after_is_counted(fresh):
    """A program that froze its set-up (``gc.freeze()``) before the first census: the census freezes
    nothing, counts the tensors made since (not those inside what the program froze), and ``release``
    (``Monitor.close``) leaves the program's objects frozen. Before, it unfroze them."""
    setup = [torch.ones(256) for _ in range(3)]  # frozen by the program: not counted
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    n0, b0 = probe.tensor_census()
    assert gc.get_freeze_count() == frozen  # nothing more frozen by the census
    made = [torch.ones(512) for _ in range(4)]
    assert probe.tensor_census() == (n0 + 4, b0 + 4 * 2048)

    class Holder:
        pass

    h = Holder()
    h.me, h.t = h, torch.zeros(100)  # garbage waiting for the cycle collector: not counted
    del h
    assert probe.tensor_census() == (n0 + 4, b0 + 4 * 2048)
    census.release()
    assert gc.get_freeze_count() == frozen
    gc.unfreeze()
    del setup, made


def test_a_watched_loop_in_a_program_that_froze_its_set_up_finds_a_leak_and_leaves_the_freeze(fresh, tmp_path):
    """End to end, a real Monitor: the program's freeze survives ``close()``, and a loop that keeps every
    step's loss with its graph is still OC401 (the census counts what the loop made)."""
    import optcheck

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    kept = []
    with optcheck.Monitor(model, opt, every=5, on_finding="log", out=str(tmp_path / "run")) as mon:
        for _ in range(300):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(model(torch.randn(8, 16)).sum())  # a graph kept every step
    assert gc.get_freeze_count() > 0.99 * frozen  # (a few frozen objects freed by refcount meanwhile)
    assert "OC401" in {f.code for f in mon.findings}, [f.code for f in mon.findings]
    gc.unfreeze()
