"""optcheck.judge.compare and `optcheck compare` on run directories written with RunDir."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from optcheck.cli import cli
from optcheck.judge.compare import compare_losses, compare_runs
from optcheck.errors import InputError
from optcheck.run.exitcodes import CLEAN, FINDINGS
from optcheck.run.rundir import RunDir
from optcheck.rules import get
from optcheck.record.snapshot import SCHEMA

MiB = 2**20


def curve(steps: np.ndarray, *, speed: float = 1.0, seed: int = 0, noise: float = 0.08) -> np.ndarray:
    """A loss curve like the built-in GPT's: 5.5 nats falling towards ~1.5, with batch noise."""
    rng = np.random.default_rng(seed)
    return 1.5 + 4.0 * np.exp(-speed * steps / 150) + rng.normal(0, noise, len(steps))


def make_run(path, losses, *, step_time=0.016, rss=400 * MiB, findings=(), torch="2.13.0", status="clean",
             crash=None, summary=True):
    rd = RunDir(path)
    steps = np.arange(1, len(losses) + 1)
    for s, loss in zip(steps, losses):
        rd.metric(int(s), float(loss), step_time)
    for s in steps[::50]:
        rd.snapshot({"schema": SCHEMA, "backend": "pytorch", "run": str(path), "step": int(s), "phase": "post-step",
                     "trigger": "cadence", "params": [], "groups": [], "versions": {"torch": torch},
                     "memory": {"rss_bytes": rss + int(s) * 1000}})
    for f in findings:
        rd.finding(f)
    if summary:
        rd.summary({"run": str(path), "backend": "pytorch", "status": status, "versions": {"torch": torch},
                    "last_step": len(losses), "crash": crash})
    rd.close()
    return path


def finding(code, subjects, step=100):
    cls = get(code)
    return {"code": code, "symbol": cls.symbol, "severity": cls.severity, "step": step, "phase": "post-step",
            "message": f"{code} on {subjects}", "subjects": subjects}


STEPS = np.arange(1, 601)


def test_two_seeds_agree(tmp_path):
    a = make_run(tmp_path / "a", curve(STEPS, seed=1))
    b = make_run(tmp_path / "b", curve(STEPS, seed=2), step_time=0.020, rss=500 * MiB, torch="2.14.0")
    res = compare_runs(a, b)
    assert not res.diverged and res.findings == [] and res.exit_code == CLEAN
    assert res.loss.common_steps == 600 and res.loss.window == 50
    assert res.step_time_ratio == pytest.approx(1.25)
    assert res.peak_memory_ratio == pytest.approx((500 * MiB + 551_000) / (400 * MiB + 551_000))
    assert res.a.versions == {"torch": "2.13.0"} and res.b.versions == {"torch": "2.14.0"}
    text = res.render()
    assert "PASS (exit 0)" in text and "1.25x" in text and "torch 2.14.0" in text


def test_slower_training_diverges_with_first_step(tmp_path):
    a = make_run(tmp_path / "a", curve(STEPS, seed=1))
    b = make_run(tmp_path / "b", curve(STEPS, seed=1, speed=0.1))  # e.g. lr 10x lower
    res = compare_runs(a, b)
    assert res.diverged and res.exit_code == FINDINGS
    [f] = res.findings
    assert (f.code, f.symbol, f.severity) == ("OC601", "run-divergence", "error")
    assert f.step == res.loss.first_beyond_step and 50 <= f.step < 150
    assert f.message.startswith(f"loss trajectories diverge from step {f.step:,}: 50-step mean loss ")
    assert f.detail["mean_b"] > f.detail["mean_a"] and f.detail["rtol"] == 0.05
    assert "FAIL (exit 1): OC601 run-divergence" in res.render()


def test_noise_spike_does_not_diverge_but_sustained_shift_does(tmp_path):
    base = curve(STEPS, seed=3, noise=0.0)
    spike = base.copy()
    spike[300] += 3.0  # one bad batch: +3 nats once, 0.06 on a 50-step mean
    assert not compare_losses(dict(zip(STEPS, base)), dict(zip(STEPS, spike))).diverged
    shifted = base.copy()
    shifted[300:] += 0.5
    res = compare_losses(dict(zip(STEPS, base)), dict(zip(STEPS, shifted)))
    assert res.diverged and 301 < res.first_beyond_step <= 340


def test_alignment_uses_common_steps_only():
    a = {s: 2.0 for s in range(1, 201)}
    b = {s: 2.0 for s in range(101, 401)}
    res = compare_losses(a, b, window=10)
    assert res.common_steps == 100 and res.compared == 91 and not res.diverged


def test_non_finite_in_one_run_is_divergence():
    a = {s: 2.0 for s in range(1, 101)}
    b = dict(a)
    b[70] = math.nan
    res = compare_losses(a, b, window=10)
    assert res.diverged and res.first_beyond_step == 70 and math.isinf(res.max_abs_diff)
    both = compare_losses(b, b, window=10)
    assert not both.diverged


