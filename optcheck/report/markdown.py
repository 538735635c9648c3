"""The end-of-run summary as short GitHub-flavoured Markdown, for a CI job summary
(``$GITHUB_STEP_SUMMARY``) or a merge-request comment. Torch-free.

``render_markdown(summary, findings, plot=...)`` reads the same inputs as
``optcheck.report.text.render_summary`` (an ``optcheck.summary/1`` dict and the
run's finding dicts) and returns: a status line, a table of the run's figures
(steps, loss first -> last, held-out loss, steps/s, peak RSS, versions), a table
of findings (code, symbol, severity, step, parameters, message) and a link to
the plot when one was written. Numbers and versions are formatted by
``optcheck.report.text`` so the terminal and the Markdown agree.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from optcheck.report.text import num_text, versions_text
from optcheck.units import format_bytes

_ICON = {"clean": "✅", "findings": "❌", "crashed": "💥", "interrupted": "⏹", "stopped": "⏹"}
MAX_ROWS = 50          # findings listed; the rest are counted
MAX_CELL = 160         # characters of a message / subject list in one cell


def _cell(text, width: int = MAX_CELL) -> str:
    """One table cell: whitespace folded, ``|`` escaped, cut to ``width``."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def _int(v) -> str:
    return f"{v:,}" if isinstance(v, int) else "-"


def _held_out(s: dict) -> str:
    first, last = s.get("val_loss_first"), s.get("val_loss_last")
    if first is None and last is None:
        return "-"
    if s.get("val_step_first") == s.get("val_step_last") or first is None or last is None:
        return num_text(last if last is not None else first)
    return f"{num_text(first)} → {num_text(last)}"


_STATUS_ICON = {"regression": "❌", "ok": "✅", "differs": "⚠️", "not compared": "➖"}


def render_baseline(result) -> str:
    """The comparison with a baseline (an ``optcheck.judge.baseline.BaselineResult``) as a
    Markdown section: heading with the job's verdict, the baseline, one row per check
    (status, check, step, what was compared). Ends with a newline."""
    icon = "❌" if result.regressions else ("⚠️" if not result.compared else "✅")
    lines = [f"### {icon} Against the baseline: {_cell(result.headline(), 400)}", "",
             f"Baseline: {_cell(result.baseline.text(), 300)}", ""]
    if result.regressions:
        lines += ["**Fails the job (exit 1):** " + "; ".join(
            f"{c.name}: {_cell(c.text, 300)}" for c in result.regressions), ""]
    lines += ["| | check | step | compared |", "|---|---|---:|---|"]
    for c in result.checks:
        lines.append(f"| {_STATUS_ICON.get(c.status, '')} {c.status} | {c.name} | {_int(c.step)} | "
                     f"{_cell(c.text, 400)} |")
    return "\n".join(lines) + "\n"


