"""The ``optcheck`` command line: a click group whose commands live in
``optcheck/commands/``. Exit codes: ``optcheck.run.exitcodes``."""

from __future__ import annotations

import io
import sys

import click

from optcheck import __version__
from optcheck.commands import register_all
from optcheck.errors import InputError, RecordError
from optcheck.run.exitcodes import RECORD_FAILED, USAGE


class StdoutLost(Exception):
    """A write to stdout failed (a closed pipe, a full disk): carried past click, which would
    otherwise end a broken pipe with exit 1 and no word (``click.core.Command.main``)."""

    def __init__(self, err: OSError):
        super().__init__(str(err))
        self.err = err


class _Group(click.Group):
    """A click group that turns :class:`InputError` into one line on stderr and
    exit 2, :class:`RecordError` (nothing could be recorded) into one line and exit 4,
    and a failed write to stdout into :class:`StdoutLost` (one line and exit 4 in :func:`main`)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except InputError as e:
            click.echo(f"optcheck: error: {e}", err=True)
            ctx.exit(USAGE)
        except RecordError as e:
            click.echo(f"optcheck: error: {e}", err=True)
            ctx.exit(RECORD_FAILED)
        except OSError as e:
            if _stdout_failed(e):
                raise StdoutLost(e) from None
            if isinstance(e, PermissionError) and ctx.invoked_subcommand in READING_COMMANDS:
                # a run directory (or a folder above it) this user may not read: one line, as
                # `history` says it (issue 48: check's rank_dirs, compare, the baseline's reader)
                click.echo(f"optcheck: error: {e.filename or 'a run directory'}: cannot read "
                           f"({e.strerror or e})", err=True)
                ctx.exit(USAGE)
            raise


#: The commands that only read run directories: a PermissionError in any of them is the user's
#: input (a folder they may not read), one line and exit 2, never a traceback.
READING_COMMANDS = frozenset({"check", "compare", "baseline", "history"})


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="optcheck")
def cli() -> None:
    """Soak tester and consistency checker for deep-learning optimizers.

    \b
    optcheck soak --steps 20000          soak the built-in GPT on the default corpus
    optcheck check RUN/snapshots.jsonl   re-run the rules over a recorded stream
    optcheck rules / explain OC101       the rule catalogue
    optcheck scenarios                   the faults --inject can plant
    """


register_all(cli)


#: True in the ``optcheck`` process itself (set by :func:`main`): a soak then keeps
#: its SIGINT/SIGTERM handlers until the process exits (``optcheck.drivers.watch.Signals``).
STANDALONE = False


def main() -> None:
    """Console-script entry point: InputError anywhere becomes one line and exit 2."""
    global STANDALONE
    STANDALONE = True
    _watch_stdout()
    try:
        rc = cli.main(standalone_mode=False)
    except StdoutLost as e:
        _stdout_lost(e.err)
    except OSError as e:
        if not _stdout_failed(e):
            raise
        _stdout_lost(e)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(USAGE if e.exit_code == 2 or isinstance(e, click.UsageError) else e.exit_code)
    _ignore_late_signals()
    try:
        sys.stdout.flush()
    except OSError as e:  # the last lines did not fit (a full disk, a closed pipe)
        _stdout_lost(e)
    sys.exit(rc or 0)


def _stdout_lost(e: OSError) -> None:
    """One line on stderr, exit 4: what optcheck printed could not be written."""
    _quiet_stdout()
    try:
        click.echo(f"optcheck: error: cannot write to stdout ({e.strerror or e})", err=True)
    except OSError:
        pass
    sys.exit(RECORD_FAILED)


class _RecordingStdout(io.FileIO):
    """File descriptor 1 as :func:`main` writes it: a write that fails is kept in
    :attr:`error`, so a failure is told apart from one of any other file (the
    buffer a failed write leaves is dropped, so flushing again tells nothing)."""

    error: OSError | None = None

    def write(self, b):
        try:
            return super().write(b)
        except OSError as e:
            _RecordingStdout.error = e
            raise


def _watch_stdout() -> None:
    """Put :class:`_RecordingStdout` under ``sys.stdout`` (same encoding and buffering)."""
    out = sys.stdout
    try:
        fd = out.fileno()
        raw = _RecordingStdout(fd, "w", closefd=False)
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), encoding=out.encoding, errors=out.errors,
                                      line_buffering=out.line_buffering, write_through=out.write_through)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):  # no real stdout: leave it
        return
    try:
        out.flush()
    except (OSError, ValueError):
        pass


def _stdout_failed(e: OSError) -> bool:
    """Whether ``e`` is a write to stdout that failed (EPIPE: the reader went away;
    ENOSPC/EFBIG/EIO: stdout is redirected to a full disk): it is then one line on
    stderr and exit 4, not a traceback. Told by stdout itself (:class:`_RecordingStdout`):
    a report file that failed the same way (``--summary-md /dev/full``) is named by its writer."""
    failed = _RecordingStdout.error
    return failed is not None and (failed is e or failed.errno == e.errno)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so Python's own flush at exit does not fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _ignore_late_signals() -> None:
    """A soak's SIGINT/SIGTERM handlers (``optcheck.drivers.watch.Signals``) become SIG_IGN
    for the last moments of the process: Python resets its own handlers to the
    default action while it shuts down, and a repeated Ctrl-C arriving then
    would turn the exit code already decided (130) into a death by SIGINT."""
    import signal

    from optcheck.drivers.watch import Signals

    for s in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(s)
        if getattr(handler, "__self__", None) is not None and isinstance(handler.__self__, Signals):
            signal.signal(s, signal.SIG_IGN)


if __name__ == "__main__":
    main()
