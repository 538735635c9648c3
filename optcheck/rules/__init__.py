"""The rule catalogue: every rule registered by code, in the module of its family.

Where a rule lives: ``optcheck/rules/<family>.py``, or ``<family>_<topic>.py`` when a
family outgrows one module — references (OC101–OC109: ``references.py``,
``references_state.py``, ``references_disposed.py``), gradients (OC201–OC203),
updates (OC204–OC208), autograd (OC3xx), memory (OC401 ``memory.py``, OC402
``memory_dispose_scope.py``), values (OC5xx), parity (OC6xx), crossrank (OC701–OC705
``crossrank.py``: the table the ranks of a ``torch.distributed`` job exchange; OC706,
OC707 ``crossrank_events.py``: events one rank records). Modules starting with
``_`` are helpers. Every other module in this package is imported here, so a new
family module registers itself by existing.

Every rule class carries ``VALID`` and ``INVALID`` examples (``_fixtures.py``); one
generic test runs the catalogue on each (``tests/unit/test_rule_fixtures.py``).
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


def warm_up() -> None:
    """Import now what rules import on first use. Nothing is left since OC401's
    statistics are numpy (``_memory_stats.py``, no ``scipy.stats``); kept because the
    soak supervisor calls it (``optcheck.drivers.soak``)."""
    from optcheck.rules._memory_trend import _stats

    _stats()


__all__ = ["REGISTRY", "Rule", "RuleConfig", "RuleContext", "register", "catalogue", "get", "warm_up"]
