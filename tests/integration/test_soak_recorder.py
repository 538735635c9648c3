"""The soak supervisor through the one recorder (issue 26) and a diverging run
(issue 28 item 6): a NaN/inf loss is the OC501 finding at its step and the run
ends FINDINGS, never a traceback; every message kind carrying non-finite numbers
goes through the supervisor's message handling and leaves a summary that reads
back; the exit code of several runs is ``exitcodes.worst`` (two backends, one
ending with exit 4, used to raise ``ValueError: 4 is not in list``)."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import SMALL, run_cli
from optcheck.run import exitcodes
from optcheck.record.snapshot import read_jsonl

ROOT = Path(__file__).resolve().parents[2]


def test_a_diverging_pytorch_soak_is_oc501_at_its_step_and_findings(tmp_path):
    out = tmp_path / "lr1e6"
    rc, stdout, stderr = run_cli(["soak", "--lr", "1e6", "--steps", "60", "--out", str(out)])
    assert "Traceback" not in stdout + stderr
    assert rc == exitcodes.FINDINGS, stdout + stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "findings" and s["exit_code"] == exitcodes.FINDINGS and s["last_step"] == 60
    losses = {r["step"]: r["loss"] for r in read_jsonl(out / "metrics.jsonl")}
    first_nan = min(step for step, v in losses.items() if isinstance(v, str))
    oc501 = [f for f in read_jsonl(out / "findings.jsonl") if f["code"] == "OC501"]
    assert oc501 and oc501[0]["step"] == first_nan and "loss" in oc501[0]["subjects"]
    assert s["loss_last"] == "nan"


def test_the_same_soak_at_a_sane_lr_has_no_oc501(tmp_path):
    out = tmp_path / "sane"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "60", "--out", str(out), *SMALL])
    assert rc == exitcodes.CLEAN, stdout
    assert not [f for f in read_jsonl(out / "findings.jsonl") if f["code"] == "OC501"]


# ------------------------------------------------------------- the supervisor's message handling, fuzzed
NONFINITE = st.sampled_from(["nan", "inf", "-inf", float("nan"), float("inf"), float("-inf")])
NUMBER = st.one_of(NONFINITE, st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(-5, 10**6),
                   st.none(), st.booleans(), st.text(max_size=3), st.lists(st.integers(), max_size=2))


def _snapshot(step, loss, rss, grad_norm):
    from snapfactory import clean  # tests/snapfactory.py: a valid schema-1 snapshot

    snap = clean(step=step)
    snap["loss"], snap.setdefault("memory", {})["rss_bytes"] = loss, rss
    for p in snap.get("params", [])[:1]:
        p["grad_norm"] = grad_norm
    return snap


@st.composite
def messages(draw):
    step = draw(st.integers(0, 50))
    kind = draw(st.sampled_from(["hello", "metrics", "snapshot", "lifecycle", "crash", "stopped", "done"]))
    n = draw(st.integers(0, 4))
    if kind == "metrics":
        return {"type": kind, "steps": [step + i for i in range(n)], "losses": [draw(NUMBER) for _ in range(n)],
                "step_times_s": [draw(NUMBER) for _ in range(draw(st.integers(0, n)))]}
    if kind == "snapshot":
        return {"type": kind, "snapshot": _snapshot(step, draw(NONFINITE), draw(NUMBER), draw(NONFINITE)),
                "cost_s": draw(NUMBER)}
    if kind == "hello":
        return {"type": kind, "threads": draw(NUMBER), "versions": {"torch": "2.13.0"}, "pid": 1}
    if kind == "done":
        return {"type": kind, "step": draw(st.one_of(st.just(step), NUMBER)),
                **{k: draw(NUMBER) for k in ("loss_first", "loss_last", "val_loss_first", "val_loss_last",
                                             "train_cpu_s")},
                "val_step_first": draw(NUMBER), "step_cost": {"mean_us": draw(NONFINITE)}}
    if kind == "lifecycle":
        return {"type": kind, "step": draw(NUMBER), "kind": "eval", "detail": {"val_loss": draw(NONFINITE)}}
    return {"type": kind, "step": draw(NUMBER), "message": "x", "reason": "y", "exc_type": "E"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.lists(messages(), min_size=1, max_size=8))
@example(msgs=[{"type": "stopped", "step": 2.0**63, "message": "x", "reason": "y", "exc_type": "E"}])  # found in CI
def test_every_message_kind_with_non_finite_numbers_goes_through_the_supervisor(tmp_path_factory, msgs):
    """Each message is sent as the worker sends it (``optcheck.record.snapshot.dumps``: non-finite
    numbers as strings), read back by ``protocol.read_messages`` and handled by the
    supervisor; the summary it ends with is written and reads back through the
    published schema, with no traceback on the way."""
    import io

    from optcheck.engine import RuleEngine
    from optcheck.drivers.protocol import read_messages
    from optcheck.run.recorder import RunRecorder
    from optcheck.report.reader import read_summary
    from optcheck.drivers.worker_process import Progress
    from optcheck.record.summary import Summary
    from optcheck.record.snapshot import dumps
    from optcheck.drivers.soak import _handle, _State

    out = tmp_path_factory.mktemp("fuzz") / "run"
    rec = RunRecorder(out, Summary(run="fuzz", backend="pytorch", source="soak", steps_requested=50),
                      engine=RuleEngine())
    stream = io.StringIO("".join(dumps(m) + "\n" for m in msgs))
    st_, bar = _State(), Progress(50, True, "fuzz")
    try:
        for msg in read_messages(stream):
            for field in ("losses", "step_times_s"):
                assert all(v is None or isinstance(v, (int, float)) for v in msg.get(field, []))
            _handle(msg, st_, rec, bar)
        summary = rec.finish(crashed=st_.crash is not None, stopped=st_.stopped is not None)
    finally:
        bar.close()
        rec.close()
    assert summary["exit_code"] in (0, 1, 3)
    back = read_summary(out)
    assert back["last_step"] == summary["last_step"]
    losses = [m for m in msgs if m["type"] == "metrics" for v in m["losses"]
              if isinstance(v, (str, float)) and str(v).lower() in ("nan", "inf", "-inf")]
    if losses:
        assert "OC501" in back["findings_by_code"]


# ------------------------------------------------------------------ several runs, one exit code
def test_worst_exit_code_is_one_policy():
    assert exitcodes.worst([]) == exitcodes.CLEAN
    assert exitcodes.worst([0, 4]) == exitcodes.RECORD_FAILED
    assert exitcodes.worst([4, 3, 1]) == exitcodes.RECORD_FAILED
    assert exitcodes.worst([1, 130, 4]) == exitcodes.INTERRUPTED
    assert exitcodes.worst([0, 2]) == exitcodes.USAGE
    assert exitcodes.worst([0, 77]) == 77  # an unknown code is kept, never dropped
    from optcheck.judge import upgrade

    assert upgrade.worst is exitcodes.worst


@pytest.mark.slow
@pytest.mark.dotnet
def test_two_backends_one_ending_with_exit_4_is_exit_4_not_a_traceback(tmp_path):
    """``--backend pytorch,torchsharp`` (TorchSharp: the .NET stand-in) under a file-size
    limit: a side ends record-failed (4); the command exits 4 with one line, no ValueError."""
    sys.path.insert(0, str(ROOT / "tests" / "dotnet"))
    from build import BuildUnavailable, build_testloop

    from optcheck.torchsharp_bridge import runtime

    try:
        dll = build_testloop()
        runtime.select("coreclr")
    except (BuildUnavailable, Exception) as e:  # no mcs / no CoreCLR here
        pytest.skip(str(e))
    out = tmp_path / "both"
    limit = 120 * 1024
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--backend", "pytorch,torchsharp",
                          "--steps", "2000", "--every", "10", "--dotnet-runtime", "coreclr", "--dotnet-assembly",
                          str(dll), "--dotnet-trainer", "OptCheckTest.LazyTrainer", "--out", str(out), *SMALL],
                         capture_output=True, text=True, env=env, timeout=900,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert "Traceback" not in res.stderr and "is not in list" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == exitcodes.RECORD_FAILED, (res.returncode, res.stderr[-3000:])
    codes = [json.loads((out / b / "summary.json").read_text())["exit_code"] for b in ("pytorch", "torchsharp")
             if (out / b / "summary.json").exists()]
    assert exitcodes.RECORD_FAILED in codes and max(codes, key=lambda c: c == 4) == 4
    assert math.isfinite(len(codes))
