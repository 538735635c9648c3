"""What a snapshot costs on real TorchSharp, and the forced collection before its live-tensor count: taken when a
tensor may be waiting for its finalizer (a step without a DisposeScope, a kept loss taken out of its scope),
skipped while every step's tensors stay inside their DisposeScope, and still taken every 10th snapshot
(dotnet/Probe/ProbeCore.cs, docs/memory.md). The built-in GPT, in a process of its own (tests/torchsharp_real/gc_probe.py).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from realts import real_ts  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.torchsharp_real
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def probes(real_ts):  # noqa: F811
    from concurrent.futures import ThreadPoolExecutor

    def one(fault):
        res = subprocess.run([sys.executable, str(HERE / "gc_probe.py"), str(real_ts.worker), fault], capture_output=True,
                             text=True, timeout=300, env=real_ts.env)
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads(res.stdout.strip().splitlines()[-1])

    faults = ("none", "state-leak", "no-dispose-scope")
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(faults, pool.map(one, faults)))


def test_a_scoped_training_loop_is_counted_without_a_forced_collection(probes):
    got = probes["none"]
    # the first read collects (nothing to compare with), then every 10th; the rest skip it
    assert got["collected"] == [True] + [False] * 9 + [True] + [False], got["collected"]
    assert len(set(got["live"])) == 1  # the same exact count either way
    skipped = [ms for ms, c in zip(got["cpu_ms"], got["collected"]) if not c]
    taken = [ms for ms, c in zip(got["cpu_ms"], got["collected"]) if c]
    assert statistics.median(skipped) < statistics.median(taken)


@pytest.mark.parametrize("fault", ["state-leak", "no-dispose-scope"])
def test_a_tensor_left_to_the_finalizer_makes_every_snapshot_collect(probes, fault):
    got = probes[fault]
    assert all(got["collected"]), got["collected"]
    live = got["live"]
    if fault == "state-leak":  # one kept loss per step: the exact count rises by 20 per snapshot
        assert [b - a for a, b in zip(live[1:], live[2:])] == [20] * 10, live
    else:  # the temporaries are garbage, not alive: after the collection the count stays flat
        assert len(set(live[1:])) == 1, live
