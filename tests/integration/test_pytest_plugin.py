"""``pytest --optcheck`` (``optcheck/integrations/pytest_plugin.py``): real ``python -m pytest``
runs, as subprocesses, on a test file written to ``tmp_path`` that trains a tiny torch model.

The file's tests: a clean loop (passes), the same loop with a layer replaced after the
optimizer exists (fails with OC101's text, as ``optcheck check`` prints it, at the test's
``opt.step()`` line), a module the optimizer holds but the forward never uses (OC202, a
warning: fails by default, passes under ``@pytest.mark.optcheck(fail_on="error")``), an
optimizer swapped mid-loop (OC209, info: passes by default, fails under ``fail_on="info"``),
the replaced layer under ``off=True`` (passes), a test with no optimizer (not listed), a test
that fails by its own assertion (its failure kept, the findings beside it), an in-place write
to a tensor saved for backward (stopped, the op and line named) and a bad marker (its set-up
fails in one line). Each run's outcomes are read from ``--junitxml``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "optcheck.integrations.pytest_plugin"

TESTS = '''
import pytest
import torch

torch.set_num_threads(1)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        self.spare = torch.nn.Linear(2, 2)  # trained by the optimizer only if the forward uses it

    def forward(self, x, spare=True):
        y = self.body(x)
        return self.spare(y) if spare else y


def train(steps=12, replace_at=None, spare=True, switch_at=None):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        if step == replace_at:
            model.body[2] = torch.nn.Linear(8, 2)  # the optimizer still holds the old layer
        if step == switch_at:
            opt = torch.optim.SGD(model.parameters(), lr=0.01)  # another optimizer, same parameters
        loss = model(torch.randn(8, 4), spare).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()  # STEP LINE
    return loss.item()


def test_clean():
    assert train() < 10


def test_replaced_layer():
    assert train(replace_at=6) < 10


@pytest.mark.optcheck(off=True)
def test_replaced_layer_off():
    assert train(replace_at=6) < 10


def test_unused_module():
    assert train(steps=32, spare=False) < 10


@pytest.mark.optcheck(fail_on="error")
def test_unused_module_error_level():
    assert train(steps=32, spare=False) < 10


def test_switched_optimizer():
    assert train(switch_at=6) < 10


@pytest.mark.optcheck(fail_on="info")
def test_switched_optimizer_info_level():
    assert train(switch_at=6) < 10


def test_no_optimizer():
    assert torch.nn.Linear(2, 2)(torch.ones(2)).shape == (2,)


def test_own_failure():
    loss = train(replace_at=6)
    assert loss < 0, "the test's own assertion"


def test_inplace_write():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(12):
        h = model[1](model[0](torch.randn(8, 4)))
        if step == 5:
            h.mul_(2)  # INPLACE LINE: Sigmoid saved its output for its backward
        loss = model[2](h).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.optcheck(fail_on="fatal")
def test_bad_marker():
    assert train() < 10
'''

#: what each test of TESTS gives with --optcheck (default level warning)
WATCHED = {"test_clean": "passed", "test_replaced_layer": "failed", "test_replaced_layer_off": "passed",
           "test_unused_module": "failed", "test_unused_module_error_level": "passed",
           "test_switched_optimizer": "passed", "test_switched_optimizer_info_level": "failed",
           "test_no_optimizer": "passed", "test_own_failure": "failed", "test_inplace_write": "failed",
           "test_bad_marker": "error"}
#: without --optcheck only the test's own assertion and PyTorch's own error in backward() fail
INERT = {**{name: "passed" for name in WATCHED}, "test_own_failure": "failed", "test_inplace_write": "failed"}
STEP_LINE, INPLACE_LINE = (next(i for i, line in enumerate(TESTS.splitlines(), 1) if mark in line)
                           for mark in ("# STEP LINE", "# INPLACE LINE"))


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """``tmp_path`` as a pytest project of its own: the test file and an empty ``pytest.ini``
    (so this repository's ``addopts`` do not apply)."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_train.py").write_text(TESTS)
    return tmp_path


def run_pytest(project: Path, *args: str, timeout: float = 240, target: str = "test_train.py", **env_extra: str) \
        -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m pytest ARGS TARGET --junitxml`` in ``project``: the process and
    {test name: (outcome, failure text, optcheck property or None)}."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "OPTCHECK_RUN"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **env_extra)
    xml = project / "report.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, target,
                           f"--junitxml={xml}"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=timeout)
    cases = {}
    if xml.exists():
        for tc in ET.parse(xml).iter("testcase"):
            bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
            outcome = "passed" if bad is None else ("failed" if bad.tag == "failure" else "error")
            text = "" if bad is None else (bad.get("message") or "") + "\n" + (bad.text or "")
            prop = next((json.loads(p.get("value")) for p in tc.iter("property") if p.get("name") == "optcheck"),
                        None)
            cases[tc.get("name")] = (outcome, text, prop)
    return proc, cases


