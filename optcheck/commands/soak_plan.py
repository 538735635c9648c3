"""``optcheck soak`` as a plan, then its run: :func:`plan_soak` turns the command's options
into a :class:`SoakPlan` — every option checked, the baseline read, the report files
checked, nothing created yet — and :func:`run_plan` runs it (one soak, one per seed, one per
backend then compared, or ``--nproc`` ranks) and writes the reports. The command
(``optcheck/commands/soak.py``) only parses the options and prints the outcome.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

from optcheck.config import (ChecksConfig, DataConfig, Injection, ModelConfig, OptimizerConfig, RunConfig, SoakConfig,
                             TorchSharpConfig)
from optcheck.errors import InputError, RecordError
from optcheck.rules import RuleConfig


@dataclass
class SoakPlan:
    """What ``optcheck soak`` will run (:func:`plan_soak`). ``mode``: "one" soak, "seeds" (one
    per seed), "backends" (one per backend, then compared) or "nproc" (DDP ranks)."""

    mode: str
    cfg: SoakConfig
    options: SimpleNamespace
    backends: list[str]
    seeds: list[int] | None = None
    rule_config: RuleConfig | None = None
    ignore: list = field(default_factory=list)
    baseline: tuple | None = None  # optcheck.judge.baseline.prepare's (Baseline, Tolerances)


@dataclass
class SoakOutcome:
    """What :func:`run_plan` ran: the soaks' results (``optcheck.drivers.soak.SoakResult``), the
    exit code of the command, the judgment against ``--baseline`` and the comparison of two
    backends when there was one, and notes (lines of the ranks' files that were skipped)."""

    results: list
    code: int
    baseline: object = None  # optcheck.judge.baseline.BaselineResult
    compare: object = None  # optcheck.judge.compare.CompareResult
    notes: list[str] = field(default_factory=list)
    error: Exception | None = None  # raised once the run's summary is printed (a baseline not comparable)


def ignore_entries(ignores) -> list:
    """``--ignore`` entries after the nearest pyproject.toml's ``[tool.optcheck] ignore``;
    InputError (exit 2) on a bad entry."""
    from optcheck.errors import InputError
    from optcheck.suppress import resolve

    try:
        return resolve(ignores)
    except ValueError as e:
        raise InputError(f"--ignore: {e}") from None


def rule_config_for(memory_budget: str | None) -> RuleConfig:
    """The rule knobs a soak's options set: ``--memory-budget`` (e.g. ``4GiB``; default
    this machine's physical memory, so OC401 projects the step at which it would run
    out). InputError (exit 2) on a bad size."""
    rule_config = RuleConfig()
    if memory_budget:
        from optcheck.units import parse_bytes

        rule_config.memory_budget_bytes = parse_bytes(memory_budget, "--memory-budget")
    else:
        import psutil

        rule_config.memory_budget_bytes = psutil.virtual_memory().total
    return rule_config


def backends_of(o: SimpleNamespace) -> list[str]:
    """``--backend``'s list, checked with the options that depend on how many it names
    (InputError, exit 2)."""
    from optcheck.errors import InputError

    backends = [b.strip() for b in o.backend.split(",") if b.strip()]
    if not backends or any(b not in ("pytorch", "torchsharp") for b in backends) or len(set(backends)) < len(backends):
        raise InputError(f"--backend {o.backend!r}: pytorch, torchsharp or pytorch,torchsharp")
    if o.same_init and len(backends) < 2:
        raise InputError("--same-init needs two backends: --backend pytorch,torchsharp")
    if (len(backends) > 1 or o.seeds is not None) and (o.junit or o.plot):
        option = "--junit" if o.junit else "--plot"
        many = f"--backend {o.backend} makes two" if len(backends) > 1 else f"--seeds {o.seeds} makes one per seed"
        raise InputError(f"{option} writes one run's report, and {many}: run each with its own {option}, "
                         f"or use --summary-md (it covers every run)")
    return backends


def soak_config(o: SimpleNamespace, backend: str) -> SoakConfig:
    """``optcheck soak``'s options as a :class:`SoakConfig` for ``backend`` (the first of
    ``--backend``), validated: InputError (exit 2) names the first bad option."""
    from optcheck.torchsharp_bridge.options import parse_trainer_options

    return SoakConfig(
        model=ModelConfig(n_layer=o.n_layer, n_head=o.n_head, n_embd=o.n_embd, block_size=o.block_size,
                          vocab_size=o.vocab_size),
        optimizer=OptimizerConfig(name=o.optimizer, lr=o.lr),
        data=DataConfig(path=o.data, batch_size=o.batch_size, val_every=o.val_every),
        run=RunConfig(backend=backend, steps=o.steps, every=o.every, seed=o.seed, threads=o.threads, device=o.device,
                      step_timeout_s=o.step_timeout, eval_every=o.eval_every, checkpoint_every=o.checkpoint_every,
                      resume_at=o.resume_at, python=o.python or None),
        checks=ChecksConfig(inject=[Injection.parse(i) for i in o.injects], stop_on_finding=o.stop_on_finding,
                            hazards="off" if o.no_hazards else o.hazard_mode, allow_inplace=o.allow_inplace),
        torchsharp=TorchSharpConfig(version=o.torchsharp or None, assembly=o.dotnet_assembly or None,
                                    trainer=o.dotnet_trainer or None, runtime=o.dotnet_runtime,
                                    dotnet_root=o.dotnet_root or None),
        trainer_options=parse_trainer_options(o.trainer_options),
    ).validate()


def plan_soak(options: dict | SimpleNamespace) -> SoakPlan:
    """The plan of ``optcheck soak`` with ``options`` (its click options, by name). Nothing is
    created: a bad option, a missing or incomparable baseline, a report file that cannot be
    written, ``--nproc`` beyond this machine are one line, exit 2 (InputError) here.
    """
    from optcheck.commands._paths import check_output_file, same_dir
    from optcheck.distributed.cli import check_nproc
    from optcheck.judge.baseline import prepare

    o = options if isinstance(options, SimpleNamespace) else SimpleNamespace(**options)
    backends = backends_of(o)
    cfg = soak_config(o, backends[0])  # every option before anything is created
    if check_nproc(cfg, o.nproc, other_options=bool(o.seeds or len(backends) > 1 or o.junit or o.plot
                                                     or o.summary_md or o.baseline or o.ignores or o.memory_budget)):
        return SoakPlan("nproc", cfg, o, backends)
    if o.baseline is not None and same_dir(o.baseline, o.out if o.out is not None else "runs"):
        raise InputError(f"--baseline {o.baseline}: is the --out of this soak; the run would replace its own "
                         f"baseline and be judged against itself (give the baseline another folder)")
    prepared = prepare(o.baseline, cfg.to_json(), seeds=o.seeds, backends=backends, speed=o.speed_tolerance,
                       memory=o.memory_tolerance, fail_on=o.fail_on)
    for option, target in (("--junit", o.junit), ("--plot", o.plot), ("--summary-md", o.summary_md)):
        if target:
            check_output_file(target, option, created_dir=o.out)
    rule_config, ignore = rule_config_for(o.memory_budget), ignore_entries(o.ignores)
    if o.seeds is not None:
        from optcheck.judge.upgrade import parse_seeds

        if len(backends) > 1:
            raise InputError("--seeds runs one backend: give --backend pytorch or torchsharp")
        return SoakPlan("seeds", cfg, o, backends, parse_seeds(o.seeds), rule_config, ignore, prepared)
    mode = "backends" if len(backends) > 1 else "one"
    return SoakPlan(mode, cfg, o, backends, None, rule_config, ignore, prepared)


def run_plan(plan: SoakPlan, signals=None) -> SoakOutcome:
    """Run ``plan`` (see the module docstring); write its reports (``--junit``, ``--plot``,
    ``--summary-md``). ``signals``: the caller's ``optcheck.drivers.watch.Signals`` (None: this
    function installs its own, restored at its end when ``restore`` — a test's CliRunner)."""
    from optcheck.drivers.soak import run_backends, run_soak
    from optcheck.drivers.watch import Signals

    o, cfg = plan.options, plan.cfg
    if plan.mode == "nproc":
        from optcheck.distributed.soak import run_distributed_soak

        result = run_distributed_soak(cfg, o.nproc, o.out, fail_on=o.fail_on, progress=not o.quiet, force=o.force)
        return SoakOutcome([result], result.exit_code, notes=list(result.summary.get("notes") or []))
    sig = signals if signals is not None else Signals(restore=_embedded())
    common = dict(fail_on=o.fail_on, rule_config=plan.rule_config, progress=not o.quiet, force=o.force, signals=sig,
                  ignore=plan.ignore)
    if plan.mode == "seeds":
        from optcheck.judge.upgrade import run_seeds

        results, code = run_seeds(cfg, plan.seeds, o.out, **common)
        if o.summary_md:
            _write_md(o.summary_md, [(r.summary, r.findings) for r in results], None)
        return SoakOutcome(results, code)
    if plan.mode == "backends":
        results, code = run_backends(cfg, plan.backends, o.out, same_init=o.same_init, **common)
        if o.summary_md:
            _write_md(o.summary_md, [(r.summary, r.findings) for r in results], None)
        compared = None
        if all(r.summary["status"] in ("clean", "findings") for r in results):
            from optcheck.judge.compare import compare_runs

            compared = compare_runs(results[0].out, results[1].out)
            code = max(code, compared.exit_code)
        return SoakOutcome(results, code, compare=compared)
    result = run_soak(cfg, o.out, **common)
    if result.summary.get("record_error"):  # the run directory stopped taking writes: no report, no judgment
        return SoakOutcome([result], result.exit_code)
    against, code = None, result.exit_code
    if plan.baseline:
        from optcheck.judge.baseline import after_soak

        try:
            against, code = after_soak(result.out, plan.baseline, result.exit_code, echo=lambda line: None)
        except InputError as e:  # (no step in common): said after the run's own summary
            return SoakOutcome([result], result.exit_code, error=e)
    try:
        if o.junit:
            from optcheck.report.junit import write_junit

            write_junit([f.to_dict() for f in result.findings], o.junit, suite_name=f"optcheck soak {result.out}",
                        summary=result.summary, crash=result.summary.get("crash"), fail_on=o.fail_on,
                        time_s=result.summary.get("elapsed_s"), baseline=against)
        if o.plot:
            from optcheck.report.plot import plot_run

            plot_run(result.out, o.plot)
        if o.summary_md:
            _write_md(o.summary_md, [(result.summary, result.findings)], o.plot, against)
    except OSError as e:
        raise RecordError(e.filename or o.junit or o.plot or o.summary_md, e) from None
    return SoakOutcome([result], code, baseline=against)


def _embedded() -> bool:
    """True when the command runs inside another program (a test's CliRunner), whose signal
    handlers come back after the run; False in the ``optcheck`` process itself
    (``optcheck.cli.main``), whose handlers stay until it exits."""
    cli = sys.modules.get("optcheck.cli")
    return not getattr(cli, "STANDALONE", False)


def _write_md(path: str, runs: list, plot, baseline=None) -> None:
    from optcheck.report.markdown import write_markdown

    write_markdown(path, [(s, [f.to_dict() for f in fs]) for s, fs in runs], plot, baseline=baseline)
