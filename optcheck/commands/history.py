"""``optcheck history RUN_DIR... | FOLDER``: the trend of a soak night by night."""

from __future__ import annotations

import click

from optcheck.run import exitcodes


def register(group: click.Group) -> None:
    @group.command()
    @click.argument("runs", nargs=-1, required=True, type=click.Path(readable=False))
    @click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Also write a PNG of the trend.")
    @click.option("--k", "k", type=float, default=None,
                  help="Regression band: median + k x spread of the earlier nights (default 5).")
    def history(runs, plot, k):
        """Print (and with --plot, draw) final and held-out loss, steps/s, peak RSS,
        findings and versions of each run, oldest first; mark the nights a version
        changed, new finding codes appeared, a loss rose beyond the earlier
        nights' spread (median + k x 1.4826 MAD, at least 1% of the median), or
        steps/s fell / peak RSS rose by over 15% against the previous night and
        beyond the earlier nights' spread.

        RUNS: run directories, or folders holding them (a subfolder that cannot be
        read is left out, with a note). Exit codes: 0 printed, 2 bad input.
        """
        from optcheck.commands._paths import check_output_file
        from optcheck.errors import InputError
        from optcheck.report.history import K_MAD, mark_nights, plot_history, read_nights, render_history

        if k is not None and not k > 0:
            raise InputError(f"--k {k}: must be a positive number")
        if plot:
            check_output_file(plot, "--plot")
        skipped: list[str] = []
        nights = mark_nights(read_nights(runs, skipped), K_MAD if k is None else k)
        for note in skipped:
            click.echo(f"optcheck: note: {note}", err=True)
        click.echo(render_history(nights))
        if plot:
            try:
                plot_history(nights, plot)
            except OSError as e:
                raise InputError(f"--plot {plot}: cannot write there ({e.strerror or e})") from None
        return exitcodes.CLEAN
