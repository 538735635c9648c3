"""``optcheck soak --baseline DIR`` with real short soaks: one kept baseline of two seeds
(shared by the module), then a clean rerun, a planted fault, a slower worker, a lower
learning rate and another seed, each judged against it; the reason is in the Markdown
summary. ``optcheck baseline RUN DIR`` judges the same runs again from their folders.

The machine is shared (2 cores, other jobs): step times move by +-20 % from load alone,
and by 1.6x when another process shares the machine while one of the two soaks runs (seen
in a CI run beside a 20,000-step soak). So the speed check runs with
``--speed-tolerance 50%`` where it is the subject (the slow worker sleeps long enough per
step, a global optimizer step pre-hook, test-only, through ``--python``, to be several
times slower), and with 400% in the tests about seeds, losses and findings, whose verdict
a loaded moment must not decide."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from conftest import SMALL, run_cli
from optcheck.run import exitcodes

STEPS = ["--steps", "200", "--every", "100", *SMALL]
LOOSE = ["--speed-tolerance", "50%"]  # the speed check's own tests
NOT_SPEED = ["--speed-tolerance", "400%"]  # tests of the other checks: only a 5x slower run fails on speed
NIGHTS = Path(__file__).resolve().parents[1] / "fixtures" / "nights"  # recorded runs, see its README.md
XSD = Path(__file__).resolve().parents[1] / "fixtures" / "junit.xsd"

SITECUSTOMIZE = '''\
import os, time
from torch.optim.optimizer import register_optimizer_step_pre_hook

_SLEEP = float(os.environ.get("OPTCHECK_TEST_STEP_SLEEP", "0"))


def _slow(optimizer, args, kwargs):  # burns CPU: the speed check reads the worker's CPU time, not the wall clock
    t0 = time.process_time()
    while time.process_time() - t0 < _SLEEP:
        pass


register_optimizer_step_pre_hook(_slow)
'''


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A kept baseline: seeds 1 and 2 (``base/seed-1``, ``base/seed-2``)."""
    d = tmp_path_factory.mktemp("baseline") / "base"
    rc, stdout, _ = run_cli(["soak", "-q", "--seeds", "1,2", "--out", str(d), *STEPS])
    assert rc == exitcodes.CLEAN, stdout
    return d


def _soak(tmp_path, base_dir, *args):
    out, md = tmp_path / "run", tmp_path / "summary.md"
    rc, stdout, stderr = run_cli(["soak", "-q", "--out", str(out), "--summary-md", str(md), "--baseline",
                                  str(base_dir), "--junit", str(tmp_path / "junit.xml"), *STEPS, *args])
    return rc, stdout + stderr, md.read_text(encoding="utf-8") if md.exists() else ""


def _junit(path: Path, rc: int) -> dict:
    """The JUnit file at ``path``: valid against tests/fixtures/junit.xsd, and failing
    (failures + errors > 0) exactly when the job's exit code ``rc`` is not 0. Returns
    {test case name: element}."""
    xmlschema.XMLSchema(XSD).validate(str(path))
    suite = ET.parse(path).getroot().find("testsuite")
    failing = int(suite.get("failures")) + int(suite.get("errors"))
    assert (failing > 0) == (rc != exitcodes.CLEAN), (rc, ET.tostring(suite, encoding="unicode")[:3000])
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert int(suite.get("tests")) == len(cases)
    return cases


def _failed(case) -> bool:
    return case.find("failure") is not None


def _rows(md: str) -> dict[str, str]:
    """The baseline table of the Markdown summary: check -> its status."""
    out = {}
    for line in md.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].split(" ", 1)[-1] in ("ok", "regression", "differs", "not compared"):
            out[cells[1]] = cells[0].split(" ", 1)[-1]
    return out


