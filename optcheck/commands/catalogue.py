"""``optcheck rules``, ``optcheck explain CODE``, ``optcheck scenarios``: the catalogues."""

from __future__ import annotations

import click

from optcheck import rules
from optcheck.errors import InputError
from optcheck.scenarios import CATALOGUE


def register(group: click.Group) -> None:
    @group.command("rules")
    def list_rules():
        """List every rule: code, symbol, severity, message."""
        for cls in rules.catalogue():
            click.echo(f"{cls.code}  {cls.symbol:<25} {cls.severity:<8} {cls.doc().splitlines()[0] if cls.doc() else ''}")

    @group.command()
    @click.argument("code")
    def explain(code):
        """Print a rule's documentation: what it means, what fails next, how to fix it."""
        try:
            cls = rules.get(code)
        except KeyError as e:
            raise InputError(e.args[0]) from None
        click.echo(f"{cls.code} {cls.symbol} ({cls.severity}, {cls.family})\n")
        click.echo(cls.doc())

    @group.command()
    @click.option("--backend", type=click.Choice(["pytorch", "torchsharp"]), default=None,
                  help="Only the scenarios this backend implements.")
    def scenarios(backend):
        """List the fault scenarios --inject NAME@STEP can plant, and what each reproduces."""
        for s in CATALOGUE.values():
            if backend and backend not in s.backends:
                continue
            expect = "; ".join(f"{b}: {', '.join(s.expected(b))}" for b in s.backends)
            click.echo(f"{s.name}  [{', '.join(s.backends)}]  expect {expect}")
            click.echo(f"    {s.summary}")
            click.echo(f"    reproduces: {s.reproduces}")
            click.echo(f"    without optcheck: {s.without_optcheck}")
