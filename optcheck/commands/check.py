"""``optcheck check``: re-run the rules over a recorded snapshot stream."""

from __future__ import annotations

from pathlib import Path

import click

from optcheck.engine import RuleEngine
from optcheck.errors import InputError
from optcheck.findings import SEVERITIES
from optcheck.run.recorder import RunRecorder
from optcheck.report.reader import RunReader, rank_dirs
from optcheck.record.summary import Summary


def check_file(path: str | Path, ignore: list | None = None) -> tuple[list, list[str], int]:
    """Findings of a recorded stream: (findings, notes, number of snapshots); see :func:`replay`."""
    rec, notes = replay(path, ignore)
    return rec.findings, notes, rec.summary.snapshots


def replay(path: str | Path, ignore: list | None = None, fail_on: str = "warning"):
    """Replay a recorded stream through an in-memory :class:`optcheck.run.recorder.RunRecorder`
    (the rules of this optcheck, the summary and exit code as a run's): returns
    ``(recorder, notes)``.

    ``path`` is a ``snapshots.jsonl`` or a run directory holding one, read by
    :class:`optcheck.report.reader.RunReader`; ``ignore``: accepted findings
    (``optcheck.suppress``), left out.

    Every line is checked against ``optcheck/schemas/snapshot-1.json``; a line
    that is not JSON at all (torn, garbage) is skipped and named in the notes
    (``"<file>:<line>: <reason>; skipped, the rest was read"``).

    Raises:
        InputError: missing, empty or unreadable stream; not a run directory; a
            newer snapshot schema; a record of the wrong shape
            ("<file>:<line>: <field>: <what is wrong>").
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file (expected snapshots.jsonl or a run directory)")
    run = RunReader(p, allow_stream=True, purpose="check")
    p = run.path / "snapshots.jsonl" if not run.stream_only else p
    if not run.stream_only and not run.has("snapshots.jsonl"):
        raise InputError(f"{path}: no snapshots.jsonl in this run directory (nothing to check)")
    if run.has("summary.json"):
        try:
            run.summary  # noqa: B018 - read for its note: a run that ended without closing is said
        except InputError:
            pass
    snaps = run.snapshots
    if not snaps:
        raise InputError(f"{p}: no snapshots in it")
    rec = RunRecorder(None, Summary(run=str(path), backend=str(snaps[0].get("backend") or ""), source="check",
                                    fail_on=fail_on), engine=RuleEngine(ignore=ignore))
    for s in snaps:
        try:
            rec.check(s)
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError, OverflowError) as e:
            # a record the schema lets through but a rule cannot use: bad input, not a finding
            raise InputError(f"{p}: snapshot at step {s.get('step')}: a rule cannot read it "
                             f"({type(e).__name__}: {str(e)[:120]})") from None
    return rec, run.notes()


def replay_ranks(path: str | Path, ignore: list | None = None, fail_on: str = "warning"):
    """Replay each rank of a distributed run directory (:func:`rank_dirs`) with
    :func:`replay`: returns ``(findings, notes, snapshots, exit_code)`` where findings
    are dicts with their ``rank`` (a cross-rank OC70x finding, which every rank derives
    from the same exchanged table, once: ``optcheck.distributed.merge.fold``), notes
    are prefixed ``rank K:``, snapshots are summed over the ranks and the exit code is
    the worst of the ranks' (``optcheck.run.exitcodes.worst``). Raises InputError as
    :func:`replay` does, naming the rank's folder."""
    from optcheck.run import exitcodes
    from optcheck.distributed.merge import fold

    findings: list[dict] = []
    notes: list[str] = []
    seen: set = set()
    snapshots, codes = 0, []
    for k, d in rank_dirs(path):
        rec, rank_notes = replay(d, ignore, fail_on)
        fold(k, [f.to_dict() for f in rec.findings], seen, findings)
        notes += [f"rank {k}: {n}" for n in rank_notes]
        snapshots += rec.summary.snapshots
        codes.append(rec.finish()["exit_code"])
    return findings, notes, snapshots, exitcodes.worst(codes)


