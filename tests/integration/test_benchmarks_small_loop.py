"""Issue 34's cost benchmarks run, scaled down, so that a refactor cannot leave them broken
until the next person who measures (``benchmarks/bench_paired.py``, ``bench_small_loop.py``,
``bench_floor.py``, ``bench_grad_objects.py``, ``bench_twins.py``, ``quiet_machine.sh``; their figures are in
docs/guide/cost.md) and
``bench_speed_pairs.py`` (docs/guide/upgrade.md). What they measure is not
asserted: a time is no test here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_paired_benchmark_prints_a_ratio_for_each_configuration():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_paired.py"), "--pairs", "1", "--block", "6",
                        "--every", "3"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| (plain|off|auto)\b[^|]*\| ([0-9.]+)x", p.stdout, re.M)}
    assert set(rows) == {"plain", "off", "auto"} and all(r > 0 for r in rows.values()), p.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_paired.py"), "--configs", "auto,fast"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and "unknown configuration(s) ['fast']" in bad.stderr


@pytest.mark.slow
def test_the_floor_benchmark_prints_its_five_configurations():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_floor.py"), "--pairs", "1", "--block", "6",
                        "--every", "3"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {m.group(1) for m in re.finditer(r"^\| (plain|entry|fused|off|auto) \| [0-9.]+x", p.stdout, re.M)}
    assert rows == {"plain", "entry", "fused", "off", "auto"}, p.stdout
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_floor.py"), "--configs", "fused,auto",
                        "--split", "1", "--block", "4", "--every", "4"], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = {m.group(1) for m in re.finditer(r"^\| (plain|fused|auto) \| [0-9,]+ \| [0-9,]+ \([0-9.]+x\) \| [0-9,]+ \| ([0-9]+|-) \|$",
                                            p.stdout, re.M)}
    assert rows == {"plain", "fused", "auto"}, p.stdout


def test_the_floor_watcher_does_the_reads_it_is_the_floor_of():
    """The fused watcher is a floor only if it reads what the Monitor's quiet step reads: its
    fingerprint moves when a layer is replaced, its buffer holds each step's loss and clip
    total, and it takes its wrappers off again."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import torch
        from bench_floor import Watcher
        from bench_small_loop import build_loop
    finally:
        sys.path.pop(0)
    model, opt, step = build_loop(40)
    orig = torch.Tensor.backward, torch.nn.utils.clip_grad_norm_
    w = Watcher(model, opt, every=5, fused=True)
    losses = [step().item() for _ in range(4)]
    assert w.steps == 4 and w.fingerprint_moved == 0 and w.cleared == 0 and w.nonfinite == 0
    assert w.buffer[0:8:2].tolist() == pytest.approx(losses) and all(v > 0 for v in w.buffer[1:8:2].tolist())
    assert len(w.arrived) == len(w.params)
    model.out.weight = torch.nn.Parameter(model.out.weight.detach().clone())
    step()
    assert w.fingerprint_moved == 1
    w.close()
    assert (torch.Tensor.backward, torch.nn.utils.clip_grad_norm_) == orig
    h = Watcher(model, opt, every=5, fused=True, hazards=True)  # fused-hazards: the probes' least
    for _ in range(3):
        step()
    assert (h.arm_next, h.no_grad_fn, h.foreign_hooks) == (0, 0, 0)
    model.norm.forward = lambda x: x  # a forward replaced on an instance: the next step is armed
    step()
    with torch.autograd.graph.save_on_cpu():  # someone else's saved-tensor hooks
        step()
    h.close()
    assert (h.arm_next, h.foreign_hooks) == (2, 1)  # (the replaced norm: its parameters lose their gradients too)


@pytest.mark.slow
def test_the_quiet_machine_script_runs_its_three_methods(tmp_path):
    env = {**os.environ, "STEPS": "20", "ROUNDS": "1", "PAIRS": "1", "PYTHON": sys.executable}
    p = subprocess.run(["bash", str(ROOT / "benchmarks" / "quiet_machine.sh"), str(tmp_path)], capture_output=True,
                       text=True, timeout=900, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "cores:" in (tmp_path / "machine.txt").read_text()
    for name in ("rounds", "lockstep", "paired"):
        text = (tmp_path / f"{name}.txt").read_text()
        assert re.search(r"^\| auto\b", text, re.M) and re.search(r"^\| off\b", text, re.M), (name, text[-2000:])


@pytest.mark.slow
def test_the_gradient_objects_benchmark_prints_each_piece():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_grad_objects.py"), "--steps", "2"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = dict(re.findall(r"^\| ([a-z ,]+) \| (-?[0-9.]+) \|$", p.stdout, re.M))
    assert set(rows) == {"first read", "second read", "clip alone", "clip after a read",
                         "first read less second, per tensor"}, p.stdout
    assert "30 gradient tensors" in p.stdout and float(rows["clip alone"]) > 0, p.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_grad_objects.py"), "--steps", "0"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "--steps must be at least 1" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_the_speed_pairs_benchmark_prints_each_pair_and_the_spread(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_speed_pairs.py"), "--pairs", "3", "--steps",
                        "30", "--n-layer", "1", "--n-embd", "32", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    pairs = re.findall(r"^pair (\d): (baseline|candidate) first .* ratio ([0-9.]+)x$", p.stdout, re.M)
    assert [(k, side) for k, side, _ in pairs] == [("1", "baseline"), ("2", "candidate"), ("3", "baseline")], p.stdout
    assert all(float(r) > 0 for _, _, r in pairs)
    assert re.search(r"^medians of three consecutive pairs: min [0-9.]+x max [0-9.]+x; above 1\.25x .*: [01] of 1$",
                     p.stdout, re.M), p.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_speed_pairs.py"), "--steps", "10"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines() == [
        "bench_speed_pairs: --pairs must be >= 1 and --steps >= 30 (two 10-step blocks after the first)"]


