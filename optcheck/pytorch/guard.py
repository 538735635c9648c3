"""optcheck never breaks the loop it watches: the Monitor's per-step hooks run inside
the user's ``optimizer.step()`` and ``backward()``, so an unexpected exception in
optcheck's own code there must not come out of them.

:func:`guarded` wraps such a hook: an exception it does not expect is logged once
(``optcheck`` logger, warning, with its traceback) and kept as a note
(:class:`Notes`, the summary's ``not_checked``), and the user's call goes on. What
optcheck raises on purpose passes through: :class:`~optcheck.pytorch.monitor_hooks.FindingError`
(``on_finding="raise"``), :class:`~optcheck.worker_loop.StepStopped` (a hazard that
stops a step before harm is done), and ``KeyboardInterrupt``/``SystemExit`` (not
``Exception`` subclasses).
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger("optcheck")


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


def guarded(*passing: type[BaseException]):
    """Decorator for a Monitor hook method (``self.notes``: :class:`Notes`): exceptions
    other than ``passing`` become a note (``"<hook> raised <type>: <message>; ..."``,
    once per hook and exception type) and the hook returns None."""

    def deco(fn):
        @functools.wraps(fn)
        def hook(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except passing:
                raise
            except Exception as e:  # noqa: BLE001 - optcheck's own failure is not the user's
                first = str(e).splitlines()[0][:200] if str(e) else ""
                self.notes.add(f"internal error in {fn.__name__.lstrip('_')} ({type(e).__name__}: {first}); "
                               f"the step went on unchecked there", logging.WARNING, exc_info=e,
                               key=(fn.__name__, type(e)))
                return None

        return hook

    return deco
