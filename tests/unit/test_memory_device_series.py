"""OC401 on device memory series at the GPU soak's cadence (``every=50``), and what an
out-of-memory crash carries, on the CPU.

The series start from ``tests/fixtures/cuda/memory_stats_gpt2_small_step200.json`` (one
``torch.cuda.memory_stats()`` dictionary of GPT-2 small under AdamW) and change the keys a
run moves: the caching allocator's warm-up over the first steps (the optimizer state made
at step 1, the allocator reserving segments as activations of growing size first appear,
the peak climbing to its plateau), a leak that keeps each step's loss graph (a few MiB a
step from its onset), and the two together. Each dictionary goes through
``probe.device_memory`` (the code a GPU run executes) into a schema-1 snapshot and the
rule engine.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from optcheck.engine import RuleEngine  # noqa: E402
from optcheck.pytorch import device as devices  # noqa: E402
from optcheck.pytorch import probe  # noqa: E402
from optcheck.rules import RuleConfig  # noqa: E402
from optcheck.rules.memory import MemoryGrowth  # noqa: E402
from optcheck.record.snapshot import SCHEMA, validate  # noqa: E402

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "cuda" / "memory_stats_gpt2_small_step200.json")
                      .read_text())
MiB = 2**20
PARAMS = 498 * MiB  # GPT-2 small's float32 parameters
SEGMENT = 20 * MiB


def stats(step: int, *, warmup: bool = True, leak_from: int | None = None, per_step: int = 3 * MiB) -> dict:
    """The dictionary at ``step``: warm-up (the state of AdamW at step 1, activations whose
    segments the allocator reserves over the first 150 steps, the peak reaching its plateau)
    and a leak of ``per_step`` bytes per step from ``leak_from``."""
    s = copy.deepcopy(RECORDED)
    base = s["allocated_bytes.all.current"]
    if warmup:
        if step == 0:  # parameters only: no gradient, no optimizer state yet
            alloc, reserved, peak = PARAMS, PARAMS + SEGMENT, PARAMS
        else:
            ramp = 1 - math.exp(-step / 40)  # the allocator's cache filling up to its plateau
            alloc = base
            reserved = s["reserved_bytes.all.current"] - int((1 - ramp) * 800 * MiB) // SEGMENT * SEGMENT
            peak = s["allocated_bytes.all.peak"] - int((1 - ramp) * 1500 * MiB)
        s["allocated_bytes.all.current"], s["reserved_bytes.all.current"] = alloc, reserved
        s["allocated_bytes.all.peak"] = peak
    leaked = per_step * max(0, step - leak_from) if leak_from is not None else 0
    s["allocated_bytes.all.current"] += leaked
    s["allocated_bytes.all.peak"] = max(s["allocated_bytes.all.peak"], s["allocated_bytes.all.current"])
    s["reserved_bytes.all.current"] += -(-leaked // SEGMENT) * SEGMENT
    return s


def findings(steps, **kw) -> list:
    engine = RuleEngine(RuleConfig(), rules=[MemoryGrowth])
    steps = list(steps)
    for i, step in enumerate(steps):
        mem = {"rss_bytes": 2048 * MiB, "state_bytes": 2 * PARAMS, **probe.device_memory([stats(step, **kw)])}
        engine.feed(validate({"schema": SCHEMA, "backend": "pytorch", "run": "t", "step": step,
                              "phase": "pre-step" if step == 0 else "post-step",
                              "trigger": "start" if step == 0 else "final" if i == len(steps) - 1 else "cadence",
                              "params": [], "groups": [], "memory": mem}))
    return engine.findings


def test_the_caching_allocators_warm_up_is_no_leak():
    series = [probe.device_memory([stats(s)]) for s in (0, 50, 100, 150, 200)]
    assert series[0]["device_allocated_bytes"] < series[1]["device_allocated_bytes"]  # it does rise at first
    assert len({d["device_reserved_bytes"] for d in series}) > 2  # and reserves segment after segment
    assert findings(range(0, 3001, 50)) == []


@pytest.mark.parametrize("onset", [100, 250, 1000])
def test_a_kept_loss_graph_is_found_within_300_steps_at_every_50(onset):
    found = findings(range(0, 3001, 50), leak_from=onset)
    assert found, "no finding"
    first = found[0]
    assert first.code == "OC401" and first.key == "device_allocated_bytes", [(f.key, f.step) for f in found]
    assert onset < first.step <= onset + 300 and first.message.startswith("device allocated memory")


def test_a_slow_leak_under_the_warm_up_is_found_too():
    """1 MiB a step from step 100, while the allocator is still warming up."""
    found = findings(range(0, 3001, 50), leak_from=100, per_step=MiB)
    assert found and found[0].key == "device_allocated_bytes" and found[0].step <= 400


# -- out of memory ----------------------------------------------------------------------------
TRAIL = [{"after_step": s, "device_allocated_bytes": a, "device_reserved_bytes": r, "rss_bytes": 900 * MiB}
         for s, a, r in ((100, 2000 * MiB, 3000 * MiB), (150, 2300 * MiB, 3200 * MiB), (200, 2600 * MiB, 3400 * MiB))]


def test_an_out_of_memory_error_is_recognised():
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    assert devices.is_oom(oom("CUDA out of memory. Tried to allocate 2.00 GiB"))
    try:  # the CPU allocator's own failure, for real
        torch.empty(1 << 60, dtype=torch.uint8)
    except RuntimeError as e:
        assert devices.is_oom(e), str(e)
    assert not devices.is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not devices.is_oom(ValueError("out of range"))


def test_the_oom_report_says_what_was_held_and_what_rose():
    rep = devices.oom_report(RuntimeError("out of memory"), torch.device("cpu"), TRAIL)
    assert rep["before"] == TRAIL and rep["rss_bytes"] > 0
    assert rep["rose"] == {"device_allocated_bytes": 600 * MiB, "device_reserved_bytes": 400 * MiB}
    assert "steps 100-200" in rep["summary"] and "device_allocated +0.59 GiB" in rep["summary"]
    flat = devices.oom_report(RuntimeError("out of memory"), torch.device("cpu"), TRAIL[:1] * 2)
    assert flat["rose"] == {} and "one step's peak did not fit" in flat["summary"]
    assert "no snapshot" in devices.oom_report(RuntimeError("x"), torch.device("cpu"), [])["summary"]
