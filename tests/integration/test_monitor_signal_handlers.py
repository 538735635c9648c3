"""A signal handler that raises to stop the loop stops it, wherever the signal lands:
in the user's code or inside one of optcheck's hooks (``optcheck/pytorch/guard.py``
swallows optcheck's own errors there, never a handler's exception). This is how
``torch.distributed.run``'s SIGTERM reaches a rank (``optcheck.distributed.watch``)
and how users stop a loop on SIGUSR1/SIGALRM. Real Monitor, real timer signals
(``setitimer``) at spread-out delays; the test also counts the signals that landed
inside optcheck's code, so it cannot pass without having exercised that case."""

from __future__ import annotations

import signal
import traceback

import pytest
import torch

import optcheck
from optcheck.pytorch.guard import raised_by_signal_handler

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer (POSIX)")


class Stop(Exception):
    """The user's own 'stop now' exception, raised by their SIGALRM handler."""


LANDED: list = []  # where the last signal landed: (file, line, function) innermost last


def _handler(signum, frame):
    LANDED[:] = [(f.filename.rsplit("/", 2)[-2:], f.lineno, f.name) for f in traceback.extract_stack(frame)[-6:]]
    raise Stop("SIGALRM")


def _loop(mon_dir, delay_s: float, max_steps: int = 400) -> tuple[int, bool, optcheck.Monitor]:
    """Train a tiny MLP under a Monitor (every=1: hooks and snapshots on every step) until
    the handler's Stop comes out; (steps done, whether Stop landed in optcheck's code, monitor)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 16), torch.randn(32, 1)
    mon = optcheck.Monitor(model, opt, every=1, out=str(mon_dir), on_finding="log")
    step = 0
    in_optcheck = False
    signal.setitimer(signal.ITIMER_REAL, delay_s)
    try:
        with mon:
            for step in range(1, max_steps + 1):
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
    except Stop as e:
        files = [f.filename for f in traceback.extract_tb(e.__traceback__)]
        in_optcheck = any("/optcheck/" in f for f in files)
        return step, in_optcheck, mon
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        # an exception raised inside torch.no_grad().__enter__ (torch's, or the optimizer's own) leaves
        # autograd off, with or without optcheck: the next trial starts as a fresh loop would
        torch.set_grad_enabled(True)
    return step, in_optcheck, mon


@pytest.mark.slow
def test_a_handlers_exception_always_reaches_the_loop(tmp_path):
    prev = signal.signal(signal.SIGALRM, _handler)
    try:
        landed_inside = 0
        for i in range(40):
            step, inside, mon = _loop(tmp_path / f"r{i}", 0.02 + 0.0037 * i)
            assert step < 400, f"trial {i}: the handler's Stop was swallowed; the loop ran to its end; it landed in {LANDED}"
            assert not any("internal error" in n for n in mon.notes), mon.notes
            landed_inside += inside
            if landed_inside >= 3 and i >= 10:
                break
    finally:
        signal.signal(signal.SIGALRM, prev)
    assert landed_inside >= 1, "no signal landed inside optcheck's hooks: the case was not exercised"


def test_optchecks_own_error_is_not_taken_for_a_handlers():
    try:
        raise RuntimeError("a probe's own bug")
    except RuntimeError as e:
        assert not raised_by_signal_handler(e)
    prev = signal.signal(signal.SIGALRM, _handler)
    try:
        signal.raise_signal(signal.SIGALRM)
    except Stop as e:
        assert raised_by_signal_handler(e)
    finally:
        signal.signal(signal.SIGALRM, prev)