def test_findings_in_one_run_only(tmp_path):
    shared = finding("OC401", ["rss_bytes"], 900)
    a = make_run(tmp_path / "a", curve(STEPS), findings=[shared, finding("OC103", ["<ref 1234>"])])
    b = make_run(tmp_path / "b", curve(STEPS), findings=[shared, finding("OC103", ["<ref 999>"]),
                                                         finding("OC104", ["h.0.mlp.c_fc.weight"], 200),
                                                         finding("OC104", ["h.0.mlp.c_fc.weight"], 400)])
    res = compare_runs(a, b)
    assert res.only_in_a == []
    assert [(f["code"], f["subjects"], f["step"]) for f in res.only_in_b] == [("OC104", ["h.0.mlp.c_fc.weight"], 200)]
    assert res.exit_code == CLEAN
    assert compare_runs(a, b, fail_on_new=True).exit_code == FINDINGS
    assert "OC104 ref-churn" in res.render()


def test_crashed_run_is_named(tmp_path):
    a = make_run(tmp_path / "a", curve(STEPS))
    b = make_run(tmp_path / "b", curve(STEPS[:250]), status="crashed",
                 crash={"exc_type": "System.Collections.Generic.KeyNotFoundException", "step": 251,
                        "message": "The given key '94721149339328' was not present in the dictionary."})
    res = compare_runs(a, b)
    assert res.loss.common_steps == 250
    assert "B: b crashed at step 251: System.Collections.Generic.KeyNotFoundException" in res.render()


def test_bad_inputs_are_input_errors(tmp_path):
    a = make_run(tmp_path / "a", curve(STEPS))
    with pytest.raises(InputError, match="no such run directory"):
        compare_runs(a, tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a run directory"):
        compare_runs(a, tmp_path / "empty")
    other = make_run(tmp_path / "other", [])
    with pytest.raises(InputError, match="no training step in common"):
        compare_runs(a, other)
    with pytest.raises(InputError, match="--window"):
        compare_runs(a, a, window=0)
    with pytest.raises(InputError, match="--tolerance"):
        compare_runs(a, a, loss_rtol=-1)
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\nnot json\n{"step": 3}\n')
    res = compare_runs(a, tmp_path / "torn")  # the garbage line is named and skipped, the rest read
    assert res.b.defects == ["metrics.jsonl:2: not a JSON line (Expecting value)"] and res.b.last_step == 1
    assert "metrics.jsonl:2: not a JSON line" in res.render()
    (tmp_path / "torn" / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": "x"}\n')
    with pytest.raises(InputError, match=r"metrics.jsonl:2: step: 'x' is not of type 'integer'"):
        compare_runs(a, tmp_path / "torn")


def test_run_without_summary_is_accepted(tmp_path):
    a = make_run(tmp_path / "a", curve(STEPS), summary=False)
    res = compare_runs(a, a)
    assert res.a.status == "" and not res.diverged and res.loss.max_abs_diff == 0


def test_cli_table_json_and_exit_codes(tmp_path):
    a = make_run(tmp_path / "a", curve(STEPS, seed=1))
    b = make_run(tmp_path / "b", curve(STEPS, seed=2))
    c = make_run(tmp_path / "c", curve(STEPS, seed=1, speed=0.1))
    runner = CliRunner()
    ok = runner.invoke(cli, ["compare", str(a), str(b)], standalone_mode=False, catch_exceptions=False)
    assert ok.return_value == CLEAN and "PASS" in ok.output, ok.output
    bad = runner.invoke(cli, ["compare", str(a), str(c), "--window", "20"], standalone_mode=False,
                        catch_exceptions=False)
    assert bad.return_value == FINDINGS and "OC601" in bad.output, bad.output
    js = runner.invoke(cli, ["compare", str(a), str(c), "--json"], standalone_mode=False, catch_exceptions=False)
    d = json.loads(js.output)
    assert d["diverged"] is True and d["findings"][0]["code"] == "OC601" and d["exit_code"] == FINDINGS
    loose = runner.invoke(cli, ["compare", str(a), str(c), "--tolerance", "10"], standalone_mode=False,
                          catch_exceptions=False)
    assert loose.return_value == CLEAN


def test_cli_bad_path_is_one_line_exit_2(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "optcheck.cli", "compare", str(tmp_path / "x"), str(tmp_path / "y")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "no such run directory" in p.stderr and "Traceback" not in p.stderr


def test_oc601_is_in_the_catalogue_and_silent_on_one_stream():
    from optcheck.rules import RuleConfig, RuleContext

    cls = get("OC601")
    assert cls.symbol == "run-divergence" and "optcheck compare" in cls.doc()
    snap = {"schema": SCHEMA, "backend": "pytorch", "run": "r", "step": 1, "phase": "post-step",
            "trigger": "cadence", "params": [], "groups": []}
    assert list(cls().check(snap, RuleContext(None, [snap], RuleConfig(), {}))) == []


def test_peak_rss_from_the_summary_when_it_has_one(tmp_path):
    a = make_run(tmp_path / "a", curve(STEPS))
    b = make_run(tmp_path / "b", curve(STEPS))
    s = json.loads((b / "summary.json").read_text())
    (b / "summary.json").write_text(json.dumps({**s, "peak_rss_bytes": 2 * (400 * MiB + 551_000)}))
    assert compare_runs(a, b).peak_memory_ratio == pytest.approx(2.0)
