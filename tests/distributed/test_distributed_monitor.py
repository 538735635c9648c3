"""optcheck.Monitor on 2 real ranks (``torch.distributed.run``, gloo, CPU, 1 thread each).

Each fixture is one ``torchrun`` job (tests/distributed/dist_loop.py); jobs that
end normally run several scenarios one after the other in one process group, to
pay for the start-up of three interpreters once. Rank 1 is the odd one out in
iteration 4 (``--at 4``), so a finding in the exchange before the next backward
pass is at step 5 on a rank that took all its steps.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.record.snapshot import validate

LOOP = Path(__file__).with_name("dist_loop.py")
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out: Path, *args: str, nproc: int = 2, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --nproc-per-node N dist_loop.py OUT ARGS``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(LOOP), str(out), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def ranks_alone(out: Path, *args: str, nproc: int = 2, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """``dist_loop.py OUT ARGS`` on ``nproc`` ranks started as plain processes (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``/``PORT``: the ``env://`` rendezvous), without an elastic agent: a rank that dies is not
    followed by a SIGTERM to the others, as on another node of a multi-node job. Returns each rank's result."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(LOOP), str(out), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), RANK=str(r),
                                       LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port)) for r in range(nproc)]
    done = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def findings(run: Path, rank: int) -> list[dict]:
    path = run / f"rank-{rank}" / "findings.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def first(run: Path, rank: int, code: str) -> dict:
    hits = [f for f in findings(run, rank) if f["code"] == code]
    assert hits, f"no {code} on rank {rank}: {[(f['step'], f['code']) for f in findings(run, rank)]}"
    return hits[0]


