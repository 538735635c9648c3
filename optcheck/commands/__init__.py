"""CLI commands, one module each; every module defines ``register(group)``.

``optcheck/cli.py`` calls :func:`register_all`, so a new command is a new module
here. Commands stay thin: parse options, call a library function, print, return
an exit code from ``optcheck.run.exitcodes``.
"""

from __future__ import annotations

import importlib
import pkgutil

import click


def register_all(group: click.Group) -> None:
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}").register(group)
