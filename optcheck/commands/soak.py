"""``optcheck soak``: run the built-in GPT for many steps and check it all the way."""

from __future__ import annotations

from types import SimpleNamespace

import click

from optcheck.config import (ChecksConfig, DataConfig, Injection, ModelConfig, OptimizerConfig, RunConfig, SoakConfig,
                             TorchSharpConfig)
from optcheck.findings import SEVERITIES
from optcheck.rules import RuleConfig


class _Int(click.ParamType):
    """An integer option whose bad value (``--seed 1e20``) is one error line and exit 2
    (:class:`optcheck.errors.InputError`), like every other bad input, instead of
    click's three-line usage block."""

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return int(str(value), 10)
        except ValueError:
            from optcheck.errors import InputError

            opt = param.opts[0] if param is not None and param.opts else "value"
            raise InputError(f"{opt} {value}: not an integer (digits only, e.g. {opt} 1000)") from None


INT = _Int()


def _print_summary(summary: dict, findings: list) -> None:
    """The run's closing lines, then what optcheck cost it (``summary["cost"]``)."""
    from optcheck.report.text import render_summary
    from optcheck.record.summary import cost_line

    click.echo(render_summary(summary, [f.to_dict() for f in findings]))
    line = cost_line(summary)
    if line:
        click.echo(line)


def _embedded() -> bool:
    """True when the command runs inside another program (a test's CliRunner),
    whose signal handlers come back after the run; False in the ``optcheck``
    process itself (``optcheck.cli.main``), whose handlers stay until it exits."""
    import sys

    cli = sys.modules.get("optcheck.cli")
    return not getattr(cli, "STANDALONE", False)


def _say_record_error(summary: dict) -> bool:
    """One line on stderr when the run directory stopped taking writes; True then."""
    if not summary.get("record_error"):
        return False
    where = f"the worker was stopped at step {summary.get('last_step', 0):,}"
    if summary.get("summary_error"):
        where += f"; {summary['summary_error']} (summary.json keeps its last state)"
    else:
        where += f"; {summary.get('out')}/summary.json says record-failed"
    click.echo(f"optcheck: error: {summary['record_error']}; {where}", err=True)
    return True


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


def _write_md(path: str, runs: list, plot, baseline=None) -> None:
    from optcheck.report.markdown import write_markdown

    write_markdown(path, [(s, [f.to_dict() for f in fs]) for s, fs in runs], plot, baseline=baseline)


def _compare(run_a, run_b) -> int:
    """Compare two finished runs as ``optcheck compare`` does; return its exit code."""
    from optcheck.judge.compare import compare_runs

    res = compare_runs(run_a, run_b)
    click.echo(res.render())
    return res.exit_code


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


