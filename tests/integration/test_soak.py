"""Real soaks through the CLI: a worker subprocess, real training on the default
corpus, the run directory, findings, exit codes, crashes and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL, run_cli, run_clis, start_long_soak
from optcheck.run import exitcodes
from optcheck.record.snapshot import read_jsonl
from optcheck.record.check import read_snapshots


def lines(path: Path) -> list[dict]:
    return list(read_jsonl(path))


def _injected(scenario: str, out: Path) -> list[str]:
    return ["--steps", "200", "--every", "50", "--inject", f"{scenario}@120", "--junit", str(out / "junit.xml"),
            "--plot", str(out / "run.png")]


#: The module's soaks, each independent of the others: run side by side once (``run_clis``).
SOAKS = {
    "run": lambda out: ["--steps", "300", "--every", "50"],
    "param-rebind": lambda out: _injected("param-rebind", out),
    "life": lambda out: ["--steps", "240", "--every", "60", "--eval-every", "50", "--checkpoint-every", "70",
                         "--resume-at", "150"],
    "to": lambda out: ["--steps", "200", "--every", "50", "--inject", "module-to-after-optimizer@60"],
}


#: under -m slow: tie-after-optimizer's OC101 fires in the default run through `soak --ignore` (test_monitor_api.py)
SLOW_SOAKS = {"tie-after-optimizer": lambda out: _injected("tie-after-optimizer", out)}


def _run(root: Path, soaks: dict) -> dict[str, tuple[Path, int, str]]:
    done = run_clis({name: ["soak", "-q", *args(root / name), "--out", str(root / name), *SMALL]
                     for name, args in soaks.items()})
    return {name: (root / name, rc, stdout) for name, (rc, stdout, _) in done.items()}


@pytest.fixture(scope="module")
def soaks(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    """{name: (run directory, exit code, stdout)} of :data:`SOAKS`."""
    return _run(tmp_path_factory.mktemp("soaks"), SOAKS)


@pytest.fixture(scope="module")
def slow_soaks(tmp_path_factory) -> dict[str, tuple[Path, int, str]]:
    return _run(tmp_path_factory.mktemp("slow-soaks"), SLOW_SOAKS)


def test_clean_soak_writes_the_run_dir_and_the_loss_falls(soaks):
    out, rc, stdout = soaks["run"]
    assert rc == exitcodes.CLEAN, stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "clean" and summary["findings"] == 0 and summary["last_step"] == 300
    assert summary["loss_last"] < summary["loss_first"] - 1.0  # 5.5 -> ~2.5 on byte tokens
    snaps = read_snapshots(out / "snapshots.jsonl")
    assert [s["step"] for s in snaps] == [0, 50, 100, 150, 200, 250, 300]
    assert snaps[-1]["trigger"] == "final" and snaps[1]["versions"]["torch"]
    assert len(lines(out / "metrics.jsonl")) == 300
    assert lines(out / "findings.jsonl") == []
    assert not (out / ".optcheck.lock").exists() and not (out / ".optcheck-reserve").exists()  # nothing left
    # the recorded stream re-checks clean
    rc, stdout, _ = run_cli(["check", str(out / "snapshots.jsonl")])
    assert rc == exitcodes.CLEAN and "7 snapshots, 0 finding(s)" in stdout


@pytest.mark.parametrize("scenario,expected", [
    ("param-rebind", {"OC101", "OC102", "OC104"}),
    pytest.param("tie-after-optimizer", {"OC101"}, marks=pytest.mark.slow),
])
def test_injected_fault_is_flagged_at_its_step(request, scenario, expected):
    out, rc, stdout = request.getfixturevalue("slow_soaks" if scenario in SLOW_SOAKS else "soaks")[scenario]
    assert rc == exitcodes.FINDINGS, stdout
    import xml.etree.ElementTree as ET

    suite = ET.parse(out / "junit.xml").getroot()
    assert int(suite.get("failures")) == len(expected)
    assert (out / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "FINDINGS (exit 1)" in stdout
    found = lines(out / "findings.jsonl")
    assert {f["code"] for f in found} == expected
    assert {f["step"] for f in found} == {120} and {f["phase"] for f in found} == {"pre-step"}
    assert "wte.weight" in found[0]["subjects"]
    # `optcheck check` finds the same on the recorded stream
    rc, stdout, _ = run_cli(["check", str(out)])
    assert rc == exitcodes.FINDINGS
    assert all(code in stdout for code in expected)


def test_lifecycle_events_stay_silent(soaks):
    out, rc, stdout = soaks["life"]
    assert rc == exitcodes.CLEAN, stdout
    kinds = [e.get("name") for e in lines(out / "events.jsonl") if e["kind"] == "lifecycle"]
    assert kinds.count("eval") == 4 and kinds.count("checkpoint") == 3 and kinds.count("resume") == 1


def test_crash_in_training_is_reported_with_lead_time(soaks):
    out, rc, stdout = soaks["to"]
    assert rc == exitcodes.CRASHED, stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "crashed" and s["crash"]["step"] == 60 and s["crash"]["exc_type"] == "RuntimeError"
    assert "dtype" in s["crash"]["message"]
    assert s["lead_time"]["flagged_step"] == 60 and s["lead_time"]["finding"] == "OC107 state-mismatch"


def test_sigkill_of_the_worker_leaves_a_readable_run(tmp_path):
    out = tmp_path / "killed"
    proc, worker = start_long_soak(out)
    os.kill(worker, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exitcodes.CRASHED, stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "crashed" and s["crash"]["signal"] == "SIGKILL" and s["last_step"] >= 40
    snaps = read_snapshots(out / "snapshots.jsonl")
    assert len(snaps) >= 3 and "Traceback" not in stderr


@pytest.mark.parametrize("args,needle", [
    (["--inject", "no-such@5"], "unknown scenario 'no-such'"),
    (["--steps", "0"], "--steps 0: must be a whole number >= 1"),
    (["--data", "/nonexistent/corpus.txt"], "no such file"),
    (["--data", "{empty}"], "the file is empty"),
    (["--data", "{corrupt}"], "corrupt .bin"),
    (["--out", "/proc/optcheck-cannot-write"], "cannot write there"),
    (["--inject", "eager-param-list@5"], "not available on pytorch"),
    (["--seed", "1e20"], "--seed 1e20: not an integer"),
    (["--backend", "pytorch,torchsharp", "--junit", "j.xml"], "--junit writes one run's report"),
    (["--backend", "pytorch,torchsharp", "--plot", "p.png"], "--plot writes one run's report"),
    (["--seeds", "1,2", "--junit", "j.xml"], "--junit writes one run's report, and --seeds 1,2 makes one per seed"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "corrupt.bin").write_bytes(b"\x01\x02\x03")
    args = [a.format(empty=tmp_path / "empty.txt", corrupt=tmp_path / "corrupt.bin") for a in args]
    proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "10", *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120) if "--steps" not in args else \
        subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", *args],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "Traceback" not in proc.stderr


def test_stop_on_finding_stops_before_the_step_on_the_supervisors_finding(tmp_path):
    """--stop-on-finding: the pre-step check snapshot waits for the supervisor's verdict (its
    engine is the run's only one); the worker stops before the step, which never trains."""
    out = tmp_path / "stop"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "100", "--every", "50", "--inject", "tie-after-optimizer@40",
                             "--stop-on-finding", "--out", str(out), *SMALL])
    assert rc == exitcodes.FINDINGS, stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "stopped" and s["last_step"] == 40
    assert s["stopped"] == {"step": 40, "reason": "OC101 stale-param before step 40 (--stop-on-finding)"}
    assert [(f["code"], f["step"], f["phase"]) for f in lines(out / "findings.jsonl")] == [("OC101", 40, "pre-step")]
    assert max(m["step"] for m in lines(out / "metrics.jsonl")) == 39  # step 40 never ran
    assert "Stopped at step 40: OC101 stale-param before step 40 (--stop-on-finding)" in stdout


