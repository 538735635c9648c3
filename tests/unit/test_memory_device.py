"""CUDA device memory in every snapshot, and OC401 on it, from recorded
``torch.cuda.memory_stats()`` dictionaries (no GPU here).

``tests/fixtures/cuda/memory_stats_gpt2_small_step200.json`` is one such dictionary,
every key ``torch/cuda/memory.py`` (``memory_stats``' docstring) documents, with the
values of GPT-2 small under AdamW between two steps. A run is replayed by changing
the few keys a run moves and handing each dictionary to ``probe.memory`` in place of
the real ``torch.cuda.memory_stats``: the code from there to the rule is the code a
GPU run executes.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from optcheck.engine import RuleEngine  # noqa: E402
from optcheck.pytorch import probe  # noqa: E402
from optcheck.rules import RuleConfig  # noqa: E402
from optcheck.rules.memory import MemoryGrowth  # noqa: E402
from optcheck.record.snapshot import SCHEMA, validate  # noqa: E402

RECORDED = json.loads((Path(__file__).parents[1] / "fixtures" / "cuda" / "memory_stats_gpt2_small_step200.json")
                      .read_text())
MiB = 2**20


def stats_at(step: int, leak_from: int | None = None, per_step: int = 4 * MiB, retries_from: int | None = None):
    """The recorded dictionary as it would read at ``step``: ``per_step`` more bytes
    allocated (and reserved, in 20 MiB segments) for every step after ``leak_from``;
    one allocation retry per 10 steps after ``retries_from``."""
    s = copy.deepcopy(RECORDED)
    leaked = per_step * max(0, step - leak_from) if leak_from is not None else 0
    for pool in ("all", "large_pool"):
        s[f"allocated_bytes.{pool}.current"] += leaked
        s[f"allocated_bytes.{pool}.peak"] += leaked
        s[f"reserved_bytes.{pool}.current"] += -(-leaked // (20 * MiB)) * 20 * MiB
    if retries_from is not None:
        s["num_alloc_retries"] = max(0, step - retries_from) // 10
    return s


@pytest.fixture
def recorded_cuda(monkeypatch):
    """``torch.cuda`` answering as a one-GPU process would, from ``feed[0]``."""
    feed: list[dict] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: feed[0])
    return feed


def run(recorded_cuda, steps, **kw) -> list:
    model = torch.nn.Linear(4, 4)
    engine = RuleEngine(RuleConfig(), rules=[MemoryGrowth])
    for i, step in enumerate(steps):
        recorded_cuda[:] = [stats_at(step, **kw)]
        mem = probe.memory(1000, census=False, model=model)
        mem["rss_bytes"] = 800 * MiB  # the host side steady: the device is what is read here
        mem.pop("heap_in_use_bytes", None)
        engine.feed(validate({"schema": SCHEMA, "backend": "pytorch", "run": "t", "step": step,
                              "phase": "post-step", "trigger": "final" if i == len(steps) - 1 else "cadence",
                              "params": [], "groups": [], "memory": mem}))
    return engine.findings


def test_fields_from_a_recorded_dictionary():
    assert probe.device_memory([RECORDED]) == {
        "device_allocated_bytes": 2_010_734_592, "device_reserved_bytes": 3_909_091_328,
        "device_peak_allocated_bytes": 6_548_357_120, "device_alloc_retries": 0}
    two = probe.device_memory([RECORDED, RECORDED])  # two devices in use: summed
    assert two["device_allocated_bytes"] == 2 * 2_010_734_592
    assert probe.device_memory([{}]) == dict.fromkeys(probe.DEVICE_STATS, 0)  # allocator not used yet


def test_every_snapshot_carries_them_when_cuda_is_in_use(recorded_cuda):
    model = torch.nn.Linear(4, 4)
    recorded_cuda[:] = [RECORDED]
    body = probe.snapshot_body(model, torch.optim.SGD(model.parameters(), lr=0.1), census=False)
    validate({"schema": SCHEMA, "backend": "pytorch", "run": "t", "step": 0, "phase": "pre-step",
              "trigger": "start", **body, "events": []})
    assert body["memory"]["device_allocated_bytes"] == 2_010_734_592
    assert body["memory"]["device_peak_allocated_bytes"] == 6_548_357_120


def test_no_device_fields_without_cuda():
    model = torch.nn.Linear(4, 4)
    mem = probe.memory(0, census=False, model=model)
    assert not any(k.startswith("device_") for k in mem)


def test_device_leak_fires_oc401_on_allocated_bytes(recorded_cuda):
    found = run(recorded_cuda, range(100, 3001, 100), leak_from=1000)
    assert [(f.code, f.key) for f in found][:1] == [("OC401", "device_allocated_bytes")], [f.message for f in found]
    assert found[0].step == 1300  # a steady rise, three snapshots after it began
    assert found[0].message.startswith("device allocated memory")


def test_steady_device_memory_is_silent(recorded_cuda):
    assert run(recorded_cuda, range(100, 3001, 100)) == []


def test_climbing_allocation_retries_fire_oc401(recorded_cuda):
    found = run(recorded_cuda, range(100, 3001, 100), retries_from=500)
    assert [(f.code, f.key) for f in found] == [("OC401", "device_alloc_retries")], [f.message for f in found]
