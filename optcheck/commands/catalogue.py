"""``optcheck rules``, ``optcheck explain CODE``, ``optcheck scenarios``, ``optcheck schema KIND``: the catalogues."""

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
    @click.argument("kind", type=click.Choice(["summary", "snapshot", "finding", "metrics"]))
    def schema(kind):
        """Print the JSON Schema (draft 2020-12) of a run directory's record file:
        summary (summary.json), snapshot (snapshots.jsonl lines), finding, metrics."""
        import json

        from optcheck.record.snapshot import schema_document

        click.echo(json.dumps(schema_document(kind), indent=2))

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
                  help="Only the scenarios this backend implements (and only its outcomes).")
    @click.option("--sources", is_flag=True, help="Also say where each outcome was measured.")
    def scenarios(backend, sources):
        """List the fault scenarios --inject NAME@STEP can plant, what each reproduces, and
        what it does without optcheck on each backend version it was measured on."""
        for s in CATALOGUE.values():
            if backend and backend not in s.backends:
                continue
            expect = "; ".join(f"{b}: {', '.join(s.expected(b))}" for b in s.backends)
            click.echo(f"{s.name}  [{', '.join(s.backends)}]  expect {expect}")
            click.echo(f"    {s.summary}")
            click.echo(f"    reproduces: {s.reproduces}")
            click.echo("    without optcheck:")
            outs = s.outcomes(backend)
            width = max(len(o.label) for o in outs)
            for o in outs:
                flagged = f"  [optcheck: {', '.join(o.flagged)}]" if o.flagged else ""
                click.echo(f"      {o.label:<{width}}  {o.text}{flagged}")
                if sources and o.source:
                    click.echo(f"      {'':<{width}}  (measured: {o.source})")
