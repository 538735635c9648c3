"""Issue 13, row by row: nothing lost, one clear line. Real optcheck processes,
real files, a real tiny tmpfs where the machine lets root mount one (else a
documented skip) and RLIMIT_FSIZE, which works everywhere."""

from __future__ import annotations

import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from conftest import SMALL, run_cli
from optcheck.run import exitcodes
from optcheck.run.rundir import RunDir

OPTCHECK = [sys.executable, "-m", "optcheck"]


def soak_cmd(out: Path, *extra: str, steps: int = 300, every: int = 50) -> list[str]:
    return [*OPTCHECK, "soak", "-q", "--steps", str(steps), "--every", str(every), "--out", str(out), *SMALL, *extra]


def run(cmd: list[str], timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def whole_lines(path: Path) -> list[dict]:
    """Every line of a record file, each of which must be whole JSON (no torn line)."""
    text = path.read_text()
    assert text == "" or text.endswith("\n"), f"{path} ends with a torn line"
    return [json.loads(line) for line in text.splitlines()]


def workers_of(out: Path) -> list[psutil.Process]:
    """Live worker processes started for run directory ``out`` (their --config is in it)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if any(str(out) in a for a in cmd) and "--stream-fd" in cmd:
            found.append(p)
    return found


def start(out: Path, *extra: str, steps: int = 100_000, every: int = 1000) -> subprocess.Popen:
    return subprocess.Popen(soak_cmd(out, *extra, steps=steps, every=every), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_worker(out: Path, min_step: int = 1, timeout_s: float = 120) -> int:
    """The worker's pid once ``out/metrics.jsonl`` has reached ``min_step``."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        ev, met = out / "events.jsonl", out / "metrics.jsonl"
        if ev.exists() and met.exists() and met.stat().st_size:
            hello = [json.loads(x) for x in ev.read_text().splitlines() if '"hello"' in x]
            last = met.read_text().splitlines()[-1]
            if hello and json.loads(last)["step"] >= min_step:
                return hello[0]["pid"]
        time.sleep(0.2)
    raise AssertionError(f"no worker progress in {out} after {timeout_s} s")


def one_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("optcheck: error:")]
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def tmpfs(tmp_path):
    """A 300 KiB tmpfs (root only); skipped where mount is not permitted (not root,
    or a container without CAP_SYS_ADMIN)."""
    def mount(options: str = "size=300k") -> Path:
        d = tmp_path / "tmpfs"
        d.mkdir(exist_ok=True)
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here ({res.stderr.strip() or 'not root'}); "
                        f"test_file_size_limit_stops_the_run_with_exit_4 covers the path")
        mounted.append(d)
        return d

    mounted: list[Path] = []
    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


# -- row 1: full disks ------------------------------------------------------------------

def assert_record_failed(res, out: Path, errname: str) -> None:
    assert res.returncode == exitcodes.RECORD_FAILED, res.stderr
    line = one_error_line(res.stderr)
    assert f"cannot record to {out}/" in line and f"({errname})" in line and "the worker was stopped at step" in line
    s = summary(out)
    assert s["status"] == "record-failed" and s["exit_code"] == 4 and errname in s["record_error"]
    metrics = whole_lines(out / "metrics.jsonl")
    whole_lines(out / "snapshots.jsonl")
    assert metrics and s["last_step"] >= metrics[-1]["step"] > 0
    assert not workers_of(out)


def test_disk_fills_mid_run_on_a_300k_tmpfs(tmpfs):
    out = tmpfs() / "run"
    res = run(soak_cmd(out, steps=2000, every=10))
    assert "will write about" in res.stderr  # the space estimate warned before the run
    assert_record_failed(res, out, "ENOSPC")


