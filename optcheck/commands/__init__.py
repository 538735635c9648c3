"""CLI commands, one module each; every module defines ``register(group)``, except the
helpers (a name starting with ``_``, and :data:`NOT_COMMANDS`).

``optcheck/cli.py`` calls :func:`register_all`, so a new command is a new module
here. Commands stay thin: parse options, call a library function, print, return
an exit code from ``optcheck.run.exitcodes``.
"""

from __future__ import annotations

import importlib
import pkgutil

import click


#: Modules here that are no command: ``optcheck soak``'s plan (``soak_plan.plan_soak``, ``run_plan``).
NOT_COMMANDS = ("soak_plan",)


def register_all(group: click.Group) -> None:
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not mod.name.startswith("_") and mod.name not in NOT_COMMANDS:
            importlib.import_module(f"{__name__}.{mod.name}").register(group)
