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
