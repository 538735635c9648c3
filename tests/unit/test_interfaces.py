"""The small public interfaces the drivers talk through (issue 35): a null object has
the whole interface of the real one, so no caller probes with ``getattr``/``hasattr``
or asks ``is None``; the Monitor implements the listener interfaces its hooks call.

Each check compares public names and their parameter names, so a method added to the
real class and not to its null object (or renamed on one side) fails here."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from optcheck.distributed import NoRankWatch  # noqa: E402
from optcheck.distributed.watch import RankWatch  # noqa: E402
from optcheck.drivers import monitor_end  # noqa: E402
from optcheck.drivers.monitor import Monitor  # noqa: E402
from optcheck.pytorch import monitor_hooks  # noqa: E402
from optcheck.pytorch.hazards import HazardProbes  # noqa: E402
from optcheck.pytorch.null_hazards import NullHazards  # noqa: E402


def public(cls) -> dict:
    """Public names defined by ``cls`` and its bases (not ``object``'s), with their parameters
    (``None`` for a non-callable: a class attribute or a property)."""
    out = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        v = inspect.getattr_static(cls, name)
        fn = v.__func__ if isinstance(v, (staticmethod, classmethod)) else v
        out[name] = list(inspect.signature(fn).parameters) if inspect.isfunction(fn) else None
    return out


def missing_or_different(real: dict, null: dict, names=None) -> dict:
    names = real if names is None else names
    return {n: (real.get(n), null.get(n, "(missing)")) for n in names if null.get(n, "(missing)") != real.get(n)}


def test_null_hazards_has_the_whole_interface_of_the_hazard_probes():
    assert missing_or_different(public(HazardProbes), public(NullHazards)) == {}


def test_null_hazards_carries_the_attributes_a_driver_sets_or_reads():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    real, null = HazardProbes(model, opt), NullHazards(opt)
    try:
        for name in ("optimizer", "on_stop", "armed", "not_checked", "can_replay", "wants_norms"):
            assert hasattr(null, name) and hasattr(real, name), name
        assert null.optimizer is opt and null.not_checked == [] and null.stats() is None
        assert null.end_step(1) is False and not null.has_events() and null.drain() == []
    finally:
        real.remove()


#: what the Monitor calls on its rank watch
RANK_WATCH_HOOKS = ("locate", "before_backward", "after_backward", "annotate", "close", "remove")


def test_the_null_rank_watch_has_the_monitors_hooks_of_the_rank_watch():
    assert missing_or_different(public(RankWatch), public(NoRankWatch), RANK_WATCH_HOOKS) == {}
    null = NoRankWatch()
    assert null.locate("runs/x", None) == ("runs/x", None)
    assert null.before_backward(3) is False and null.after_backward(4) is None
    snap = {"step": 1, "events": []}
    null.annotate(snap)
    assert snap == {"step": 1, "events": []}


def protocol_methods(proto) -> dict:
    return {n: list(inspect.signature(v).parameters) for n, v in vars(proto).items()
            if inspect.isfunction(v) and not n.startswith("_")}


@pytest.mark.parametrize("proto", [monitor_hooks.BackwardListener, monitor_end.RunEnd], ids=lambda p: p.__name__)
def test_the_monitor_implements_the_interfaces_its_hooks_call(proto):
    methods = protocol_methods(proto)
    assert methods, proto
    mine = public(Monitor)
    assert {n: mine.get(n) for n in methods} == methods


def test_a_monitor_without_hazard_probes_follows_an_optimizer_swapped_in():
    """The swap sets the hazard probes' optimizer (a NullHazards has one: no hasattr probe)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = Monitor(model, opt, every=2, hazards=False, on_finding="ignore")
    try:
        for i in range(6):
            if i == 3:
                opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    finally:
        s = mon.close()
    assert mon.hazards.optimizer is opt and mon.optimizer is opt
    assert s["last_step"] == 6 and s["hazards"] is None and s["not_checked"] == []


def test_record_crash_is_how_a_loop_that_catches_its_own_exception_says_it_crashed(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = Monitor(model, opt, every=5, out=str(tmp_path / "run"), on_finding="ignore")
    try:
        for i in range(1, 9):
            if i == 7:
                raise ValueError("a bad batch at step 7")
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    except ValueError as e:
        mon.record_crash(e)
        mon.record_crash(RuntimeError("a second one"))  # only the first crash counts
    s = mon.close()
    assert (s["status"], s["exit_code"], s["last_step"]) == ("crashed", 3, 6)
    assert s["crash"] == {"step": 7, "exc_type": "ValueError", "message": "a bad batch at step 7"}
    mon.record_crash(ValueError("after close"))  # nothing after close
    assert mon.summary()["crash"]["message"] == "a bad batch at step 7"


def test_every_soak_backend_is_a_backend_and_implements_what_it_must():
    """The soak loop calls a backend's optional methods without asking (no getattr probe): each
    backend inherits the no-op defaults and implements every required method itself."""
    from optcheck.pytorch.train import TorchBackend
    from optcheck.run.backend import Backend
    from optcheck.torchsharp_bridge.worker import TorchSharpBackend

    required = [n for n, v in vars(Backend).items() if inspect.isfunction(v) and not n.startswith("_")
                and "raise NotImplementedError" in inspect.getsource(v) and not n.startswith("block")
                and n != "train_block"]
    assert {"setup", "train_step", "snapshot_body", "fingerprint"} <= set(required)
    for cls in (TorchBackend, TorchSharpBackend):
        assert issubclass(cls, Backend)
        assert [n for n in required if vars(Backend)[n] is inspect.getattr_static(cls, n)] == [], cls
    blocks = ("max_block", "block_inputs", "train_block", "block_done", "block_results")
    assert all(inspect.getattr_static(TorchSharpBackend, n) is not vars(Backend)[n] for n in blocks)
    assert Backend().max_block(8, 32) == 0 and Backend().settle([1.0]) == [1.0] and not Backend().in_step()


def test_the_worker_loop_asks_no_backend_what_it_has():
    import ast
    from pathlib import Path

    import optcheck.drivers.worker_loop as wl

    tree = ast.parse(Path(wl.__file__).read_text(encoding="utf-8"))
    probes = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and n.func.id in ("getattr", "hasattr")]
    assert probes == []
