"""The rule catalogue: one module per family, every rule registered by code.

Where a rule lives: ``optcheck/rules/<family>.py`` — references (OC1xx),
gradients (OC2xx), autograd (OC3xx), memory (OC4xx), values (OC5xx),
parity (OC6xx). Every module in this package is imported here, so a new family
module registers itself by existing.
"""

from __future__ import annotations

import importlib
import pkgutil

from optcheck.rules.base import REGISTRY, Rule, RuleConfig, RuleContext, register

for _mod in pkgutil.iter_modules(__path__):
    if _mod.name != "base" and not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")


def catalogue() -> list[type[Rule]]:
    """Every registered rule class, ordered by code."""
    return [REGISTRY[c] for c in sorted(REGISTRY)]


def get(code_or_symbol: str) -> type[Rule]:
    """A rule by code ("OC101", case-insensitive) or symbol ("stale-param").

    Raises:
        KeyError: no such rule (the message lists the known codes).
    """
    key = code_or_symbol.strip()
    for cls in REGISTRY.values():
        if cls.code.lower() == key.lower() or cls.symbol == key.lower():
            return cls
    raise KeyError(f"no rule {code_or_symbol!r}; known: {', '.join(sorted(REGISTRY))}")


__all__ = ["REGISTRY", "Rule", "RuleConfig", "RuleContext", "register", "catalogue", "get"]