def register(group: click.Group) -> None:
    @group.command()
    @click.option("--steps", type=INT, default=20_000, show_default=True, help="Training steps to run.")
    @click.option("--every", type=INT, default=100, show_default=True, help="A snapshot every N steps.")
    @click.option("--seed", type=INT, default=1337, show_default=True, help="Seeds init and batches.")
    @click.option("--seeds", type=str, default=None, metavar="N,N,...",
                  help="Run once per seed into --out/seed-N: a seed set, which `optcheck compare` "
                       "and `--baseline` judge by its seed band.")
    @click.option("--python", "python", type=click.Path(dir_okay=False), default=None,
                  help="PyTorch backend: the interpreter to run the worker with (another venv's bin/python: "
                       "its torch, this optcheck).")
    @click.option("--data", type=str, default=None,
                  help="Text file, or nanoGPT .bin of uint16 token ids. Default: the Python stdlib's sources.")
    @click.option("--vocab-size", type=INT, default=None, help="Vocabulary of a .bin without meta.pkl beside it.")
    @click.option("--out", type=click.Path(file_okay=False), default=None,
                  help="Run directory (default: runs/<UTC time>).")
    @click.option("--inject", "injects", multiple=True, metavar="NAME@STEP",
                  help="Plant a fault scenario at a step (repeatable; `optcheck scenarios` lists them).")
    @click.option("--fail-on", type=click.Choice(SEVERITIES), default="warning", show_default=True,
                  help="Lowest finding severity that makes the exit code 1.")
    @click.option("--backend", default="pytorch", show_default=True,
                  help="pytorch, torchsharp, or both as pytorch,torchsharp (run one after the other, then compared).")
    @click.option("--same-init", is_flag=True,
                  help="With several backends: start TorchSharp from the PyTorch GPT's initial weights.")
    @click.option("--device", default="cpu", show_default=True, metavar="cpu|cuda|cuda:N",
                  help="Where the GPT, its optimizer state and the batches live (docs/gpu.md); a CUDA device "
                       "that is not there: one line, exit 2.")
    @click.option("--threads", type=INT, default=1, show_default=True,
                  help="Intra-op threads (1 is fastest for the small default model on 2 cores).")
    @click.option("--stop-on-finding", is_flag=True, help="Stop the worker at the first finding of its pre-step check.")
    @click.option("--no-hazards", is_flag=True, help="Switch the autograd hazard probes off.")
    @click.option("--hazards", "hazard_mode", type=click.Choice(["auto", "always"]), default="auto", show_default=True,
                  help="When the hazard probes' hooks are armed: auto (the steps that need them; a failing step "
                       "is re-run armed) or always (every step; docs/hazards.md).")
    @click.option("--allow-inplace", is_flag=True,
                  help="Continue past an in-place write to a saved tensor (default: stop that step).")
    @click.option("--val-every", type=INT, default=1000, show_default=True, help="Held-out loss every N steps (0: never).")
    @click.option("--eval-every", type=INT, default=0, help="Eval-mode pass + model.to() round trip every N steps.")
    @click.option("--checkpoint-every", type=INT, default=0, help="Save and reload model+optimizer every N steps.")
    @click.option("--resume-at", type=INT, default=0, help="Rebuild model+optimizer from the last checkpoint at step N.")
    @click.option("--memory-budget", type=str, default=None,
                  help="Memory budget for OC401's projection, e.g. 4GiB (default: this machine's RAM).")
    @click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak learning rate.")
    @click.option("--optimizer", type=click.Choice(["adamw", "sgd"]), default="adamw", show_default=True)
    @click.option("--n-layer", type=INT, default=2, show_default=True)
    @click.option("--n-embd", type=INT, default=64, show_default=True)
    @click.option("--n-head", type=INT, default=2, show_default=True)
    @click.option("--block-size", type=INT, default=64, show_default=True)
    @click.option("--batch-size", type=INT, default=16, show_default=True)
    @click.option("--dotnet-runtime", type=click.Choice(["coreclr", "mono"]), default="coreclr", show_default=True,
                  help="TorchSharp backend: the .NET runtime pythonnet loads.")
    @click.option("--torchsharp", "torchsharp", type=str, default=None,
                  help="TorchSharp backend: a TorchSharp version to build the worker for (exactly that version; "
                       "default $OPTCHECK_TORCHSHARP or 0.107.0), or a local build's folder.")
    @click.option("--dotnet-assembly", type=click.Path(), default=None,
                  help="TorchSharp backend: a prebuilt worker assembly (.dll) to load instead.")
    @click.option("--dotnet-trainer", type=str, default=None,
                  help="TorchSharp backend: trainer type name in it (default: its one trainer type).")
    @click.option("--trainer-option", "trainer_options", multiple=True, metavar="KEY=VALUE",
                  help="TorchSharp backend: a setting of your own trainer, read in Setup as extra.KEY (repeatable).")
    @click.option("--dotnet-root", type=click.Path(), default=None,
                  help="TorchSharp backend: a .NET installation folder to take CoreCLR from (default: found).")
    @click.option("--force", is_flag=True, help="Replace a run already in --out (default: refuse).")
    @click.option("--step-timeout", "step_timeout", type=float, default=0.0, metavar="SECONDS",
                  help="Kill a worker that reports no step for this long, exit 3 (default 0: never).")
    @click.option("--ignore", "ignores", multiple=True, metavar="CODE[:PATTERN]",
                  help="Accept a finding: a rule code, or CODE:PATTERN on parameter names, e.g. OC205:lm_head.* "
                       "(repeatable; added to [tool.optcheck] ignore of the nearest pyproject.toml).")
    @click.option("--junit", type=click.Path(dir_okay=False), default=None, help="Also write findings as JUnit XML.")
    @click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Also write a PNG of loss/time/memory.")
    @click.option("--summary-md", "summary_md", type=click.Path(dir_okay=False), default=None,
                  help="Also write a Markdown report (e.g. $GITHUB_STEP_SUMMARY; appended to when it is that file).")
    @click.option("--baseline", type=click.Path(), default=None, metavar="DIR",
                  help="Compare with a kept run (or a folder of seed-N runs) and fail only on a regression "
                       "(new findings, loss above its band, steps/s or peak RSS worse beyond tolerance).")
    @click.option("--speed-tolerance", default="25%", show_default=True,
                  help="With --baseline: rise of the worker's CPU time per step allowed (optcheck.judge.baseline).")
    @click.option("--memory-tolerance", default="15%", show_default=True, help="With --baseline: peak RSS rise allowed.")
    @click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
    @click.option("--nproc", type=click.IntRange(min=1), default=1, show_default=True,
                  help="Ranks: >= 2 runs the GPT under DDP with torch.distributed.run (gloo), one run "
                       "directory per rank in --out/rank-K (optcheck/distributed/).")
    def soak(**options):
        """Soak-test a GPT training run and flag inconsistencies at the step they happen.

        Runs the training in a worker process, takes a snapshot every --every steps
        (and at once when the model and optimizer stop agreeing), applies every rule,
        and records snapshots.jsonl, findings.jsonl, metrics.jsonl and summary.json in
        --out. Exit codes: 0 clean, 1 findings, 2 bad input, 3 worker crashed or
        hung, 4 could not record (disk full), 130 interrupted.
        """
        from optcheck.commands._paths import check_output_file
        from optcheck.errors import InputError, RecordError
        from optcheck.drivers.soak import run_backends, run_soak
        from optcheck.drivers.watch import Signals

        o = SimpleNamespace(**options)
        backends = backends_of(o)
        cfg = soak_config(o, backends[0])  # every option before anything is created
        from optcheck.distributed.cli import dispatch  # optcheck.distributed hook: --nproc

        if (code := dispatch(cfg, o.nproc, o.out, fail_on=o.fail_on, quiet=o.quiet, force=o.force,
                             print_summary=_print_summary,
                             other_options=bool(o.seeds or len(backends) > 1 or o.junit or o.plot or o.summary_md
                                                 or o.baseline or o.ignores or o.memory_budget))) is not None:
            return code

        from optcheck.judge.baseline import after_soak, prepare
        from optcheck.commands._paths import same_dir

        if o.baseline is not None and same_dir(o.baseline, o.out if o.out is not None else "runs"):
            raise InputError(f"--baseline {o.baseline}: is the --out of this soak; the run would replace its own "
                             f"baseline and be judged against itself (give the baseline another folder)")
        prepared = prepare(o.baseline, cfg.to_json(), seeds=o.seeds, backends=backends, speed=o.speed_tolerance,
                           memory=o.memory_tolerance, fail_on=o.fail_on)
        for option, target in (("--junit", o.junit), ("--plot", o.plot), ("--summary-md", o.summary_md)):
            if target:
                check_output_file(target, option, created_dir=o.out)
        rule_config = rule_config_for(o.memory_budget)
        ignore = ignore_entries(o.ignores)
        if o.seeds is not None:
            from optcheck.judge.upgrade import parse_seeds, run_seeds

            if len(backends) > 1:
                raise InputError("--seeds runs one backend: give --backend pytorch or torchsharp")
            results, code = run_seeds(cfg, parse_seeds(o.seeds), o.out, fail_on=o.fail_on, rule_config=rule_config,
                                      progress=not o.quiet, force=o.force, signals=Signals(restore=_embedded()),
                                      ignore=ignore)
            for r in results:
                _print_summary(r.summary, r.findings)
                _say_record_error(r.summary)
            if o.summary_md:
                _write_md(o.summary_md, [(r.summary, r.findings) for r in results], None)
            return code
        if len(backends) > 1:
            results, code = run_backends(cfg, backends, o.out, same_init=o.same_init, fail_on=o.fail_on,
                                         rule_config=rule_config, progress=not o.quiet, force=o.force,
                                         signals=Signals(restore=_embedded()), ignore=ignore)
            for r in results:
                _print_summary(r.summary, r.findings)
                _say_record_error(r.summary)
            if o.summary_md:
                _write_md(o.summary_md, [(r.summary, r.findings) for r in results], None)
            if all(r.summary["status"] in ("clean", "findings") for r in results):
                code = max(code, _compare(results[0].out, results[1].out))
            return code
        result = run_soak(cfg, o.out, fail_on=o.fail_on, rule_config=rule_config, progress=not o.quiet, force=o.force,
                          signals=Signals(restore=_embedded()), ignore=ignore)
        _print_summary(result.summary, result.findings)
        if _say_record_error(result.summary):
            return result.exit_code
        against, code = after_soak(result.out, prepared, result.exit_code, click.echo) if prepared else (None, None)
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
        return result.exit_code if code is None else code
