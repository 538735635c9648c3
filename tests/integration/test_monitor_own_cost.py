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


def _steps(mon, model, opt, n: int = 3) -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        x = torch.randn(16, 8, generator=g)
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def _slowed(orig):
    def slow(*args, **kwargs):
        time.sleep(SLOW_S)
        return orig(*args, **kwargs)
    return slow


@pytest.mark.parametrize("hazards", [False, "auto"])
@pytest.mark.parametrize("piece", [(GradClearProbe, "_before_step"), (GradClearProbe, "_after_step"),
                                   (ClipNorm, "record")], ids=["OC207-pre-step", "OC204-post-step", "clip-record"])
def test_the_own_timer_counts_the_probes_step_hooks_and_the_clip(tmp_path, monkeypatch, hazards, piece):
    cls, name = piece
    monkeypatch.setattr(cls, name, _slowed(getattr(cls, name)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = optcheck.Monitor(model, opt, every=100, out=str(tmp_path / "run"), on_finding="ignore", hazards=hazards)
    try:
        _steps(mon, model, opt)
    finally:
        summary = mon.close()
    assert summary["cost"]["steps"]["count"] == 3
    assert summary["cost"]["steps"]["total_s"] >= 3 * SLOW_S, (name, summary["cost"])


def test_an_error_in_a_probes_step_hook_is_a_note_not_the_users_exception(tmp_path, monkeypatch):
    monkeypatch.delenv("OPTCHECK_RAISE_INTERNAL", raising=False)

    def _before_step(self, optimizer, args, kwargs):
        raise RuntimeError("planted in the gradient-flow probe")

    monkeypatch.setattr(GradClearProbe, "_before_step", _before_step)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    mon = optcheck.Monitor(model, opt, every=100, out=str(tmp_path / "run"), on_finding="ignore", hazards=False)
    try:
        _steps(mon, model, opt)  # (raised into opt.step() before: the step hooks were not guarded)
    finally:
        summary = mon.close()
    assert mon.step_count == 3
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))  # the steps moved the weights
    notes = [n for n in summary["not_checked"] if "planted in the gradient-flow probe" in n]
    assert len(notes) == 1 and notes[0].startswith("internal error in before_step (RuntimeError: "), summary["not_checked"]


@pytest.mark.parametrize("name", ["_before_step", "_after_step"])
def test_the_own_timer_counts_the_hazard_probes_step_hooks(tmp_path, monkeypatch, name):
    from optcheck.pytorch.hazards import HazardProbes

    monkeypatch.setattr(HazardProbes, name, _slowed(getattr(HazardProbes, name)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = optcheck.Monitor(model, opt, every=100, out=str(tmp_path / "run"), on_finding="ignore")
    try:
        _steps(mon, model, opt)
    finally:
        summary = mon.close()
    assert summary["cost"]["steps"]["count"] == 3
    assert summary["cost"]["steps"]["total_s"] >= 3 * SLOW_S, (name, summary["cost"])
