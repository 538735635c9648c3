"""optcheck.report.reader.RunReader: run directories written before the redesign
stay readable by `check`, `compare`, the plot and `history`; what it cannot read, it says in
one line with exit 2; a torn last line is reported, not a traceback.

The old runs are real: ``tests/fixtures/runs/`` holds what optcheck at commit
70eccfc wrote (its README gives the commands).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from PIL import Image

from conftest import run_cli
from optcheck.judge.compare import compare_runs
from optcheck.errors import InputError
from optcheck.run.exitcodes import CLEAN, FINDINGS, USAGE
from optcheck.report.plot import plot_run
from optcheck.report.reader import RunReader, known_version
from optcheck.record.snapshot import read_jsonl

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def recorded(run: str) -> list[tuple[str, int]]:
    """(code, step) of the findings the old optcheck itself wrote for ``run``."""
    return sorted((f["code"], f["step"]) for f in read_jsonl(OLD / run / "findings.jsonl"))


@pytest.mark.parametrize("run, expected", [
    ("clean", []),
    ("param-rebind", [("OC101", 150), ("OC102", 150), ("OC104", 150)]),
    ("monitor-param-replaced", [("OC101", 21), ("OC102", 21), ("OC104", 21)]),
])
def test_check_reads_an_old_run_and_finds_what_it_found(run, expected):
    assert recorded(run) == expected  # what the code before the redesign wrote
    rc, out, err = run_cli(["check", str(OLD / run)])
    assert rc == (FINDINGS if expected else CLEAN), err
    found = sorted((line.split()[3], int(line.split()[1])) for line in out.splitlines() if line.startswith("step "))
    assert found == expected
    assert "note:" not in err


def test_reader_gives_old_runs_their_summary_losses_and_snapshots():
    run = RunReader(OLD / "param-rebind")
    assert run.summary["schema"] == "optcheck.summary/1" and run.summary["status"] == "findings"
    assert sorted(run.losses) == list(range(1, 301)) and len(run.step_times) == 300
    assert [s["step"] for s in run.snapshots][:2] == [0, 50] and run.defects == []
    mon = RunReader(OLD / "monitor-param-replaced")
    assert mon.summary["source"] == "monitor" and len(mon.losses) == 60
    assert mon.peak_rss_bytes() == mon.summary["peak_rss_bytes"] and mon.versions()["torch"]


def test_compare_reads_two_old_runs():
    same = compare_runs(OLD / "clean", OLD / "clean")
    assert same.exit_code == CLEAN and same.verdict.kind == "identical" and same.loss.common_steps == 300
    res = compare_runs(OLD / "clean", OLD / "param-rebind")
    assert res.exit_code == FINDINGS and res.findings[0].code == "OC601"
    assert res.verdict.first_step == 151  # the first loss after the rebind at step 150
    assert sorted(f["code"] for f in res.only_in_b) == ["OC101", "OC102", "OC104"] and res.only_in_a == []
    rc, out, _ = run_cli(["compare", str(OLD / "clean"), str(OLD / "param-rebind")])
    assert rc == FINDINGS and "OC601 run-divergence" in out.splitlines()[-1]


@pytest.mark.parametrize("run", ["clean", "param-rebind", "monitor-param-replaced"])
def test_plot_draws_an_old_run(tmp_path, run):
    png = plot_run(OLD / run, tmp_path / "run.png", width_px=700)
    with Image.open(png) as im:
        assert im.size == (700, 448)
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert len(colours) > 50  # curves and labels, not a blank canvas


def test_history_reads_old_runs():
    rc, out, err = run_cli(["history", str(OLD)])
    assert rc == CLEAN, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert set(rows) == {"clean", "param-rebind", "monitor-param-replac"}  # the run column is 20 wide
    assert "2.9239" in rows["clean"] and rows["param-rebind"].endswith("<- new findings: OC101, OC102, OC104")


def copy_old(tmp_path: Path, run: str = "param-rebind") -> Path:
    dst = tmp_path / run
    shutil.copytree(OLD / run, dst)
    return dst


def tear_last_line(path: Path) -> int:
    """Cut ``path``'s last record in half (a run killed mid-write); return its line number."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    return len(lines)


