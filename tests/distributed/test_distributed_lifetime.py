"""``optcheck soak --nproc 2`` under real signals and a real second writer: its processes
never outlive it, SIGTERM/SIGINT end it as interrupted (exit 130), a stopped rank is the
one blamed, the run directory's lock holds both ways. Real CLI, real torchrun/gloo ranks,
real signals; every wait is bounded by what it waits for (the ranks' start-up: the
subprocess cap; a stop: the supervisor's own grace, ``optcheck.drivers.watch.GRACE_S``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from optcheck.distributed.lifetime import proc_state
from optcheck.report.reader import read_summary
from optcheck.drivers.watch import GRACE_S

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
         "--val-every", "0"]
START_CAP_S = 300  # an upper bound on the ranks' start-up (imports, DDP, the Monitor) on a loaded machine
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


@pytest.fixture
def start(tmp_path):
    """``start(out, *args)``: ``optcheck soak --nproc 2`` in the background, stdout/stderr to files (read
    while it runs). Whatever a failed test leaves running is stopped: optcheck, its launcher, its ranks."""
    started: list[tuple[subprocess.Popen, Path]] = []

    def run(out: Path, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "optcheck", "soak", *SMALL, "--nproc", "2", "--steps",
                                 "100000", "--out", str(out), *args], env=ENV, stdout=open(tmp_path / "stdout", "w"),
                                stderr=open(tmp_path / "stderr", "w"))
        started.append((proc, out))
        return proc

    yield run
    for proc, out in started:
        for pid in [proc.pid, *processes(str(out))]:
            if proc_state(pid) not in (None, "Z", "X"):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def processes(*words: str) -> list[int]:
    """PIDs whose command line holds every word (``/proc/PID/cmdline``), this test's own processes."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if d.name.isdecimal() and all(w in cmd for w in words):
            found.append(int(d.name))
    return found


def ranks_at(out: Path, step: int, proc: subprocess.Popen) -> list[int]:
    """Wait until both ranks have finished ``step`` (their heartbeats); the two rank PIDs, in rank order."""
    deadline = time.monotonic() + START_CAP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, (out.parent / "stderr").read_text()[-2000:]
        try:
            if all(int((out / f"rank-{r}" / "heartbeat").read_text().split()[0]) >= step for r in (0, 1)):
                ranks = {r: p for p in processes("optcheck.distributed.worker", str(out))
                         if (r := rank_of(p)) is not None}
                assert sorted(ranks) == [0, 1], ranks
                return [ranks[0], ranks[1]]
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not reach step {step} in {START_CAP_S} s")


def rank_of(pid: int) -> int | None:
    """``RANK`` of a rank's environment (set by torch.distributed.run); None for another process."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)


def gone(pids: list[int], within: float) -> bool:
    """True once every PID is gone or a zombie, waiting at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while any(proc_state(p) not in (None, "Z", "X") for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
                         ids=lambda s: s.name)
def test_a_signal_ends_the_run_interrupted_130_with_no_rank_left(tmp_path, start, sig):
    out = tmp_path / "run"
    proc = start(out, "--every", "5", "--inject", "rank1-lr@3")
    if sig == signal.SIGTERM:  # findings are printed as they are written, while the ranks train on
        deadline = time.monotonic() + START_CAP_S
        while "OC702" not in (tmp_path / "stderr").read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            time.sleep(0.2)
        assert "rank 0 OC702 rank-group-mismatch [error]" in (tmp_path / "stderr").read_text()
    pids = ranks_at(out, 1, proc)
    if sig == signal.SIGTERM:  # a one-process soak told to --force the folder is refused, naming the holder
        other = subprocess.run([sys.executable, "-m", "optcheck", "soak", *SMALL, "--steps", "5", "--force",
                                "--out", str(out), "-q"], env=ENV, capture_output=True, text=True, timeout=START_CAP_S)
        assert other.returncode == 2 and f"in use by PID {proc.pid}" in other.stderr, other.stderr
        assert len(other.stderr.strip().splitlines()) == 1
    proc.send_signal(sig)
    assert proc.wait(timeout=START_CAP_S) == 130, (tmp_path / "stderr").read_text()[-2000:]
    assert gone(pids, 1.0)  # the supervisor waited for them (or killed them after its grace)
    s = read_summary(out)  # checked against optcheck/schemas/summary-1.json
    assert (s["summary_version"], s["status"], s["exit_code"], s["interrupted_by"]) == (2, "interrupted", 130,
                                                                                         sig.name)
    assert s["last_step"] >= 1 and not (out / ".optcheck.lock").exists()
    for r in (0, 1):  # each rank got the stop once and recorded it (a second SIGTERM broke its closing writes)
        own = read_summary(out / f"rank-{r}")
        # the rank's Monitor records the launcher's SIGTERM as an interruption (optcheck/drivers/monitor_end.py)
        assert (own["status"], own["exit_code"], own["interrupted_by"]) == ("interrupted", 130, "SIGTERM"), own
    assert "INTERRUPTED (exit 130)" in (tmp_path / "stdout").read_text()


