"""Issue 48 point 4: two processes writing one run's summary.json at once (two ranks folding) lose no
write and never publish a half-written file; a fold that cannot be written says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from optcheck.run.recorder import RankRecorder
from optcheck.run.rundir import SUMMARY_TEMP, summary_temp_name, summary_temps

WRITER = textwrap.dedent("""
    import sys, time
    from optcheck.errors import RecordError
    from optcheck.run.rundir import write_summary
    out, me, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    pad = "x" * 200_000  # big enough that a write takes several write(2) calls' worth of time
    ok = lost = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            write_summary(out, {"status": "running", "writer": me, "n": ok, "pad": pad})
            ok += 1
        except RecordError as e:
            lost += 1
            print("LOST", e, file=sys.stderr)
    print(ok, lost)
""")


def test_two_concurrent_writers_lose_no_write_and_never_publish_a_partial_file(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(out), str(k), "4"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env) for k in range(2)]
    reads = torn = 0
    while any(w.poll() is None for w in writers):
        try:
            text = (out / "summary.json").read_text()
        except FileNotFoundError:
            continue
        reads += 1
        try:
            doc = json.loads(text)
            torn += len(doc["pad"]) != 200_000
        except (ValueError, KeyError):
            torn += 1
        time.sleep(0.001)
    results = [w.communicate() for w in writers]
    counts = [tuple(map(int, o.split())) for o, _ in results]
    assert all(w.returncode == 0 for w in writers), results
    assert sum(ok for ok, _ in counts) > 20, counts          # the writers did write, many times each
    assert [lost for _, lost in counts] == [0, 0], [e for _, e in results]
    assert reads > 0 and torn == 0, (reads, torn)
    assert summary_temps(out) == []                           # no temporary left behind


def test_the_temporary_name_is_one_per_process_and_thread():
    a, b = summary_temp_name(), summary_temp_name()
    assert a != b and SUMMARY_TEMP.fullmatch(a) and f".{os.getpid()}-" in a
    assert SUMMARY_TEMP.fullmatch("summary.json.tmp")        # an older version's leftover is still known


def test_a_fold_that_cannot_be_written_is_told_not_dropped(tmp_path, capfd):
    gone = tmp_path / "no-such-folder"
    s = RankRecorder(gone, source="monitor").fold([None, None], [], [], attempts=2)
    err = capfd.readouterr().err
    assert isinstance(s, dict)
    assert "optcheck: the ranks' summary was not written (2 tries)" in err and str(gone) in err, err
