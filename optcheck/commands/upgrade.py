"""``optcheck upgrade``: is it safe to move from version A to version B? (issue 12)."""

from __future__ import annotations

import click

from optcheck.findings import SEVERITIES


def register(group: click.Group) -> None:
    @group.command()
    @click.option("--baseline-python", type=click.Path(dir_okay=False), default=None,
                  help="PyTorch: the baseline's interpreter (default: this one).")
    @click.option("--candidate-python", type=click.Path(dir_okay=False), default=None,
                  help="PyTorch: the candidate's interpreter, e.g. /venv-new-torch/bin/python.")
    @click.option("--baseline-torchsharp", type=str, default=None,
                  help="TorchSharp: the baseline's version (or a local build's folder).")
    @click.option("--candidate-torchsharp", type=str, default=None,
                  help="TorchSharp: the candidate's version (or a local build's folder).")
    @click.option("--baseline-backend", type=click.Choice(["pytorch", "torchsharp"]), default=None,
                  help="Default: torchsharp when --baseline-torchsharp is given, else pytorch.")
    @click.option("--candidate-backend", type=click.Choice(["pytorch", "torchsharp"]), default=None,
                  help="Default: torchsharp when --candidate-torchsharp is given, else pytorch. Two backends "
                       "start from the same initial weights.")
    @click.option("--steps", type=int, default=2000, show_default=True, help="Training steps of the soak.")
    @click.option("--every", type=int, default=100, show_default=True, help="A snapshot every N steps.")
    @click.option("--seed", type=int, default=1337, show_default=True, help="Seeds init and batches (both sides).")
    @click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak learning rate (both sides).")
    @click.option("--threads", type=int, default=1, show_default=True, help="Intra-op threads (both sides).")
    @click.option("--data", type=str, default=None, help="Training text or .bin (default: the stdlib's sources).")
    @click.option("--n-layer", type=int, default=2, show_default=True)
    @click.option("--n-embd", type=int, default=64, show_default=True)
    @click.option("--batch-size", type=int, default=16, show_default=True)
    @click.option("--scenarios", "with_scenarios", is_flag=True,
                  help="Also run every --inject scenario both sides support (short runs) and print the matrix.")
    @click.option("--scenario", "only", multiple=True, metavar="NAME",
                  help="With --scenarios: only these scenarios (repeatable).")
    @click.option("--scenario-steps", type=int, default=40, show_default=True,
                  help="Steps of each scenario run; the fault is planted halfway.")
    @click.option("--out", type=click.Path(file_okay=False), default=None,
                  help="Folder for baseline/, candidate/ and scenarios/ (default: runs/<UTC time>).")
    @click.option("--force", is_flag=True, help="Replace runs already in --out.")
    @click.option("--junit", type=click.Path(dir_okay=False), default=None,
                  help="Also write one testcase per verdict and per scenario row as JUnit XML.")
    @click.option("--fail-on", type=click.Choice(SEVERITIES), default="warning", show_default=True,
                  help="Lowest finding severity that counts against a side (as `optcheck soak --fail-on`).")
    @click.option("--memory-budget", type=str, default=None,
                  help="Memory budget for OC401's projection on both sides, e.g. 4GiB (default: this machine's RAM).")
    @click.option("--ignore", "ignores", multiple=True, metavar="CODE[:PATTERN]",
                  help="Accept a finding on both sides (as `optcheck soak --ignore`; repeatable; added to "
                       "[tool.optcheck] ignore of the nearest pyproject.toml).")
    @click.option("--speed-tolerance", default="25%", show_default=True,
                  help="Rise of the candidate's worker CPU time per step allowed (as soak --baseline).")
    @click.option("--speed-pairs", type=int, default=3, show_default=True,
                  help="A speed regression of the two runs is run again in this many interleaved pairs of "
                       "short runs and fails only if their median confirms it (0: not run again).")
    @click.option("--memory-tolerance", default="15%", show_default=True,
                  help="Rise of the candidate's peak RSS allowed (as soak --baseline).")
    @click.option("--policy", type=click.Choice(["auto", "rerun", "migration"]), default="auto", show_default=True,
                  help="How the trajectories are judged (as optcheck compare --policy): auto takes a migration "
                       "when the backend or its torch/libtorch differs.")
    @click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
    def upgrade(baseline_python, candidate_python, baseline_torchsharp, candidate_torchsharp, baseline_backend,
                candidate_backend, steps, every, seed, lr, threads, data, n_layer, n_embd, batch_size,
                with_scenarios, only, scenario_steps, out, force, junit, fail_on, memory_budget, ignores,
                speed_tolerance, speed_pairs, memory_tolerance, policy, quiet):
        """Run the same soak (seed, data, batches, config) on a baseline and a candidate
        and print the verdict first: IDENTICAL, WITHIN NUMERICAL NOISE (same seed, with the
        measured size), WITHIN THE SEED BAND (a migration: another backend or torch/libtorch)
        or DIVERGED (from which step, by how much, where: parameter, option, versions), with
        every regression of the candidate on the same line: new findings, loss above its band,
        worker CPU time per step (--speed-tolerance; confirmed in --speed-pairs interleaved
        pairs of short runs before it fails), peak RSS (--memory-tolerance), as
        `soak --baseline` judges a night. Everything is checked before anything runs: the
        scenarios (listed first; never the --nproc-only ones), each side's options, and the
        torch of each --*-python.

        \b
        optcheck upgrade --candidate-python /venv-torch-new/bin/python --steps 2000
        optcheck upgrade --baseline-torchsharp 0.99.6 --candidate-torchsharp 0.107.0
        optcheck upgrade --candidate-backend torchsharp          # PyTorch against TorchSharp

        Exit codes: 0 identical, within noise or within the seed band, no regression (and, with
        --scenarios, no scenario changed); 1 diverged, a regression or a scenario changed
        behaviour; 2 bad input (nothing run); 3 a side crashed; 130 interrupted.
        """
        from optcheck.commands._paths import check_output_file
        from optcheck.commands.soak_plan import ignore_entries, rule_config_for
        from optcheck.config import DataConfig, ModelConfig, OptimizerConfig, RunConfig, SoakConfig
        from optcheck.errors import InputError
        from optcheck.judge.baseline import Tolerances, parse_fraction
        from optcheck.judge.upgrade import Side, check_python, render, run_upgrade

        sides = []
        for name, python, ts, backend in (("baseline", baseline_python, baseline_torchsharp, baseline_backend),
                                          ("candidate", candidate_python, candidate_torchsharp, candidate_backend)):
            backend = backend or ("torchsharp" if ts else "pytorch")
            if python and backend != "pytorch":
                raise InputError(f"--{name}-python: only for the pytorch backend ({name} is {backend})")
            if ts and backend != "torchsharp":
                raise InputError(f"--{name}-torchsharp: only for the torchsharp backend ({name} is {backend})")
            sides.append(Side(name, backend, check_python(python, f"--{name}-python"), ts))
        if only and not with_scenarios:
            raise InputError("--scenario needs --scenarios")
        if junit:
            check_output_file(junit, "--junit", created_dir=out)
        # every option that shapes a side's findings reaches both sides' soaks and scenario runs
        shaping = {"fail_on": fail_on, "rule_config": rule_config_for(memory_budget), "ignore": ignore_entries(ignores)}
        cfg = SoakConfig(model=ModelConfig(n_layer=n_layer, n_embd=n_embd), optimizer=OptimizerConfig(lr=lr),
                         data=DataConfig(path=data, batch_size=batch_size, val_every=0),
                         run=RunConfig(steps=steps, every=every, seed=seed, threads=threads)).validate()
        tol = Tolerances(speed=parse_fraction(speed_tolerance, "--speed-tolerance"),
                         memory=parse_fraction(memory_tolerance, "--memory-tolerance"), fail_on=fail_on)
        names = (list(only) or "all") if with_scenarios else None
        result = run_upgrade(cfg, sides[0], sides[1], out, scenarios=names, scenario_steps=scenario_steps,
                             progress=not quiet, force=force, tolerances=tol, policy=policy, echo=click.echo,
                             speed_pairs=speed_pairs, **shaping)
        click.echo(render(result, sides))
        if junit:
            from optcheck.report.junit import write_upgrade_junit

            write_upgrade_junit(result, sides, junit)
        return result.exit_code