def merged(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


DDP_SCENARIOS = ["clean", "lr", "skipstep", "nosync", "unused-rank1", "buffers"]


@pytest.fixture(scope="module")
def ddp(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    proc = torchrun(out, "--kind", "ddp", "--scenario", ",".join(DDP_SCENARIOS))
    assert all((out / s / "summary.json").exists() for s in DDP_SCENARIOS), proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp")
    proc = torchrun(out, "--kind", "fsdp", "--scenario", "clean,lr,skipstep,plain-mismatch")
    assert all((out / s / "summary.json").exists() for s in ("clean", "lr", "skipstep", "plain-mismatch")), \
        proc.stderr[-3000:]
    return out


def test_clean_ddp_is_silent_with_a_stream_per_rank_and_a_merged_summary(ddp):
    run = ddp / "clean"
    for rank in (0, 1):
        assert findings(run, rank) == []
        snaps = [json.loads(line) for line in (run / f"rank-{rank}" / "snapshots.jsonl").read_text().splitlines()]
        tables = [s["ranks"] for s in snaps if "ranks" in s]
        assert tables and all(t["world"] == 2 and t["kind"] == "ddp" for t in tables)
        for s in snaps:
            validate(s)
        assert json.loads((run / f"rank-{rank}" / "summary.json").read_text())["exit_code"] == 0
    s = merged(run)
    assert (s["status"], s["exit_code"], s["world"], s["missing_ranks"]) == ("clean", 0, 2, [])
    assert [r["rank"] for r in s["ranks"]] == [0, 1] and s["last_step"] == 8


def test_rank_1_learning_rate_changed_is_OC702_at_its_step(ddp):
    run = ddp / "lr"
    for rank in (0, 1):
        f = first(run, rank, "OC702")
        assert f["step"] == 4 and f["detail"]["ranks"] == [1]
        assert "lr=0.1 on rank 1, 0.01 on rank 0" in f["message"]
    assert merged(run)["exit_code"] == 1 and merged(run)["status"] == "findings"


def test_a_skipped_optimizer_step_on_rank_1_is_a_finding_not_a_hang(ddp):
    run = ddp / "skipstep"
    f0, f1 = first(run, 0, "OC703"), first(run, 1, "OC703")
    assert (f0["step"], f1["step"]) == (5, 4)  # rank 1 took one step fewer
    assert f0["detail"]["ranks"] == [1] and "rank 1 has taken 3 optimizer step(s), rank 0 4" in f0["message"]
    assert first(run, 0, "OC701")["detail"]["ranks"] == [1]
    assert merged(run)["ranks"][1]["last_step"] == 7


def test_no_sync_that_never_syncs_makes_replicas_diverge_OC701(ddp):
    f = first(ddp / "nosync", 0, "OC701")
    assert f["step"] == 5 and f["detail"]["ranks"] == [1] and "fc1.weight" in f["subjects"]
    assert not [x for x in findings(ddp / "nosync", 0) if x["step"] < 5]


def test_a_parameter_unused_on_rank_1_only_is_OC704(ddp):
    f = first(ddp / "unused-rank1", 0, "OC704")
    assert f["step"] == 5 and f["subjects"] == ["extra.bias", "extra.weight"] and f["detail"]["ranks"] == [1]
    assert not [x for x in findings(ddp / "unused-rank1", 0) if x["code"] == "OC701"]  # DDP averaged it in


def test_diverging_batchnorm_buffers_are_OC705_info(ddp):
    f = first(ddp / "buffers", 0, "OC705")
    assert f["severity"] == "info" and f["step"] == 1 and "bn.running_mean" in f["subjects"]
    assert merged(ddp / "buffers")["exit_code"] == 0


def test_clean_fsdp2_is_silent_and_compares_groups_and_steps_not_shards(fsdp):
    run = fsdp / "clean"
    for rank in (0, 1):
        assert findings(run, rank) == []
        t = [json.loads(line) for line in (run / f"rank-{rank}" / "snapshots.jsonl").read_text().splitlines()][-1]
        assert t["ranks"]["kind"] == "fsdp" and t["ranks"]["sharded"] == t["ranks"]["params"]
        # each rank's snapshot holds its own shard: shapes are the global ones, checksums differ
        rows = t["ranks"]["rows"]
        assert rows[0]["checksums"] != rows[1]["checksums"]
    assert merged(run)["exit_code"] == 0


def test_fsdp2_lr_and_skipped_step_on_rank_1(fsdp):
    assert first(fsdp / "lr", 0, "OC702")["step"] == 4
    f = first(fsdp / "skipstep", 0, "OC703")
    assert f["step"] == 5 and f["detail"]["ranks"] == [1]
    assert not [x for x in findings(fsdp / "skipstep", 0) if x["code"] == "OC701"]  # shards are not compared


@pytest.mark.slow  # its own torchrun job; OC701 fires in the DDP job (no_sync) and a replaced layer under FSDP1 in the default run
def test_a_parameter_replaced_on_rank_1_only(tmp_path):
    proc = torchrun(tmp_path, "--scenario", "replace")  # rank 1's error closes its connections: no timeout waited
    assert proc.returncode != 0  # DDP raises at the next forward on rank 1
    f = first(tmp_path, 0, "OC701")
    assert f["step"] == 5 and f["subjects"] == ["fc2.weight"] and f["detail"]["ranks"] == [1]
    assert first(tmp_path, 1, "OC104")["step"] == 4  # rank 1's own pre-step check saw the new object
    s = merged(tmp_path)
    assert s["status"] == "crashed" and s["exit_code"] == 3
    assert "Expected to have finished reduction" in s["crash"]["message"] and s["crash"]["rank"] == 1


def test_an_unused_parameter_under_ddp_is_OC706_one_forward_before_ddp_raises(tmp_path):
    proc = torchrun(tmp_path, "--scenario", "unused")
    assert proc.returncode != 0
    for rank in (0, 1):
        f = first(tmp_path, rank, "OC706")
        assert f["step"] == 1 and f["subjects"] == ["extra.weight", "extra.bias"] and f"on rank {rank}" in f["message"]
        s = json.loads((tmp_path / f"rank-{rank}" / "summary.json").read_text())
        assert s["crash"]["step"] == 2 and "Expected to have finished reduction" in s["crash"]["message"]
        assert s["lead_time"]["finding"] == "OC706 ddp-unused-param" and s["lead_time"]["predicted"]
    assert merged(tmp_path)["exit_code"] == 3


def test_a_rank_killed_under_the_monitor_is_OC707_naming_it(tmp_path):
    """Without torch.distributed.run, whose SIGTERM to rank 0 races rank 0's next exchange (on a loaded
    machine it came first, and rank 0 stopped before it could see rank 1 gone): the kernel closes the
    dead rank's sockets, rank 0's exchange fails at once, whatever the process group's timeout."""
    rank0, rank1 = ranks_alone(tmp_path, "--scenario", "kill")
    assert rank1.returncode == -9 and rank0.returncode != 0, rank0.stderr[-3000:]
    f = first(tmp_path, 0, "OC707")
    assert f["step"] == 4 and f["detail"]["ranks"] == [1] and "rank(s) 1 stopped answering" in f["message"]
    s = merged(tmp_path)
    assert s["status"] == "crashed" and s["exit_code"] == 3 and s["ranks"][1]["status"] == "running"
    assert json.loads((tmp_path / "rank-0" / "summary.json").read_text())["crash"]["step"] == 4


def test_ranks_with_different_models_switch_the_exchange_off_instead_of_hanging(fsdp):
    run = fsdp / "plain-mismatch"
    for rank in (0, 1):
        snaps = [json.loads(line) for line in (run / f"rank-{rank}" / "snapshots.jsonl").read_text().splitlines()]
        assert any("different parameter or buffer names" in n for n in snaps[0]["notes"])
        assert not any("ranks" in s for s in snaps) and snaps[-1]["step"] == 8
        assert not [f for f in findings(run, rank) if f["code"].startswith("OC70")]
