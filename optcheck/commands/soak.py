"""``optcheck soak``: run the built-in GPT for many steps and check it all the way.

The command parses its options and prints; what it runs is planned by
``optcheck.commands.soak_plan.plan_soak`` and run by ``run_plan``."""

from __future__ import annotations

import click

from optcheck.findings import SEVERITIES


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


def _say_record_error(summary: dict) -> bool:
    """One line on stderr when the run directory stopped taking writes; True then."""
    if not summary.get("record_error"):
        return False
    where = (f"the ranks trained on to step {summary.get('last_step', 0):,}" if (summary.get("world") or 1) > 1
             else f"the worker was stopped at step {summary.get('last_step', 0):,}")
    if summary.get("summary_error"):
        where += f"; {summary['summary_error']} (summary.json keeps its last state)"
    else:
        where += f"; {summary.get('out')}/summary.json says record-failed"
    click.echo(f"optcheck: error: {summary['record_error']}; {where}", err=True)
    return True


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
        from optcheck.commands.soak_plan import plan_soak, run_plan

        plan = plan_soak(options)  # every option checked, nothing created yet
        return _print_outcome(run_plan(plan))


def _print_outcome(outcome) -> int:
    """Print what ``run_plan`` ran (``optcheck.commands.soak_plan.SoakOutcome``): each run's closing
    lines, the judgment against the baseline, the comparison of two backends; return the exit code."""
    import sys

    for r in outcome.results:
        _print_summary(r.summary, r.findings)
        _say_record_error(r.summary)
    for note in outcome.notes:  # lines of the ranks' files the reader skipped
        print(f"optcheck: note: {note}", file=sys.stderr)
    if outcome.error is not None:
        raise outcome.error
    if outcome.baseline is not None:
        for line in outcome.baseline.lines():
            click.echo(line)
    if outcome.compare is not None:
        click.echo(outcome.compare.render())
    return outcome.code