def test_sigterm_to_one_rank_names_the_rank_and_the_signal(tmp_path, start):
    """Issue 35: SIGTERM to rank 1 (not to optcheck) read "INTERRUPTED (exit 130)" with rank 0's
    gloo "Connection closed by peer" as the crash: neither rank 1 nor the signal named,
    interrupted_by null. The run's recorder folds the ranks now: rank 1 and SIGTERM are the story."""
    out = tmp_path / "run"
    proc = start(out, "--every", "5", "-q")
    pids = ranks_at(out, 3, proc)
    os.kill(pids[1], signal.SIGTERM)
    assert proc.wait(timeout=START_CAP_S) == 130, (tmp_path / "stderr").read_text()[-2000:]
    assert gone(pids, 1.0)
    s = read_summary(out)
    assert (s["status"], s["exit_code"], s["interrupted_by"]) == ("interrupted", 130, "SIGTERM"), s
    assert (s["crash"]["rank"], s["crash"]["signal"]) == (1, "SIGTERM"), s["crash"]
    assert "rank 1 got SIGTERM (not from optcheck)" in s["crash"]["message"]
    assert "Connection closed" not in s["crash"]["message"]
    assert read_summary(out / "rank-1")["interrupted_by"] == "SIGTERM"  # the rank's own record says so too
    stdout = (tmp_path / "stdout").read_text()
    assert "INTERRUPTED (exit 130)" in stdout and "rank 1 got SIGTERM" in stdout, stdout


def _rank_pid_once_it_beats(out: Path, rank: int, proc: subprocess.Popen) -> int:
    """The PID of ``rank`` as soon as its heartbeat file exists (step 0: before or while its Monitor starts)."""
    deadline = time.monotonic() + START_CAP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, (out.parent / "stderr").read_text()[-2000:]
        if (out / f"rank-{rank}" / "heartbeat").exists():
            found = [p for p in processes("optcheck.distributed.worker", str(out)) if rank_of(p) == rank]
            if found:
                return found[0]
        time.sleep(0.01)
    raise AssertionError(f"rank {rank} wrote no heartbeat in {START_CAP_S} s")


def _assert_rank_1_and_sigterm_named(tmp_path, out, proc):
    assert proc.wait(timeout=START_CAP_S) == 130, (tmp_path / "stderr").read_text()[-2000:]
    s = read_summary(out)
    assert (s["status"], s["exit_code"], s["interrupted_by"]) == ("interrupted", 130, "SIGTERM"), s
    assert (s["crash"]["rank"], s["crash"]["signal"]) == (1, "SIGTERM"), s["crash"]
    assert "rank 1 got SIGTERM (not from optcheck)" in s["crash"]["message"], s["crash"]
    stdout = (tmp_path / "stdout").read_text()
    assert "INTERRUPTED (exit 130)" in stdout and "rank 1 got SIGTERM" in stdout, stdout


def test_sigterm_to_one_rank_at_start_up_names_the_rank_and_the_signal(tmp_path, start):
    """Issue 48 point 1: SIGTERM to rank 1 as soon as its heartbeat exists (its Monitor not yet running: it dies
    by the signal, -15, with no summary) read CRASHED with rank 0 as the crash and no signal named. The
    launcher's log names rank 1 and SIGTERM: the fold reads it."""
    out = tmp_path / "run"
    proc = start(out, "--every", "5", "-q")
    os.kill(_rank_pid_once_it_beats(out, 1, proc), signal.SIGTERM)
    _assert_rank_1_and_sigterm_named(tmp_path, out, proc)


def test_a_rank_that_fails_before_its_monitor_gives_the_launcher_its_error(tmp_path):
    """The CI failure of stop 53 (1 run in 3 here): rank 1 killed at start-up, rank 0's first collective
    broken by it ("Connection reset by peer") in the same second. Neither rank had a record, and the
    launcher's report said only "To enable traceback see ..." for rank 0, so its end could not be told
    from a fault of its own and rank 0 was the crash (CRASHED, exit 3). A rank that fails now writes
    torch's error file, and the report carries its error. Real ``torch.distributed.run``, one rank
    whose corpus does not exist."""
    from optcheck.config import SoakConfig
    from optcheck.distributed.launcher_report import launcher_failures
    from optcheck.distributed.soak import free_port

    cfg = SoakConfig()
    cfg.data.path = str(tmp_path / "no-such-corpus.txt")
    (tmp_path / "config.json").write_text(cfg.to_json())
    log = subprocess.run([sys.executable, "-m", "optcheck.distributed.launch", "--nproc-per-node", "1",
                          "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "optcheck.distributed.worker",
                          "--config", str(tmp_path / "config.json"), "--out", str(tmp_path / "run")], env=ENV,
                         capture_output=True, text=True, timeout=START_CAP_S)
    assert log.returncode != 0
    failures = launcher_failures(log.stdout + log.stderr)
    assert [(f["rank"], f["exitcode"]) for f in failures] == [(0, 1)], log.stderr[-3000:]
    assert "no-such-corpus.txt" in failures[0]["traceback"], failures[0]["traceback"]
    assert "To enable traceback" not in failures[0]["traceback"]