def render_markdown(summary: dict, findings: list[dict] | None = None, plot: str | os.PathLike | None = None,
                    relative_to: str | os.PathLike | None = None, baseline=None) -> str:
    """Markdown text of a finished run (ends with a newline).

    Args:
        summary: an ``optcheck.summary/1`` dict (any field may be missing).
        findings: the run's findings as dicts (``Finding.to_dict()`` or lines of
            ``findings.jsonl``); one table row each, first ``MAX_ROWS`` by step.
        plot: the PNG written with ``--plot``, linked (as an image) when given.
        relative_to: the folder the Markdown file lives in; the plot link is made
            relative to it when possible, else left as given.
        baseline: an ``optcheck.judge.baseline.BaselineResult`` (``--baseline``): its section
            (:func:`render_baseline`) follows the verdict line.
    """
    s = summary
    findings = sorted(findings or [], key=lambda f: (f.get("step") or 0))
    status = str(s.get("status") or "?")
    run_code = f" (exit {s['exit_code']})" if isinstance(s.get("exit_code"), int) else ""
    if baseline is not None and baseline.compared and status in ("clean", "findings"):
        # the job's verdict leads: a run that is clean but regressed is not a green headline
        if baseline.regressions:
            head = (f"## ❌ optcheck {s.get('command', 'soak')}: REGRESSION against the baseline (job exit "
                    f"{baseline.exit_code}) — {_cell(baseline.regression_text(), 300)}; run {status.upper()}{run_code}")
        else:
            head = (f"## ✅ optcheck {s.get('command', 'soak')}: NO REGRESSION against the baseline (job exit "
                    f"{baseline.exit_code}) — run {status.upper()}{run_code}")
    else:
        head = f"## {_ICON.get(status, '')} optcheck {s.get('command', 'soak')}: {status.upper()}".replace("  ", " ")
        head += run_code
    lines = [head, ""]
    nf = s.get("findings") if isinstance(s.get("findings"), int) else len(findings)
    by_code = s.get("findings_by_code") or {}
    if not by_code:
        for f in findings:
            by_code[f.get("code", "?")] = by_code.get(f.get("code", "?"), 0) + 1
    verdict = "no findings" if not nf else f"{nf} finding(s): " + ", ".join(f"{c} ×{n}" for c, n in by_code.items())
    lines += [f"**Verdict:** {verdict}" + (f" — crashed: {_cell((s.get('crash') or {}).get('exc_type') or 'crash')}"
                                           if s.get("crash") else ""), ""]
    if baseline is not None:
        lines += [render_baseline(baseline)]

    rows = [("run", f"`{s.get('run') or '-'}` ({s.get('backend') or '-'})")]
    if s.get("steps_requested") is not None or s.get("last_step") is not None:
        rows.append(("steps", f"{_int(s.get('last_step'))} of {_int(s.get('steps_requested'))}"))
    if s.get("loss_first") is not None or s.get("loss_last") is not None:
        rows.append(("loss", f"{num_text(s.get('loss_first'))} → {num_text(s.get('loss_last'))}"))
    rows.append(("held-out loss", _held_out(s)))
    rows.append(("steps/s", num_text(s.get("steps_per_s"), "{:.2f}")))
    if isinstance(s.get("peak_rss_bytes"), (int, float)) and math.isfinite(s["peak_rss_bytes"]):
        rows.append(("peak RSS", format_bytes(s["peak_rss_bytes"])))
    rows.append(("versions", versions_text(s.get("versions")) or "-"))
    if s.get("inject"):
        rows.append(("injected", ", ".join(map(str, s["inject"]))))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in rows] + [""]

    if findings:
        lines += ["### Findings", "", "| code | symbol | severity | step | parameters | message |",
                  "|---|---|---|---:|---|---|"]
        for f in findings[:MAX_ROWS]:
            subjects = ", ".join(f"`{x}`" for x in (f.get("subjects") or [])[:8]) or "-"
            lines.append(f"| {f.get('code', '?')} | {_cell(f.get('symbol', ''))} | {f.get('severity', '')} | "
                         f"{_int(f.get('step'))} | {_cell(subjects)} | {_cell(f.get('message', ''))} |")
        if len(findings) > MAX_ROWS:
            lines.append(f"\n…and {len(findings) - MAX_ROWS} more in `findings.jsonl`.")
        lines.append("")
    crash = s.get("crash")
    if crash:
        lines += [f"**Crash** at step {_int(crash.get('step'))}: {_cell(crash.get('exc_type') or 'crash')} "
                  f"{_cell(crash.get('message') or '')}", ""]
    if plot:
        link = Path(plot)
        if relative_to is not None:
            try:
                link = Path(os.path.relpath(Path(plot).absolute(), Path(relative_to).absolute()))
            except ValueError:  # another drive (Windows)
                pass
        lines += [f"![loss, step time and memory]({link.as_posix()})", "", f"Plot: [{link.name}]({link.as_posix()})",
                  ""]
    if s.get("out"):
        lines += [f"Run directory: `{s['out']}`", ""]
    return "\n".join(lines)


def write_markdown(path: str | os.PathLike, runs: list[tuple[dict, list[dict]]],
                   plot: str | os.PathLike | None = None, baseline=None) -> None:
    """Write :func:`render_markdown` of each ``(summary, findings)`` in ``runs``
    (one per backend) to ``path``, UTF-8. When ``path`` is the file
    ``$GITHUB_STEP_SUMMARY`` names, append instead, as GitHub expects of steps
    sharing it. ``baseline``: the first run's comparison with its baseline (``--baseline``).

    Raises:
        RecordError: the file cannot be written (one line naming ``--summary-md`` and the
            file, exit 4: never mistaken for stdout).
    """
    from optcheck.errors import RecordError

    p = Path(path)
    text = "\n".join(render_markdown(s, f, plot=plot, relative_to=p.parent, baseline=baseline if i == 0 else None)
                     for i, (s, f) in enumerate(runs))
    gh = os.environ.get("GITHUB_STEP_SUMMARY")
    append = bool(gh) and Path(gh).absolute() == p.absolute()
    try:
        with open(p, "a" if append else "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as e:
        raise RecordError(f"--summary-md {path}", e) from None
