"""``optcheck run`` around ``torchrun --nproc-per-node 2`` (gloo, DDP): one run directory with the
ranks' streams folded (in the "torchrun" serial group of tests/conftest.py: its ranks take the cores)."""

from __future__ import annotations

import sys

import pytest

from test_run_command import ACCELERATE, findings, optcheck_run, script, summary

# -- torchrun ---------------------------------------------------------------------------------
DDP = """
import os, sys, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 21):
    x = torch.randn(16, 8)
    loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if "fault" in sys.argv and step == 10:
        net[2] = torch.nn.Linear(16, 1)
dist.destroy_process_group()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("fault", [False, True], ids=["clean", "replaced-layer"])
def test_torchrun_two_ranks_gloo(tmp_path, fault):
    script(tmp_path, "ddp.py", DDP)
    rc, stdout, stderr, out = optcheck_run(
        tmp_path, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
        "127.0.0.1", "--master-port", str(_free_port()), "ddp.py", *(["fault"] if fault else []), timeout=300)
    s = summary(out)
    assert s["world"] == 2 and sorted(d.name for d in out.glob("rank-*")) == ["rank-0", "rank-1"], stderr
    if not fault:
        assert rc == 0 and s["findings"] == 0, stderr
        assert [r["last_step"] for r in s["ranks"]] == [20, 20]
    else:  # DDP's reducer never had the new layer: torch raises in the next forward; optcheck named it first
        assert rc == 1 and "Expected to have finished reduction" in stderr
        assert s["status"] == "crashed" and s["config"]["command_exit"] == 1
        for rank in ("rank-0", "rank-1"):  # the layer replaced on every rank: each names it at its step
            assert [f["step"] for f in findings(out / rank) if f["code"] == "OC101"] == [11]


# -- accelerate launch, two processes -------------------------------------------------------------
ACCELERATE_2 = ACCELERATE + "assert acc.num_processes == 2, acc.num_processes\n"  # (the single-process script)


@pytest.mark.slow
@pytest.mark.parametrize("fault", [False, True], ids=["clean", "replaced-layer"])
def test_accelerate_launch_two_processes(tmp_path, fault):
    """``accelerate launch --multi_gpu --num_processes 2`` on a machine without a GPU: accelerate's
    MULTI_CPU (gloo) through ``torch.distributed.run``; its dataloader shards 40 batches into 20 a rank."""
    pytest.importorskip("accelerate")
    script(tmp_path, "train.py", ACCELERATE_2)
    rc, stdout, stderr, out = optcheck_run(
        tmp_path, sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
        str(_free_port()), "train.py", *(["fault"] if fault else []), timeout=300)
    s = summary(out)
    assert s["world"] == 2 and sorted(d.name for d in out.glob("rank-*")) == ["rank-0", "rank-1"], stderr
    if not fault:
        assert rc == 0 and s["findings"] == 0, stderr
        assert [r["last_step"] for r in s["ranks"]] == [20, 20]
    else:  # accelerate's DDP never had the new layer: torch raises in the next forward; optcheck named it first
        assert rc == 1 and s["status"] == "crashed", stderr
        for rank in ("rank-0", "rank-1"):
            assert [f["step"] for f in findings(out / rank) if f["code"] == "OC101"] == [11]
