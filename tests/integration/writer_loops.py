"""What the OC301 writer tests share (test_inplace_writer.py, test_inplace_transformers.py): a
loop of ``step_loss`` steps with or without ``optcheck.Monitor``, the OC301 finding that stopped
it, and the ``file:line`` of a marked line of a test file."""

from __future__ import annotations

import os

import optcheck
from optcheck.errors import StepStopped


def train(model, opt, step_loss, monitor=True, steps=2, hazards="auto"):
    """(monitor or None, the exception that stopped the loop or None); ``step_loss(model, step)``
    is each step's loss (step from 0)."""
    mon = optcheck.Monitor(model, opt, every=5, on_finding="ignore", hazards=hazards) if monitor else None
    exc = None
    try:
        for step in range(steps):
            loss = step_loss(model, step)
            opt.zero_grad()
            loss.backward()
            opt.step()
    except (StepStopped, RuntimeError) as e:
        exc = e
    if mon is not None:
        mon.close()
    return mon, exc


def stopped(mon, exc):
    """The one OC301 finding, the same sentence as the StepStopped that stopped the step; and
    the event's detail."""
    (f,) = [f for f in mon.findings if f.code == "OC301"]
    assert isinstance(exc, StepStopped) and str(exc) == f"step {f.step}: {f.message}"
    return f, exc.event["detail"]


def line_of(path: str, text: str) -> str:
    """``file:N`` of the one line of ``path`` marked ``# text``."""
    with open(path, encoding="utf-8") as fh:
        lines = [i for i, s in enumerate(fh.read().splitlines(), 1) if "# " + text in s]
    assert len(lines) == 1, (text, lines)
    return f"{os.path.basename(path)}:{lines[0]}"
