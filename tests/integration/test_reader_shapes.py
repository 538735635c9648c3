"""Bad input is one line and an exit code, never a traceback (issue 26): summaries
without ``summary_version`` whose fields have odd types, read by ``history``,
``baseline``, ``compare`` and ``check`` (hypothesis); a ``[tool.optcheck]`` of the
wrong shape in ``check``, ``soak`` and ``Monitor()``; a bad ``ignore=`` that
leaves the folder unlocked; ``--python`` at an interpreter without torch; a
full stdout. Real files, the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
CLEAN = ROOT / "tests" / "fixtures" / "runs" / "clean"
FIELDS = sorted(json.loads((CLEAN / "summary.json").read_text()))

ODD = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["abc", "", "nan", "-inf", "12"]),
                st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(), max_size=2),
                st.dictionaries(st.sampled_from(["a", "count", "total_s", "median_s"]), st.integers(), max_size=2))


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")


def _no_traceback(rc, stdout, stderr, allowed=(0, 1, 2)):
    assert rc in allowed and "Traceback" not in stdout + stderr, (rc, stdout, stderr)
    if rc == 2:
        assert len([ln for ln in stderr.splitlines() if ln.startswith("optcheck: error:")]) == 1, stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.dictionaries(st.sampled_from(FIELDS), ODD, min_size=1, max_size=3))
def test_old_summaries_with_odd_field_types_are_one_line(tmp_path_factory, mutations):
    d = tmp_path_factory.mktemp("odd") / "run"
    shutil.copytree(CLEAN, d)
    s = json.loads((d / "summary.json").read_text())
    s.pop("summary_version", None)
    s.update(mutations)
    (d / "summary.json").write_text(json.dumps(s))
    for args in (["history", str(d)], ["compare", str(d), str(CLEAN)], ["compare", str(CLEAN), str(d)],
                 ["baseline", str(d), str(CLEAN)], ["baseline", str(CLEAN), str(d)], ["check", str(d)]):
        try:
            rc, out, err = run_cli(args)
        except SystemExit as e:  # an InputError turned into exit 2 by the group
            rc, out, err = e.code, "", "optcheck: error: (exit)"
        _no_traceback(rc, out, err)


def test_a_field_of_the_wrong_type_names_the_field(tmp_path):
    d = tmp_path / "run"
    shutil.copytree(CLEAN, d)
    s = json.loads((d / "summary.json").read_text())
    s.pop("summary_version", None)
    s["loss_last"] = [1, 2]
    (d / "summary.json").write_text(json.dumps(s))
    res = subprocess.run([sys.executable, "-m", "optcheck", "history", str(d)], capture_output=True, text=True,
                         env=_env(), timeout=300)
    assert res.returncode == 2 and "loss_last" in res.stderr and "Traceback" not in res.stderr


PYPROJECTS = {"optcheck = 5": '[tool]\noptcheck = 5\n', "tool = x": 'tool = "x"\n',
              "[[tool.optcheck]]": '[[tool.optcheck]]\nignore = ["OC205"]\n',
              "ignore = 5": '[tool.optcheck]\nignore = 5\n'}


@pytest.mark.parametrize("name", sorted(PYPROJECTS))
def test_a_pyproject_of_the_wrong_shape_is_one_line_in_check_and_soak(tmp_path, name):
    (tmp_path / "pyproject.toml").write_text(PYPROJECTS[name])
    for args in (["check", str(CLEAN)], ["soak", "--steps", "5", "--out", str(tmp_path / "s")]):
        res = subprocess.run([sys.executable, "-m", "optcheck", *args], capture_output=True, text=True, env=_env(),
                             cwd=tmp_path, timeout=300)
        assert res.returncode == 2, (args, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert "pyproject.toml" in res.stderr and "tool" in res.stderr
        assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name", sorted(PYPROJECTS))
def test_a_pyproject_of_the_wrong_shape_is_a_valueerror_in_monitor_and_leaves_out_free(tmp_path, name, monkeypatch):
    import torch

    import optcheck

    (tmp_path / "pyproject.toml").write_text(PYPROJECTS[name])
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="tool"):
        optcheck.Monitor(model, opt, out=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_bad_ignore_does_not_lock_the_folder_before_refusing(tmp_path):
    import torch

    import optcheck

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "run"
    for bad in (["OC999"], "OC205", [5]):
        with pytest.raises(ValueError):
            optcheck.Monitor(model, opt, out=str(out), ignore=bad, ignore_config=False)
        assert not out.exists()
    mon = optcheck.Monitor(model, opt, out=str(out), ignore=["OC205"], ignore_config=False)  # the corrected retry
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert mon.close()["status"] == "clean"


def test_python_without_torch_is_exit_2_before_anything_runs(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    env = {k: v for k, v in _env().items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = str(ROOT)
    for cmd in (["soak", "--steps", "5", "--out", str(tmp_path / "s"), "--python", str(py)],
                ["upgrade", "--steps", "5", "--out", str(tmp_path / "u"), "--candidate-python", str(py)]):
        res = subprocess.run([sys.executable, "-m", "optcheck", *cmd], capture_output=True, text=True, env=env,
                             timeout=300)
        assert res.returncode == 2, (cmd, res.returncode, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "torch is not installed" in lines[0] and str(py) in lines[0], res.stderr
        assert not (tmp_path / "s").exists() and not (tmp_path / "u" / "baseline").exists()


def test_a_full_stdout_is_one_line_and_exit_4():
    with open("/dev/full", "w") as full:
        res = subprocess.run([sys.executable, "-m", "optcheck", "check", str(CLEAN)], stdout=full,
                             stderr=subprocess.PIPE, text=True, env=_env(), timeout=300)
    assert res.returncode == 4, res.stderr
    assert res.stderr.strip().splitlines() == ["optcheck: error: cannot write to stdout (No space left on device)"]


NIGHTS = ROOT / "tests" / "fixtures" / "nights"


def test_a_full_summary_md_file_is_named_not_stdout():
    """Issue 35: ``baseline --summary-md /dev/full > /dev/null`` said "cannot write to stdout"."""
    res = subprocess.run([sys.executable, "-m", "optcheck", "baseline", str(NIGHTS / "night-2-torch2.13"),
                          str(NIGHTS / "night-1-torch2.13"), "--summary-md", "/dev/full"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), timeout=300)
    assert res.returncode == 4, res.stderr
    assert res.stderr.strip().splitlines() == [
        "optcheck: error: cannot record to --summary-md /dev/full: No space left on device (ENOSPC)"]


@pytest.mark.parametrize("args", [
    ["baseline", str(NIGHTS / "night-2-torch2.13"), str(NIGHTS / "night-1-torch2.13")],
    ["compare", str(CLEAN), str(CLEAN)],
    ["history", str(NIGHTS)],
    ["rules"],
], ids=lambda a: a[0])
def test_a_reader_gone_is_one_line_and_exit_4_not_clicks_silent_exit_1(args):
    """Issue 35: ``optcheck baseline R A | head -1`` exited 1 (the regression code) with no
    word, 4 times in 5: click ended the broken pipe before optcheck could. Here the
    reader is gone before the first line, every time."""
    r, w = os.pipe()
    os.close(r)
    try:
        res = subprocess.run([sys.executable, "-m", "optcheck", *args], stdout=w, stderr=subprocess.PIPE,
                             text=True, env=_env(), timeout=300)
    finally:
        os.close(w)
    assert res.returncode == 4, (res.returncode, res.stderr)
    assert res.stderr.strip().splitlines() == ["optcheck: error: cannot write to stdout (Broken pipe)"]


@pytest.mark.parametrize("name", ["snapshots.jsonl", "metrics.jsonl", "summary.json"])
def test_an_unreadable_record_file_is_one_line(tmp_path, name):
    """A record file the user may not read (as a non-root user: root here drops
    CAP_DAC_OVERRIDE with setpriv, so the kernel refuses the read as it would them)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to drop the capability that bypasses file permissions")
    d = tmp_path / "run"
    shutil.copytree(CLEAN, d)
    (d / name).chmod(0)
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
            "--inh-caps=-dac_override,-dac_read_search"]
    for args in (["check", str(d)], ["compare", str(d), str(CLEAN)], ["history", str(d)],
                 ["baseline", str(d), str(CLEAN)]):
        res = subprocess.run([*drop, sys.executable, "-m", "optcheck", *args], capture_output=True, text=True,
                             env=_env(), timeout=300)
        assert "Traceback" not in res.stderr, (args, res.stderr)
        if res.returncode == 2:
            assert "Permission denied" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        else:  # a command that does not need that file
            assert res.returncode in (0, 1), (args, res.returncode, res.stderr)


