"""Cross-rank rules OC701–OC707 on hand-built ``ranks`` tables (no torch, no processes):
each fires on its difference and is silent on agreeing ranks."""

from __future__ import annotations

import copy
import json

import pytest
from snapfactory import clean

from optcheck.distributed.merge import merged, ranks_in
from optcheck.engine import RuleEngine
from optcheck.rules import _crossrank_table
from optcheck.record.snapshot import validate

NAMES = ["fc.weight", "fc.bias"]


def row(rank: int, **over) -> dict:
    r = {"rank": rank, "step": 10, "iteration": 10, "groups_keys": 7, "groups_options": 8,
         "checksums": [111, 222], "grads": [1, 1], "state_steps": [10, 10], "buffers": [5]}
    r.update(over)
    return r


def snap(*rows, kind="ddp", sharded=(), groups=None, events=()) -> dict:
    s = clean(step=11)
    s["phase"] = "pre-step"
    s["ranks"] = {"world": len(rows), "kind": kind, "iteration": 10, "params": NAMES, "sharded": list(sharded),
                  "buffers": ["bn.running_mean"], "rows": list(rows), "groups": groups}
    s["events"] = list(events)
    return validate(s)


def fire(s: dict) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in RuleEngine().feed(s):
        out.setdefault(f.code, []).append(f)
    return {k: v for k, v in out.items() if k.startswith("OC70")}


def test_agreeing_ranks_are_silent():
    assert fire(snap(row(0), row(1), row(2))) == {}
    assert fire(snap(row(0), row(1, checksums=[9, 9]), kind="fsdp", sharded=NAMES)) == {}  # shards differ by design


def test_oc701_names_the_rank_and_parameter_that_differ():
    f = fire(snap(row(0), row(1), row(2, checksums=[111, 999])))["OC701"][0]
    assert f.subjects == ["fc.bias"] and f.detail["ranks"] == [2] and "rank 2" in f.message
    assert "OC701" not in fire(snap(row(0), row(1, checksums=[1, 2]), kind="none"))  # not DDP: no replica contract


def test_oc702_says_which_option_differs():
    groups = [{"rank": 0, "groups": [{"keys": ["lr"], "members": NAMES, "options": {"lr": 0.01}}]},
              {"rank": 1, "groups": [{"keys": ["lr"], "members": NAMES, "options": {"lr": 0.1}}]}]
    f = fire(snap(row(0), row(1, groups_options=9), groups=groups))["OC702"][0]
    assert "group 0 lr=0.1 on rank 1, 0.01 on rank 0" in f.message and f.detail["ranks"] == [1]
    f = fire(snap(row(0), row(1, groups_keys=1)))["OC702"][0]  # no detail gathered: still names the rank
    assert "rank 1" in f.message


def test_oc703_counts_steps_per_rank():
    f = fire(snap(row(0), row(1, step=9, state_steps=[9, 9])))["OC703"][0]
    assert "rank 1 has taken 9 optimizer step(s), rank 0 10" in f.message and f.detail["ranks"] == [1]
    assert f.subjects == sorted(NAMES)


def test_oc704_a_gradient_on_some_ranks_only():
    f = fire(snap(row(0, grads=[1, 0]), row(1, grads=[1, 1])))["OC704"][0]
    assert f.subjects == ["fc.bias"] and f.detail["ranks"] == [0] and f.severity == "warning"


def test_oc705_buffers_are_info():
    f = fire(snap(row(0), row(1, buffers=[6])))["OC705"][0]
    assert f.severity == "info" and f.subjects == ["bn.running_mean"]


def test_oc706_and_oc707_read_their_events():
    unused = {"kind": "ddp_unused", "step": 1, "where": None, "count": 1,
              "detail": {"rank": 1, "iteration": 1, "params": ["extra.weight"]}}
    lost = {"kind": "rank_lost", "step": 11, "where": None, "count": 1,
            "detail": {"rank": 0, "iteration": 10, "ranks": [1], "error": "Connection closed by peer"}}
    found = fire(snap(row(0), row(1), events=[unused, lost]))
    assert found["OC706"][0].subjects == ["extra.weight"] and "on rank 1" in found["OC706"][0].message
    assert found["OC707"][0].detail["ranks"] == [1] and "rank(s) 1 stopped answering" in found["OC707"][0].message
    assert "OC706" not in fire(snap(row(0), row(1))) and "OC707" not in fire(snap(row(0), row(1)))


def test_a_persisting_difference_is_one_finding():
    engine = RuleEngine()
    bad = snap(row(0), row(1, checksums=[1, 2]))
    assert [f.code for f in engine.feed(bad)] == ["OC701"]
    later = copy.deepcopy(bad)
    later["step"] = 12
    assert engine.feed(later) == []


def test_a_single_rank_table_or_none_is_silent():
    s = clean()
    assert _crossrank_table.table(s) is None and fire(s) == {}


@pytest.mark.parametrize("message,expect", [
    ("Rank 1 failed to pass monitoredBarrier in 5000 ms", [1]),
    ("Ranks [2, 3] failed to pass monitoredBarrier", [2, 3]),
    ("Connection closed by peer", [1, 2, 3]),
])
def test_ranks_named_by_a_monitored_barrier_error(message, expect):
    assert ranks_in(message, 0, 4) == expect


def test_merged_summary_counts_a_missing_rank_as_crashed(tmp_path):
    (tmp_path / "rank-0").mkdir()
    (tmp_path / "rank-0" / "summary.json").write_text('{"status": "clean", "exit_code": 0, "last_step": 5}')
    (tmp_path / "rank-0" / "findings.jsonl").write_text('{"code": "OC701", "step": 5, "message": "m"}\n{torn')
    s = merged(tmp_path, 2)
    assert (s["status"], s["exit_code"], s["missing_ranks"], s["findings"]) == ("crashed", 3, [1], 1)


def test_merged_summary_reads_rank_files_with_the_record_readers_policy(tmp_path):
    """A line that is not JSON is skipped and named; a file of the wrong shape is named and left out; the
    merged summary is a summary_version 2 one that validates like every other."""
    from optcheck.report.reader import read_summary
    from optcheck.run.rundir import write_summary
    from optcheck.record.summary import Summary

    good = {"code": "OC104", "symbol": "ref-churn", "severity": "error", "step": 4, "message": "m", "phase": "pre-step",
            "subjects": ["w"]}
    for r, lines in ((0, [json.dumps(good), "{garbage", json.dumps({**good, "step": 6})]),
                     (1, [json.dumps({**good, "step": "four"})])):
        d = tmp_path / f"rank-{r}"
        d.mkdir()
        write_summary(d, Summary(run=f"rank-{r}", backend="pytorch", source="monitor", status="findings",
                                 exit_code=1, last_step=8).to_dict())
        (d / "findings.jsonl").write_text("\n".join(lines) + "\n")
    s = merged(tmp_path, 2)
    assert s["findings"] == 2 and s["findings_by_code"] == {"OC104": 2}  # rank 0's two good lines
    assert any("rank-0/findings.jsonl:2" in n and "skipped" in n for n in s["notes"]), s["notes"]
    assert any(n.startswith("rank 1:") and "findings.jsonl:1" in n and "left out" in n for n in s["notes"]), s["notes"]
    write_summary(tmp_path, s)
    assert read_summary(tmp_path)["summary_version"] == 2
