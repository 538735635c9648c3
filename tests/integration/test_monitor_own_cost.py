"""The Monitor's own timer (``summary.json``'s ``cost.steps``) counts all of its per-step work,
and none of that work raises into the user's loop (issue 34, part 8).

``benchmarks/bench_twins.py`` measured a quiet step's added time 55-90 µs above the own timer: the
gradient-flow probe's optimizer step hooks (OC207 before the step, OC204/OC208 after it), the
hazard probes' and the record of ``clip_grad_norm_``'s total ran outside the Monitor's timed
hooks, and an exception in one of those step hooks went on into the user's ``optimizer.step()``.
Here each of them is made slow (or made to raise) at the class, before the Monitor is built,
in a real loop.
"""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import optcheck  # noqa: E402
from optcheck.pytorch.grad_clear import GradClearProbe  # noqa: E402
from optcheck.pytorch.monitor_hooks import ClipNorm  # noqa: E402

torch.set_num_threads(1)
SLOW_S = 0.02


def _monitored_steps(tmp_path, hazards, n: int = 3) -> tuple[dict, list, list]:
    """``n`` steps of a small MLP with ``clip_grad_norm_``, under a Monitor: (its summary, the
    weights before, the weights after)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    mon = optcheck.Monitor(model, opt, every=100, out=str(tmp_path / "run"), on_finding="ignore", hazards=hazards)
    g = torch.Generator().manual_seed(0)
    try:
        for _ in range(n):
            x = torch.randn(16, 8, generator=g)
            opt.zero_grad(set_to_none=True)
            model(x).pow(2).mean().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    finally:
        summary = mon.close()
    return summary, before, [p.detach() for p in model.parameters()]


def _slowed(orig):
    def slow(*args, **kwargs):
        time.sleep(SLOW_S)
        return orig(*args, **kwargs)
    return slow


def _hazard_probes():
    from optcheck.pytorch.hazards import HazardProbes

    return HazardProbes


@pytest.mark.parametrize("hazards,piece", [
    (hazards, piece) for hazards in (False, "auto") for piece in ("grad_clear.before", "grad_clear.after", "clip")] + [
    ("auto", "hazards.before"), ("auto", "hazards.after")])
def test_the_own_timer_counts_the_probes_step_hooks_and_the_clip(tmp_path, monkeypatch, hazards, piece):
    cls, name = {"grad_clear.before": (GradClearProbe, "_before_step"),  # OC207
                 "grad_clear.after": (GradClearProbe, "_after_step"),  # OC204, OC208
                 "clip": (ClipNorm, "record"),
                 "hazards.before": (_hazard_probes(), "_before_step"),
                 "hazards.after": (_hazard_probes(), "_after_step")}[piece]
    monkeypatch.setattr(cls, name, _slowed(getattr(cls, name)))
    summary, _, _ = _monitored_steps(tmp_path, hazards)
    assert summary["cost"]["steps"]["count"] == 3
    assert summary["cost"]["steps"]["total_s"] >= 3 * SLOW_S, (piece, summary["cost"])


def test_an_error_in_a_probes_step_hook_is_a_note_not_the_users_exception(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTCHECK_RAISE_INTERNAL", raising=False)

    def _before_step(self, optimizer, args, kwargs):
        raise RuntimeError("planted in the gradient-flow probe")

    monkeypatch.setattr(GradClearProbe, "_before_step", _before_step)
    # (raised into the user's opt.step() before: the probes' step hooks were not guarded)
    summary, before, after = _monitored_steps(tmp_path, hazards=False)
    assert summary["cost"]["steps"]["count"] == 3
    assert all(not torch.equal(a, b) for a, b in zip(before, after))  # the steps moved the weights
    notes = [n for n in summary["not_checked"] if "planted in the gradient-flow probe" in n]
    assert len(notes) == 1 and notes[0].startswith("internal error in before_step (RuntimeError: "), summary["not_checked"]


@pytest.mark.parametrize("hazards", [False, "auto"])
def test_a_clean_loop_gets_no_internal_error_note_and_every_step_timed(tmp_path, hazards):
    """The silent side: nothing slowed or planted, the wrapped step hooks and the clip record
    leave no note, count each step once, and the steps train."""
    summary, before, after = _monitored_steps(tmp_path, hazards, n=5)
    assert summary["cost"]["steps"]["count"] == 5 and summary["cost"]["steps"]["total_s"] > 0
    assert not [n for n in summary["not_checked"] if "internal error" in n], summary["not_checked"]
    assert summary["status"] == "clean" and all(not torch.equal(a, b) for a, b in zip(before, after))
