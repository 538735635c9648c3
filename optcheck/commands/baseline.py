"""``optcheck baseline RUN BASELINE``: judge a finished run against a kept one, as ``soak --baseline`` does."""

from __future__ import annotations

import click


def register(group: click.Group) -> None:
    @group.command()
    @click.argument("run", type=click.Path())
    @click.argument("baseline", type=click.Path())
    @click.option("--speed-tolerance", default="25%", show_default=True,
                  help="Rise of the worker's CPU time per step allowed (wall-clock step time for runs without it).")
    @click.option("--memory-tolerance", default="15%", show_default=True, help="Peak RSS rise allowed.")
    @click.option("--fail-on", type=click.Choice(["info", "warning", "error"]), default="warning", show_default=True,
                  help="Lowest severity of a new finding that is a regression.")
    @click.option("--summary-md", "summary_md", type=click.Path(dir_okay=False), default=None,
                  help="Also write the run's Markdown report with the comparison (e.g. $GITHUB_STEP_SUMMARY).")
    @click.option("--junit", type=click.Path(dir_okay=False), default=None,
                  help="Also write the run's findings and the comparison as JUnit XML (fails exactly when the exit "
                       "code is 1).")
    def baseline(run, baseline, speed_tolerance, memory_tolerance, fail_on, summary_md, junit):
        """Compare run directory RUN (an `optcheck soak --out` folder) with BASELINE (a kept
        run, or a folder of seed-N runs) and fail only on a regression: findings not in the
        baseline, final or held-out loss above the baseline's band, CPU time per step or peak RSS worse
        beyond tolerance. A trajectory that differs inside the band is reported, not failed.

        Exit codes: 0 no regression, 1 regression, 2 bad input or not comparable.
        """
        from optcheck.judge.baseline import Tolerances, compare_with_baseline, load_baseline, parse_fraction
        from optcheck.commands._paths import check_output_file
        from optcheck.report.reader import RunReader, read_summary

        tol = Tolerances(speed=parse_fraction(speed_tolerance, "--speed-tolerance"),
                         memory=parse_fraction(memory_tolerance, "--memory-tolerance"), fail_on=fail_on)
        for option, target in (("--summary-md", summary_md), ("--junit", junit)):
            if target:
                check_output_file(target, option)
        summary = read_summary(run)
        res = compare_with_baseline(run, load_baseline(baseline), tol)
        for line in res.lines():
            click.echo(line)
        if summary_md:
            from optcheck.report.markdown import write_markdown

            write_markdown(summary_md, [(summary, RunReader(run).findings)], None, baseline=res)
        if junit:
            from optcheck.report.junit import write_junit

            write_junit(RunReader(run).findings, junit, suite_name=f"optcheck baseline {run}", summary=summary,
                        fail_on=fail_on, baseline=res)
        return res.exit_code
