"""``optcheck soak --nproc N``: the option's checks and its dispatch to
:func:`optcheck.distributed.soak.run_distributed_soak` (one call from
``optcheck/commands/soak.py``). Torch-free."""

from __future__ import annotations

from optcheck.config import SoakConfig
from optcheck.distributed.limits import check_capacity, env_timeout_s
from optcheck.errors import InputError

DIST_SCENARIOS = ("rank1-param-replaced", "rank1-lr", "no-sync-forever", "rank1-skip-step", "ddp-unused-param",
                  "rank1-kill", "rank1-hang")  # optcheck/distributed/worker.py implements them


def dispatch(cfg: SoakConfig, nproc: int, out, *, fail_on: str, quiet: bool, force: bool, print_summary,
             other_options: bool) -> int | None:
    """Run the distributed soak and return its exit code; None when ``nproc`` is 1 (the
    ordinary soak goes on). InputError (exit 2) for a distributed scenario without
    ``--nproc``, or options ``--nproc`` does not take (several backends or seeds,
    TorchSharp, --junit/--plot/--summary-md/--baseline/--ignore/--memory-budget, lifecycle events)."""
    dist_only = [i.name for i in cfg.checks.inject if i.name in DIST_SCENARIOS]
    if nproc < 2:
        if dist_only:
            raise InputError(f"--inject {dist_only[0]}: a distributed scenario, needs --nproc 2 or more")
        return None
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
    from optcheck.distributed.soak import run_distributed_soak

    result = run_distributed_soak(cfg, nproc, out, fail_on=fail_on, progress=not quiet, force=force)
    print_summary(result.summary, result.findings)
    import sys

    for note in result.summary.get("notes") or []:  # lines of the ranks' files the reader skipped
        print(f"optcheck: note: {note}", file=sys.stderr)
    return result.exit_code
