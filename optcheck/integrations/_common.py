"""What both framework callbacks share: the Monitor they own and its results."""

from __future__ import annotations

from pathlib import Path

from optcheck.run import exitcodes


class MonitorOwner:
    """Holds the :class:`optcheck.Monitor` a callback starts and closes.

    Args:
        out: run directory (default: ``<the framework's output folder>/optcheck``).
        every, fail_on, on_finding, hazards, ignore, ...: :class:`optcheck.Monitor`'s
            keyword arguments, passed through.
    """

    def __init__(self, out: str | Path | None = None, **monitor_kwargs):
        self.out = out
        self.monitor_kwargs = monitor_kwargs
        self.monitor = None
        self.summary: dict | None = None

    def _start(self, model, optimizer, default_out: str | Path) -> None:
        from optcheck.drivers.monitor import Monitor

        if self.monitor is not None and not self.monitor.closed:  # a second fit() on the same callback
            self._finish()
        out = self.out if self.out is not None else Path(default_out) / "optcheck"
        self.summary = None
        self.monitor = Monitor(model, optimizer, out=str(out), **self.monitor_kwargs)

    def _finish(self, exc: BaseException | None = None) -> None:
        if self.monitor is None or self.monitor.closed:
            return
        if exc is not None:
            self.monitor.record_crash(exc)
        self.summary = self.monitor.close()

    @property
    def findings(self) -> list:
        """Every finding of the run (``optcheck.findings.Finding``), in order."""
        return self.monitor.findings if self.monitor is not None else []

    @property
    def exit_code(self) -> int:
        """The run's exit code (``optcheck.run.exitcodes``: 0 clean, 1 a finding at or above
        ``fail_on``, 3 training crashed); ``sys.exit(callback.exit_code)`` after
        ``fit()``/``train()`` fails a CI job as ``optcheck soak`` would."""
        return self.monitor.exit_code if self.monitor is not None else exitcodes.CLEAN