def register(group: click.Group) -> None:
    @group.command()
    @click.argument("stream", type=click.Path())
    @click.option("--fail-on", type=click.Choice(SEVERITIES), default="warning", show_default=True)
    @click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Also write JUnit XML.")
    @click.option("--summary-md", "summary_md", type=click.Path(dir_okay=False), default=None,
                  help="Also write a Markdown report (as `optcheck soak --summary-md`).")
    @click.option("--json", "as_json", is_flag=True, help="Print findings as JSON lines.")
    @click.option("--ignore", "ignores", multiple=True, metavar="CODE[:PATTERN]",
                  help="Accept a finding (as `optcheck soak --ignore`; repeatable).")
    def check(stream, fail_on, junit, summary_md, as_json, ignores):
        """Re-run every rule over a recorded stream (snapshots.jsonl or a run directory;
        an --nproc run directory is checked rank by rank, each finding with its rank).

        Exit codes: 0 clean, 1 findings at or above --fail-on, 2 bad input.
        """
        from optcheck.commands._paths import check_output_file
        from optcheck.commands.soak_plan import ignore_entries

        if junit:
            check_output_file(junit, "--junit")
        if summary_md:
            check_output_file(summary_md, "--summary-md")
        if rank_dirs(stream):
            findings, notes, n, code = replay_ranks(stream, ignore_entries(ignores), fail_on)
            ranks = len(rank_dirs(stream))
            by_code: dict = {}
            for f in findings:
                by_code[f["code"]] = by_code.get(f["code"], 0) + 1
            summary = {"command": "check", "run": str(stream), "status": "findings" if code else "clean",
                       "exit_code": code, "snapshots": n, "findings": len(findings), "findings_by_code": by_code,
                       "world": ranks}
            _report(stream, findings, notes, f"{ranks} ranks, {n} snapshots", summary, fail_on, junit, summary_md,
                    as_json)
            return code
        rec, notes = replay(stream, ignore_entries(ignores), fail_on)
        findings, n = [f.to_dict() for f in rec.findings], rec.summary.snapshots
        replayed = rec.finish()  # status and exit code by the one policy (optcheck.run.exitcodes)
        code = replayed["exit_code"]
        summary = {"command": "check", "run": str(stream), "status": replayed["status"], "exit_code": code,
                   "snapshots": n, "findings": len(findings), "findings_by_code": replayed["findings_by_code"]}
        if summary_md and Path(stream).is_dir() and (Path(stream) / "summary.json").exists():
            recorded = RunReader(stream).summary
            summary = {**{k: recorded.get(k) for k in ("backend", "steps_requested", "last_step", "loss_first",
                                                       "loss_last", "val_loss_first", "val_loss_last",
                                                       "val_step_first", "val_step_last", "steps_per_s",
                                                       "peak_rss_bytes", "versions")}, **summary}
        _report(stream, findings, notes, f"{n} snapshots", summary, fail_on, junit, summary_md, as_json)
        return code


def _report(stream, findings: list[dict], notes: list[str], counted: str, summary: dict, fail_on: str, junit,
            summary_md, as_json: bool) -> None:
    """What ``optcheck check`` prints and writes, for one run or every rank of one
    (a finding with a ``rank`` is printed with it): notes on stderr, one line per
    finding (or JSON lines), the count line, JUnit XML and the Markdown report."""
    from optcheck.record.snapshot import dumps
    from optcheck.report.text import finding_lines

    for note in notes:
        click.echo(f"optcheck: note: {note}", err=True)
    for f in findings:
        if as_json:
            click.echo(dumps(f))
        else:
            for line in finding_lines(f):
                click.echo(line)
    if not as_json:
        click.echo(f"{counted}, {len(findings)} finding(s)")
    try:
        if junit:
            from optcheck.report.junit import write_junit

            write_junit(findings, junit, suite_name=f"optcheck check {stream}", fail_on=fail_on)
        if summary_md:
            from optcheck.report.markdown import write_markdown

            write_markdown(summary_md, [(summary, findings)])
    except OSError as e:
        from optcheck.errors import RecordError

        raise RecordError(e.filename or junit or summary_md, e) from None
