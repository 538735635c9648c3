"""``optcheck soak --nproc 2``: the built-in GPT under DDP on 2 real ranks (gloo, CPU),
through the real CLI; scenarios, a killed rank, a hung rank, usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.report.reader import read_summary
from optcheck.scenarios import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32", "--batch-size", "8",
         "--val-every", "0", "-q"]


def soak(*args: str, timeout: float = 300, **env_over: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env_over)
    return subprocess.run([sys.executable, "-m", "optcheck", "soak", *SMALL, *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]  # every line parses: nothing torn


@pytest.mark.slow
def test_soak_nproc_2_flags_rank_1s_learning_rate_at_the_next_exchange(tmp_path):
    out = tmp_path / "run"
    proc = soak("--nproc", "2", "--steps", "40", "--every", "10", "--inject", "rank1-lr@15", "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["world"] == 2 and s["status"] == "findings" and s["last_step"] == 40
    assert [r["status"] for r in s["ranks"]] == ["findings", "findings"]
    f = [f for f in lines(out / "rank-0" / "findings.jsonl") if f["code"] == "OC702"][0]
    assert f["step"] == 21 and f["detail"]["ranks"] == [1]  # exchanged before backward passes 1, 11, 21, ...
    for rank in (0, 1):  # the one-process layout, per rank
        assert {"snapshots.jsonl", "metrics.jsonl", "findings.jsonl", "summary.json"} <= {
            p.name for p in (out / f"rank-{rank}").iterdir()}
    assert "OC702" in proc.stdout and "rank-group-mismatch" in proc.stdout
    s = read_summary(out)  # checked against optcheck/schemas/summary-1.json, like every summary
    assert s["summary_version"] == 2 and s["source"] == "soak" and s["inject"] == ["rank1-lr@15"]
    assert set(CATALOGUE["rank1-lr"].expected("pytorch")) <= set(s["findings_by_code"])
    # `optcheck check OUT` replays every rank's stream: the live run's findings, each with its rank
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    chk = subprocess.run([sys.executable, "-m", "optcheck", "check", str(out), "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert chk.returncode == 1, chk.stderr
    replayed = [json.loads(line) for line in chk.stdout.splitlines()]
    live = [f for r in (0, 1) for f in lines(out / f"rank-{r}" / "findings.jsonl")]
    assert {(f["code"], f["step"]) for f in replayed} == {(f["code"], f["step"]) for f in live}
    assert {f["rank"] for f in replayed} <= {0, 1} and all(f["run"].endswith(f"rank-{f['rank']}") for f in replayed)
    text = subprocess.run([sys.executable, "-m", "optcheck", "check", str(out)], env=env, capture_output=True,
                          text=True, timeout=120).stdout
    assert "rank 0 step 21 (pre-step) OC702 rank-group-mismatch [error]" in text and "2 ranks," in text


@pytest.mark.slow
def test_rank_1s_replaced_parameter_fires_what_the_catalogue_lists_each_row_filled(tmp_path):
    out = tmp_path / "run"
    proc = soak("--nproc", "2", "--steps", "40", "--every", "10", "--inject", "rank1-param-replaced@12", "--out",
                str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr[-2000:]
    s = read_summary(out)
    assert set(CATALOGUE["rank1-param-replaced"].expected("pytorch")) <= set(s["findings_by_code"]), s
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line.startswith("  OC")}
    assert set(rows) == set(s["findings_by_code"])
    assert rows["OC706"][1:3] == ["ddp-unused-param", "error"]  # symbol and severity, not blank
    assert s["lead_time"]["finding"] == "OC706 ddp-unused-param" and s["crash"]["rank"] == 1


def test_a_killed_rank_is_named_with_its_step_and_exit_3(tmp_path):
    out = tmp_path / "run"
    proc = soak("--nproc", "2", "--steps", "40", "--every", "10", "--inject", "rank1-kill@12", "--out", str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["crash"]["rank"] == 1 and s["crash"]["signal"] == "SIGKILL" and s["crash"]["step"] == 12
    assert "rank 1 was killed by SIGKILL in step 12" in proc.stdout
    # rank 0 closed after step 11; rank 1's summary was never closed: read back as ended without closing,
    # its last step the last one recorded (metrics are sent in batches: 10 or 11)
    assert s["ranks"][0]["last_step"] == 11 and s["ranks"][1]["last_step"] in (10, 11)
    assert s["ranks"][1]["status"] in ("crashed", "ended without closing")
    for rank in (0, 1):
        assert lines(out / f"rank-{rank}" / "snapshots.jsonl")  # readable to the last line
        lines(out / f"rank-{rank}" / "metrics.jsonl")


@pytest.mark.slow
def test_a_hung_rank_is_named_through_step_timeout_and_exit_3(tmp_path):
    out = tmp_path / "run"
    proc = soak("--nproc", "2", "--steps", "40", "--every", "10", "--inject", "rank1-hang@12", "--step-timeout", "15",
                "--out", str(out))
    assert proc.returncode == 3, proc.stdout + proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["crash"]["rank"] == 1 and s["crash"]["exc_type"] == "Hang" and s["crash"]["step"] == 12
    assert "rank 1 made no progress for 15 s" in proc.stdout
    for rank in (0, 1):
        assert lines(out / f"rank-{rank}" / "snapshots.jsonl")


def test_usage_errors_are_one_line_and_exit_2(tmp_path):
    for args, words in ((["--inject", "rank1-lr@5"], "needs --nproc 2 or more"),
                        (["--nproc", "2", "--backend", "torchsharp"], "PyTorch GPT under DDP only"),
                        (["--nproc", "2", "--inject", "param-rebind@5"], "only the distributed scenarios"),
                        (["--nproc", "2", "--ignore", "OC101"], "PyTorch GPT under DDP only"),
                        (["--nproc", "2", "--memory-budget", "1GiB"], "PyTorch GPT under DDP only"),
                        (["--nproc", "2", "--device", "cuda"], "runs its ranks on the CPU over gloo")):
        proc = soak(*args, "--out", str(tmp_path / "x"), timeout=120)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_nproc_beyond_the_machine_or_a_junk_timeout_is_one_line_exit_2_before_any_rank_starts(tmp_path):
    import psutil

    from optcheck.distributed.limits import RANK_BYTES_PER_PARAM, usable_cores

    too_many = 2 * usable_cores() + 1
    layers = psutil.virtual_memory().available // (2 * RANK_BYTES_PER_PARAM * 12 * 1024 ** 2) + 1  # 2 ranks > memory
    for args, env, words in ((["--nproc", str(too_many)], {}, f"usable core(s), which take at most {too_many - 1}"),
                             (["--nproc", "2", "--n-embd", "1024", "--n-layer", str(layers)], {},
                              "is available; give --nproc"),
                             (["--nproc", "2"], {"OPTCHECK_DIST_TIMEOUT": "soon"}, "OPTCHECK_DIST_TIMEOUT='soon'")):
        proc = soak(*args, "--out", str(tmp_path / "x"), timeout=120, **env)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "x").exists()  # nothing was started


def test_scenarios_lists_the_distributed_ones():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    text = subprocess.run([sys.executable, "-m", "optcheck", "scenarios"], env=env, capture_output=True, text=True,
                          timeout=120).stdout
    for name in ("rank1-param-replaced", "rank1-lr", "no-sync-forever", "rank1-skip-step", "ddp-unused-param"):
        assert name in text


@pytest.mark.slow
def test_without_optcheck_rank_1s_learning_rate_trains_on_silently_into_different_replicas(tmp_path):
    """The measured outcome ``optcheck scenarios`` shows for rank1-lr (and, the same way, no-sync-forever and
    rank1-skip-step): the job ends normally and nothing says the replicas differ."""
    from optcheck.config import ChecksConfig, DataConfig, Injection, ModelConfig, RunConfig, SoakConfig

    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_embd=32, n_head=2, block_size=32),
                     data=DataConfig(batch_size=8, val_every=0), run=RunConfig(steps=20, every=10),
                     checks=ChecksConfig(inject=[Injection("rank1-lr", 5)]))
    (tmp_path / "config.json").write_text(cfg.to_json())
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    from test_distributed_monitor import free_port

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                           "127.0.0.1", "--master-port", str(free_port()), "-m", "optcheck.distributed.worker",
                           "--config", str(tmp_path / "config.json"), "--out", str(tmp_path), "--no-monitor"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (0, 1):
        o = json.loads((tmp_path / f"rank-{rank}" / "outcome.json").read_text())
        assert o["steps"] == 20 and o["replicas_equal"] is False
    assert not (tmp_path / "rank-0" / "findings.jsonl").exists()  # no Monitor, no records


def test_a_clean_nproc_run_checks_clean_rank_by_rank(tmp_path):
    """``optcheck check OUT`` of a clean ``--nproc 2`` run: silent, exit 0, both ranks replayed."""
    out = tmp_path / "run"
    proc = soak("--nproc", "2", "--steps", "12", "--every", "4", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    chk = subprocess.run([sys.executable, "-m", "optcheck", "check", str(out)], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, timeout=120)
    snaps = sum(len(lines(out / f"rank-{r}" / "snapshots.jsonl")) for r in (0, 1))
    assert chk.returncode == 0 and chk.stdout.strip().splitlines() == [f"2 ranks, {snaps} snapshots, 0 finding(s)"], \
        chk.stdout + chk.stderr


@pytest.mark.slow
def test_soak_nproc_2_hazards_always_arms_every_step_on_every_rank(tmp_path):
    """``--hazards always`` reaches each rank's Monitor as the mode, not as "on" (which is auto)."""
    out = tmp_path / "run"
    proc = soak("--nproc", "2", "--steps", "12", "--every", "6", "--hazards", "always", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    for rank in (0, 1):
        h = json.loads((out / f"rank-{rank}" / "summary.json").read_text())["hazards"]
        assert h["mode"] == "always" and h["armed_steps"] == h["steps"] == 12, h
