"""Every ``torch.optim`` optimizer with every implementation flag it has on CPU,
under ``optcheck.Monitor`` (issue 11, item 1): clean loops give no finding and
exit 0; a stalled update is still OC205. Loops: ``optimizer_zoo.py``.

``torch.optim.AdamW(fused=True)`` (Hugging Face Trainer's default) updates
parameters without bumping their version counter: OC205 used to fire on it.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import optimizer_zoo as zoo  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

EVERY = 10  # 120 steps: 12 post-step snapshots compared pairwise


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def _monitor(tmp_path):
    return {"every": EVERY, "out": str(tmp_path / "run"), "on_finding": "ignore"}


def _assert_clean(tmp_path, losses, mon):
    found = list(read_jsonl(tmp_path / "run" / "findings.jsonl"))
    assert found == [] and mon.exit_code == 0 and mon.summary()["status"] == "clean", found
    assert mon.snapshots >= 10
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


def _refused_on_cpu(name, flag):
    """torch's own reason when it refuses ``flag`` for ``name`` on CPU (capturable=True), else None."""
    model = zoo.Regressor()
    try:
        opt = zoo.make_optimizer(name, flag, model.parameters())
        model(torch.randn(2, 16)).sum().backward()
        opt.step()
    except (AssertionError, RuntimeError, ValueError) as e:
        return str(e).splitlines()[0]
    return None


MATRIX = [(name, flag) for name, (_, flags) in zoo.OPTIMIZERS.items() for flag in flags]


@pytest.mark.parametrize("name,flag", MATRIX, ids=[f"{n}-{f}" for n, f in MATRIX])
def test_every_optimizer_and_implementation_is_silent(tmp_path, name, flag):
    reason = _refused_on_cpu(name, flag)
    if reason is not None:
        assert flag == "capturable", reason  # only capturable may be refused (it needs CUDA/XPU state steps)
        pytest.skip(f"torch refuses {name}({flag}=True) on CPU: {reason}")
    _assert_clean(tmp_path, *zoo.train(name, flag, monitor=_monitor(tmp_path)))


@pytest.mark.parametrize("loop", ["lbfgs", "sparse_adam", "muon", "zero"])
def test_special_optimizers_are_silent(tmp_path, loop):
    train = {"lbfgs": zoo.train_lbfgs, "sparse_adam": zoo.train_sparse_adam, "muon": zoo.train_muon,
             "zero": zoo.train_zero}[loop]
    _assert_clean(tmp_path, *train(monitor=_monitor(tmp_path)))


@pytest.mark.parametrize("style", ["add", "copy", "data"])
def test_updates_written_by_hand_are_silent(tmp_path, style):
    # p.add_(...), p.copy_(...) under no_grad, and p.data -= ... (no version bump on p: only its values move)
    _assert_clean(tmp_path, *zoo.train_by_hand(style, monitor=_monitor(tmp_path)))


@pytest.mark.parametrize("flag", ["for-loop", "foreach", "fused"])
@pytest.mark.parametrize("name", ["AdamW", "SGD-plain"])
def test_bf16_parameters_are_silent(tmp_path, name, flag):
    # bf16 rounding swallows updates below half an ulp (the LayerNorm weight of 1.0 under SGD fused)
    _assert_clean(tmp_path, *zoo.train(name, flag, dtype=torch.bfloat16, monitor=_monitor(tmp_path)))


@pytest.mark.parametrize("flag", ["for-loop", "fused"])
@pytest.mark.parametrize("name", ["AdamW", "SGD-plain"])
@pytest.mark.parametrize("warmup", ["linear", "delayed"])
def test_warmup_from_zero_is_silent(tmp_path, name, flag, warmup):
    # "delayed": lr exactly 0 for 30 steps (3 snapshot intervals) in a fused kernel: nothing moves, no version bump
    _assert_clean(tmp_path, *zoo.train(name, flag, warmup=warmup, monitor=_monitor(tmp_path)))


def test_a_hand_written_step_that_rebinds_is_stalled(tmp_path):
    # `p = p - lr * p.grad`: the parameters never change
    _, mon = zoo.train_by_hand("rebinding", monitor=_monitor(tmp_path))
    found = [f for f in mon.findings if f.code == "OC205"]
    assert len(found) == 1 and found[0].step == 3 * EVERY and found[0].detail["since_step"] == EVERY
    assert set(found[0].subjects) == {"fc1.weight", "fc1.bias", "norm.weight", "norm.bias", "fc2.weight", "fc2.bias"}
    assert mon.exit_code == 1


def test_a_fused_step_that_a_grad_scaler_always_skips_is_stalled(tmp_path):
    # GradScaler passes found_inf to the fused kernel, which leaves the values and takes back the step count
    _, mon = zoo.train(bug="scaler-always-inf", monitor=_monitor(tmp_path))
    found = [f for f in mon.findings if f.code == "OC205"]
    # the inf gradients are OC501 dated at step 1, read at the step-10 snapshot (no sync per step,
    # docs/gpu.md); the two intervals without movement are 10-20 and 20-30, as for the loop above
    assert min(f.step for f in mon.findings if f.code == "OC501") == 1
    assert len(found) == 1 and found[0].step == 3 * EVERY and found[0].detail["since_step"] == EVERY
    assert len(found[0].subjects) == 6 and mon.exit_code == 1