@pytest.mark.slow
def test_the_twins_benchmark_prints_each_configuration_and_its_floor(tmp_path):
    """Scaled down: every configuration's row, the table less the plain floor, each step's time in
    the JSON, and the twins' weights bit-equal at the end (the Monitor changed nothing A computed)."""
    out = tmp_path / "twins.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_twins.py"), "--steps", "12", "--rounds", "2",
                        "--every", "4", "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = re.findall(r"^\| (plain|burn|fused|off|auto|run) \| [0-9.]+ \| [0-9.]+x \([0-9.]+-[0-9.]+\) \| [0-9., ]+ \| .* \| (yes|NO) \|$",
                      p.stdout, re.M)
    assert [c for c, _ in rows] == ["plain", "burn", "fused", "off", "auto", "run"] and {s for _, s in rows} == {"yes"}, p.stdout
    floor = re.findall(r"^\| (burn|fused|off|auto|run) \| [0-9.]+x ± [0-9.]+ \| [-+][0-9]+ ± [0-9]+ \|$", p.stdout, re.M)
    assert floor == ["burn", "fused", "off", "auto", "run"], p.stdout
    import json

    got = json.loads(out.read_text())
    assert [f["config"] for f in got["figures"]] == ["plain", "burn", "fused", "off", "auto", "run"]
    for config, runs in got["runs"].items():
        assert len(runs) == 2 and all(len(r["a"]) == len(r["b"]) == 12 and min(r["a"] + r["b"]) > 0 for r in runs)
        assert all(r["own_us"] is not None for r in runs) == (config in ("fused", "off", "auto", "run")), (config, runs)
    ablations = ["fused-no-fingerprint", "fused-ids-only", "fused-no-arrival", "fused-arrival-hooks", "fused-no-copy",
                 "fused-hazards"]
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_twins.py"), "--steps", "6", "--rounds", "1",
                        "--every", "3", "--configs", ",".join(ablations)], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = re.findall(r"^\| (fused-[a-z-]+) \| [0-9.]+ \| [0-9.]+x .* \| [0-9]+ \| yes \|$", p.stdout, re.M)
    assert rows == ablations and "Less the plain" not in p.stdout, p.stdout  # (no plain asked for: no floor table)
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_twins.py"), "--configs", "plain,fast"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_the_plain_twin_does_not_pass_through_the_monitor(tmp_path):
    """The twins method's premise: twin B, built before the Monitor with ``bound=True``, takes its
    steps outside the Monitor's wrappers, and twin A through them; the burn control burns what it
    is asked to."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import time

        import optcheck
        from bench_small_loop import build_loop
        from bench_twins import spin
    finally:
        sys.path.pop(0)
    a_model, a_opt, a_step = build_loop(20)
    b_model, b_opt, b_step = build_loop(20, bound=True)
    mon = optcheck.Monitor(a_model, a_opt, every=100, out=str(tmp_path / "run"), on_finding="ignore", hazards=False)
    try:
        before = mon.step_cost.ns  # (the time inside the Monitor's hooks, summary.json's cost.steps)
        for _ in range(3):
            b_step()
        assert mon.step_count == 0 and mon.step_cost.ns == before
        a_step()
        assert mon.step_count == 1 and mon.step_cost.ns > before
    finally:
        mon.close()
    t0 = time.thread_time_ns()
    spin(2000)
    assert time.thread_time_ns() - t0 >= 2_000_000


def test_the_plain_twin_is_left_by_optcheck_runs_watch(tmp_path):
    """The ``run`` configuration's premise: ``AutoWatch`` installed over both twins, with B left
    (``AutoWatch.leave``), opens one Monitor, on A's model and optimizer, and B's steps add nothing
    to its own timer; without ``leave`` B would be watched too (the control)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_small_loop import build_loop
    finally:
        sys.path.pop(0)
    from optcheck.autowatch.attach import AutoWatch

    for leave in (True, False):
        a_model, a_opt, a_step = build_loop(20)
        b_model, b_opt, b_step = build_loop(20, bound=True)
        watch = AutoWatch(str(tmp_path / f"run-{leave}"), every=100, on_finding="ignore").install()
        try:
            if leave:
                watch.leave(b_opt)
            for _ in range(3):
                a_step()
                b_step()
            watched = [m.optimizer for m in watch.monitors]
            if not leave:
                assert watched == [a_opt, b_opt]
                continue
            assert watched == [a_opt] and watch.notes == []
            mon = watch.monitors[0]
            before, count = mon.step_cost.ns, mon.step_count
            for _ in range(3):
                b_step()
            assert mon.step_count == count and mon.step_cost.ns == before
            a_step()
            assert mon.step_count == count + 1 and mon.step_cost.ns > before
        finally:
            watch.uninstall()
