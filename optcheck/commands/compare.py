"""``optcheck compare RUN_A RUN_B``: do two runs train alike? (upgrade / backend validation)."""

from __future__ import annotations

import json

import click

from optcheck.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL, DEFAULT_WINDOW, compare_runs


def register(group: click.Group) -> None:
    @group.command()
    @click.argument("run_a", type=click.Path())
    @click.argument("run_b", type=click.Path())
    @click.option("--tolerance", "rtol", type=float, default=DEFAULT_RTOL, show_default=True,
                  help="Relative tolerance of the smoothed losses (fraction of run A's).")
    @click.option("--atol", type=float, default=DEFAULT_ATOL, show_default=True,
                  help="Absolute tolerance of the smoothed losses (loss units).")
    @click.option("--window", type=int, default=DEFAULT_WINDOW, show_default=True,
                  help="Trailing-mean window over the common steps.")
    @click.option("--fail-on-new", is_flag=True, help="Exit 1 also when run B has findings run A has not.")
    @click.option("--policy", type=click.Choice(["auto", "rerun", "migration"]), default="auto", show_default=True,
                  help="rerun: same seed judged step by step on float rounding; migration (another backend or "
                       "native library): trailing means within the seed tolerance, options compared where both "
                       "sides have them, findings only in B fail; auto picks from the runs' versions.")
    @click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
    def compare(run_a, run_b, rtol, atol, window, fail_on_new, policy, as_json):
        """Compare two run directories: loss trajectories aligned by step (OC601 when
        they diverge beyond tolerance), findings present in one run only, step-time
        and peak-memory ratios (B/A), library versions.

        RUN_A is the reference (e.g. the last good version), RUN_B the candidate.
        The verdict comes first: IDENTICAL, WITHIN NUMERICAL NOISE (same seed: float-rounding
        size), WITHIN THE SEED BAND (different seeds, seed sets, or a migration: another backend
        or torch/libtorch, judged on trailing means) or DIVERGED, each with its size, and the
        policy used. Runs of different --steps are refused (the learning-rate schedule follows
        --steps). Folders of `optcheck soak --seeds 1,2,3` (seed-N runs inside)
        are compared as seed bands: the candidate's seeds against the baseline's. Runs folded
        from several streams (`soak --nproc`, `optcheck run` of a GAN or torchrun: rank-K
        folders) are compared rank by rank, each under its heading; both need the same streams.
        Exit codes: 0 the trajectories agree, 1 OC601 (or, with --fail-on-new, findings
        only in B), 2 bad input.
        """
        from pathlib import Path

        from optcheck.judge.seeds import compare_seed_sets, seed_runs

        if not (Path(run_a) / "summary.json").exists() and seed_runs(run_a) and seed_runs(run_b):
            verdict, code, text = compare_seed_sets(run_a, run_b, window=window)
            click.echo(json.dumps(verdict.to_dict(), indent=2) if as_json else text)
            return code
        from optcheck.judge.folded import compare_folded, paired_streams

        pairs = paired_streams(run_a, run_b)
        if pairs:  # runs folded from several streams (GAN, torchrun, soak --nproc): rank by rank
            text, code = compare_folded(pairs, as_json=as_json, loss_rtol=rtol, loss_atol=atol, window=window,
                                        fail_on_new=fail_on_new, policy=policy)
            click.echo(text)
            return code
        res = compare_runs(run_a, run_b, loss_rtol=rtol, loss_atol=atol, window=window, fail_on_new=fail_on_new,
                           policy=policy)
        click.echo(res.to_json() if as_json else res.render())
        return res.exit_code
