"""Findings as JUnit XML, the format CI systems render (Jenkins, GitLab, GitHub
test reporters). Torch-free.

One ``<testcase>`` per rule of the catalogue (``classname`` ``optcheck.<family>``,
``name`` ``"OC101 stale-param"``): it passes when the rule made no finding and has
one ``<failure>`` per finding otherwise. A crashed worker adds a ``run`` test case
with an ``<error>``. With a baseline (``optcheck soak --baseline``) the file agrees
with the job's exit code: a finding the baseline has too goes to ``<system-out>``
("in the baseline"), only new ones fail, and each check of the comparison (findings,
loss, held-out loss, speed, peak RSS, trajectory) is a ``baseline <check>`` test
case, failing on a regression and ``<skipped>`` when not compared. The layout
follows the widely used JUnit 4 schema (Ant's ``XMLJUnitResultFormatter`` output as
Jenkins reads it); ``tests/fixtures/junit.xsd`` is the schema the tests validate against.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterable

from optcheck.errors import InputError
from optcheck.findings import severity_rank


def _text(value) -> str:
    """XML 1.0 cannot hold most control characters: drop them."""
    s = "" if value is None else str(value)
    return "".join(ch for ch in s if ch in "\t\n\r" or ord(ch) >= 0x20)


def _flatten(d: dict, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        elif v is not None and not isinstance(v, list):
            out[key] = _text(v)
    return out


SUMMARY_PROPERTIES = ("run", "backend", "status", "exit_code", "steps_requested", "last_step", "snapshots",
                      "findings", "loss_first", "loss_last", "val_loss_first", "val_loss_last", "elapsed_s",
                      "steps_per_s", "peak_rss_bytes", "out")


def summary_properties(summary: dict) -> dict[str, str]:
    """The run facts of a ``summary.json`` worth a ``<property>``: scalars of
    ``SUMMARY_PROPERTIES`` plus ``versions.*``, ``corpus.sha256`` / ``corpus.source``,
    ``config.*`` and ``stopped.*``."""
    props = {k: _text(summary[k]) for k in SUMMARY_PROPERTIES if summary.get(k) is not None}
    props.update(_flatten(summary.get("versions") or {}, "versions."))
    corpus = summary.get("corpus") or {}
    props.update({f"corpus.{k}": _text(corpus[k]) for k in ("source", "sha256") if corpus.get(k)})
    props.update(_flatten(summary.get("config") or {}, "config."))
    props.update(_flatten(summary.get("stopped") or {}, "stopped."))
    return props


def _failure_text(f: dict) -> str:
    lines = [f"{f.get('code')} {f.get('symbol')} [{f.get('severity')}] at step {f.get('step')} ({f.get('phase', 'post-step')})",
             f.get("message", "")]
    if f.get("subjects"):
        lines.append("subjects: " + ", ".join(map(str, f["subjects"])))
    if f.get("next_failure"):
        lines.append("next failure: " + str(f["next_failure"]))
    if f.get("run") or f.get("backend"):
        lines.append(f"run: {f.get('run', '')} ({f.get('backend', '')})")
    return _text("\n".join(lines))


def build_junit(findings: Iterable[dict], *, suite_name: str = "optcheck", rules=None,
                properties: dict | None = None, summary: dict | None = None, crash: dict | None = None,
                fail_on: str = "info", time_s: float | None = None, baseline=None) -> ET.ElementTree:
    """The JUnit XML tree (see :func:`write_junit` for the arguments)."""
    if rules is None:
        from optcheck.rules import catalogue

        rules = catalogue()
    findings = list(findings)
    threshold = severity_rank(fail_on)
    if summary is not None:
        properties = {**summary_properties(summary), **(properties or {})}
        crash = crash if crash is not None else summary.get("crash")
        if time_s is None and isinstance(summary.get("elapsed_s"), (int, float)):
            time_s = float(summary["elapsed_s"])
    by_code: dict[str, list[dict]] = {}
    for f in findings:
        by_code.setdefault(str(f.get("code", "")), []).append(f)
    cases: list[tuple[str, str, list[dict]]] = []  # (classname, name, findings)
    for cls in rules:
        cases.append((f"optcheck.{cls.family or 'rules'}", f"{cls.code} {cls.symbol}", by_code.pop(cls.code, [])))
    for code, fs in sorted(by_code.items()):  # findings of codes outside the catalogue given
        cases.append(("optcheck.other", f"{code} {fs[0].get('symbol', '')}".strip(), fs))

    suite = ET.Element("testsuite")
    props = ET.SubElement(suite, "properties")
    for k, v in sorted((properties or {}).items()):
        ET.SubElement(props, "property", name=_text(k), value=_text(v))
    known = _in_baseline(baseline)
    failed = skipped = 0
    for classname, name, fs in cases:
        tc = ET.SubElement(suite, "testcase", name=name, classname=classname, time="0")
        old = [f for f in fs if known(f)]
        failing = [f for f in fs if _rank(f) >= threshold and f not in old]
        below = [f for f in fs if _rank(f) < threshold and f not in old]
        for f in failing:
            el = ET.SubElement(tc, "failure", message=_text(f.get("message", "")).replace("\n", " "),
                               type=f"{f.get('code')} {f.get('symbol')}")
            el.text = _failure_text(f)
        if below or old:
            out = ET.SubElement(tc, "system-out")
            out.text = "\n\n".join([*(_failure_text(f) for f in below),
                                     *(f"in the baseline (not a regression): {_failure_text(f)}" for f in old)])
        failed += bool(failing)
    n_baseline = 0
    if baseline is not None:
        n_baseline, more_failed, skipped = _baseline_cases(suite, baseline)
        failed += more_failed
    errors = 0
    if crash:
        tc = ET.SubElement(suite, "testcase", name="run", classname="optcheck.run", time=f"{time_s or 0:.3f}")
        what = crash.get("exc_type") or (f"signal {crash['signal']}" if crash.get("signal") else "crash")
        el = ET.SubElement(tc, "error", message=_text(f"{what}: {crash.get('message', '')}").replace("\n", " ")[:2000],
                           type=_text(what))
        tail = crash.get("stderr_tail") or []
        el.text = _text("\n".join([f"at step {crash.get('step')}", str(crash.get("stack") or ""),
                                   *(["--- worker stderr (tail) ---", *map(str, tail)] if tail else [])]))
        errors = 1
    suite.set("name", _text(suite_name))
    suite.set("tests", str(len(cases) + n_baseline + errors))
    suite.set("failures", str(failed))
    suite.set("errors", str(errors))
    suite.set("skipped", str(skipped))
    suite.set("time", f"{time_s or 0:.3f}")
    suite.set("timestamp", _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None, microsecond=0).isoformat())
    suite.set("hostname", _text(socket.gethostname()) or "localhost")
    root = ET.Element("testsuites", name=_text(suite_name), tests=suite.get("tests"),
                      failures=suite.get("failures"), errors=suite.get("errors"), time=suite.get("time"))
    root.append(suite)
    ET.indent(root)
    return ET.ElementTree(root)


def _in_baseline(baseline):
    """``known(finding) -> bool``: the baseline has a finding of that code on those
    parameters (``optcheck.judge.compare.finding_difference``, as the comparison matches them).
    Always False without a baseline, or when the run was not compared with it."""
    if baseline is None or not baseline.compared:
        return lambda f: False
    from optcheck.judge.compare import finding_difference  # (upward: a finding matches as the judge matches it)

    theirs = list(baseline.baseline_findings)
    return lambda f: not finding_difference([f], theirs)


def _baseline_cases(suite: ET.Element, baseline) -> tuple[int, int, int]:
    """One ``baseline <check>`` test case per check of ``baseline`` (an
    ``optcheck.judge.baseline.BaselineResult``): a regression is a ``<failure>``, and so is
    a run that did not finish (it cannot pass: exit 1); another check not compared is
    ``<skipped>``; the others pass with their line in ``<system-out>``.
    Returns (test cases, failures, skipped)."""
    from optcheck.judge.baseline import NOT_COMPARED, REGRESSION  # (upward: renders the judge's own result)

    failed = skipped = 0
    for c in baseline.checks:
        tc = ET.SubElement(suite, "testcase", name=_text(f"baseline {c.name}"), classname="optcheck.judge.baseline",
                           time="0")
        at = f" (step {c.step})" if c.step is not None else ""
        if c.status == REGRESSION or (c.status == NOT_COMPARED and c.name == "run"):  # an unfinished run cannot pass
            kind = f"regression {c.name}" if c.status == REGRESSION else "not compared: the run did not finish"
            el = ET.SubElement(tc, "failure", message=_text(f"{c.name}{at}: {c.text}"), type=kind)
            el.text = _text(f"against the baseline {baseline.baseline.text()}\n{c.line().strip()}")
            failed += 1
        elif c.status == NOT_COMPARED:
            ET.SubElement(tc, "skipped", message=_text(f"not compared: {c.text}"))
            skipped += 1
        else:
            ET.SubElement(tc, "system-out").text = _text(c.line().strip())
    return len(baseline.checks), failed, skipped


def _rank(f: dict) -> int:
    try:
        return severity_rank(str(f.get("severity", "error")))
    except ValueError:
        return severity_rank("error")


def write_junit(findings: Iterable[dict], path: str | os.PathLike, *, suite_name: str = "optcheck", rules=None,
                properties: dict | None = None, summary: dict | None = None, crash: dict | None = None,
                fail_on: str = "info", time_s: float | None = None, baseline=None) -> Path:
    """Write findings as a JUnit XML file; return its path.

    Args:
        findings: finding dicts (``Finding.to_dict()``, or lines of ``findings.jsonl``).
        path: the XML file to write (its directory is created).
        suite_name: the ``<testsuite name>`` (e.g. "optcheck soak runs/x").
        rules: rule classes, one test case each (default: the whole catalogue).
        properties: extra ``<property>`` name/value pairs.
        summary: a ``summary.json`` dict: adds its run facts as properties
            (:func:`summary_properties`), its crash as an ``<error>`` test case and
            its ``elapsed_s`` as the suite's time.
        crash: a crash record (``exc_type``, ``message``, ``stack``, ``step``,
            ``signal``, ``stderr_tail``) when there is no summary.
        fail_on: findings below this severity ("info" | "warning" | "error") are
            written to the test case's ``<system-out>`` instead of as failures.
        time_s: the suite's ``time`` attribute, seconds.
        baseline: the run's ``optcheck.judge.baseline.BaselineResult`` (``--baseline``): findings
            it has too go to ``<system-out>`` ("in the baseline"), not failures, and each
            of its checks is a ``baseline <check>`` test case (a regression fails it), so
            the file fails exactly when the job's exit code is 1.

    Raises:
        InputError: the file cannot be written.
    """
    tree = build_junit(findings, suite_name=suite_name, rules=rules, properties=properties, summary=summary,
                       crash=crash, fail_on=fail_on, time_s=time_s, baseline=baseline)
    p = Path(path)
    try:
        if p.parent and not p.parent.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
        tree.write(p, encoding="utf-8", xml_declaration=True)
    except OSError as e:
        raise InputError(f"--junit {path}: cannot write there ({e.strerror or e})") from None
    return p


def build_upgrade_junit(result, sides) -> ET.ElementTree:
    """``optcheck upgrade --junit``: one ``<testcase>`` for the verdict (failing when diverged,
    ``time`` the two soaks' seconds), one ``baseline <check>`` per check of the candidate against
    the baseline (``optcheck.judge.baseline``: failing on a regression, skipped when not compared),
    and one per scenario-matrix row (failing when the row
    changed, ``time`` its two runs' seconds). The suite's properties: each side's versions,
    backend and interpreter, the seed, and each scenario's injected fault.

    ``result`` is an ``optcheck.judge.upgrade.UpgradeResult``, ``sides`` its two ``Side``s."""
    suite = ET.Element("testsuite")
    props = ET.SubElement(suite, "properties")
    values: dict[str, str] = {}
    for side, run in zip(sides, (result.baseline, result.candidate)):
        values[f"{side.name}.backend"] = side.backend
        values[f"{side.name}.environment"] = side.python or side.torchsharp or "this environment"
        if run is not None:
            values.update(_flatten(run.summary.get("versions") or {}, f"{side.name}.versions."))
            values["seed"] = _text((run.summary.get("config") or {}).get("seed"))
            values["steps"] = _text((run.summary.get("config") or {}).get("steps"))
    for row in result.rows:
        values[f"scenario.{row.scenario}.inject"] = f"{row.scenario}@{row.step}"
    for k, v in sorted(values.items()):
        ET.SubElement(props, "property", name=_text(k), value=_text(v))
    failures = 0
    cmp = result.compare
    seconds = sum(float(r.summary.get("elapsed_s") or 0) for r in (result.baseline, result.candidate) if r)
    tc = ET.SubElement(suite, "testcase", name="verdict", classname="optcheck.judge.upgrade", time=f"{seconds:.3f}")
    if cmp is None or cmp.verdict is None or cmp.exit_code:
        text = cmp.verdict.headline() if cmp is not None and cmp.verdict is not None else "a side did not finish"
        el = ET.SubElement(tc, "failure", message=_text(text), type="OC601 run-divergence")
        el.text = _text("\n".join(cmp.verdict.lines() if cmp is not None and cmp.verdict is not None else [text]))
        failures += 1
    else:
        ET.SubElement(tc, "system-out").text = _text("\n".join(cmp.verdict.lines()))
    against = getattr(result, "against", None)  # the candidate by optcheck.judge.baseline's regression policy
    checks = [c for c in (against.checks if against is not None else []) if c.name != "trajectory"]
    for c in checks:
        tc = ET.SubElement(suite, "testcase", name=f"baseline {c.name}", classname="optcheck.judge.upgrade.baseline",
                           time="0.000")
        if c.status == "regression":
            ET.SubElement(tc, "failure", message=_text(f"{c.name}: {c.text}"), type=f"regression {c.name}").text = \
                _text(c.line())
            failures += 1
        elif c.status == "not compared":
            ET.SubElement(tc, "skipped", message=_text(c.text))
        else:
            ET.SubElement(tc, "system-out").text = _text(c.line())
    for row in result.rows:
        tc = ET.SubElement(suite, "testcase", name=f"scenario {row.scenario}@{row.step}",
                           classname="optcheck.judge.upgrade.scenarios", time=f"{row.time_s:.3f}")
        text = (f"baseline: findings {row.baseline[0]}, {row.baseline[1]}, lead {row.baseline[2]}; "
                f"candidate: findings {row.candidate[0]}, {row.candidate[1]}, lead {row.candidate[2]}")
        if row.changed:
            ET.SubElement(tc, "failure", message=_text(text), type="changed behaviour").text = _text(text)
            failures += 1
        else:
            ET.SubElement(tc, "system-out").text = _text(text)
    n = 1 + len(checks) + len(result.rows)
    suite.set("name", "optcheck upgrade")
    suite.set("tests", str(n))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(sum(c.status == "not compared" for c in checks)))
    suite.set("time", f"{result.time_s:.3f}")
    suite.set("timestamp", _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None, microsecond=0).isoformat())
    suite.set("hostname", _text(socket.gethostname()) or "localhost")
    root = ET.Element("testsuites", name="optcheck upgrade", tests=str(n), failures=str(failures), errors="0",
                      time=suite.get("time"))
    root.append(suite)
    ET.indent(root)
    return ET.ElementTree(root)


def write_upgrade_junit(result, sides, path: str | os.PathLike) -> Path:
    """Write :func:`build_upgrade_junit` to ``path``; InputError when it cannot be written."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        build_upgrade_junit(result, sides).write(p, encoding="utf-8", xml_declaration=True)
    except OSError as e:
        raise InputError(f"--junit {path}: cannot write there ({e.strerror or e})") from None
    return p