def said(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-3000:]}"


def check_lines(run_dir: Path) -> list[str]:
    """What ``optcheck check`` prints for one test's run directory, its finding lines."""
    p = subprocess.run([sys.executable, "-m", "optcheck", "check", str(run_dir)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    return [ln for ln in p.stdout.splitlines() if ln.startswith(("step ", "  next: "))]


def assert_watched(proc, cases, out: Path | None) -> None:
    """The outcomes of WATCHED, each failure's text and the terminal summary."""
    assert {k: v[0] for k, v in cases.items()} == WATCHED, said(proc)
    assert proc.returncode == 1, said(proc)
    # the replaced layer: OC101 as `optcheck check` prints it, at the test's opt.step() line
    text = cases["test_replaced_layer"][1]
    where = f"test_train.py:{STEP_LINE}: "
    assert f"{where}step 7 (pre-step) OC101 stale-param [error]: optimizer steps 2 tensor(s) the model no longer " \
           f"uses: body.2.weight (replaced), body.2.bias (replaced)" in text, text
    assert "  next: the optimizer's old tensors get no gradient" in text, text
    prop = cases["test_replaced_layer"][2]
    assert prop["monitors"] == ["SGD over Net, 12 steps"] and prop["failing"] == 3, prop
    if out is not None:  # each test's run directory under --optcheck-out; its findings read back as check says
        run_dir = next((out / "test_train.py_test_replaced_layer").glob("proc-*"))
        assert prop["out"] == str(out / "test_train.py_test_replaced_layer")
        for line in check_lines(run_dir):
            assert line in text, (line, text)
    # the levels: a warning fails by default, not at error; an info passes by default, fails at info
    assert "OC202 grad-starved [warning]: " in cases["test_unused_module"][1]
    assert "spare.weight" in cases["test_unused_module"][1]
    assert [f["code"] for f in cases["test_unused_module_error_level"][2]["findings"]] == ["OC202"]
    assert "OC209 optimizer-switched [info]" in cases["test_switched_optimizer_info_level"][1]
    assert cases["test_switched_optimizer"][2]["findings"][0]["code"] == "OC209"
    # unwatched: off=True, and a test that steps no optimizer has no record
    assert cases["test_replaced_layer_off"][2] is None and cases["test_no_optimizer"][2] is None
    # a test's own failure stands; the findings are beside it (the report section "optcheck")
    own = cases["test_own_failure"][1]
    assert "the test's own assertion" in own and "optcheck: 3 finding(s)" not in own.split("\n")[0], own
    assert "Captured optcheck call" in proc.stdout and "OC101 stale-param" in proc.stdout, said(proc)
    # an in-place write to a tensor saved for backward: the step is stopped (optcheck.StepStopped) naming the op
    # and the test's line that wrote it (--optcheck-hazards always), where PyTorch's own error names neither
    inplace = cases["test_inplace_write"][1]
    assert "StepStopped" in inplace and f"written in place by mul_ at test_train.py:{INPLACE_LINE}" in inplace, inplace
    assert "step 6 (pre-step) OC301 inplace-on-saved [error]" in proc.stdout, said(proc)
    # a bad marker: its set-up fails in one line
    assert "@pytest.mark.optcheck(fail_on='fatal'): one of info, warning, error" in cases["test_bad_marker"][1]
    # the terminal summary: the tests that stepped an optimizer, and their findings
    summary = proc.stdout.split("optcheck: 8 test(s) stepped an optimizer, 7 with findings", 1)
    assert len(summary) == 2, said(proc)
    tail = summary[1]
    assert "test_train.py::test_clean [PASSED]: SGD over Net, 12 steps" in tail, tail
    assert "test_train.py::test_replaced_layer [FAILED]: SGD over Net, 12 steps" in tail, tail
    assert f"  x {where}step 7 (pre-step) OC101 stale-param [error]" in tail, tail
    assert re.search(r"test_switched_optimizer \[PASSED\].*\n  - .*OC209 optimizer-switched \[info\]", tail), tail
    assert "test_no_optimizer" not in tail and "test_replaced_layer_off" not in tail, tail


@pytest.mark.slow
def test_clean_passes_replaced_layer_fails_with_oc101(project):
    out = project / "optcheck-runs"
    proc, cases = run_pytest(project, "-p", PLUGIN, "--optcheck", "--optcheck-out", str(out))
    assert_watched(proc, cases, out)
    assert f"run directories in {out.resolve()}" in proc.stdout, said(proc)


@pytest.mark.slow
def test_under_xdist_each_worker_watches_and_the_controller_sums_up(project):
    proc, cases = run_pytest(project, "-p", PLUGIN, "--optcheck", "-n", "2")
    assert_watched(proc, cases, None)
    assert "[gw0]" in proc.stdout or "[gw1]" in proc.stdout, said(proc)  # it did run on workers
    dirs = {cases[name][2]["out"] for name in ("test_clean", "test_replaced_layer")}
    assert len({str(Path(d).parent) for d in dirs}) == 1, dirs  # both workers under the controller's folder


def test_without_the_flag_the_plugin_is_inert(project):
    (project / "conftest.py").write_text(textwrap.dedent("""
        import json, sys

        def pytest_sessionfinish(session):
            with open("modules.json", "w") as f:
                json.dump(sorted(m for m in sys.modules if m.startswith("optcheck")), f)
    """))
    proc, cases = run_pytest(project, "-p", PLUGIN, "--strict-markers")  # the marker is registered all the same
    assert {k: v[0] for k, v in cases.items()} == INERT, said(proc)
    assert all(prop is None for _, _, prop in cases.values())
    assert "optcheck:" not in proc.stdout and "stepped an optimizer" not in proc.stdout, said(proc)
    loaded = json.loads((project / "modules.json").read_text())
    assert PLUGIN in loaded and not [m for m in loaded if m.startswith(("optcheck.autowatch", "optcheck.drivers"))], \
        loaded


def test_under_optcheck_run_the_plugin_steps_aside(project):
    # `optcheck run -- pytest --optcheck`: the run's watch (OPTCHECK_RUN) is in the process already
    (project / "test_plain.py").write_text("def test_plain():\n    assert True\n")
    proc, cases = run_pytest(project, "-p", PLUGIN, "--optcheck", target="test_plain.py",
                             OPTCHECK_RUN='{"out": "unused"}')
    assert "optcheck: optcheck run already watches this process; --optcheck is off" in proc.stdout, said(proc)
    assert {k: v[0] for k, v in cases.items()} == {"test_plain": "passed"}, said(proc)
    assert "stepped an optimizer" not in proc.stdout, said(proc)


def test_optcheck_out_not_empty_is_one_line(project):
    (project / "busy").mkdir()
    (project / "busy" / "x").write_text("")
    proc, cases = run_pytest(project, "-p", PLUGIN, "--optcheck", "--optcheck-out", "busy")
    assert proc.returncode == 4 and not cases, said(proc)  # pytest's usage error
    assert "--optcheck-out busy: not an empty folder" in proc.stderr and "Traceback" not in proc.stderr, said(proc)


def test_the_entry_point_is_declared_and_installed():
    """``pytest --optcheck`` without ``-p``: the ``pytest11`` entry point names the plugin's module (one
    plugin either way) and ``scripts/setup.sh`` installed it (the run through it: the next test, ``-m slow``)."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["pytest11"]
    assert declared == {PLUGIN: PLUGIN}  # named as its module: `-p` and the entry point are one plugin
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    assert installed.get(PLUGIN) == PLUGIN, "re-run `pip install -e .` (scripts/setup.sh)"


@pytest.mark.slow
def test_through_the_installed_entry_point(project):
    if PLUGIN not in {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}:
        pytest.skip("the pytest11 entry point is not installed yet: re-run `pip install -e .` (scripts/setup.sh)")
    proc, cases = run_pytest(project, "--optcheck")
    assert {k: v[0] for k, v in cases.items()} == WATCHED, said(proc)
    assert "OC101 stale-param [error]" in cases["test_replaced_layer"][1]


@pytest.mark.slow
def test_the_entry_point_and_dash_p_at_once_are_one_plugin(project):
    if PLUGIN not in {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}:
        pytest.skip("the pytest11 entry point is not installed yet: re-run `pip install -e .` (scripts/setup.sh)")
    proc, cases = run_pytest(project, "-p", PLUGIN, "--optcheck", "-k", "clean")  # both ways at once: one plugin
    assert proc.returncode == 0 and cases["test_clean"][0] == "passed", said(proc)


def test_run_directory_names_of_test_ids():
    from optcheck.integrations.pytest_plugin import _dir_name

    assert _dir_name("tests/test_x.py::test_y[a-b]") == "tests_test_x.py_test_y_a-b"
    long_a, long_b = (f"tests/test_x.py::test_y[{'p' * 200}{k}]" for k in "ab")
    assert len(_dir_name(long_a)) <= 100 and _dir_name(long_a) != _dir_name(long_b)  # cut, told apart by a hash