def test_a_torn_last_line_is_reported_and_the_rest_read(tmp_path):
    run = copy_old(tmp_path)
    n_snap = tear_last_line(run / "snapshots.jsonl")
    n_metric = tear_last_line(run / "metrics.jsonl")
    rc, out, err = run_cli(["check", str(run)])
    assert rc == FINDINGS and out.splitlines()[-1] == "7 snapshots, 3 finding(s)"
    assert len(err.splitlines()) == 1
    assert err.startswith(f"optcheck: note: {run}/snapshots.jsonl:{n_snap}: truncated last line (")
    assert err.rstrip().endswith("); skipped, the rest was read")
    res = compare_runs(OLD / "param-rebind", run)
    assert res.b.steps == 299 and any(d.startswith(f"metrics.jsonl:{n_metric}: truncated last line")
                                      for d in res.b.defects)
    assert f"metrics.jsonl:{n_metric}: truncated last line" in res.render()
    plot_run(run, tmp_path / "torn.png", width_px=400)


def test_garbage_mid_file_is_skipped_and_named_by_every_command(tmp_path):
    run = copy_old(tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[99] = "\x00\x01 not json"
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    reader = RunReader(run)
    assert len(reader.losses) == 299 and reader.defects[0].startswith("metrics.jsonl:100: not a JSON line")
    assert any("metrics.jsonl:100: not a JSON line" in d for d in compare_runs(run, run).a.defects)


def one_line_error(args: list[str]) -> str:
    rc, out, err = run_cli(args)
    assert rc == USAGE and out == "" and len(err.splitlines()) == 1, (rc, out, err)
    return err


def test_a_newer_schema_is_refused_in_one_line(tmp_path):
    run = copy_old(tmp_path)
    s = json.loads((run / "summary.json").read_text())
    s["schema"] = f"optcheck.summary/{known_version('summary') + 1}"
    (run / "summary.json").write_text(json.dumps(s))
    err = one_line_error(["compare", str(OLD / "param-rebind"), str(run)])
    assert "written by a newer optcheck (optcheck.summary/2); this one reads optcheck.summary/1 at most" in err
    snaps = run / "snapshots.jsonl"
    snaps.write_text(snaps.read_text().replace('"schema":"optcheck.snapshot/1"', '"schema":"optcheck.snapshot/7"'))
    err = one_line_error(["check", str(snaps)])
    assert f"{snaps}: written by a newer optcheck (optcheck.snapshot/7)" in err


def test_what_is_not_a_run_directory_is_said(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    err = one_line_error(["compare", str(tmp_path), str(OLD / "clean")])
    assert "not a run directory (none of summary.json, snapshots.jsonl, metrics.jsonl, findings.jsonl in it)" in err
    assert "no such run directory" in one_line_error(["compare", str(tmp_path / "nope"), str(OLD / "clean")])
    empty = tmp_path / "empty"
    empty.mkdir()
    for name in ("snapshots.jsonl", "metrics.jsonl", "findings.jsonl"):
        (empty / name).touch()
    assert "nothing to check: an empty run directory" in one_line_error(["check", str(empty)])
    assert "nothing to compare: an empty run directory" in one_line_error(["compare", str(empty), str(empty)])
    with pytest.raises(InputError, match="nothing to plot"):
        plot_run(empty, tmp_path / "x.png")


def test_read_jsonl_streams_a_line_before_the_file_ends(tmp_path):
    """A FIFO whose writer has not finished: ``readlines()`` would wait for its end."""
    fifo = tmp_path / "live.jsonl"
    os.mkfifo(fifo)
    finish = threading.Event()

    def writer():
        with open(fifo, "w") as f:
            f.write('{"step": 1}\n')
            f.flush()
            finish.wait(10)
            f.write('{"step": 2}\n{"st')  # and a torn last line

    t = threading.Thread(target=writer)
    t.start()
    defects: list = []
    stream = read_jsonl(fifo, defects)
    got = [next(stream)]  # returns while the writer still holds the file open
    finish.set()
    got += list(stream)
    t.join()
    assert got == [{"step": 1}, {"step": 2}] and [d.line for d in defects] == [3]
    assert defects[0].reason.startswith("truncated last line")
