"""Property: `optcheck check` and `optcheck compare` never show a Python traceback (and the
plot reads the records or raises one InputError line),
whatever is in the record files; they exit 0, 1 or 2.

The records are real: one short soak with a planted fault (so the stream has
findings too) runs once per session; hypothesis then mutates its lines — a field
set to a random JSON value (wrong types), a key deleted, a line truncated,
replaced by garbage bytes or by deep nesting — and runs the commands in-process
with exceptions propagating (``catch_exceptions=False``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SMALL
from optcheck.cli import cli

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False)
    | st.text(max_size=6) | st.sampled_from(["nan", "inf", "-inf", "set", "none", "pre-step"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@pytest.fixture(scope="session")
def real_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("hyp") / "run"
    res = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "120", "--every", "40",
                          "--inject", "param-rebind@60", "--out", str(out), *SMALL],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stderr  # the planted fault is found: findings.jsonl has lines
    assert (out / "findings.jsonl").read_text().strip()
    return out


def mutate_value(data, value):
    """Walk into ``value`` along drawn keys/indexes and change what is there."""
    if isinstance(value, dict) and value and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(value)))
        kind = data.draw(st.sampled_from(["descend", "replace", "delete"]))
        if kind == "descend":
            value[key] = mutate_value(data, value[key])
        elif kind == "replace":
            value[key] = data.draw(json_values)
        else:
            del value[key]
        return value
    if isinstance(value, list) and value and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(value) - 1))
        value[i] = mutate_value(data, value[i]) if data.draw(st.booleans()) else data.draw(json_values)
        return value
    return data.draw(json_values)


def mutate_line(data, line: str) -> str:
    kind = data.draw(st.sampled_from(["field", "field", "field", "truncate", "garbage", "nest", "deep", "value"]))
    if kind == "field":
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):  # a line an earlier mutation already broke
            value = None
        return json.dumps(mutate_value(data, value))
    if kind == "truncate":
        return line[: data.draw(st.integers(0, max(0, len(line) - 1)))]
    if kind == "garbage":
        return data.draw(st.binary(min_size=1, max_size=40)).decode("latin-1").replace("\n", " ")
    if kind == "nest":
        return "[" * data.draw(st.sampled_from([10, 1000, 100_000]))
    if kind == "deep":
        n = data.draw(st.sampled_from([500, 990, 5000]))
        return "[" * n + "]" * n
    return json.dumps(data.draw(json_values))


def mutate_file(data, path: Path) -> None:
    lines = path.read_text().splitlines() or ["{}"]
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = mutate_line(data, lines[i])
    path.write_text("\n".join(lines) + ("\n" if data.draw(st.booleans()) else ""))


def invoke(args: list[str]) -> int:
    res = CliRunner().invoke(cli, args, catch_exceptions=False, standalone_mode=False)
    rc = res.return_value if isinstance(res.return_value, int) else res.exit_code
    assert "Traceback" not in res.output + res.stderr
    return rc


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                           HealthCheck.too_slow])


@SETTINGS
@given(data=st.data())
def test_check_never_tracebacks_on_mutated_snapshots(real_run, tmp_path_factory, data):
    work = tmp_path_factory.mktemp("c") / "run"
    shutil.copytree(real_run, work, ignore=shutil.ignore_patterns(".optcheck*", "work"))
    mutate_file(data, work / "snapshots.jsonl")
    assert invoke(["check", str(work)]) in (0, 1, 2)


def mutated_copy(real_run: Path, tmp_path_factory, data, target: str) -> Path:
    """A copy of the real run with record file ``target`` mutated."""
    b = tmp_path_factory.mktemp("b") / "run"
    shutil.copytree(real_run, b, ignore=shutil.ignore_patterns(".optcheck*", "work"))
    if target == "summary.json":
        text = (b / target).read_text()
        (b / target).write_text(mutate_line(data, json.dumps(json.loads(text))))
    else:
        mutate_file(data, b / target)
    return b


RECORD_FILES = st.sampled_from(["metrics.jsonl", "findings.jsonl", "summary.json", "snapshots.jsonl"])


@SETTINGS
@given(data=st.data(), target=RECORD_FILES)
def test_compare_never_tracebacks_on_mutated_records(real_run, tmp_path_factory, data, target):
    b = mutated_copy(real_run, tmp_path_factory, data, target)
    assert invoke(["compare", str(real_run), str(b)]) in (0, 1, 2)


@settings(SETTINGS, max_examples=12)
@given(data=st.data(), target=RECORD_FILES)
def test_plot_reads_mutated_records_or_says_why(real_run, tmp_path_factory, data, target):
    """The plot reads through the same RunReader: a PNG, or one InputError line."""
    from optcheck.errors import InputError
    from optcheck.report.plot import plot_run

    b = mutated_copy(real_run, tmp_path_factory, data, target)
    try:
        assert plot_run(b, b / "p.png", width_px=300).stat().st_size > 0
    except InputError as e:
        assert "\n" not in str(e)
