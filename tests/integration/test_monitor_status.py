"""A Monitor's summary says what happened to the loop it watched (issue 26):
interrupted (KeyboardInterrupt, SIGINT, SIGTERM: the user's handler still runs),
record-failed (a full disk: reported, never raised into ``optimizer.step()``,
training goes on), crashed (an exception, the loop's thread dying), clean only on
a normal close (``sys.exit(0)`` inside ``with`` too); an ``os.fork()`` child never
writes to its parent's run; a process that dies without closing is reported by
every reader as ended without closing, with the last step recorded, and a fatal
signal's Python stack is in ``fatal.log``.

Real processes, real signals, real files; the full disk is ``RLIMIT_FSIZE``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import os, sys, time, signal, threading, json
import torch
torch.set_num_threads(1)
import optcheck
OUT = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(0)
X, Y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)

def step(i):
    loss = torch.nn.functional.mse_loss(model(X), Y)
    loss.backward()
    opt.step()
    opt.zero_grad()

def ready(i):  # tell the test the loop is under way
    if i == 5:
        open(OUT + ".ready", "w").close()
"""


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def _script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "loop.py"
    p.write_text(PRELUDE + textwrap.dedent(body))
    return p


def _run(tmp_path: Path, body: str, **kw) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, str(_script(tmp_path, body)), str(out)], capture_output=True, text=True,
                         env=_env(), timeout=600, **kw)
    return res, out


def _start(tmp_path: Path, body: str) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(_script(tmp_path, body)), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env())
    ready = Path(str(out) + ".ready")
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the loop ended before its 5th step: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    return proc, out


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def _metric_steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]


LOOP_FOREVER = """
mon = optcheck.Monitor(model, opt, every=5, out=OUT)
i = 0
while True:
    i += 1
    step(i)
    ready(i)
    time.sleep(0.01)
"""


def test_keyboard_interrupt_inside_with_is_interrupted_not_clean(tmp_path):
    res, out = _run(tmp_path, """
        try:
            with optcheck.Monitor(model, opt, every=5, out=OUT) as mon:
                for i in range(1, 30):
                    step(i)
                    if i == 12:
                        raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        print(mon.exit_code)
    """)
    assert res.returncode == 0, res.stderr
    s = _summary(out)
    assert (s["status"], s["exit_code"], s["last_step"]) == ("interrupted", 130, 12)
    assert res.stdout.split() == ["130"]


@pytest.mark.slow
def test_sigint_to_a_loop_without_with_is_interrupted(tmp_path):
    proc, out = _start(tmp_path, LOOP_FOREVER)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert "KeyboardInterrupt" in err  # Python's own handler still ran after ours
    s = _summary(out)
    assert s["status"] == "interrupted" and s["exit_code"] == 130 and s["interrupted_by"] == "SIGINT"
    assert s["last_step"] == max(_metric_steps(out))


def test_sigterm_is_interrupted_and_the_process_still_dies_by_it(tmp_path):
    proc, out = _start(tmp_path, LOOP_FOREVER)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGTERM  # the default action, as without optcheck
    s = _summary(out)
    assert s["status"] == "interrupted" and s["interrupted_by"] == "SIGTERM"
    assert s["last_step"] == max(_metric_steps(out)) >= 5  # the summary is not left behind the records
    assert not (out / ".optcheck.lock").exists()


@pytest.mark.slow
def test_sigterm_chains_to_the_users_handler_which_keeps_training(tmp_path):
    proc, out = _start(tmp_path, """
        stop = []
        signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))  # the user's graceful stop
        mon = optcheck.Monitor(model, opt, every=5, out=OUT)
        i = 0
        while not stop:
            i += 1
            step(i)
            ready(i)
            time.sleep(0.01)
        for _ in range(7):  # the user's handler lets a few more steps run, then closes
            i += 1
            step(i)
        mon.close()
        print("closed", i)
    """)
    proc.send_signal(signal.SIGTERM)
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    last = int(stdout.split()[-1])
    s = _summary(out)
    assert (s["status"], s["exit_code"], s["last_step"]) == ("interrupted", 130, last)


def test_full_disk_is_record_failed_and_training_goes_on(tmp_path):
    import resource

    res, out = _run(tmp_path, """
        import warnings
        warnings.simplefilter("always")
        mon = optcheck.Monitor(model, opt, every=1, out=OUT)
        for i in range(1, 401):
            step(i)           # a RecordError here would end the loop
        s = mon.close()
        print(json.dumps({"steps": i, "status": s["status"], "exit": s["exit_code"]}))
    """, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (70_000, resource.RLIM_INFINITY)))
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.splitlines()[-1])
    assert got == {"steps": 400, "status": "record-failed", "exit": 4}
    assert "training goes on" in res.stderr and "Traceback" not in res.stderr
    s = _summary(out)
    assert s["status"] == "record-failed" and s["exit_code"] == 4 and "File too large" in s["record_error"]
    assert s["last_step"] == 400


def _ends_at(at: int, statement: str) -> str:
    """A ``with Monitor`` loop whose step ``at`` runs ``statement``."""
    return textwrap.dedent(f"""
        with optcheck.Monitor(model, opt, every=5, out=OUT):
            for i in range(1, 30):
                step(i)
                if i == {at}:
                    {statement}
    """)


