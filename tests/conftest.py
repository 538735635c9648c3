"""Shared test set-up: paths, a small soak configuration, CLI helpers, and how a run is
spread over pytest-xdist workers.

Parallel runs (``addopts = "-n auto --dist loadgroup"`` in pyproject.toml): a run of the
whole tree (``python3 -m pytest``, or any folder) gets one xdist worker per core, at most
:data:`MAX_WORKERS`; a run that names test files or node ids (``python3 -m pytest
tests/unit/test_x.py -k y``) runs in this process, since starting workers that import torch
costs more than a few tests take. ``OPTCHECK_TEST_WORKERS=N`` (or ``-n N``) overrides both.
Each test file is one xdist group (its module-scoped fixtures, e.g. the soaks of
:func:`run_clis`, run once, on one worker); the ``torchrun`` modules share one group, so two
2-rank jobs never run at the same time. Each worker builds the .NET test loop in its own
folder (``$OPTCHECK_TESTLOOP_CACHE``, ``tests/dotnet/build.py``).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Workers of a full run: one per core, at most this many (each soak's worker keeps a core busy).
MAX_WORKERS = 4
#: Test files run on the same xdist worker, one after the other (each starts 2-rank torchrun jobs).
SERIAL_GROUPS = {"torchrun": ("tests/distributed/test_distributed_monitor.py",
                              "tests/distributed/test_distributed_soak.py",
                              "tests/distributed/test_distributed_lifetime.py",
                              "tests/distributed/test_next_failure_ranks.py",
                              "tests/distributed/test_fsdp1.py",
                              "tests/distributed/test_deepspeed.py",
                              "tests/integration/test_run_torchrun.py")}

# an internal error in a Monitor hook fails the test (and every process a test starts) instead of
# becoming a note that only says the hook's checks were skipped (optcheck/pytorch/guard.py)
os.environ.setdefault("OPTCHECK_RAISE_INTERNAL", "1")

# Bytecode caches (git-ignored __pycache__/) are written as a plain Python writes them: with
# PYTHONDONTWRITEBYTECODE set, as on this project's machines, each xdist worker rewrote every test
# module's asserts again and every Python process a test starts (hundreds of soaks, workers and
# scripts) compiled optcheck from source again (issue 48 point 9, docs/guide/testing.md).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and "OPTCHECK_TESTLOOP_CACHE" not in os.environ:
    # the .NET test loop is built per source hash; each worker compiles into its own folder
    os.environ["OPTCHECK_TESTLOOP_CACHE"] = os.path.join(tempfile.gettempdir(), "optcheck-testloop", _WORKER)
if _WORKER and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # an xdist worker starts with SIGINT ignored, and the processes it starts would inherit that: a
    # worker is the plain pytest process again (Ctrl-C raises KeyboardInterrupt, children get SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: Tests between two full collections of a worker's frozen heap (:func:`_frozen_heap`).
REFREEZE_EVERY = 100
_since_full = [0]


@pytest.fixture(autouse=True)
def _frozen_heap():
    """Each test starts with this process's heap frozen (``gc.freeze()``, after a collection of what the
    tests before it left unfrozen), as a program that froze its set-up runs: a Monitor's census then
    walks only what the test made (``optcheck/pytorch/census.py``: a program's own freeze is left as
    it is) instead of every object of a worker that imported torch, transformers and lightning
    (0.3-0.8 s per Monitor, about half of the in-process tests' time: issue 48 point 9). The census's
    path for a process nobody froze runs in every subprocess a test starts and in
    tests/unit/test_census.py, which unfreezes first. Every :data:`REFREEZE_EVERY` tests the heap is
    unfrozen and collected once, so cyclic garbage of earlier tests is freed."""
    _since_full[0] += 1
    if _since_full[0] >= REFREEZE_EVERY:
        _since_full[0] = 0
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True)
def _no_write_log_mode_left_behind():
    """A test that leaves optcheck's write-log mode (``optcheck/pytorch/hazards/writes.py``) on this
    thread's torch-function mode stack fails at teardown, naming itself; the mode is taken out, so
    the tests after it on this worker start clean (left there, every later ``torch.compile`` would
    trace it)."""
    yield
    writes = sys.modules.get("optcheck.pytorch.hazards.writes")
    if writes is None:
        return
    from torch.overrides import _get_current_function_mode_stack

    left = [m for m in _get_current_function_mode_stack() if isinstance(m, writes.WriteWatch)]
    if left:
        import torch

        kept = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())][::-1]
        for m in kept:
            if not isinstance(m, writes.WriteWatch):
                torch._C._push_on_torch_function_stack(m)
        pytest.fail(f"optcheck's write-log mode left on the torch-function mode stack ({len(left)})", pytrace=False)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: 0 (this process) for named files or node ids, else one worker per core."""
    env = os.environ.get("OPTCHECK_TEST_WORKERS")
    if env:
        return int(env)
    named = [a.split("::", 1)[0] for a in config.args]
    if config.args_source == pytest.Config.ArgsSource.ARGS and named and \
            all("::" in a or Path(n).is_file() for a, n in zip(config.args, named)):
        return 0
    n = min(_cores(), MAX_WORKERS)
    return n if n >= 2 else 0


#: Parametrized matrices the default run thins (issue 48, docs/guide/testing.md): of each test
#: function named here, the default run keeps every k-th case in collection order (the first, the
#: (k+1)-th, ...) and marks the others ``slow`` (``python3 -m pytest -m slow`` runs them).
THINNED = {
    "tests/integration/test_monitor_optimizers.py::test_every_optimizer_and_implementation_is_silent": 3,
    "tests/integration/test_monitor_optimizers.py::test_warmup_from_zero_is_silent": 4,
    "tests/integration/test_monitor_optimizers.py::test_bf16_parameters_are_silent": 3,
    "tests/integration/test_optimizer_zoo_thirdparty.py::test_clean_loop_is_silent": 4,
    "tests/integration/test_monitor_zoo.py::test_clean_loop_has_no_finding": 2,
    "tests/integration/test_monitor_memory.py::test_clean_loop_is_silent": 2,
    "tests/unit/test_state_read.py::test_wrappers_and_duck_typed_optimizers_are_watched": 2,
    "tests/integration/test_checkpoint_inputs.py::test_a_checkpoint_input_written_before_the_recompute_is_found_at_its_step": 2,
    "tests/integration/test_checkpoint_inputs.py::test_clean_checkpointed_loops_are_silent_and_unchanged": 2,
    "tests/integration/test_monitor_fast_paths.py::test_dynamo_traces_and_recompiles_none_of_optcheck_under_torch_compile": 2,
    "tests/integration/test_monitor_own_cost.py::test_the_own_timer_counts_the_probes_step_hooks_and_the_clip": 2,
    "tests/integration/test_monitor_api.py::test_wrapped_optimizer_is_watched_clean_and_bug_found": 2,
    "tests/integration/test_host_reads.py::test_the_soak_worker_reads_nothing_between_snapshots": 2,
    "tests/integration/test_monitor_parametrize.py::test_parametrization_before_the_optimizer_is_silent": 2,
    "tests/integration/test_integrations_lightning.py::test_clean_runs_have_no_findings": 2,
    "tests/integration/test_reliability.py::test_compare_never_passes_an_incomplete_run": 2,
    "tests/integration/test_inplace_writer.py::test_the_writer_is_named_wherever_it_writes": 2,
    "tests/integration/test_bridge_worker.py::test_a_nan_gradient_is_oc501_at_its_step": 2,
    "tests/integration/test_soak_lifecycle.py::test_signal_to_optcheck_flushes_and_writes_the_summary": 2,
    "tests/integration/test_monitor_unsaved.py::test_torch_save_while_watched_loads_with_torch_load_here_and_without_optcheck": 2,
    "tests/integration/test_run_command.py::test_a_signal_reaches_the_command_and_the_record_is_finished": 2,
    "tests/integration/test_bridge_worker.py::test_clean_soak_writes_the_run_directory_and_check_reruns_the_rules": 2,
    "tests/integration/test_monitor_plain_loop.py::test_a_bad_argument_is_one_valueerror_line_and_the_folder_stays_free": 2,
    "tests/integration/test_reader_shapes.py::test_an_unreadable_record_file_is_one_line": 2,
    "tests/integration/test_hazards_arming.py::test_a_one_off_cut_is_what_auto_misses_and_always_finds": 2,
    # the .NET stand-in's twins of what the real-TorchSharp tier checks in the default run
    "tests/integration/test_torchsharp_instep.py::test_a_bug_inside_the_users_step_is_named_at_that_step_before_the_exception": 2,
    "tests/integration/test_soak_memory.py::test_standin_without_dispose_scope_is_named_at_the_next_snapshot": 2,
}


def _path(item) -> str:
    """The test file of ``item``, relative to the checkout (as given where it lies outside)."""
    try:
        return Path(str(item.path)).resolve().relative_to(ROOT).as_posix()
    except ValueError:  # a test file outside the checkout
        return str(item.path)


def _thin(items) -> None:
    """Mark ``slow`` the cases :data:`THINNED` leaves out of the default run."""
    seen: dict[str, int] = {}
    for item in items:
        if getattr(item, "callspec", None) is None:
            continue
        key = f"{_path(item)}::{item.originalname}"
        k = THINNED.get(key)
        if k:
            i = seen[key] = seen.get(key, -1) + 1
            if i % k:
                item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The thinned matrices' other cases marked ``slow`` (:data:`THINNED`); one xdist group per
    test file (``--dist loadgroup``), the torchrun files in one."""
    _thin(items)
    if not hasattr(config, "workerinput"):  # not an xdist worker
        return
    group_of = {f: g for g, files in SERIAL_GROUPS.items() for f in files}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = _path(item)
            item.add_marker(pytest.mark.xdist_group(group_of.get(path, path)))

def pytest_terminal_summary(terminalreporter):
    """One line on the real-TorchSharp tier (marker ``torchsharp_real``, tests/torchsharp_real/) when the session
    collected any of it: how many of its tests ran and how many skipped, and why. ``.ci/run`` fails a run in
    which none ran where real TorchSharp is there."""
    outcomes: dict[str, str] = {}
    reasons: set[str] = set()
    for key in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(key, []):
            if "torchsharp_real" not in getattr(rep, "keywords", {}) or (key == "passed" and rep.when != "call"):
                continue
            outcomes.setdefault(rep.nodeid, "failed" if key == "error" else key)
            if key == "skipped" and isinstance(rep.longrepr, tuple):
                reasons.add(str(rep.longrepr[2]).removeprefix("Skipped: "))
    if not outcomes:
        return
    n = {k: sum(v == k for v in outcomes.values()) for k in ("passed", "failed", "skipped")}
    why = f": {'; '.join(sorted(reasons))}" if reasons else ""
    terminalreporter.write_line(f"torchsharp_real: {n['passed'] + n['failed']} ran ({n['passed']} passed, "
                                f"{n['failed']} failed), {n['skipped']} skipped{why}")


# A model small enough for a few hundred steps in seconds on one thread.
SMALL = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
         "--val-every", "100"]


@pytest.fixture
def small_args():
    return list(SMALL)


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield


@pytest.fixture(autouse=True)
def _no_monitor_left_open():
    """A test whose loop died inside an optcheck.Monitor must not leave its hooks to the next test."""
    yield
    mod = sys.modules.get("optcheck.pytorch.monitor_hooks")
    if mod is not None:
        for mon in list(mod._ACTIVE):
            mon.close()
        assert not mod._ACTIVE and not mod._ORIG


def start_long_soak(out: Path, snapshots: int = 3, timeout_s: float = 90.0):
    """Start ``optcheck soak`` (100,000 steps of the small model, a snapshot every 20)
    in a subprocess and return it once ``out`` holds ``snapshots`` snapshots, with
    the worker's pid (from the hello event)."""
    import json
    import subprocess
    import time

    proc = subprocess.Popen([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "100000", "--every", "20",
                             "--out", str(out), *SMALL], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + timeout_s
    snaps = out / "snapshots.jsonl"
    while time.time() < deadline and not (snaps.exists() and len(snaps.read_text().splitlines()) >= snapshots):
        time.sleep(0.2)
    hello = next(line for line in (out / "events.jsonl").read_text().splitlines() if '"hello"' in line)
    return proc, json.loads(hello)["pid"]


def run_cli(args: list[str], cwd: str | os.PathLike | None = None):
    """Invoke the optcheck CLI in-process through click's CliRunner; returns (exit_code, stdout, stderr)."""
    from click.testing import CliRunner

    from optcheck.cli import cli

    runner = CliRunner()
    res = runner.invoke(cli, args, catch_exceptions=False, standalone_mode=False)
    rc = res.return_value if isinstance(res.return_value, int) else res.exit_code
    return rc, res.stdout, res.stderr


def run_clis(commands: dict, jobs: int | None = None) -> dict[str, tuple[int, str, str]]:
    """Run independent optcheck commands (``{name: args}`` or ``{name: (args, extra
    environment)}``, e.g. a module's soaks) as
    ``python -m optcheck <args>`` subprocesses, up to ``jobs`` at a time (default: the
    CPU count, at least 2): a soak's worker keeps one core busy, so on two cores two
    soaks side by side take about the time of one. Returns ``{name: (exit code, stdout,
    stderr)}``; each command's result is the same as run alone (a soak's training is
    deterministic for its seed and thread count, whatever runs beside it)."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def one(command) -> tuple[int, str, str]:
        args, extra = command if isinstance(command, tuple) else (command, {})
        p = subprocess.run([sys.executable, "-m", "optcheck", *args], capture_output=True, text=True,
                           env={**env, **extra}, timeout=1800)
        return p.returncode, p.stdout, p.stderr

    with ThreadPoolExecutor(max_workers=jobs or max(2, os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(one, args) for name, args in commands.items()}
        return {name: f.result() for name, f in futures.items()}
