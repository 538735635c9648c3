"""``optcheck soak``: run the built-in GPT for many steps and check it all the way."""

from __future__ import annotations

import click

from optcheck.config import Injection, SoakConfig
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
    from optcheck.run.summary import cost_line

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
    def soak(steps, every, seed, seeds, python, data, vocab_size, out, injects, fail_on, backend, same_init, device, threads, stop_on_finding,
             no_hazards, hazard_mode, allow_inplace, val_every, eval_every, checkpoint_every, resume_at, memory_budget, lr,
             optimizer, n_layer, n_embd, n_head, block_size, batch_size, dotnet_runtime, torchsharp,
             dotnet_assembly, dotnet_trainer, trainer_options, dotnet_root, force, step_timeout, ignores, junit, plot, summary_md, baseline, speed_tolerance, memory_tolerance, quiet, nproc):
        """Soak-test a GPT training run and flag inconsistencies at the step they happen.

        Runs the training in a worker process, takes a snapshot every --every steps
        (and at once when the model and optimizer stop agreeing), applies every rule,
        and writes snapshots.jsonl, findings.jsonl, metrics.jsonl and summary.json to
        --out. Exit codes: 0 clean, 1 findings, 2 bad input, 3 worker crashed or
        hung, 4 could not record (disk full), 130 interrupted.
        """
        from optcheck.commands._paths import check_output_file
        from optcheck.errors import InputError, RecordError
        from optcheck.drivers.soak import run_backends, run_soak
        from optcheck.drivers.watch import Signals

        backends = [b.strip() for b in backend.split(",") if b.strip()]
        if not backends or any(b not in ("pytorch", "torchsharp") for b in backends) or len(set(backends)) < len(backends):
            raise InputError(f"--backend {backend!r}: pytorch, torchsharp or pytorch,torchsharp")
        if same_init and len(backends) < 2:
            raise InputError("--same-init needs two backends: --backend pytorch,torchsharp")
        if (len(backends) > 1 or seeds is not None) and (junit or plot):
            option = "--junit" if junit else "--plot"
            many = f"--backend {backend} makes two" if len(backends) > 1 else f"--seeds {seeds} makes one per seed"
            raise InputError(f"{option} writes one run's report, and {many}: run each with its own {option}, "
                             f"or use --summary-md (it covers every run)")

        from optcheck.torchsharp_bridge.options import parse_trainer_options

        extra = {**parse_trainer_options(trainer_options), "optimizer": optimizer, "dotnet_runtime": dotnet_runtime}
        for key, value in (("python", python), ("torchsharp", torchsharp), ("dotnet_assembly", dotnet_assembly),
                           ("dotnet_trainer", dotnet_trainer), ("dotnet_root", dotnet_root)):
            if value:
                extra[key] = value
        cfg = SoakConfig(
            backend=backends[0], steps=steps, every=every, seed=seed, data=data, vocab_size=vocab_size,
            inject=[Injection.parse(i) for i in injects], threads=threads, stop_on_finding=stop_on_finding,
            hazards=not no_hazards, hazard_mode=hazard_mode, allow_inplace=allow_inplace, val_every=val_every, eval_every=eval_every,
            checkpoint_every=checkpoint_every, resume_at=resume_at, lr=lr, n_layer=n_layer, n_embd=n_embd,
            n_head=n_head, block_size=block_size, batch_size=batch_size, step_timeout_s=step_timeout, device=device,
            extra=extra)
        cfg.validate()  # every option before anything is created
        from optcheck.distributed.cli import dispatch  # optcheck.distributed hook: --nproc

        if (code := dispatch(cfg, nproc, out, fail_on=fail_on, quiet=quiet, force=force, print_summary=_print_summary,
                             other_options=bool(seeds or len(backends) > 1 or junit or plot or summary_md or baseline
                                                 or ignores or memory_budget))) is not None:
            return code

        from optcheck.judge.baseline import after_soak, prepare
        from optcheck.commands._paths import same_dir

        if baseline is not None and same_dir(baseline, out if out is not None else "runs"):
            raise InputError(f"--baseline {baseline}: is the --out of this soak; the run would replace its own "
                             f"baseline and be judged against itself (give the baseline another folder)")
        prepared = prepare(baseline, cfg.to_json(), seeds=seeds, backends=backends, speed=speed_tolerance,
                           memory=memory_tolerance, fail_on=fail_on)
        for option, target in (("--junit", junit), ("--plot", plot), ("--summary-md", summary_md)):
            if target:
                check_output_file(target, option, created_dir=out)
        rule_config = rule_config_for(memory_budget)
        ignore = ignore_entries(ignores)
        if seeds is not None:
            from optcheck.judge.upgrade import parse_seeds, run_seeds

            if len(backends) > 1:
                raise InputError("--seeds runs one backend: give --backend pytorch or torchsharp")
            results, code = run_seeds(cfg, parse_seeds(seeds), out, fail_on=fail_on, rule_config=rule_config,
                                      progress=not quiet, force=force, signals=Signals(restore=_embedded()),
                                      ignore=ignore)
            for r in results:
                _print_summary(r.summary, r.findings)
                _say_record_error(r.summary)
            if summary_md:
                _write_md(summary_md, [(r.summary, r.findings) for r in results], None)
            return code
        if len(backends) > 1:
            results, code = run_backends(cfg, backends, out, same_init=same_init, fail_on=fail_on,
                                         rule_config=rule_config, progress=not quiet, force=force,
                                         signals=Signals(restore=_embedded()), ignore=ignore)
            for r in results:
                _print_summary(r.summary, r.findings)
                _say_record_error(r.summary)
            if summary_md:
                _write_md(summary_md, [(r.summary, r.findings) for r in results], None)
            if all(r.summary["status"] in ("clean", "findings") for r in results):
                code = max(code, _compare(results[0].out, results[1].out))
            return code
        result = run_soak(cfg, out, fail_on=fail_on, rule_config=rule_config, progress=not quiet, force=force,
                          signals=Signals(restore=_embedded()), ignore=ignore)
        _print_summary(result.summary, result.findings)
        if _say_record_error(result.summary):
            return result.exit_code
        against, code = after_soak(result.out, prepared, result.exit_code, click.echo) if prepared else (None, None)
        try:
            if junit:
                from optcheck.report.junit import write_junit

                write_junit([f.to_dict() for f in result.findings], junit, suite_name=f"optcheck soak {result.out}",
                            summary=result.summary, crash=result.summary.get("crash"), fail_on=fail_on,
                            time_s=result.summary.get("elapsed_s"), baseline=against)
            if plot:
                from optcheck.report.plot import plot_run

                plot_run(result.out, plot)
            if summary_md:
                _write_md(summary_md, [(result.summary, result.findings)], plot, against)
        except OSError as e:
            raise RecordError(e.filename or junit or plot or summary_md, e) from None
        return result.exit_code if code is None else code