def test_clean_rerun_of_the_baseline_passes(base, tmp_path):
    rc, out, md = _soak(tmp_path, base / "seed-1", "--seed", "1", *NOT_SPEED)
    assert rc == exitcodes.CLEAN, out
    assert "optcheck baseline: NO REGRESSION against the baseline" in out
    assert "IDENTICAL" in out  # same seed, same torch: bit-for-bit
    assert "### ✅ Against the baseline: NO REGRESSION" in md
    assert _rows(md) == {"findings": "ok", "loss": "ok", "held-out loss": "ok", "speed": "ok",
                         "peak RSS": "ok", "trajectory": "ok"}
    cases = _junit(tmp_path / "junit.xml", rc)
    checks = {n: c for n, c in cases.items() if c.get("classname") == "optcheck.judge.baseline"}
    assert set(checks) == {f"baseline {n}" for n in ("findings", "loss", "held-out loss", "speed", "peak RSS",
                                                     "trajectory")}
    assert not any(map(_failed, checks.values()))
    assert checks["baseline loss"].find("system-out").text.startswith("ok")


@pytest.mark.slow
def test_another_seed_inside_the_seed_band_is_reported_not_failed(base, tmp_path):
    rc, out, md = _soak(tmp_path, base, "--seed", "3", *NOT_SPEED)
    assert rc == exitcodes.CLEAN, out
    assert "2 seeds (1, 2)" in out and "seed band" in out
    rows = _rows(md)
    assert rows["loss"] == rows["held-out loss"] == rows["findings"] == "ok", md
    if rows["trajectory"] == "differs":  # outside the band early on, inside at the end: said, not failed
        assert "trajectory differs (reported, not failed)" in md


@pytest.mark.slow
def test_trajectory_that_differs_inside_the_band_is_reported_not_failed(base, tmp_path):
    """Same seed, lr x 1.01: the losses leave float-rounding noise from step 2 (docs/verdict.md),
    as when a dependency changes the numerics, but end inside the band: exit 0, said so."""
    rc, out, md = _soak(tmp_path, base / "seed-1", "--seed", "1", "--lr", "0.00101", *NOT_SPEED)
    assert rc == exitcodes.CLEAN, out
    assert "NO REGRESSION, trajectory differs (reported, not failed): DIVERGED from step" in out
    rows = _rows(md)
    assert rows["trajectory"] == "differs" and rows["loss"] == rows["held-out loss"] == "ok", md
    assert "lr 0.001 vs 0.00101" in md and "### ✅ Against the baseline" in md


def test_planted_fault_fails_with_the_new_finding(base, tmp_path):
    rc, out, md = _soak(tmp_path, base / "seed-1", "--seed", "1", "--inject", "no-zero-grad@100", *NOT_SPEED)
    assert rc == exitcodes.FINDINGS, out
    assert "REGRESSION against the baseline: findings" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("REGRESSION") and "findings" in x)
    assert "step 100" in line and "OC204" in line and "not in the baseline" in line
    assert "**Fails the job (exit 1):** findings: new: OC204" in md
    assert _rows(md)["findings"] == "regression"
    cases = _junit(tmp_path / "junit.xml", rc)
    assert _failed(cases["OC204 grad-not-cleared"]) and _failed(cases["baseline findings"])
    assert not _failed(cases["baseline loss"])


@pytest.mark.slow
def test_findings_the_baseline_has_are_not_junit_failures(base, tmp_path):
    """A baseline that has OC204 (the same planted fault, kept last night): tonight's OC204
    does not fail the job (exit 0), so the JUnit file lists it in <system-out> "in the
    baseline" and has no failure; a finding the baseline lacks still fails (the test above)."""
    old = tmp_path / "old"
    rc, stdout, _ = run_cli(["soak", "-q", "--out", str(old), *STEPS, "--seed", "1", "--inject", "no-zero-grad@100"])
    assert rc == exitcodes.FINDINGS and "OC204" in stdout
    rc, out, md = _soak(tmp_path, old, "--seed", "1", "--inject", "no-zero-grad@100", *NOT_SPEED)
    assert rc == exitcodes.CLEAN and "only findings the baseline has too: OC204" in out, out
    cases = _junit(tmp_path / "junit.xml", rc)
    case = cases["OC204 grad-not-cleared"]
    assert not _failed(case) and case.find("system-out").text.startswith("in the baseline (not a regression): "
                                                                         "OC204 grad-not-cleared [error] at step 100")
    assert not _failed(cases["baseline findings"])


