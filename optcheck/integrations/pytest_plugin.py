"""``pytest --optcheck``: every test that steps an optimizer is watched by an ``optcheck.Monitor``.

Registered through the ``pytest11`` entry point (``pyproject.toml``), under this module's own
name, so ``-p optcheck.integrations.pytest_plugin`` (a checkout that is not pip-installed) and
the entry point never load it twice; ``-p no:optcheck.integrations.pytest_plugin`` blocks it.
Without ``--optcheck`` the plugin only adds its options and registers its marker: no test run
changes because optcheck is installed (torch is not even imported).

With ``--optcheck``, for each test (``docs/guide/pytest.md``):

- before its set-up, an :class:`optcheck.autowatch.attach.AutoWatch` is installed (torch's global
  optimizer-step and module-forward hooks): at an optimizer's first ``step()`` a Monitor opens
  over the model whose forward ran, writing ``<session dir>/<test id>/proc-<pid>``;
- at the end of its call, the watch is uninstalled (every Monitor closed, its final snapshot
  checked); a finding at or above ``--optcheck-fail-on`` (default ``warning``) makes a test that
  passed FAIL with the findings as ``optcheck check`` prints them, each with the test's line
  that was running when it was found (``test_x.py:23``); a test that already failed keeps its
  own failure, the findings added as a report section ("optcheck");
- what was watched goes into the report's ``user_properties`` (``("optcheck", JSON)``), which
  pytest-xdist passes from each worker to the controller and ``--junitxml`` writes; the terminal
  summary (on the controller under ``-n``) lists every test that stepped an optimizer.

The autograd hazard probes are on for every step (``--optcheck-hazards always``, where a Monitor
arms them on the steps that need them: a test's loop is short, and an in-place write to a tensor
saved for backward is then stopped naming the op and the test's line that wrote it).
``@pytest.mark.optcheck(off=True)`` leaves a test unwatched; ``@pytest.mark.optcheck(fail_on="error")``
sets its level (``info``, ``warning``, ``error``). Findings are only recorded while the test runs
(``on_finding="ignore"``): no ``OptcheckWarning`` reaches the test's own warning filters.

Limits: steps taken in a fixture's teardown are not judged (the watch ends with the call);
a test that opens its own ``Monitor`` gets a second one from the plugin; under
``optcheck run -- pytest`` the run's own watch is already in every process, so ``--optcheck``
steps aside (one line in the header).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import pytest

from optcheck.findings import SEVERITIES, severity_rank

#: the ``user_properties`` name of what the plugin records for a test
PROPERTY = "optcheck"
#: snapshot cadence of each test's Monitors (tests are short loops: 10, not the Monitor's 100)
EVERY = 10
_MARKER = "optcheck(off=False, fail_on=None): off=True leaves this test unwatched by --optcheck; " \
          "fail_on='info'|'warning'|'error' sets the level at which its findings fail it"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")

try:  # pluggy >= 1.2's new-style wrappers; an older pytest still loads this module (every run autoloads it)
    _WRAPPER = pytest.hookimpl(wrapper=True)
except TypeError:
    _WRAPPER = None


def _wrapper(fn):
    """``@pytest.hookimpl(wrapper=True)`` where pluggy has it (else --optcheck is refused, in one line)."""
    return fn if _WRAPPER is None else _WRAPPER(fn)


def pytest_addoption(parser) -> None:
    group = parser.getgroup("optcheck", "optcheck: watch every test's optimizer steps")
    group.addoption("--optcheck", action="store_true", default=False,
                    help="watch every test that steps a torch optimizer; fail it on a finding")
    group.addoption("--optcheck-out", metavar="DIR", default=None,
                    help="where each test's run directory goes (DIR/<test id>; DIR must be empty or "
                         "absent; default: a new temporary folder)")
    group.addoption("--optcheck-fail-on", choices=SEVERITIES, default="warning",
                    help="the lowest severity that fails a test (default: warning)")
    group.addoption("--optcheck-hazards", choices=("always", "auto", "off"), default="always",
                    help="the autograd hazard probes: always (default: a test's loop is short; an in-place "
                         "write is named with its op and line), auto (as a Monitor), off")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", _MARKER)
    if not config.getoption("optcheck"):
        return
    if os.environ.get("OPTCHECK_RUN"):  # `optcheck run -- pytest`: its watch is in this process already
        config.pluginmanager.register(_Inert("optcheck run already watches this process; --optcheck is off"),
                                      "optcheck-watch")
        return
    if _WRAPPER is None:
        raise pytest.UsageError("--optcheck needs pluggy >= 1.2 (pytest >= 8)")
    plugin = OptcheckPlugin(config)  # (--optcheck-out checked first: a usage error costs no torch import)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise pytest.UsageError("--optcheck needs torch (pip install 'optcheck[pytorch]')") from None
    config.pluginmanager.register(plugin, "optcheck-watch")


class _Inert:
    """``--optcheck`` given where it cannot watch: says why in the header, does nothing else."""

    def __init__(self, why: str):
        self.why = why

    def pytest_report_header(self, config) -> str:
        return f"optcheck: {self.why}"


class OptcheckPlugin:
    """The session's watch: an AutoWatch per test (on a worker, or without xdist) and what every
    test recorded (on the controller, or without xdist), for the terminal summary."""

    def __init__(self, config):
        self.config = config
        self.fail_on = config.getoption("optcheck_fail_on")
        hazards = config.getoption("optcheck_hazards")
        self.hazards = False if hazards == "off" else hazards
        self.root = Path(str(config.rootpath))
        self.out = self._session_dir(config)
        self.watch = None  # the current test's _TestWatch
        self.where: dict[int, str] = {}  # id(finding) -> "file:line" of the test's code when it was found
        self.watched: list[tuple[str, str, dict]] = []  # (nodeid, outcome, record), in report order

    @staticmethod
    def _session_dir(config) -> Path:
        given = getattr(config, "workerinput", {}).get("optcheck_out")  # an xdist worker: the controller's
        if given:
            return Path(given)
        out = config.getoption("optcheck_out")
        if out is None:
            return Path(tempfile.mkdtemp(prefix="optcheck-pytest-"))
        out = Path(out)
        if out.exists() and (not out.is_dir() or any(out.iterdir())):
            raise pytest.UsageError(f"--optcheck-out {out}: not an empty folder (each run needs its own)")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise pytest.UsageError(f"--optcheck-out {out}: cannot be created ({e.strerror})") from None
        return out.resolve()

    # -- xdist: the workers write under the controller's folder ----------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        node.workerinput["optcheck_out"] = str(self.out)

    def pytest_report_header(self, config) -> str:
        return f"optcheck: watching every test's optimizer steps (fail on {self.fail_on}); run directories in {self.out}"

    # -- one test ----------------------------------------------------------------------------------
    @_wrapper
    def pytest_runtest_setup(self, item):
        level = _marker_level(item, self.fail_on)  # a bad marker fails the set-up, in one line
        if level is not None:
            self._start(item, level)
        return (yield)

    @_wrapper
    def pytest_runtest_call(self, item):
        try:
            result = yield
        except BaseException:
            failing = self._finish(item)
            if failing:  # the test's own failure stands; the findings go with it
                item.add_report_section("call", "optcheck", "\n".join(failing))
            raise
        failing = self._finish(item)
        if failing:
            pytest.fail("\n".join(failing), pytrace=False)
        return result

    @_wrapper
    def pytest_runtest_teardown(self, item, nextitem):
        self._finish(item)  # set-up failed, the call never ran: the watch still ends
        return (yield)

    def _start(self, item, level: str) -> None:
        from optcheck.autowatch.attach import AutoWatch

        class _TestWatch(AutoWatch):
            """An AutoWatch whose Monitors tell the plugin each finding as it is found (the test's
            line is on the stack then)."""

            @property
            def monitors(self):
                return self._mons

            @monitors.setter
            def monitors(self, value):
                self._mons = _Told(value, plugin._found)

        plugin = self
        name = _dir_name(item.nodeid)
        out, k = self.out / name, 1
        while out.exists():  # the same test run again in this session (a rerun plugin, a repeat)
            k += 1
            out = self.out / f"{name}-{k}"
        watch = _TestWatch(out, every=EVERY, fail_on=level, on_finding="ignore", hazards=self.hazards)
        watch.level = level
        watch.in_call = True
        self.watch = watch.install()

    def _found(self, finding) -> None:
        """A Monitor's ``on_finding``: where in the test's code it was found (while the test runs)."""
        if self.watch is None or not self.watch.in_call:
            return
        from optcheck.userframe import user_stacklevel

        try:
            frame = sys._getframe(user_stacklevel() - 1)
            path = Path(os.path.abspath(frame.f_code.co_filename))  # (not resolved: a linked folder keeps its name)
            if path.is_relative_to(self.root):
                path = path.relative_to(self.root)
            self.where[id(finding)] = f"{path}:{frame.f_lineno}"
        except Exception:  # noqa: BLE001 - a line not found is no error in the test's step
            pass

    def _finish(self, item) -> list[str]:
        """Uninstall the test's watch (if any); record it; the lines that fail the test ([] if none)."""
        watch, self.watch = self.watch, None
        if watch is None:
            return []
        watch.in_call = False
        watch.uninstall()
        rank = severity_rank(watch.level)
        findings = []
        for f in watch.findings():
            d = {k: v for k, v in f.to_dict().items() if k != "detail"}
            where = self.where.pop(id(f), None)
            if where:
                d["where"] = where
            findings.append(d)
        failing = [d for d in findings if severity_rank(d["severity"]) >= rank]
        if watch.monitors or watch.notes:
            record = {"out": str(watch.out), "fail_on": watch.level, "failing": len(failing),
                      "monitors": [_monitor_text(m) for m in watch.monitors], "notes": list(watch.notes),
                      "findings": findings}
            item.user_properties.append((PROPERTY, json.dumps(record)))
        if not failing:
            return []
        lines = [f"optcheck: {len(failing)} finding(s) at or above {watch.level} in this test's training loop "
                 f"(run directory {watch.out}):"]
        for d in failing:
            text = _finding_lines(d)
            lines += [f"{d['where']}: {text[0]}" if "where" in d else text[0], *text[1:]]
        return lines

    # -- every test's record, on the controller ----------------------------------------------------
    def pytest_runtest_logreport(self, report) -> None:
        for name, value in getattr(report, "user_properties", ()):
            if name == PROPERTY and report.when == "call":
                try:
                    self.watched.append((report.nodeid, report.outcome, json.loads(value)))
                except (TypeError, ValueError):
                    pass

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if getattr(self.config, "workerinput", None) is not None:
            return
        tr = terminalreporter
        with_findings = sum(1 for _, _, r in self.watched if r["findings"])
        tr.write_sep("=", f"optcheck: {len(self.watched)} test(s) stepped an optimizer, {with_findings} with findings")
        for nodeid, outcome, r in self.watched:
            tr.write_line(f"{nodeid} [{outcome.upper()}]: {'; '.join(r['monitors']) or 'nothing watched'}")
            for d in r["findings"]:
                mark = "x" if severity_rank(d["severity"]) >= severity_rank(r["fail_on"]) else "-"
                head = _finding_lines(d)[0]
                tr.write_line(f"  {mark} {d['where'] + ': ' if 'where' in d else ''}{head}")
            for note in r["notes"]:
                tr.write_line(f"  note: {note}")
        tr.write_line(f"run directories: {self.out}")