@pytest.mark.slow
def test_a_full_disk_under_nproc_says_where_the_records_stop(tmpfs):
    """Issue 48 point 5: with --nproc the ranks' Monitors train on after a full disk (recorded in
    memory); the error said "stopped at step 400" where the ranks stopped recording at 170. It says
    the step after which nothing was recorded, the one the rank's own records end at."""
    out = tmpfs("size=600k") / "run"
    res = run(soak_cmd(out, "--nproc", "2", steps=300, every=5), timeout=600)
    assert res.returncode == exitcodes.RECORD_FAILED, res.stderr
    line = one_error_line(res.stderr)
    s = summary(out)
    assert s["status"] == "record-failed" and "ENOSPC" in s["record_error"], s
    import re
    m = re.search(r"rank (\d+): cannot record to .*; nothing recorded after step (\d+);", line)
    assert m and "the ranks trained on to step" in line, line
    rank, recorded = int(m.group(1)), int(m.group(2))
    metrics = whole_lines(out / f"rank-{rank}" / "metrics.jsonl")
    assert recorded < s["last_step"] and metrics[-1]["step"] <= recorded, (recorded, metrics[-1], s["last_step"])
    assert s["record_error"].endswith(f"nothing recorded after step {recorded}")


@pytest.mark.slow
def test_file_size_limit_stops_the_run_with_exit_4(tmp_path):
    """RLIMIT_FSIZE (ulimit -f) in the optcheck process: the same path as a full
    disk, on every machine (writes fail with EFBIG; Python ignores SIGXFSZ)."""
    out = tmp_path / "run"
    limit = 120 * 1024
    res = run(soak_cmd(out, steps=2000, every=10),
              preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert "ulimit -f" in res.stderr
    assert_record_failed(res, out, "EFBIG")
    assert max(p.stat().st_size for p in out.iterdir() if p.is_file()) <= limit


def test_zero_bytes_free_is_refused_before_the_run(tmpfs):
    d = tmpfs()
    with open(d / "fill", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    res = run(soak_cmd(d / "run"))
    assert res.returncode == exitcodes.RECORD_FAILED
    assert "No space left on device: 0 bytes free there" in one_error_line(res.stderr)
    assert not (d / "run").exists()


@pytest.mark.slow
def test_inodes_running_out_before_the_final_summary_still_give_a_summary(tmpfs):
    d = tmpfs("size=20m,nr_inodes=40")
    out = d / "run"
    proc = start(out, steps=400, every=50)
    wait_for_worker(out)
    filler = d / "filler"
    filler.mkdir()
    n = 0
    try:
        while True:
            (filler / str(n)).touch()
            n += 1
    except OSError:
        pass
    assert os.statvfs(d).f_favail == 0
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == exitcodes.CLEAN, stderr
    s = summary(out)  # written with the inode the reserve gave back
    assert s["status"] == "clean" and s["last_step"] == 400


# -- row 2 and 3: one writer, no overwrite, no symlink ---------------------------------------

@pytest.mark.slow
def test_second_writer_is_refused_naming_the_pid_and_the_lock_goes_with_the_process(tmp_path):
    out = tmp_path / "run"
    first = start(out)
    try:
        wait_for_worker(out)
        rc, _, err = run_cli(["soak", "-q", "--steps", "50", "--out", str(out), *SMALL])
        assert rc == exitcodes.USAGE
        assert f"the run directory is in use by PID {first.pid}" in err
        assert len(whole_lines(out / "metrics.jsonl")) > 0  # the refused writer touched nothing
    finally:
        first.kill()  # SIGKILL: no clean-up code runs, the kernel drops the flock
        first.wait()
    for w in workers_of(out):
        w.kill()
    RunDir(out, force=True).close()


def test_finished_run_is_refused_without_force(tmp_path):
    out = tmp_path / "run"
    assert run(soak_cmd(out, steps=60, every=20)).returncode == 0
    before = (out / "metrics.jsonl").read_bytes()
    rc, _, err = run_cli(["soak", "-q", "--steps", "60", "--out", str(out), *SMALL])
    assert rc == exitcodes.USAGE and "already holds a run (status clean, last step 60); pass --force" in err
    assert (out / "metrics.jsonl").read_bytes() == before
    res = run(soak_cmd(out, "--force", steps=30, every=10))
    assert res.returncode == 0 and summary(out)["last_step"] == 30 and len(whole_lines(out / "metrics.jsonl")) == 30


def test_a_planted_symlink_is_never_written_through(tmp_path):
    out, victim = tmp_path / "run", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / "metrics.jsonl").symlink_to(victim)
    rc, _, err = run_cli(["soak", "-q", "--steps", "30", "--out", str(out), *SMALL])
    assert rc == exitcodes.USAGE and "metrics.jsonl: is a symbolic link; optcheck never writes through one" in err
    assert victim.read_text() == "precious\n"
    rd = RunDir(out, force=True)  # --force removes the link itself, never its target
    rd.metric(1, 2.0, 0.01)
    rd.close()
    assert victim.read_text() == "precious\n" and not (out / "metrics.jsonl").is_symlink()
    # a symlink as summary.json's temporary file is replaced, not followed
    (out / "summary.json.tmp").symlink_to(victim)
    rd = RunDir(out, append=True)
    rd.summary({"status": "clean"})
    rd.close()
    assert victim.read_text() == "precious\n" and summary(out)["status"] == "clean"


# -- rows 6, 7, 14, 15, 16: every option checked up front -------------------------------------

@pytest.mark.parametrize("args,needle", [
    (["--n-layer", "0"], "--n-layer 0: must be a whole number >= 1"),
    (["--n-layer", "-1"], "--n-layer -1: must be"),
    (["--n-head", "0"], "--n-head 0: must be"),
    (["--n-embd", "0"], "--n-embd 0: must be"),
    (["--n-embd", "33", "--n-head", "2"], "--n-embd 33: must be a multiple of --n-head (2)"),
    (["--block-size", "0"], "--block-size 0: must be"),
    (["--batch-size", "0"], "--batch-size 0: must be"),
    (["--lr", "nan"], "--lr nan: must be a finite number > 0"),
    (["--lr", "inf"], "--lr inf: must be a finite number > 0"),
    (["--lr", "-1"], "--lr -1.0: must be a finite number > 0"),
    (["--seed", "-1"], "--seed -1: must be in 0.."),
    (["--seed", str(10**20)], f"--seed {10**20}: must be in 0.."),
    (["--threads", "100000"], "--threads 100000: must be in 1.."),
    (["--step-timeout", "nan"], "--step-timeout nan: must be a finite number"),
    (["--inject", "param-rebind@²"], "--inject 'param-rebind@²': expected NAME@STEP"),
    (["--inject", "param-rebind@١٢"], "expected NAME@STEP"),  # Arabic-Indic digits: isdecimal but not ASCII
    (["--junit", "/proc/nope/x.xml"], "--junit /proc/nope/x.xml: the folder /proc/nope does not exist"),
    (["--plot", "{tmp}/missing/x.png"], "the folder {tmp}/missing does not exist"),
    (["--backend", "torchsharp", "--dotnet-assembly", "/bin/ls"], "--dotnet-assembly /bin/ls"),
])
def test_bad_option_is_one_line_exit_2_and_no_run_dir(tmp_path, args, needle):
    out = tmp_path / "run"
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    rc, stdout, err = run_cli(["soak", "-q", "--steps", "50", "--out", str(out), *SMALL, *args])
    assert rc == exitcodes.USAGE, stdout + err
    assert needle.replace("{tmp}", str(tmp_path)) in one_error_line(err)
    assert not out.exists() and not (tmp_path / "missing").exists()


@pytest.mark.slow
def test_junit_and_plot_inside_the_new_run_dir_are_fine(tmp_path):
    out = tmp_path / "run"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "20", "--every", "10", "--out", str(out), *SMALL,
                             "--junit", str(out / "j.xml"), "--plot", str(out / "p.png")])
    assert rc == 0, stdout
    assert (out / "j.xml").exists() and (out / "p.png").exists()


