"""Where the PyTorch fault scenarios register (``optcheck/pytorch/scenarios.py`` applies them;
``hazard_scenarios.py`` and ``memory_scenarios.py`` add theirs): one dict, one decorator, so
the modules that implement scenarios and the one that loads them import nothing of each other
but this."""

from __future__ import annotations

from typing import Callable

#: scenario name -> ``fn(trainer, step) -> dict``
IMPLEMENTATIONS: dict[str, Callable] = {}


def implements(name: str):
    """Decorator: register ``fn(trainer, step) -> dict`` for scenario ``name``."""
    def deco(fn):
        IMPLEMENTATIONS[name] = fn
        return fn
    return deco