@pytest.mark.slow
def test_slower_worker_fails_on_speed(base, tmp_path):
    d = tmp_path / "slow"
    d.mkdir()
    (d / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
    py = d / "python"
    py.write_text(f'#!/bin/sh\nPYTHONPATH="{d}:$PYTHONPATH" OPTCHECK_TEST_STEP_SLEEP=0.02 exec "{sys.executable}" "$@"\n')
    py.chmod(0o755)
    rc, out, md = _soak(tmp_path, base / "seed-1", "--seed", "1", "--python", str(py), *LOOSE)
    assert rc == exitcodes.FINDINGS, out
    rows = _rows(md)
    assert rows["speed"] == "regression" and rows["findings"] == rows["loss"] == "ok", md
    assert "**Fails the job (exit 1):** speed: train CPU" in md
    assert "the worker's CPU time per step, medians of 19 and 19 blocks (cost.train_cpu_block_s)" in md
    assert "fails above 1.50x the baseline's" in md
    cases = _junit(tmp_path / "junit.xml", rc)
    failure = cases["baseline speed"].find("failure")
    assert failure is not None and failure.get("message").startswith("speed: ")
    assert not _failed(cases["baseline loss"]) and not _failed(cases["baseline findings"])


def test_lower_learning_rate_fails_on_the_loss(base, tmp_path):
    rc, out, md = _soak(tmp_path, base / "seed-1", "--seed", "1", "--lr", "1e-4", *NOT_SPEED)
    assert rc == exitcodes.FINDINGS, out
    rows = _rows(md)
    assert rows["loss"] == "regression" and rows["held-out loss"] == "regression" and rows["findings"] == "ok", md
    assert rows["trajectory"] == "differs"
    assert "lr 0.001 vs 0.0001" in md   # what differs between the runs
    assert "**Fails the job (exit 1):** loss: final loss" in md
    cases = _junit(tmp_path / "junit.xml", rc)
    assert _failed(cases["baseline loss"]) and _failed(cases["baseline held-out loss"])
    assert cases["baseline loss"].find("failure").get("type") == "regression loss"
    assert not _failed(cases["baseline findings"]) and not _failed(cases["baseline trajectory"])
    # the same judgement from the folders, without running again
    rc2, out2, _ = run_cli(["baseline", str(tmp_path / "run"), str(base / "seed-1"), *NOT_SPEED])
    assert rc2 == exitcodes.FINDINGS and "REGRESSION against the baseline: loss " in out2 and "; held-out loss " in out2


@pytest.mark.parametrize("args,needle", [
    (["--n-embd", "16"], "not comparable with this soak: n_embd 32 vs 16"),
    (["--steps", "100"], "not comparable with this soak: steps 200 vs 100"),
    (["--seeds", "1,2"], "--baseline compares one run"),
    (["--speed-tolerance", "fast"], "--speed-tolerance fast: a fraction"),
])
def test_incompatible_baseline_is_refused_before_the_run(base, tmp_path, args, needle):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--out", str(out), "--baseline",
                           str(base / "seed-1"), *STEPS, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == exitcodes.USAGE, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in proc.stderr
    assert not out.exists()  # nothing ran


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "missing", "no such run directory"),
    (lambda p: p, "not a run directory"),
])
def test_missing_baseline_is_one_line_exit_2(tmp_path, make, needle):
    proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--out", str(tmp_path / "run"),
                           "--baseline", str(make(tmp_path)), *STEPS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == exitcodes.USAGE
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def test_unfinished_baseline_is_refused(base, tmp_path):
    import shutil

    d = tmp_path / "crashed"
    shutil.copytree(base / "seed-1", d)
    s = json.loads((d / "summary.json").read_text())
    s["status"], s["last_step"] = "crashed", 120
    (d / "summary.json").write_text(json.dumps(s))
    rc, stdout, stderr = run_cli(["baseline", str(base / "seed-2"), str(d)])
    assert rc == exitcodes.USAGE and "not a finished run (crashed at step " in stdout + stderr  # compare's words