class _Told(list):
    """The AutoWatch's list of Monitors: each Monitor appended reports its findings to ``found``
    (``Monitor.on_finding``, the override point the Monitor documents)."""

    def __init__(self, items, found):
        super().__init__(items)
        self.found = found

    def append(self, mon) -> None:
        mon.on_finding = self.found
        super().append(mon)


def _marker_level(item, default: str) -> str | None:
    """The test's fail_on level, or None when ``@pytest.mark.optcheck(off=True)``. A marker with
    anything else fails the test's set-up in one line."""
    mark = item.get_closest_marker("optcheck")
    if mark is None:
        return default
    unknown = sorted(set(mark.kwargs) - {"off", "fail_on"})
    if mark.args or unknown:
        pytest.fail(f"@pytest.mark.optcheck takes off= and fail_on= only, got "
                    f"{', '.join([*map(repr, mark.args), *unknown])}", pytrace=False)
    if mark.kwargs.get("off"):
        return None
    level = mark.kwargs.get("fail_on") or default
    if level not in SEVERITIES:
        pytest.fail(f"@pytest.mark.optcheck(fail_on={level!r}): one of {', '.join(SEVERITIES)}", pytrace=False)
    return level


def _monitor_text(mon) -> str:
    """``SGD over Sequential, 12 steps`` (the summary's steps: the optimizer's own count)."""
    try:
        steps = mon.summary().get("last_step")
    except Exception:  # noqa: BLE001 - a summary that cannot be read is not the test's failure
        steps = None
    model = getattr(mon, "autowatch_model", type(mon.model).__name__)
    return f"{type(mon.optimizer).__name__} over {model}" + (f", {steps} steps" if steps is not None else "")


def _finding_lines(d: dict) -> list[str]:
    from optcheck.report.text import finding_lines

    return finding_lines(d)


def _dir_name(nodeid: str) -> str:
    """A folder name for a test id (``tests/test_x.py::test_y[a-b]`` -> ``tests_test_x.py_test_y_a-b_``),
    cut to 100 characters with a hash of the whole id when longer."""
    name = _SAFE.sub("_", nodeid).strip("_") or "test"
    if len(name) > 100:
        name = name[:90] + "-" + hashlib.sha1(nodeid.encode()).hexdigest()[:8]
    return name
