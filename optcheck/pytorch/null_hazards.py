"""``NullHazards``: the hazard probes switched off (``--no-hazards``, ``Monitor(hazards=False)``).

It has the whole public interface of :class:`optcheck.pytorch.hazards.HazardProbes`
(``tests/unit/test_interfaces.py`` compares the two), every hook a no-op, so a
driver never asks which one it holds (no ``getattr``/``hasattr`` probe, no ``is None``).
"""

from __future__ import annotations

import contextlib


#: what :meth:`NullHazards.step_context` returns: one shared ``contextlib.nullcontext()`` (none made per step)
NO_CONTEXT = contextlib.nullcontext()


class NullHazards:
    """Hazard probes switched off: every hook does nothing.

    ``can_replay`` is False (no step runs unarmed, so none is re-run armed);
    ``wants_norms`` is False (:meth:`drain` reads no tensor); ``not_checked`` is empty
    (nothing is claimed, so nothing is left out); :meth:`stats` is None (the summary's
    ``hazards`` is null)."""

    can_replay = False
    wants_norms = False
    armed = False

    def __init__(self, optimizer=None):
        self.optimizer = optimizer  # the watched optimizer (a Monitor updates it when the optimizer is swapped)
        self.on_stop = None  # HazardProbes calls it before raising StepStopped; nothing stops a step here
        self.arrival_source = None  # HazardProbes reads a pass's gradient arrival from it; nothing here

    @property
    def not_checked(self) -> list[str]:
        return []

    def step_context(self, step: int):
        return NO_CONTEXT

    def begin_step(self, step: int) -> None:
        pass

    def finish_step(self) -> None:
        pass

    def check_loss(self, loss, step: int, value=None) -> None:
        pass

    def after_backward(self, step: int) -> None:
        pass

    def step_ended(self, step: int) -> None:
        pass

    def has_events(self) -> bool:
        return False

    def drain(self, norms: dict | None = None) -> list[dict]:
        return []

    def arm(self, reason: str) -> None:
        pass

    def end_step(self, step: int) -> bool:
        return False

    def replay(self, step: int) -> None:
        pass

    def backward_failed(self, exc: BaseException, step: int) -> None:
        pass

    def check_grads_now(self, step: int) -> None:
        pass

    def check_grad_norms(self, step: int, names: list, norms) -> None:
        pass

    def check_grads_before_step(self, step: int, kwargs: dict | None = None, clip=None) -> None:
        pass

    def stats(self) -> None:
        return None

    def remove(self) -> None:
        pass