def test_recorded_torch_upgrade_trains_the_same_and_takes_more_memory(tmp_path):
    """Recorded nights: torch 2.14.1+cu130 against 2.13.0+cpu, same seed: bit-for-bit the same
    losses, but the CUDA wheel's libraries are loaded on CPU too (peak RSS 408 -> 771 MiB)."""
    md = tmp_path / "summary.md"
    rc, out, _ = run_cli(["baseline", str(NIGHTS / "night-4-torch2.14"), str(NIGHTS / "night-1-torch2.13"),
                          "--summary-md", str(md), "--junit", str(tmp_path / "j.xml")])
    assert rc == exitcodes.FINDINGS, out
    assert "REGRESSION   peak RSS: 770.5 MiB vs 407.9 MiB (1.89x; fails above 115%)" in out
    cases = _junit(tmp_path / "j.xml", rc)
    assert cases["baseline peak RSS"].find("failure").get("message") == \
        "peak RSS: 770.5 MiB vs 407.9 MiB (1.89x; fails above 115%)"
    # the recorded CUDA-wheel night is also slower on steps/s; no rule case fails (no finding)
    assert {n for n, c in cases.items() if _failed(c)} <= {"baseline peak RSS", "baseline speed"}
    assert "IDENTICAL: 300 steps, bit-for-bit equal losses; runs differ in: torch 2.13.0+cpu → 2.14.1+cu130" in out
    rows = _rows(md.read_text(encoding="utf-8"))
    assert rows["loss"] == rows["held-out loss"] == rows["findings"] == rows["trajectory"] == "ok"


def test_recorded_night_against_the_night_before_passes(tmp_path):
    rc, out, _ = run_cli(["baseline", str(NIGHTS / "night-2-torch2.13"), str(NIGHTS / "night-1-torch2.13"),
                          "--junit", str(tmp_path / "j.xml")])
    assert rc == exitcodes.CLEAN and "NO REGRESSION against the baseline" in out, out
    assert not any(map(_failed, _junit(tmp_path / "j.xml", rc).values()))


def test_recorded_planted_regression_fails_on_findings_and_loss():
    rc, out, _ = run_cli(["baseline", str(NIGHTS / "night-5-torch2.14-regression"), str(NIGHTS / "night-4-torch2.14")])
    assert rc == exitcodes.FINDINGS
    assert ("REGRESSION against the baseline: findings: new OC101, OC102, OC104; loss 2.9128 above its band (2.5978); "
            "held-out loss 3.0027 above its band (2.7094)\n") in out  # its wall-clock step time 1.23x: inside 25 %
    assert "ok           speed: wall 161.08 vs 131.22 ms/step (1.23x; median wall-clock step time: no CPU time" in out
    assert "REGRESSION   findings step 100: new: OC101 stale-param" in out


def test_recorded_regression_junit_fails_the_new_finding_and_the_losses(tmp_path):
    rc, _, _ = run_cli(["baseline", str(NIGHTS / "night-5-torch2.14-regression"), str(NIGHTS / "night-4-torch2.14"),
                        "--junit", str(tmp_path / "j.xml")])
    cases = _junit(tmp_path / "j.xml", rc)
    assert rc == exitcodes.FINDINGS
    assert {n for n, c in cases.items() if _failed(c)} >= {"OC101 stale-param", "baseline findings", "baseline loss",
                                                             "baseline held-out loss"}
