"""Optimizers that step inside backward under ``optcheck.Monitor`` (issue 34): PyTorch's
optimizer-in-backward recipe (a dict of per-parameter AdamW), torchtune's
``optimizer_in_bwd`` wrapper, a LOMO-style fused update written here, optimi's
gradient release (alone, with the loop's ``step()``, with accumulation into the
optimizer state) and ``lomo_optim.Lomo``. Loops: ``in_backward_zoo.py``.

Each clean run is silent and counts one step per training step; each planted fault
(a layer replaced before or in the middle of a step, a dtype change, a hook that
forgets ``zero_grad()``, a hook removed, an update that rebinds instead of writing,
hooks never registered, a layer the forward never uses) is found at its step.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import in_backward_zoo as zoo  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

STEPS, EVERY, AT = 30, 5, 12  # AT: no cadence step, after two cadence snapshots
REPLACED = {"OC101", "OC102", "OC104"}
_FIGURES = None


def _needs(contract: str) -> None:
    for lib, prefix in (("optimi", "optimi"), ("lomo_optim", "lomo")):
        if contract.startswith(prefix):
            pytest.importorskip(lib, reason=f"{lib} not installed: pip install -e '.[zoo]' torch==2.13.0")


@pytest.fixture(autouse=True)
def _one_census(request):
    """The tensor census (OC401's input, 0.2-0.9 s at a process's first Monitor) runs for
    real in the first clean loop only; the others reuse its figures (these short loops do
    not exercise OC401), as ``test_optimizer_zoo_thirdparty.py`` does."""
    from optcheck.pytorch import probe

    torch.set_num_threads(1)
    global _FIGURES
    if _FIGURES is None:
        yield
        _FIGURES = probe.tensor_census()
        return
    mp = pytest.MonkeyPatch()
    mp.setattr(probe, "tensor_census", lambda: _FIGURES)
    yield
    mp.undo()


def _train(tmp_path, contract, bug=None, steps=STEPS, every=EVERY, at=AT):
    _needs(contract)
    return zoo.train(contract, bug=bug, at=at, steps=steps,
                     monitor={"every": every, "out": str(tmp_path / "run"), "on_finding": "ignore"})


@pytest.mark.parametrize("contract", zoo.CONTRACTS)
def test_clean_loop_is_silent_and_counts_one_step_per_training_step(tmp_path, contract):
    losses, mon = _train(tmp_path, contract)
    found = list(read_jsonl(tmp_path / "run" / "findings.jsonl"))
    summary = mon.summary()
    assert found == [] and mon.exit_code == 0 and summary["status"] == "clean", found
    assert mon.step_count == STEPS == summary["last_step"] and mon.snapshots >= STEPS // EVERY
    assert summary["config"]["steps_in"] == "backward" and summary["hazards"]["steps"] == STEPS
    assert losses[-1] < losses[0]
    assert not [n for n in mon.notes if n.startswith("internal error")], list(mon.notes)
    # the snapshots read the optimizers' state (the dict's, optimi's without its param group)
    snap = list(read_jsonl(tmp_path / "run" / "snapshots.jsonl"))[-1]
    keys = {k for s in snap["state"] for k in s["tensors"]}
    if contract not in ("fused-hook", "fused-hook-inplace", "lomo"):  # (those keep no state)
        assert {"exp_avg", "exp_avg_sq"} <= keys and not any(k.startswith("group") for k in keys), keys
    assert all(p["grad_arrived"] for p in snap["params"] if "grad_arrived" in p)


@pytest.mark.parametrize("contract", zoo.CONTRACTS)
def test_a_layer_replaced_before_a_step_is_found_at_that_step(tmp_path, contract):
    _, mon = _train(tmp_path, contract, "layer-replaced", steps=AT + 2)
    at = {f.code for f in mon.findings if f.step == AT}
    assert REPLACED <= at and min(f.step for f in mon.findings) == AT, [(f.code, f.step) for f in mon.findings]
    assert mon.step_count == AT + 2


@pytest.mark.parametrize("contract", ["recipe", "optimi", "lomo"])
def test_a_layer_replaced_between_forward_and_backward_is_found_at_that_step(tmp_path, contract):
    # the pre-step check runs before the backward pass that is the step: after the user's forward
    _, mon = _train(tmp_path, contract, "replaced-mid-step", steps=AT + 2)
    assert REPLACED <= {f.code for f in mon.findings if f.step == AT}, [(f.code, f.step) for f in mon.findings]
    assert min(f.step for f in mon.findings) == AT


@pytest.mark.parametrize("contract", ["recipe-fused", "torchtune", "optimi-accumulation"])
def test_a_dtype_change_is_found_at_its_step_before_the_optimizer_fails(tmp_path, contract):
    # model.double() with float32 moments: AdamW raises inside the hook, in backward; OC107 came first
    _, mon = _train(tmp_path, contract, "dtype-changed", steps=AT + 2)
    summary = mon.summary()
    assert [(f.code, f.step) for f in mon.findings] == [("OC107", AT)]
    assert summary["crash"] is not None and summary["crash"]["step"] == AT and mon.step_count == AT - 1


def test_a_hook_that_never_zeroes_the_gradient_is_grad_not_cleared(tmp_path):
    _, mon = _train(tmp_path, "recipe", "no-zero-grad-in-hook", steps=2 * EVERY)
    (f,) = [f for f in mon.findings if f.code == "OC204"]
    assert f.detail["first_step"] == 2 and f.step == EVERY, f


def test_a_removed_hook_leaves_its_layer_stalled(tmp_path):
    _, mon = _train(tmp_path, "recipe", "hook-removed", steps=AT + 4 * EVERY)
    (f,) = [f for f in mon.findings if f.code == "OC205"]
    # removed before step 12: the interval 10-15 still moved it (step 11); stalled from 15, two intervals on
    assert set(f.subjects) == {"head.weight", "head.bias"} and f.detail["since_step"] == 3 * EVERY, f
    assert f.step == 5 * EVERY and mon.step_count == AT + 4 * EVERY


@pytest.mark.parametrize("contract", ["fused-hook", "fused-hook-inplace"])
def test_a_fused_update_that_rebinds_is_stalled(tmp_path, contract):
    # `p = p - lr * g` in the user's hook: the gradient is freed, nothing moves (no finding for the
    # released gradients: they arrived, OC202 stays silent)
    _, mon = _train(tmp_path, contract, "rebinding-update", steps=4 * EVERY)
    codes = [(f.code, f.step) for f in mon.findings]
    assert codes == [("OC205", 3 * EVERY)], codes
    assert mon.step_count == 4 * EVERY


def test_gradient_release_never_prepared_is_no_optimizer_step(tmp_path):
    _, mon = _train(tmp_path, "optimi", "no-release-hooks", steps=40, every=10)
    (f,) = [f for f in mon.findings if f.code == "OC206"]
    assert mon.step_count == 0 and "no update inside backward" in f.message


@pytest.mark.parametrize("contract", ["recipe", "optimi", "lomo"])
def test_a_parameter_the_forward_never_uses_is_still_grad_starved(tmp_path, contract):
    _, mon = _train(tmp_path, contract, "unused-layer", steps=3 * EVERY)
    (f,) = [f for f in mon.findings if f.code == "OC202"]
    assert set(f.subjects) == {"aux.weight", "aux.bias"} and f.step == 3 * EVERY, mon.findings


def test_lomo_oc102_says_the_replaced_layer_may_still_train_and_it_does(tmp_path):
    """LOMO updates from ``model.named_parameters()``, not its param groups: the replaced layer's
    parameters are in no param group, yet they move. OC102 says so instead of "never updated"
    (issue 46)."""
    _, mon = _train(tmp_path, "lomo", "layer-replaced", steps=AT + 4)
    f102 = [f for f in mon.findings if f.code == "OC102"]
    assert f102 and f102[0].step == AT
    msg = f102[0].message
    assert "never" not in msg and "in no param group of Lomo" in msg and "may still train" in msg, msg
    assert "initial values" not in (f102[0].next_failure or "")
    snaps = list(read_jsonl(tmp_path / "run" / "snapshots.jsonl"))
    name = f102[0].subjects[0]
    sums = [p.get("checksum") for s in snaps if s["step"] >= AT for p in s["params"] if p["name"] == name]
    assert len(set(sums)) > 1, sums  # the new layer's values moved after AT: it trains