@pytest.mark.parametrize("meta,vocab,needle", [
    (None, "50", "the vocabulary is too small: the file holds token id 85, --vocab-size is 50; "
                 "give at least --vocab-size 86"),
    ({"vocab_size": 10**12}, None, "vocab_size 1000000000000 is not a whole number in 1..65536"),
    (None, "70000", "--vocab-size 70000: must be in 1..65536"),
])
def test_vocabulary_problems_are_exit_2(tmp_path, meta, vocab, needle):
    tokens = np.full(8000, 3, "<u2")
    tokens[500] = 85
    tokens.tofile(tmp_path / "train.bin")
    if meta is not None:
        with open(tmp_path / "meta.pkl", "wb") as f:
            pickle.dump(meta, f)
    args = ["--data", str(tmp_path / "train.bin")] + (["--vocab-size", vocab] if vocab else [])
    res = run(soak_cmd(tmp_path / "run", *args))
    assert res.returncode == exitcodes.USAGE and needle in one_error_line(res.stderr)
    assert "corrupt" not in res.stderr and not (tmp_path / "run").exists()


# -- rows 10 to 13: signals, hangs -----------------------------------------------------------------

@pytest.mark.slow
def test_stopped_worker_then_three_sigints_escalate_and_the_summary_is_written(tmp_path):
    out = tmp_path / "run"
    proc = start(out)
    pid = wait_for_worker(out, min_step=5)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.5)
    for _ in range(3):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == exitcodes.INTERRUPTED, stderr
    assert "Traceback" not in stderr
    s = summary(out)
    assert s["status"] == "interrupted" and s["interrupted_by"] == "SIGINT" and s["signals"] >= 1
    assert s["last_step"] == whole_lines(out / "metrics.jsonl")[-1]["step"] >= 5
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not workers_of(out)


