"""``render_markdown`` on partial and hostile inputs: a summary with fields
missing, a message with ``|`` and newlines, more findings than the table lists."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from optcheck.report.markdown import MAX_ROWS, render_markdown


def test_empty_summary_renders_without_error():
    text = render_markdown({})
    assert text.startswith("## optcheck soak: ?")
    assert "**Verdict:** no findings" in text and "| held-out loss | - |" in text


def test_cells_cannot_break_the_table():
    f = {"code": "OC101", "symbol": "x", "severity": "error", "step": 7, "subjects": ["a|b"],
         "message": "line one\nline | two"}
    rows = [line for line in render_markdown({"status": "findings"}, [f]).splitlines() if line.startswith("| OC101")]
    assert len(rows) == 1
    assert len(re.findall(r"(?<!\\)\|", rows[0])) == 7   # six cells: the pipes inside are escaped
    assert "line one line \\| two" in rows[0] and "`a\\|b`" in rows[0]


def test_long_finding_lists_are_cut_and_counted():
    fs = [{"code": "OC102", "step": i, "message": "m"} for i in range(MAX_ROWS + 7)]
    text = render_markdown({"status": "findings", "findings": len(fs)}, fs)
    assert sum(line.startswith("| OC102") for line in text.splitlines()) == MAX_ROWS
    assert "…and 7 more in `findings.jsonl`." in text
    assert f"{MAX_ROWS + 7} finding(s): OC102 ×{MAX_ROWS + 7}" in text


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["status", "loss_first", "loss_last", "val_loss_first", "val_loss_last",
                                        "steps_per_s", "peak_rss_bytes", "versions", "exit_code", "run"]),
                       st.one_of(st.none(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5))))
def test_any_partial_summary_renders(summary):
    if not isinstance(summary.get("versions"), (dict, type(None))):
        summary["versions"] = None
    assert render_markdown(summary).endswith("\n")


def test_a_clean_night_that_regresses_is_not_a_green_headline():
    """Night 4 (torch 2.14.1+cu130, clean, exit 0) against night 1: peak RSS 1.89x is a
    regression, so the job exits 1; the headline leads with that, never "✅ ... CLEAN"."""
    import json
    from pathlib import Path

    from optcheck.judge.baseline import Tolerances, compare_with_baseline

    nights = Path(__file__).resolve().parents[1] / "fixtures" / "nights"
    run = nights / "night-4-torch2.14"
    res = compare_with_baseline(run, nights / "night-1-torch2.13", Tolerances(speed=1.0))
    assert res.exit_code == 1 and [c.name for c in res.regressions] == ["peak RSS"]
    summary = json.loads((run / "summary.json").read_text())
    head = render_markdown(summary, [], baseline=res).splitlines()[0]
    assert head.startswith("## ❌ optcheck soak: REGRESSION against the baseline (job exit 1) — peak RSS 1.89x "
                           "the baseline's (limit 1.15x); run CLEAN (exit 0)"), head
    assert "✅" not in head
    ok = compare_with_baseline(nights / "night-2-torch2.13", nights / "night-1-torch2.13", Tolerances(speed=1.0))
    head = render_markdown(json.loads((nights / "night-2-torch2.13" / "summary.json").read_text()), [],
                           baseline=ok).splitlines()[0]
    assert head == "## ✅ optcheck soak: NO REGRESSION against the baseline (job exit 0) — run CLEAN (exit 0)"
    text = render_markdown(summary, [], baseline=res)
    assert text.count("steps/s") == 1  # one steps/s figure per run: the speed check is CPU ms/step
