"""The end-of-run summary and the comparison of two runs as plain-text tables for the terminal. Torch-free.

``render_summary(summary, findings)`` reads an ``optcheck.summary/1`` dict (what
``summary.json`` holds) and the run's finding dicts, and returns lines of at most
``WIDTH`` characters: status, steps, loss, speed, memory, the findings by code
(first step, subjects, first message, what fails next), the crash if any, and the lead time —
"flagged at step X, then <exception> at step Y". ``render_compare(result)`` is
``optcheck compare``'s table of an ``optcheck.judge.compare.CompareResult``.
"""

from __future__ import annotations

import math
import textwrap

from optcheck.findings import lead_time
from optcheck.units import format_bytes

WIDTH = 100

_STATUS = {"clean": "CLEAN", "findings": "FINDINGS", "crashed": "CRASHED", "interrupted": "INTERRUPTED",
           "stopped": "STOPPED", "running": "RUNNING"}


def finding_lines(f: dict) -> list[str]:
    """One finding (a ``findings.jsonl`` dict) as ``optcheck check`` prints it: ``[rank K ]step N
    (phase) CODE symbol [severity]: message``, then ``  next: what fails next`` when the rule says."""
    rank = f"rank {f['rank']} " if "rank" in f else ""
    lines = [f"{rank}step {f['step']} ({f['phase']}) {f['code']} {f['symbol']} [{f['severity']}]: {f['message']}"]
    if f.get("next_failure"):
        lines.append(f"  next: {f['next_failure']}")
    return lines


def _cut(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: max(0, width - 3)] + "..."


def num_text(v, fmt: str = "{:.4f}") -> str:
    """``v`` formatted, or "-" when it is not a number (None, missing)."""
    return "-" if not isinstance(v, (int, float)) else fmt.format(v)


def _int(v) -> str:
    return f"{v:,}" if isinstance(v, int) else "-"


def versions_text(v: dict | None) -> str:
    """``torch 2.13.0, python 3.11.7``: the library versions worth a glance."""
    v = v or {}
    keys = [k for k in ("torch", "torchsharp", "dotnet", "python") if v.get(k)]
    return ", ".join(f"{k} {v[k]}" for k in keys)


def _by_code(summary: dict, findings: list[dict]) -> list[dict]:
    """One row per code, in order of first appearance: code, symbol, severity, count,
    first step, subjects (union, in order), first message, and what fails next (the
    first finding's ``next_failure``, the rule's prediction; "" when none says)."""
    rows: dict[str, dict] = {}
    for f in sorted(findings, key=lambda f: (f.get("step") or 0)):
        code = str(f.get("code", "?"))
        r = rows.setdefault(code, {"code": code, "symbol": f.get("symbol", ""), "severity": f.get("severity", ""),
                                   "count": 0, "step": f.get("step"), "subjects": [], "message": f.get("message", ""),
                                   "next": ""})
        r["count"] += 1
        if not r["next"] and f.get("next_failure"):
            r["next"] = str(f["next_failure"])
        for s in f.get("subjects") or ():
            if s not in r["subjects"]:
                r["subjects"].append(s)
    for code, n in (summary.get("findings_by_code") or {}).items():
        if code not in rows:
            rows[code] = {"code": code, "symbol": "", "severity": "", "count": n, "step": None, "subjects": [],
                          "message": "", "next": ""}
    return list(rows.values())


def _held_out(s: dict) -> str:
    """``   held-out 2.41 -> 2.03`` over two evaluations or more; one evaluation is one
    value (``   held-out 2.2601 (step 1,000 only)``), never a change that did not
    happen. Summaries written before ``val_step_first/last`` existed count as one
    evaluation when both values are equal (the old loop re-evaluated the unchanged
    model at the end)."""
    first, last = s.get("val_loss_first"), s.get("val_loss_last")
    if first is None and last is None:
        return ""
    sf, sl = s.get("val_step_first"), s.get("val_step_last")
    single = (sf == sl) if sf is not None and sl is not None else (first is None or last is None or first == last)
    if single:
        value = last if last is not None else first
        return f"   held-out {num_text(value)}" + (f" (step {_int(sl)} only)" if sl is not None else "")
    return f"   held-out {num_text(first)} -> {num_text(last)}"


def _lead_time(summary: dict, findings: list[dict]) -> dict | None:
    """The summary's ``lead_time``, or the same computed from the findings
    (``optcheck.findings.lead_time``) for summaries written without one."""
    return summary.get("lead_time") or lead_time(findings, summary.get("crash"))


