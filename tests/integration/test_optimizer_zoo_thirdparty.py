"""Third-party optimizers under ``optcheck.Monitor`` (issue 25): every optimizer of
``thirdparty_zoo.py`` (pytorch-optimizer's registry, heavyball, schedule-free,
bitsandbytes, torchao, and the wrappers SAM / Lookahead / ScheduleFreeWrapper /
SAMWrapper), each in the loop its README prescribes:

- a clean loop gives no finding, never raises out of the user's loop, and the
  snapshot reads the optimizer's state wherever it holds tensors (nested dicts,
  lists, quantized subclasses);
- a layer replaced before step K is found at step K (OC101, OC102, OC104).

The default run gives every optimizer's clean loop and one optimizer per library's
replaced layer (:data:`REAL_CENSUS`; the others' under ``-m slow``, issue 48) a shorter loop (:data:`STEPS` steps, a
snapshot every :data:`EVERY`, the layer replaced at :data:`SWAP`: after three cadence
snapshots and between two, so it is the identity check before that step that finds
it, as in a real run where the swap falls anywhere); the full protocol (120 steps, the
layer replaced at step 60) runs under ``-m slow``. An
optimizer that cannot run here is skipped with its reason: the library is missing
(``pip install -e '.[zoo]'``), it needs CUDA, or its loop fails without optcheck too.
A loop that runs without optcheck and fails with it is a failure.

LOMO and AdaLOMO (``fused_backward``) and optimi's gradient release update each
parameter inside backward: the backward pass is the training step
(``optcheck/pytorch/in_backward.py``), counted once however many parameters it steps.

heavyball's optimizers set ``.grad`` to None inside ``step()``; that is read from gradient
arrival (``grad_arrived``) and is silent. heavyball's ``SAMWrapper`` zeroes the gradients
before its inner ``step(closure)``: a step given a closure is not judged by what ``.grad``
holds before it (OC207).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import thirdparty_zoo as zoo  # noqa: E402
import optcheck  # noqa: E402

STEPS, EVERY, SWAP = 24, 4, 14  # the default run (SWAP: not a cadence step, after 3 cadence snapshots)
SLOW_STEPS, SLOW_EVERY, SLOW_SWAP = 120, 10, 60  # the protocol
REPLACED = {"OC101", "OC102", "OC104"}
ENTRIES = zoo.entries()


class Capture(optcheck.Monitor):
    """A Monitor that keeps its last snapshot (``on_snapshot``)."""

    last: dict | None = None

    def on_snapshot(self, snapshot: dict) -> None:
        self.last = snapshot


#: one optimizer per library whose clean loop runs the real tensor census (see ``_one_census``)
REAL_CENSUS = set({e.id.split(".")[0]: e.id for e in reversed(ENTRIES) if not e.skip and not e.xfail}.values())


@pytest.fixture(autouse=True)
def _one_census(request):
    """The process-wide tensor census (``optcheck/pytorch/census.py``: a ``gc.collect()``
    and a walk of the objects made since) runs at each Monitor's first snapshot, 0.2 s
    here with five optimizer libraries imported: over ~440 short Monitors that is most
    of this module's time. It feeds only the memory rule (OC401), which these short
    loops do not exercise: it is taken once per test process and its figures reused,
    except in the clean loop of one optimizer per library (:data:`REAL_CENSUS`), which
    runs the real one, as a user's Monitor does, over that library's objects."""
    from optcheck.pytorch import probe

    torch.set_num_threads(1)
    entry = getattr(getattr(request.node, "callspec", None), "params", {}).get("entry")
    if request.node.originalname == "test_clean_loop_is_silent" and entry is not None and entry.id in REAL_CENSUS:
        yield
        return
    global _FIGURES
    if _FIGURES is None:
        _FIGURES = probe.tensor_census()
    mp = pytest.MonkeyPatch()
    mp.setattr(probe, "tensor_census", lambda: _FIGURES)
    yield
    mp.undo()


_FIGURES = None


def _param(e: zoo.Entry, clean: bool, slow: bool = False):
    marks = [pytest.mark.slow] if slow else []
    reason = e.xfail if clean else e.xfail_found
    if reason:
        marks.append(pytest.mark.xfail(reason=reason, strict=False))
    return pytest.param(e, id=e.id, marks=marks)


def _run(entry: zoo.Entry, steps: int, every: int, swap_at: int | None = None):
    """``zoo.run`` under a :class:`Capture`; skips with the reason where the optimizer
    cannot run here (missing library, CUDA only, or failing without optcheck too)."""
    if entry.skip:
        pytest.skip(entry.skip)
    try:
        return zoo.run(entry, steps, every, swap_at=swap_at, monitor_cls=Capture)
    except Exception as e:  # noqa: BLE001 - decide below whether optcheck caused it
        reason = zoo.refused_on_cpu(e)
        if reason:
            pytest.skip(f"needs an accelerator: {reason}")
        try:
            zoo.run(entry, min(steps, 8), every, monitor=False)
        except Exception as bare:  # noqa: BLE001
            pytest.skip(f"fails without optcheck too: {type(bare).__name__}: {str(bare)[:120]}")
        raise  # the loop runs without optcheck and breaks with it: never acceptable


def _assert_clean(entry, losses, mon, opt):
    found = [(f.code, f.step, f.message[:120]) for f in mon.findings]
    assert found == [], found
    assert mon.exit_code == 0 and mon.summary()["status"] == "clean"
    assert mon.step_count == len(losses)  # one step per training step, whoever moves the parameters (issue 34)
    assert all(math.isfinite(v) for v in losses), losses
    held = zoo.state_tensors(dict(mon.optimizer.state.items()))
    read = sum(len(s.get("tensors") or {}) for s in (mon.last or {}).get("state") or ())
    if held:  # the snapshot reads the state, however it is nested
        assert read > 0, f"{held} state tensors held, none read; notes: {list(mon.notes)}"
    assert not [n for n in mon.notes if n.startswith("internal error")], list(mon.notes)


def _assert_found(mon, step):
    at = {f.code for f in mon.findings if f.step == step}
    first = min((f.step for f in mon.findings), default=None)
    assert REPLACED <= at and first == step, [(f.code, f.step) for f in mon.findings]


@pytest.mark.parametrize("entry", [_param(e, clean=True) for e in ENTRIES])
def test_clean_loop_is_silent(entry):
    _assert_clean(entry, *_run(entry, STEPS, EVERY))


@pytest.mark.parametrize("entry", [_param(e, clean=False, slow=e.id not in REAL_CENSUS) for e in ENTRIES])
def test_replaced_layer_is_found_at_its_step(entry):
    _, mon, _ = _run(entry, SWAP + 2, EVERY, swap_at=SWAP)
    _assert_found(mon, SWAP)


@pytest.mark.parametrize("entry", [_param(e, clean=True, slow=True) for e in ENTRIES])
def test_clean_120_steps_is_silent(entry):
    _assert_clean(entry, *_run(entry, SLOW_STEPS, SLOW_EVERY))


@pytest.mark.parametrize("entry", [_param(e, clean=False, slow=True) for e in ENTRIES])
def test_replaced_layer_at_step_60_is_found(entry):
    _, mon, _ = _run(entry, SLOW_SWAP + 5, SLOW_EVERY, swap_at=SLOW_SWAP)
    _assert_found(mon, SLOW_SWAP)


def test_the_real_census_runs_for_every_library():
    libs = {e.id.split(".")[0] for e in ENTRIES if not e.skip and not e.xfail}
    assert {i.split(".")[0] for i in REAL_CENSUS} == libs


def test_every_library_is_in_the_zoo():
    # a library missing from the environment shows as one skipped entry, not as silence
    libs = {e.id.split(".")[0] for e in ENTRIES}
    assert {"pytorch_optimizer", "heavyball", "schedulefree", "bitsandbytes", "torchao", "optimi", "lomo_optim"} <= libs
    assert len(ENTRIES) >= 5
