"""``optcheck run -- COMMAND``: run a training command unchanged, every Python process of it
watched (``optcheck/autowatch/``; mechanism and limits: ``docs/guide/run.md``)."""

from __future__ import annotations

import click

from optcheck.findings import SEVERITIES


def register(group: click.Group) -> None:
    from optcheck.commands.soak import INT

    @group.command(context_settings={"allow_interspersed_args": False})
    @click.option("--out", type=click.Path(file_okay=False), default=None,
                  help="Run directory (default: runs/<UTC time>); must not hold a run.")
    @click.option("--every", type=INT, default=100, show_default=True, help="A snapshot every N optimizer steps.")
    @click.option("--hazards", type=click.Choice(["auto", "always", "off"]), default="auto", show_default=True,
                  help="The autograd hazard probes: armed on the steps that need them, on every step, or off.")
    @click.option("--fail-on", type=click.Choice(SEVERITIES), default="warning", show_default=True,
                  help="Lowest finding severity that makes the exit code 1.")
    @click.option("--ignore", "ignores", multiple=True, metavar="CODE[:PATTERN]",
                  help="Accept a finding (as `optcheck soak --ignore`; repeatable).")
    @click.option("--baseline", type=click.Path(), default=None, metavar="DIR",
                  help="Judge the run against a kept run as `soak --baseline` does: fail only on a regression.")
    @click.argument("command", nargs=-1, type=click.UNPROCESSED)
    def run(out, every, hazards, fail_on, ignores, baseline, command):
        """Run COMMAND (after --) unchanged and watch every optimizer that steps in every
        Python process it starts: `optcheck run -- python train.py`, `-- torchrun ...`,
        `-- accelerate launch ...`, a shell script. One run directory in --out.

        Exit codes: COMMAND's own when it fails; else 0 clean, 1 a finding at or above
        --fail-on (with --baseline: a regression); 2 bad input, nothing started.
        """
        import sys
        from pathlib import Path

        from optcheck.autowatch import launch
        from optcheck.commands._paths import same_dir
        from optcheck.commands.soak_plan import ignore_entries
        from optcheck.errors import InputError

        if every < 1:
            raise InputError(f"--every {every}: must be 1 or more")
        command = launch.check_command(list(command))
        if out is None:
            from optcheck.drivers.soak import default_out_dir

            out = str(default_out_dir())
        outp = launch.check_out(out)
        prepared = None
        if baseline is not None:
            from optcheck.judge.baseline import Tolerances, load_baseline

            if same_dir(baseline, out):
                raise InputError(f"--baseline {baseline}: is the --out of this run (give the baseline another folder)")
            prepared = (load_baseline(baseline), Tolerances(fail_on=fail_on))
        ignore = ignore_entries(ignores)
        env = launch.environment(outp, every=every, hazards=hazards if hazards != "off" else False,
                                 fail_on=fail_on, ignore=list(ignore or []))
        outp.mkdir(parents=True, exist_ok=True)
        ended = launch.run_command(command, env)
        summary, findings, notes = launch.fold(outp, ended, command, fail_on=fail_on, every=every)
        _print(summary, findings, notes)
        code = launch.exit_code(ended, findings, fail_on)
        if prepared is not None:
            from optcheck.judge.baseline import after_soak

            try:
                _, judged = after_soak(outp, prepared, code, echo=click.echo)
            except InputError as e:
                click.echo(f"optcheck: error: {e}", err=True)
                return code if ended.returncode else 2
            code = code if ended.returncode else judged
        sys.stdout.flush()
        return code


def _print(summary: dict, findings: list[dict], notes: list[str]) -> None:
    """The run's closing lines: the summary table, each finding, the notes."""
    from optcheck.report.text import render_summary

    for note in notes:
        click.echo(f"optcheck: note: {note}", err=True)
    if summary.get("last_step", 0) == 0 and any("no optimizer stepped" in str(n) for n in summary.get("not_checked") or []):
        click.echo(f"optcheck: no optimizer stepped (the command exited {summary['config']['command_exit']}); "
                   f"run directory {summary.get('out')}")
        return
    click.echo(render_summary(summary, findings))