def render_summary(summary: dict, findings: list[dict] | None = None) -> str:
    """The end-of-run summary as lines of text (no trailing newline).

    Args:
        summary: an ``optcheck.summary/1`` dict. Used: run, backend, status,
            exit_code, steps_requested, last_step, snapshots, findings,
            findings_by_code, loss_first/last, val_loss_first/last,
            val_step_first/last (steps of the first and last held-out evaluation), elapsed_s,
            steps_per_s, peak_rss_bytes, versions, inject, crash (exc_type,
            message, step, signal, exit_code, stderr_tail), stopped (step,
            reason), lead_time, out. Any may be missing.
        findings: the run's findings as dicts (``Finding.to_dict()`` or lines of
            ``findings.jsonl``); without them the table has counts only.
    """
    findings = list(findings or [])
    s = summary
    status = str(s.get("status") or "?")
    head = f"optcheck: {_STATUS.get(status, status.upper())}"
    if isinstance(s.get("exit_code"), int):
        head += f" (exit {s['exit_code']})"
    head += f"   run {s.get('run') or '-'}   backend {s.get('backend') or '-'}"
    lines = [head]
    ver = versions_text(s.get("versions"))
    if ver:
        lines.append(f"  versions     {ver}")
    steps = f"{_int(s.get('last_step'))} of {_int(s.get('steps_requested'))}"
    extra = []
    if isinstance(s.get("snapshots"), int):
        extra.append(f"{s['snapshots']:,} snapshots")
    if isinstance(s.get("elapsed_s"), (int, float)):
        extra.append(f"{s['elapsed_s']:.1f} s")
    if isinstance(s.get("steps_per_s"), (int, float)):
        extra.append(f"{s['steps_per_s']:.1f} steps/s")
    lines.append(f"  steps        {steps}" + (f"   ({', '.join(extra)})" if extra else ""))
    loss = f"{num_text(s.get('loss_first'))} -> {num_text(s.get('loss_last'))}"
    loss += _held_out(s)
    lines.append(f"  loss         {loss}")
    if isinstance(s.get("peak_rss_bytes"), (int, float)):
        lines.append(f"  peak RSS     {format_bytes(s['peak_rss_bytes'])}")
    if s.get("inject"):
        inj = s["inject"]
        lines.append("  injected     " + _cut(", ".join(map(str, inj)) if isinstance(inj, list) else str(inj), WIDTH - 15))

    rows = _by_code(s, findings)
    total = s.get("findings") if isinstance(s.get("findings"), int) else sum(r["count"] for r in rows)
    lines.append("")
    if not rows:
        lines.append("Findings: none")
    else:
        lines.append(f"Findings: {total}")
        w_sym = max(6, *(len(r["symbol"]) for r in rows))
        lines.append(f"  {'code':<6} {'symbol':<{w_sym}} {'severity':<8} {'count':>5} {'first step':>10}  subjects")
        for r in rows:
            prefix = (f"  {r['code']:<6} {r['symbol']:<{w_sym}} {r['severity']:<8} {r['count']:>5} "
                      f"{_int(r['step']):>10}  ")
            lines.append(prefix + _cut(", ".join(map(str, r["subjects"])) or "-", max(10, WIDTH - len(prefix))))
            if r["message"]:
                lines.append("         " + _cut(r["message"], WIDTH - 9))
            if r["next"]:  # the prediction, wrapped (at most 3 lines): it is the point of the finding
                wrapped = textwrap.wrap(" ".join(r["next"].split()), WIDTH - 15) or [""]
                if len(wrapped) > 3:
                    wrapped = [*wrapped[:2], _cut(" ".join(wrapped[2:]), WIDTH - 15)]
                lines += [("         next: " if i == 0 else " " * 15) + w for i, w in enumerate(wrapped)]

    crash = s.get("crash")
    if crash:
        what = crash.get("exc_type") or (f"signal {crash['signal']}" if crash.get("signal") else "crash")
        lines += ["", f"Crash: {what} at step {_int(crash.get('step'))}"
                      + (f" (exit code {crash['exit_code']})" if crash.get("exit_code") is not None else "")]
        if crash.get("message"):
            lines.append("  " + _cut(crash["message"], WIDTH - 2))
        tail = [t for t in (crash.get("stderr_tail") or []) if str(t).strip()][-5:]
        if tail:
            lines.append("  worker stderr (last lines):")
            lines += ["    " + _cut(t, WIDTH - 4) for t in tail]
    stopped = s.get("stopped")
    if stopped:
        lines += ["", f"Stopped at step {_int(stopped.get('step'))}: {_cut(stopped.get('reason', ''), WIDTH - 20)}"]
    lt = _lead_time(s, findings) if crash else None
    if lt:
        lines += ["", f"Lead time: flagged at step {_int(lt.get('flagged_step'))} ({lt.get('finding')}), "
                      f"then {lt.get('exception')} at step {_int(lt.get('failed_step'))}"
                      + (f", a lead of {lt['lead_steps']:,} steps" if isinstance(lt.get("lead_steps"), int) else "")
                      + (" (predicted)" if lt.get("predicted") else "")]
    if s.get("out"):
        lines += ["", f"Run directory: {s['out']}"]
    return "\n".join(lines)