@pytest.mark.slow
def test_sigterm_to_one_rank_while_the_other_is_stopped_names_the_first(tmp_path, start):
    """Issue 48 point 2: rank 0 held by SIGSTOP, SIGTERM to rank 1, SIGCONT to rank 0 8 s later: rank 0 then
    records the launcher's SIGTERM as an interruption of its own. The rank that died first (rank 1, the
    launcher's "Root Cause") is the cause; rank 0 is not said to be interrupted by the user."""
    out = tmp_path / "run"
    proc = start(out, "--every", "5", "-q")
    pids = ranks_at(out, 3, proc)
    os.kill(pids[0], signal.SIGSTOP)
    try:
        time.sleep(0.5)
        os.kill(pids[1], signal.SIGTERM)
        time.sleep(8)
    finally:
        os.kill(pids[0], signal.SIGCONT)
    _assert_rank_1_and_sigterm_named(tmp_path, out, proc)


@pytest.mark.slow
def test_a_killed_optcheck_takes_its_launcher_and_ranks_with_it(tmp_path, start):
    out = tmp_path / "run"
    proc = start(out, "--every", "10", "-q")
    pids = ranks_at(out, 1, proc)
    proc.send_signal(signal.SIGKILL)  # nothing of optcheck's runs after this: only the kernel's PR_SET_PDEATHSIG
    proc.wait(timeout=30)
    assert gone(pids, GRACE_S), [(p, proc_state(p)) for p in pids]


@pytest.mark.slow
def test_a_stopped_rank_is_blamed_by_step_timeout_and_every_rank_killed(tmp_path, start):
    out = tmp_path / "run"
    proc = start(out, "--every", "10", "--step-timeout", "15", "-q")
    pids = ranks_at(out, 2, proc)
    os.kill(pids[1], signal.SIGSTOP)
    assert proc.wait(timeout=START_CAP_S) == 3, (tmp_path / "stderr").read_text()[-2000:]
    assert gone(pids, 1.0), [(p, proc_state(p)) for p in pids]
    s = read_summary(out)
    assert s["crash"]["rank"] == 1 and s["crash"]["exc_type"] == "Hang", s["crash"]
    assert "rank 1 was stopped (SIGSTOP)" in (tmp_path / "stdout").read_text()


@pytest.mark.slow
def test_nproc_force_never_removes_a_folder_another_soak_writes(tmp_path):
    out = tmp_path / "run"
    one = subprocess.Popen([sys.executable, "-m", "optcheck", "soak", *SMALL, "--steps", "100000", "--out", str(out),
                            "-q"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + START_CAP_S
        while not (out / "snapshots.jsonl").exists() or not (out / "snapshots.jsonl").stat().st_size:
            assert one.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        before = (out / "snapshots.jsonl").stat().st_size
        proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", *SMALL, "--nproc", "2", "--steps", "5",
                               "--force", "--out", str(out), "-q"], env=ENV, capture_output=True, text=True,
                              timeout=START_CAP_S)
        assert proc.returncode == 2 and f"in use by PID {one.pid}" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert (out / "snapshots.jsonl").stat().st_size >= before and not (out / "rank-0").exists()
    finally:
        one.send_signal(signal.SIGTERM)
        one.wait(timeout=START_CAP_S)
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


def test_a_rank_folder_held_by_another_writer_is_refused_not_removed(tmp_path):
    """A Monitor rank (here: a real second process holding ``rank-1``'s lock) writes into the folder."""
    out = tmp_path / "run"
    (out / "rank-1").mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from optcheck.run.rundir import RunDir; "
                               f"RunDir({str(out / 'rank-1')!r}); print('held', flush=True); time.sleep(600)"],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", *SMALL, "--nproc", "2", "--steps", "5",
                               "--force", "--out", str(out), "-q"], env=ENV, capture_output=True, text=True,
                              timeout=START_CAP_S)
        assert proc.returncode == 2 and f"in use by PID {holder.pid}" in proc.stderr, proc.stderr
        assert (out / "rank-1" / "snapshots.jsonl").exists() and not (out / ".optcheck.lock").exists()
    finally:
        holder.kill()
        holder.wait()
