"""optcheck never breaks the loop it watches: the Monitor's per-step hooks run inside
the user's ``optimizer.step()`` and ``backward()``, so an unexpected exception in
optcheck's own code there must not come out of them.

:func:`guarded` wraps such a hook: an exception it does not expect is logged once
(``optcheck`` logger, warning, with its traceback) and kept as a note
(:class:`Notes`, the summary's ``not_checked``), and the user's call goes on. What
optcheck raises on purpose passes through: :class:`~optcheck.pytorch.monitor_hooks.FindingError`
(``on_finding="raise"``), :class:`~optcheck.errors.StepStopped` (a hazard that
stops a step before harm is done), ``KeyboardInterrupt``/``SystemExit`` (not
``Exception`` subclasses), and any exception raised by a signal handler that ran while
the hook did (:func:`raised_by_signal_handler`): a handler that raises to stop the loop
(``torch.distributed.run``'s SIGTERM turned into an exception, a user's own SIGUSR1
handler) must stop it, whichever line of optcheck's it interrupted.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time

log = logging.getLogger("optcheck")
_now_ns = time.perf_counter_ns


class Notes(list):
    """Lines saying what optcheck could not read or do, in order, each once."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: set = set()

    def add(self, text: str, level: int = logging.INFO, exc_info: BaseException | None = None,
            key: object = None) -> bool:
        """Append ``text`` and log it, unless a note with the same ``key`` (default: the
        text) was added before; True when it was new."""
        key = text if key is None else key
        if key in self._keys:
            return False
        self._keys.add(key)
        self.append(text)
        log.log(level, "optcheck: %s", text, exc_info=exc_info)
        return True


def _handler_codes() -> set:
    """The code objects of the Python signal handlers installed now (``signal.getsignal``
    over ``signal.valid_signals()``; about 80 µs)."""
    codes = set()
    for s in _SIGNALS:
        try:
            h = signal.getsignal(s)
        except (ValueError, OSError):
            continue
        code = getattr(getattr(h, "__func__", h), "__code__", None)
        if code is not None:
            codes.add(code)
    return codes


_SIGNALS = tuple(signal.valid_signals())
#: Frames in these folders are never a signal handler's: optcheck's probes and torch itself.
_LIBRARY = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


def raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by (or through) a Python signal handler: a frame of its
    traceback runs the code of a handler installed now (:func:`_handler_codes`). Python
    runs a handler between two bytecodes of the main thread, so its frame sits on top of
    whatever it interrupted, here optcheck's hook (Python docs, "signal — Execution of
    Python signal handlers"). A handler that chains to another
    (``optcheck.drivers.monitor_end.SignalChain``) is found by its own frame.

    Cost: a walk of the traceback (a few frames); the handlers are read only when a
    frame lies outside ``optcheck/pytorch/`` and torch (a handler is the user's code,
    or the Monitor's signal chain): optcheck's own errors, and the ops a sparse or
    quantized tensor lacks, are told apart in well under a microsecond."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    if all(c.co_filename.startswith(_LIBRARY + _torch_dirs()) for c in frames):
        return False
    codes = _handler_codes()
    return any(c in codes for c in frames)


def _torch_dirs() -> tuple:
    torch = sys.modules.get("torch")
    path = getattr(torch, "__file__", None)
    return (os.path.dirname(path) + os.sep,) if path else ()


#: Set to "1" (optcheck's own test suite does, tests/conftest.py), an internal error in a
#: Monitor hook is raised instead of becoming a note: a bug in optcheck fails its tests
#: instead of skipping that hook's checks silently.
RAISE_INTERNAL_ENV = "OPTCHECK_RAISE_INTERNAL"


def guarded(*passing: type[BaseException], timed: bool = False, step_end: bool = False):
    """Decorator for a Monitor hook method (``self.notes``: :class:`Notes`): exceptions
    other than ``passing`` become a note (``"<hook> raised <type>: <message>; ..."``,
    once per hook and exception type) and the hook returns None. With
    ``OPTCHECK_RAISE_INTERNAL=1`` (:data:`RAISE_INTERNAL_ENV`) they are raised.

    ``timed``: the hook's time in nanoseconds (``time.perf_counter_ns``), less what it spent
    taking snapshots (``self.seq.busy_ns``, ``optcheck.run.sequencer.Sequencer.take``), is
    added to ``self.step_cost.ns`` (``optcheck.run.sequencer.StepCost``: the summary's
    ``cost.steps``), even when the hook raises; ``step_end`` also counts a step there. In
    the same frame as the guard: a per-step hook costs one Python call of optcheck's, not two."""

    def deco(fn):
        def note(self, e: Exception) -> None:
            if raised_by_signal_handler(e):  # the process is being stopped, not optcheck failing
                raise e
            if os.environ.get(RAISE_INTERNAL_ENV) == "1":  # optcheck's own tests: never hidden
                raise e
            first = str(e).splitlines()[0][:200] if str(e) else ""
            self.notes.add(f"internal error in {fn.__name__.lstrip('_')} ({type(e).__name__}: {first}); "
                           f"the step went on unchecked there", logging.WARNING, exc_info=e,
                           key=(fn.__name__, type(e)))

        @functools.wraps(fn)
        def hook(self, *args, **kwargs):
            if timed:
                t0, busy = _now_ns(), self.seq.busy_ns
            try:
                return fn(self, *args, **kwargs)
            except passing:
                raise
            except Exception as e:  # noqa: BLE001 - optcheck's own failure is not the user's
                note(self, e)
                return None
            finally:
                if timed:
                    cost = self.step_cost
                    cost.ns += _now_ns() - t0 - (self.seq.busy_ns - busy)
                    cost.steps += step_end

        return hook

    return deco