# -- optcheck compare's table -----------------------------------------------------

def _versions_or_dash(v: dict) -> str:
    return versions_text(v) or "-"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows of (name, A, B[, B/A]) as aligned lines."""
    widths = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(3)]
    return [("  " + "  ".join(c.ljust(widths[i]) if i < 3 else c for i, c in enumerate(r))).rstrip() for r in rows]


def render_compare(res) -> str:
    """``res`` (an ``optcheck.judge.compare.CompareResult``) as a plain-text table: runs, losses, times, memory, versions, findings, verdict."""
    a, b, L = res.a, res.b, res.loss
    rows = [
        ("", a.label, b.label, "B/A"),
        ("backend / status", f"{a.backend or '-'} / {a.status or '-'}", f"{b.backend or '-'} / {b.status or '-'}"),
        ("steps with a loss", f"{a.steps:,} (last {a.last_step:,})", f"{b.steps:,} (last {b.last_step:,})"),
        ("loss first -> last", f"{num_text(a.loss_first)} -> {num_text(a.loss_last)}", f"{num_text(b.loss_first)} -> {num_text(b.loss_last)}"),
        ("step time (median)", num_text(a.step_time_s and a.step_time_s * 1000, "{:.2f} ms"),
         num_text(b.step_time_s and b.step_time_s * 1000, "{:.2f} ms"), num_text(res.step_time_ratio, "{:.2f}x")),
        ("peak RSS", "-" if a.peak_rss_bytes is None else format_bytes(a.peak_rss_bytes),
         "-" if b.peak_rss_bytes is None else format_bytes(b.peak_rss_bytes), num_text(res.peak_memory_ratio, "{:.2f}x")),
        ("versions", _versions_or_dash(a.versions), _versions_or_dash(b.versions)),
    ]
    lines = [f"optcheck compare   {a.label}   vs   {b.label}"]
    if res.verdict is not None:
        lines += res.verdict.lines()
    lines += ["", *_table(rows)]
    for info in (a, b):
        if info.crash:
            c = info.crash
            lines.append(f"  {info.label} crashed at step {c.get('step')}: {c.get('exc_type') or c.get('signal')}: "
                         f"{str(c.get('message') or '')[:120]}")
    for info in (a, b):
        for d in info.defects[:10]:
            lines.append(f"  note: {info.label}: {d}; skipped, the rest was read")
    lines += ["", f"Loss trajectories: {L.common_steps:,} common steps compared, {L.window}-step trailing mean, "
                  f"tolerance {res.atol:g} + {res.rtol:.0%} of A's"]
    if L.max_abs_step is not None:
        rel = f"{L.max_rel_diff:.1%}" if math.isfinite(L.max_rel_diff) else "inf"
        lines.append(f"  largest difference {L.max_abs_diff:.4f} at step {L.max_abs_step:,}; "
                     f"largest relative {rel} at step {L.max_rel_step:,}")
    if L.diverged:
        lines.append(f"  first beyond tolerance at step {L.first_beyond_step:,}: "
                     f"{num_text(L.mean_a)} (A) vs {num_text(L.mean_b)} (B), tolerance {num_text(L.tolerance)}")
    else:
        lines.append("  within tolerance everywhere")
    for name, items in (("only in A", res.only_in_a), ("only in B", res.only_in_b)):
        lines.append(f"Findings {name}: " + ("none" if not items else str(len(items))))
        for f in items[:20]:
            subj = ", ".join(f["subjects"][:4]) + (" ..." if len(f["subjects"]) > 4 else "")
            lines.append(f"  {f['code']} {f['symbol']:<20} step {f['step']}: {subj}")
        if len(items) > 20:
            lines.append(f"  ... and {len(items) - 20} more")
    lines.append("")
    if res.incomplete:
        lines.append(f"FAIL (exit {res.exit_code}): cannot pass an incomplete run: {'; '.join(res.incomplete)}; "
                     f"{L.common_steps:,} common steps compared")
    for m in getattr(res, "mismatch", None) or ():
        lines.append(f"FAIL (exit {res.exit_code}): {m}")
    if res.findings:
        lines.append(f"FAIL (exit {res.exit_code}): OC601 run-divergence: {res.findings[0].message}")
    elif res.exit_code and not res.incomplete and res.only_in_b and getattr(res, "fail_on_new", True):
        lines.append(f"FAIL (exit {res.exit_code}): findings only in B"
                     + (" (a migration fails on them, as an upgrade does)" if getattr(res, "policy", "") == "migration"
                        else ""))
    elif not res.exit_code:
        lines.append(f"PASS (exit {res.exit_code})")
    return "\n".join(lines)