def test_an_exception_is_crashed_and_the_losses_before_it_are_kept(tmp_path):
    """Ended at step 12 with a snapshot every 5: steps 11 and 12 have their losses in
    metrics.jsonl (issue 35: it ended at step 10, the last losses dropped at close)."""
    res, out = _run(tmp_path, _ends_at(12, 'raise RuntimeError("user bug at 12")'))
    assert res.returncode == 1 and "user bug at 12" in res.stderr
    s = _summary(out)
    assert s["status"] == "crashed" and s["exit_code"] == 3 and s["crash"]["message"] == "user bug at 12"
    assert _metric_steps(out) == list(range(1, 13)) and s["last_step"] == 12
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["loss"] == s["loss_last"]


@pytest.mark.slow
def test_sys_exit_0_inside_with_is_clean_and_sys_exit_1_is_crashed(tmp_path):
    res, out = _run(tmp_path, _ends_at(10, "sys.exit(0)"))
    assert res.returncode == 0, res.stderr
    s = _summary(out)
    assert (s["status"], s["exit_code"], s["last_step"]) == ("clean", 0, 10)
    res, out = _run(tmp_path, "import shutil; shutil.rmtree(OUT, ignore_errors=True)\n" + _ends_at(10, "sys.exit(1)"))
    assert res.returncode == 1
    assert _summary(out)["status"] == "crashed"


@pytest.mark.slow
def test_a_loop_that_dies_in_its_thread_is_crashed(tmp_path):
    res, out = _run(tmp_path, """
        def train():
            mon = optcheck.Monitor(model, opt, every=5, out=OUT)
            for i in range(1, 30):
                step(i)
                if i == 11:
                    raise ValueError("died in the thread")
        t = threading.Thread(target=train)
        t.start(); t.join()
        time.sleep(0.2)
    """)
    assert "died in the thread" in res.stderr  # the previous threading.excepthook still reports it
    s = _summary(out)
    assert s["status"] == "crashed" and s["crash"]["exc_type"] == "ValueError" and s["last_step"] == 11
    assert _metric_steps(out) == list(range(1, 12))  # the losses of steps 11 (and 10) kept at the crash


@pytest.mark.slow
def test_a_forked_child_never_writes_to_the_parents_run(tmp_path):
    res, out = _run(tmp_path, """
        mon = optcheck.Monitor(model, opt, every=2, out=OUT)
        for i in range(1, 6):
            step(i)
        pid = os.fork()
        if pid == 0:  # the child trains on and exits normally (atexit runs): nothing of it in the parent's run
            for i in range(6, 20):
                step(i)
            mon.close()
            sys.exit(0)
        os.waitpid(pid, 0)
        assert os.path.exists(os.path.join(OUT, ".optcheck.lock")), "the child removed the parent's lock"
        assert json.load(open(os.path.join(OUT, "summary.json")))["status"] == "running"
        for i in range(6, 11):
            step(i)
        s = mon.close()
        print(s["status"], s["last_step"])
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ["clean", "10"]
    steps = _metric_steps(out)
    assert steps == sorted(set(steps)) and max(steps) == 10  # no duplicate step, none of the child's
    assert _summary(out)["last_step"] == 10


def _killed_run(tmp_path) -> Path:
    proc, out = _start(tmp_path, LOOP_FOREVER)
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=120)
    assert _summary(out)["status"] == "running"
    return out


def test_sigkill_is_reported_as_ended_without_closing_by_every_reader(tmp_path):
    out = _killed_run(tmp_path)
    last = max(_metric_steps(out))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "optcheck", *args], capture_output=True, text=True,
                              env=_env(), cwd=tmp_path, timeout=300)

    from optcheck.report.reader import read_summary

    s = read_summary(out)
    assert s["status"] == "ended without closing" and s["exit_code"] == 3
    assert "ended without closing" in s["crash"]["message"]
    assert s["last_step"] == last and s["crash"]["step"] == last
    for args in (["history", str(out)], ["compare", str(out), str(out)]):
        res = cli(*args)
        assert "Traceback" not in res.stderr, (args, res.stderr)
        assert "ended without closing" in res.stdout + res.stderr, (args, res.stdout, res.stderr)
    for args in (["baseline", str(out), str(out)], ["compare", str(out), str(out), "--json"]):
        res = cli(*args)
        assert "Traceback" not in res.stderr and res.returncode != 0, (args, res.stderr)
        assert "ended without closing" in res.stdout + res.stderr, (args, res.stdout, res.stderr)
    res = cli("check", str(out))
    assert "Traceback" not in res.stderr and "ended without closing" in res.stderr


@pytest.mark.slow
def test_a_fatal_signal_leaves_its_python_stack_in_fatal_log(tmp_path):
    res, out = _run(tmp_path, """
        mon = optcheck.Monitor(model, opt, every=5, out=OUT)
        for i in range(1, 8):
            step(i)
        def kernel_of_a_fused_optimizer():
            os.kill(os.getpid(), signal.SIGSEGV)
        kernel_of_a_fused_optimizer()
    """)
    assert res.returncode == -signal.SIGSEGV
    log = (out / "fatal.log").read_text()
    assert "Segmentation fault" in log and "kernel_of_a_fused_optimizer" in log


def test_a_clean_close_leaves_no_fatal_log_and_is_clean(tmp_path):
    res, out = _run(tmp_path, """
        with optcheck.Monitor(model, opt, every=5, out=OUT):
            for i in range(1, 21):
                step(i)
    """)
    assert res.returncode == 0, res.stderr
    assert not (out / "fatal.log").exists()
    s = _summary(out)
    assert (s["status"], s["exit_code"], s["last_step"]) == ("clean", 0, 20)