@pytest.mark.parametrize("delay", [0.15, 0.2, 1.5])
def test_early_sigterm_leaves_no_worker_and_no_running_summary(tmp_path, delay):
    out = tmp_path / "run"
    proc = start(out)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert "Traceback" not in stderr
    time.sleep(0.5)
    assert not workers_of(out)
    if (out / "summary.json").exists():  # handlers were in place: the summary says so
        assert proc.returncode == exitcodes.INTERRUPTED
        assert summary(out)["status"] == "interrupted"
    else:  # SIGTERM came while Python was still importing: nothing was created or spawned
        assert proc.returncode == -signal.SIGTERM and not out.exists()


def test_step_timeout_kills_a_hung_worker_with_exit_3(tmp_path):
    out = tmp_path / "run"
    proc = start(out, "--step-timeout", "3")
    pid = wait_for_worker(out)
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    stdout, stderr = proc.communicate(timeout=120)
    waited = time.monotonic() - t0
    assert proc.returncode == exitcodes.CRASHED, stderr
    crash = summary(out)["crash"]
    assert crash["exc_type"] == "StepTimeout" and crash["signal"] == "SIGKILL"
    assert f"after step {summary(out)['last_step']} (--step-timeout 3)" in crash["message"]
    assert "no step for" in stdout and waited < 60


@pytest.mark.slow
def test_step_timeout_is_silent_on_a_healthy_run(tmp_path):
    res = run(soak_cmd(tmp_path / "run", "--step-timeout", "30", steps=100, every=50))
    assert res.returncode == 0 and summary(tmp_path / "run")["crash"] is None


def test_worker_flushes_held_metrics_on_sigterm(tmp_path):
    """The worker itself, on its protocol pipe: after SIGTERM it sends the steps it
    held (up to 200 or 1 s of them) and exits 143."""
    from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig
    from optcheck.drivers.protocol import read_messages

    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                     data=DataConfig(val_every=0, batch_size=8),
                     run=RunConfig(steps=100_000, every=100_000, work_dir=str(tmp_path)))
    (tmp_path / "config.json").write_text(cfg.to_json())
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "optcheck.pytorch.worker", "--config", str(tmp_path / "config.json"),
                             "--stream-fd", str(w)], pass_fds=(w,), stderr=subprocess.PIPE)
    os.close(w)
    seen, after = 0, []
    with os.fdopen(r) as stream:
        msgs = read_messages(stream)
        for msg in msgs:
            if msg["type"] == "metrics":
                seen = msg["steps"][-1]
                break
        time.sleep(0.4)  # steps accumulate in the worker, not yet sent
        proc.send_signal(signal.SIGTERM)
        after = [m for m in msgs if m["type"] == "metrics"]
    assert proc.wait(timeout=30) == 143
    assert after and after[-1]["steps"][-1] > seen
    assert after[0]["steps"][0] == seen + 1  # nothing lost in between



