"""``optcheck soak --nproc N``: the option's checks (:func:`check_nproc`, called by the soak's
plan, ``optcheck/commands/soak_plan.py``, before :func:`optcheck.distributed.soak.run_distributed_soak`
runs it) and the distributed scenarios. Torch-free."""

from __future__ import annotations

from optcheck.config import SoakConfig
from optcheck.distributed.limits import check_capacity, env_timeout_s
from optcheck.errors import InputError

DIST_SCENARIOS = ("rank1-param-replaced", "rank1-lr", "no-sync-forever", "rank1-skip-step", "ddp-unused-param",
                  "rank1-kill", "rank1-hang")  # optcheck/distributed/worker.py implements them


def check_nproc(cfg: SoakConfig, nproc: int, *, other_options: bool) -> bool:
    """Whether the soak runs distributed (``nproc`` >= 2), every option checked first. InputError
    (exit 2) for a distributed scenario without ``--nproc``, or options ``--nproc`` does not take
    (several backends or seeds, TorchSharp, --junit/--plot/--summary-md/--baseline/--ignore/
    --memory-budget, lifecycle events), or ``nproc`` beyond this machine."""
    dist_only = [i.name for i in cfg.checks.inject if i.name in DIST_SCENARIOS]
    if nproc < 2:
        if dist_only:
            raise InputError(f"--inject {dist_only[0]}: a distributed scenario, needs --nproc 2 or more")
        return False
    if cfg.run.backend != "pytorch" or other_options:
        raise InputError("--nproc runs the PyTorch GPT under DDP only: without --backend torchsharp, --seeds, "
                         "--junit, --plot, --summary-md, --baseline, --ignore or --memory-budget")
    if cfg.run.device != "cpu":  # the ranks train on the CPU over gloo (optcheck/distributed/worker.py)
        raise InputError(f"--nproc with --device {cfg.run.device}: the distributed soak runs its ranks on the CPU "
                         f"over gloo; leave --device out (or use a one-process soak on {cfg.run.device})")
    if cfg.run.eval_every or cfg.run.checkpoint_every or cfg.run.resume_at or cfg.run.python:
        raise InputError("--nproc: --eval-every, --checkpoint-every, --resume-at and --python are one-process only")
    other = [i.name for i in cfg.checks.inject if i.name not in DIST_SCENARIOS]
    if other:
        raise InputError(f"--inject {other[0]}: with --nproc only the distributed scenarios: {', '.join(DIST_SCENARIOS)}")
    env_timeout_s()
    check_capacity(cfg, nproc)
    return True