def test_the_worker_loop_holds_no_rule_engine():
    """Rules run once per soak, in the supervisor: the worker's modules do not even import them."""
    code = ("import sys, optcheck.drivers.worker_loop, optcheck.pytorch.worker; "
            "print(sorted(m for m in sys.modules if m.startswith(('optcheck.engine', 'optcheck.rules'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_catalogue_commands():
    rc, out, _ = run_cli(["rules"])
    assert rc == 0 and "OC101  stale-param" in out
    rc, out, _ = run_cli(["explain", "ref-churn"])
    assert rc == 0 and "KeyNotFoundException" in out
    rc, out, err = run_cli(["explain", "OC999"])
    assert rc == exitcodes.USAGE and "no rule 'OC999'" in err
    rc, out, _ = run_cli(["scenarios", "--backend", "pytorch"])
    assert rc == 0 and "param-rebind" in out and "tie-after-optimizer" in out and "eager-param-list" not in out


@pytest.mark.parametrize("content,needle", [(None, "no such file"), ("", "no snapshots in it"),
                                            ("garbage\n{}\n", "s.jsonl:2: (the record): 'schema' is a required property")])
def test_check_bad_stream_is_one_line_and_exit_2(tmp_path, content, needle):
    path = tmp_path / "s.jsonl"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "optcheck", "check", str(path)], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == exitcodes.USAGE and len(lines) == 1 and needle in lines[0], proc.stderr


FIRST_SCIPY_IMPORT = r'''
import runpy, sys, threading
first = []
sys.addaudithook(lambda event, args: first.append(threading.current_thread().name)
                 if event == "import" and args[0] == "scipy" and not first else None)
sys.argv = ["optcheck", *sys.argv[1:]]
try:
    runpy.run_module("optcheck", run_name="__main__")
finally:
    print("scipy first imported in thread:", first[0] if first else None, file=sys.stderr)
'''


def test_the_soak_never_imports_scipy(tmp_path):
    """scipy.stats took seconds to import (OC401's trend test, now numpy: rules/_memory_stats.py):
    no rule check of a soak imports it any more, so the first check is not delayed by it.
    A fresh interpreter, so nothing imported it before; an audit hook names any importing thread."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", FIRST_SCIPY_IMPORT, "soak", "-q", "--steps", "10", "--every", "5",
                           "--val-every", "0", *SMALL, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == exitcodes.CLEAN, proc.stdout + proc.stderr
    assert "scipy first imported in thread: None" in proc.stderr, proc.stderr
    cost = json.loads((out / "summary.json").read_text())["cost"]["checks"]
    assert cost["count"] == 3 and cost["total_s"] >= cost["median_s"] > 0