def test_soak_killed_with_sigkill_leaves_metrics_readable_to_the_last_batch(tmp_path):
    """metrics.jsonl is written a batch at a time (the worker's batches: 200 steps or
    1 s): a supervisor killed with SIGKILL (no clean-up code runs) leaves every line
    up to its last written batch readable, steps 1..N with none missing."""
    from optcheck.report.reader import RunReader

    out = tmp_path / "run"
    proc = start(out, "--no-hazards")
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or metrics.stat().st_size < 2000):
        time.sleep(0.2)  # at least one batch written
    workers = workers_of(out)
    proc.kill()
    proc.communicate(timeout=30)
    for w in workers:  # its pipe's other end is gone: it fails on its next send, or is killed here
        try:
            w.wait(timeout=30)
        except psutil.TimeoutExpired:
            w.kill()
    reader = RunReader(out)
    steps = [m["step"] for m in reader.metrics]
    assert len(steps) >= 2 and steps == list(range(1, len(steps) + 1))
    assert all(isinstance(m["loss"], float) and m["step_time_s"] > 0 for m in reader.metrics)
    assert [n for n in reader.notes() if "metrics.jsonl" in n and "truncated last line" not in n] == []
    assert summary(out)["status"] == "running"  # on disk: nothing closed the run
    assert reader.summary["status"] == "ended without closing"  # read back: its writer is gone (issue 26)
    assert reader.summary["last_step"] == steps[-1]

# -- rows 4, 5, 8, 9: compare and check on incomplete runs and hostile records -----------------------

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    res = run(soak_cmd(out, steps=200, every=50))
    assert res.returncode == 0, res.stderr
    return out


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".optcheck*", "work"))
    return dst


def set_summary(out: Path, **fields) -> None:
    s = summary(out)
    s.update(fields)
    (out / "summary.json").write_text(json.dumps(s))


@pytest.mark.parametrize("status", ["crashed", "interrupted", "running", "stopped"])
def test_compare_never_passes_an_incomplete_run(tmp_path, finished_run, status):
    b = copy_run(finished_run, tmp_path / "b")
    metrics = (b / "metrics.jsonl").read_text().splitlines()[:120]
    (b / "metrics.jsonl").write_text("\n".join(metrics) + "\n")
    set_summary(b, status=status, last_step=120)
    res = run([*OPTCHECK, "compare", str(finished_run), str(b)])
    assert res.returncode == exitcodes.FINDINGS, res.stdout
    # a "running" summary whose writer is gone (no lock here) reads back as ended without closing (issue 26)
    said = "ended without closing" if status == "running" else status
    assert f"FAIL (exit 1): cannot pass an incomplete run: B: {said} at step 120 of 200" in res.stdout
    assert "B: shorter than the other run: 120 of 200 steps; 120 common steps compared" in res.stdout
    assert "PASS" not in res.stdout


def test_compare_fails_a_shorter_run_even_if_it_says_clean(tmp_path, finished_run):
    b = copy_run(finished_run, tmp_path / "b")
    (b / "metrics.jsonl").write_text("\n".join((b / "metrics.jsonl").read_text().splitlines()[:150]) + "\n")
    rc, stdout, _ = run_cli(["compare", str(finished_run), str(b)])
    assert rc == exitcodes.FINDINGS and "shorter than the other run: 150 of 200 steps" in stdout
    rc, stdout, _ = run_cli(["compare", str(finished_run), str(finished_run)])
    assert rc == exitcodes.CLEAN and "PASS (exit 0)" in stdout and "200 common steps compared" in stdout


@pytest.mark.parametrize("opt,value", [("--tolerance", "nan"), ("--atol", "nan"), ("--tolerance", "inf"),
                                       ("--atol", "-inf")])
def test_compare_non_finite_tolerance_is_bad_input(finished_run, opt, value):
    rc, _, err = run_cli(["compare", str(finished_run), str(finished_run), opt, value])
    assert rc == exitcodes.USAGE and f"{opt} {float(value)}: must be a finite number >= 0" in err


def test_nan_loss_in_one_run_only_is_a_divergence(tmp_path, finished_run):
    b = copy_run(finished_run, tmp_path / "b")
    recs = whole_lines(b / "metrics.jsonl")
    (b / "metrics.jsonl").write_text("".join(json.dumps({**r, "loss": "nan" if r["step"] >= 2 else r["loss"]}) + "\n"
                                             for r in recs))
    rc, stdout, _ = run_cli(["compare", str(finished_run), str(b)])
    assert rc == exitcodes.FINDINGS and "OC601" in stdout and "one run's loss is not finite" in stdout