RECORD_FILES = ("metrics.jsonl", "snapshots.jsonl", "findings.jsonl", "events.jsonl")


@st.composite
def record_mutation(draw):
    name = draw(st.sampled_from(RECORD_FILES))
    kind = draw(st.sampled_from(["field", "line", "truncate", "garbage"]))
    return name, kind, draw(st.integers(0, 10_000)), draw(st.sampled_from(
        ["step", "loss", "step_time_s", "params", "groups", "phase", "code", "severity", "memory", "backend"])), \
        draw(ODD)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(record_mutation(), min_size=1, max_size=3))
def test_mutated_record_files_are_read_or_refused_in_one_line(tmp_path_factory, mutations):
    """Any record file of a real run with a field of another type, a line replaced by
    another JSON value, a torn line or garbage bytes: ``check``, ``compare``,
    ``baseline`` and ``history`` read it (a note for a skipped line) or refuse it in
    one line, exit 2 — never a traceback."""
    d = tmp_path_factory.mktemp("mut") / "run"
    shutil.copytree(CLEAN, d)
    for name, kind, at, field, value in mutations:
        p = d / name
        lines = p.read_text().splitlines() or ["{}"]
        i = at % len(lines)
        if kind == "field":
            try:
                rec = json.loads(lines[i])
            except ValueError:
                continue
            if isinstance(rec, dict):
                rec[field] = value
                lines[i] = json.dumps(rec)
        elif kind == "line":
            lines[i] = json.dumps(value)
        elif kind == "truncate":
            lines[i] = lines[i][: at % max(1, len(lines[i]))]
        else:
            lines[i] = "\x00\xff garbage {"
        p.write_text("\n".join(lines) + "\n", errors="surrogateescape")
    for args in (["check", str(d)], ["compare", str(d), str(CLEAN)], ["baseline", str(d), str(CLEAN)],
                 ["history", str(d)]):
        try:
            rc, out, err = run_cli(args)
        except SystemExit as e:
            rc, out, err = e.code, "", "optcheck: error: (exit)"
        except Exception as e:  # an InputError is turned into one line by the group in a real process
            from optcheck.errors import InputError, RecordError

            assert isinstance(e, (InputError, RecordError)), (args, mutations, repr(e))
            continue
        _no_traceback(rc, out, err)
