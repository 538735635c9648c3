"""``metrics.jsonl`` is written a batch at a time (``RunDir.metrics``): one ``write(2)``
per batch, and a batch that does not fit is cut off whole (``optcheck/run/rundir.py``,
``docs/run-directory.md``). Real files, a real ``RLIMIT_FSIZE`` in a child process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

from optcheck.run import rundir
from optcheck.report.reader import RunReader
from optcheck.run.rundir import RunDir
from optcheck.record.snapshot import to_float


def test_a_batch_of_metrics_is_one_write_and_reads_back(tmp_path, monkeypatch):
    d = RunDir(tmp_path / "run")
    writes = []
    real = os.write

    def spy(fd, data):
        writes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(rundir.os, "write", spy)
    d.metrics(list(range(1, 201)), [1.0 / s for s in range(1, 201)], [0.01] * 200)
    d.metrics([201, 202], [0.5, float("nan")])  # a Monitor's: no step times; NaN written as "nan"
    d.metrics([], [])  # nothing to write: no write at all
    monkeypatch.undo()
    d.close()
    assert len(writes) == 2
    m = RunReader(tmp_path / "run").metrics
    assert [r["step"] for r in m] == list(range(1, 203))
    assert m[0] == {"step": 1, "loss": 1.0, "step_time_s": 0.01} and m[-1]["step_time_s"] is None
    assert math.isnan(to_float(m[-1]["loss"]))  # NaN written as "nan" and read back


def test_a_batch_over_the_file_size_limit_is_cut_off_whole(tmp_path):
    """RLIMIT_FSIZE (70 KB; the 64 KiB reserve fits) stops a 2,000-line batch part way:
    the partial bytes are truncated again, the file ends with the last whole batch and
    RecordError names it."""
    script = textwrap.dedent(f"""
        import resource, signal
        from optcheck.errors import RecordError
        from optcheck.run.rundir import RunDir
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (70_000, resource.RLIM_INFINITY))
        d = RunDir({str(tmp_path / "run")!r})
        d.metrics([1, 2, 3], [3.0, 2.0, 1.0], [0.1, 0.1, 0.1])
        try:
            d.metrics(list(range(4, 2004)), [0.123456789] * 2000, [0.01] * 2000)
        except RecordError as e:
            print("RecordError:", e)
        d.close()
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "RecordError:" in res.stdout and "metrics.jsonl" in res.stdout, res.stdout + res.stderr
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert text.endswith("\n") and [json.loads(line)["step"] for line in text.splitlines()] == [1, 2, 3]