@pytest.mark.parametrize("path,value,needle", [
    ("groups", [1], "snapshots.jsonl:3: groups[0]: 1 is not of type 'object'"),
    ("groups", [{"index": 0, "members": []}, 2], "snapshots.jsonl:3: groups[1]: 2 is not of type 'object'"),
    ("memory", [1], "snapshots.jsonl:3: memory: [1] is not of type 'object', 'null'"),
    ("state", ["x"], "snapshots.jsonl:3: state[0]: 'x' is not of type 'object'"),
    ("state.0.tensors", [1], "snapshots.jsonl:3: state[0].tensors: [1] is not of type 'object'"),
    ("params.0.version", "x", "snapshots.jsonl:3: params[0].version: 'x' is not of type 'integer', 'null'"),
    ("params.0.ref", "x", "snapshots.jsonl:3: params[0].ref: 'x' is not of type 'integer'"),
    ("groups.0.members.1.ref", "x", "groups[0].members[1].ref: 'x' is not of type 'integer'"),
    ("events", [7], "snapshots.jsonl:3: events[0]: 7 is not of type 'object'"),
])
def test_check_names_file_line_and_field_of_a_wrong_type(tmp_path, finished_run, path, value, needle):
    out = copy_run(finished_run, tmp_path / "r")
    lines = (out / "snapshots.jsonl").read_text().splitlines()
    rec = json.loads(lines[2])
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node = rec
    for p in parents:
        node = node[p]
    node[last] = value
    lines[2] = json.dumps(rec)
    (out / "snapshots.jsonl").write_text("\n".join(lines) + "\n")
    res = run([*OPTCHECK, "check", str(out)])
    assert res.returncode == exitcodes.USAGE and needle in one_error_line(res.stderr)
    assert "(schema: optcheck/schemas/snapshot-1.json)" in res.stderr and res.stdout == ""


def test_check_reads_past_garbage_torn_and_deeply_nested_lines(tmp_path, finished_run):
    out = copy_run(finished_run, tmp_path / "r")
    lines = (out / "snapshots.jsonl").read_text().splitlines()
    n = len(lines)
    lines.insert(2, "[" * 100_000)
    lines.insert(4, lines[1][: len(lines[1]) // 3] + lines[3][100:])  # two writers' lines torn into one
    lines.insert(5, "\x00\xff garbage")
    (out / "snapshots.jsonl").write_text("\n".join(lines) + "\n")
    res = run([*OPTCHECK, "check", str(out)])
    assert res.returncode == exitcodes.CLEAN, res.stderr
    assert f"{n} snapshots, 0 finding(s)" in res.stdout and "Traceback" not in res.stderr
    notes = [x for x in res.stderr.splitlines() if x.startswith("optcheck: note:")]
    assert [x.split(":")[3] for x in notes] == ["3", "5", "6"]
    assert "nested too deeply" in notes[0] and all("the rest was read" in x for x in notes)


def test_check_junit_target_is_checked_before_reading(finished_run, tmp_path):
    rc, stdout, err = run_cli(["check", str(finished_run), "--junit", str(tmp_path / "missing" / "j.xml")])
    assert rc == exitcodes.USAGE and "--junit" in err and "does not exist" in err and stdout == ""
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("fname,content,needle", [
    ("summary.json", "[1, 2]", "summary.json: (the record): a summary is a JSON object, not a list"),
    ("summary.json", '{"status": 3}', "summary.json: status: 3 is not of type 'string'"),
    ("findings.jsonl", "[1]\n", "findings.jsonl:1: (the record): [1] is not of type 'object'"),
    ("findings.jsonl", '{"code": "OC101", "subjects": "x"}\n', "findings.jsonl:1: subjects: 'x' is not of type"),
    ("metrics.jsonl", '{"step": 1, "loss": [2]}\n', "metrics.jsonl:1: loss: [2] is not of type 'number', 'null'"),
    ("metrics.jsonl", '{"step": 1, "loss": "lots"}\n', "metrics.jsonl:1: loss: 'lots' does not match"),
])
def test_compare_names_file_line_and_field(tmp_path, finished_run, fname, content, needle):
    b = copy_run(finished_run, tmp_path / "b")
    (b / fname).write_text(content)
    res = run([*OPTCHECK, "compare", str(finished_run), str(b)])
    assert res.returncode == exitcodes.USAGE and needle in one_error_line(res.stderr)
