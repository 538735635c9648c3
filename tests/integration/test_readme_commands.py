"""Every command README.md shows runs, and exits as the README says (issue 24: "a README
command that no test runs is a defect").

What is taken from README.md: every line of a fenced ``bash`` block (each must be a
command starting with ``optcheck``, ``python``/``python3`` or ``bash``; another line fails
:func:`test_every_readme_command_line_is_one_this_test_runs`), in README order, each with
the exit code its trailing comment gives (``# exit 1``; ``# exit 0, or 2 where ...`` allows
both; no comment: 0). A ```` ```text ```` block right after a command block is that
command's output: its lines (up to a ``...``) must appear in what the command printed,
step numbers aside (the steps are scaled down).

How a command is made to run here, in a temporary folder holding links to ``examples/``,
``scripts/``, ``tests/`` and ``pyproject.toml`` of this checkout (the run directories land
in the temporary folder), with this checkout's optcheck (``PYTHONPATH``) and one thread:

- ``--steps N`` above :data:`MAX_STEPS` (:data:`NPROC_STEPS` with ``--nproc``) becomes it, and a
  ``NAME@STEP`` injection moves in proportion (``--steps 3000 --inject param-rebind@1000`` → 40 and
  ``@13``);
- :data:`PLACEHOLDERS` replaces the README's stand-ins with what exists here;
- the setup commands (``bash scripts/setup.sh [--test]``) are checked, not rerun (they
  install with pip): the line parses (``bash -n``) and ``scripts/setup.sh`` exists and
  parses; what follows their ``&&`` runs, except ``python3 -m pytest -q``, the suite this
  test is part of (its configuration must exist instead).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

import pytest

from conftest import ROOT

README = ROOT / "README.md"
MAX_STEPS = 40
#: ``--nproc`` lines scale to this instead: ranks are compared before every ``every``-th backward pass (100 by
#: default) and not at close, so a difference planted after pass 1 is found only in a run longer than 101 steps
NPROC_STEPS = 120
#: README stand-in -> what this test runs instead, and why
PLACEHOLDERS = {
    # `optcheck upgrade --candidate-python`: another venv's interpreter; here this one (same torch:
    # the verdict is IDENTICAL, exit 0, which is what the README's line expects)
    "/venvs/torch-new/bin/python": sys.executable,
}
#: Lines that stay long at MAX_STEPS, and what the default run adds to them: `upgrade --scenarios` runs every
#: scenario on both sides (~158 s); the default run keeps one scenario, short, on a smaller model (~25 s of
#: CPU). The line as the README
#: shows it (scaled) runs under ``-m slow`` (:func:`test_a_long_readme_command_in_full`).
REDUCED = {"--scenarios": ["--scenario", "param-rebind", "--scenario-steps", "20", "--n-layer", "1", "--n-embd", "32",
                           "--batch-size", "4"]}
SETUP = "bash scripts/setup.sh"
THE_SUITE = "python3 -m pytest -q"
FENCE = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
EXIT = re.compile(r"\s+#\s*exit (\d+)(?:, or (\d+)\b.*)?$")


@dataclass
class Command:
    line: str             # as the README shows it, comment removed
    exits: tuple          # the exit codes the README allows
    output: list          # the README's lines of its output (a ```text block right after), or []

    def __str__(self):
        return self.line


def blocks(text: str | None = None) -> list[tuple[str, str]]:
    text = README.read_text(encoding="utf-8") if text is None else text
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]


def readme_commands(text: str | None = None) -> list[Command]:
    out: list[Command] = []
    found = blocks(text)
    for i, (lang, body) in enumerate(found):
        if lang != "bash":
            continue
        shown = found[i + 1][1].splitlines() if i + 1 < len(found) and found[i + 1][0] == "text" else []
        lines = [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]
        for k, ln in enumerate(lines):
            m = EXIT.search(ln)
            exits = (0,) if not m else tuple(int(g) for g in m.groups() if g is not None)
            out.append(Command(EXIT.sub("", ln).strip(), exits, shown if k == len(lines) - 1 else []))
    return out


COMMANDS = readme_commands()


def test_every_readme_command_line_is_one_this_test_runs():
    assert len(COMMANDS) >= 10
    for c in COMMANDS:
        for part in c.line.split("&&"):
            assert re.match(r"(optcheck|python3?|bash) ", part.strip()), \
                f"README command this test cannot run: {part.strip()!r}"
    # the Monitor example the README prints is the file it runs
    monitor = next(body for lang, body in blocks() if lang == "python" and "optcheck.Monitor(" in body)
    assert monitor == (ROOT / "examples" / "monitor" / "train.py").read_text(encoding="utf-8").split('"""', 2)[2] \
        .lstrip("\n"), "README's Monitor example and examples/monitor/train.py differ"


def test_how_a_readme_line_is_read_and_scaled():
    text = ("```bash\noptcheck soak --steps 3000 --inject param-rebind@1000 --out r   # exit 1\n"
            "# a comment line\noptcheck doctor\n```\n\n```text\nstep 1000 (pre-step) OC101 x: y ...\n```\n"
            "```python\npython not_a_command.py\n```\n"
            "```bash\noptcheck soak --backend torchsharp   # exit 0, or 2 where there is no .NET SDK\n```\n")
    got = readme_commands(text)
    assert [(c.line, c.exits) for c in got] == [
        ("optcheck soak --steps 3000 --inject param-rebind@1000 --out r", (1,)), ("optcheck doctor", (0,)),
        ("optcheck soak --backend torchsharp", (0, 2))]
    assert got[0].output == [] and got[1].output == ["step 1000 (pre-step) OC101 x: y ..."]  # the block's last line
    assert scaled(shlex.split(got[0].line)[1:]) == ["soak", "--steps", str(MAX_STEPS), "--inject",
                                                    f"param-rebind@{1000 * MAX_STEPS // 3000}", "--out", "r"]
    assert scaled(["upgrade", "--candidate-python", "/venvs/torch-new/bin/python"])[-1] == sys.executable
    assert scaled(["soak", "--nproc", "2", "--steps", "2000", "--inject", "rank1-lr@500"]) == \
        ["soak", "--nproc", "2", "--steps", str(NPROC_STEPS), "--inject", f"rank1-lr@{500 * NPROC_STEPS // 2000}"]
    assert _norm("changed identity since step 900, the") == "changed identity since step N, the"


def scaled(argv: list[str]) -> list[str]:
    """``--steps`` down to MAX_STEPS (NPROC_STEPS with ``--nproc``), injections moved in proportion."""
    argv = [PLACEHOLDERS.get(a, a) for a in argv]
    if "--steps" not in argv:
        return argv
    i = argv.index("--steps")
    n, most = int(argv[i + 1]), NPROC_STEPS if "--nproc" in argv else MAX_STEPS
    if n <= most:
        return argv
    argv[i + 1] = str(most)
    for k, a in enumerate(argv):
        if k and argv[k - 1] == "--inject" and "@" in a:
            name, step = a.rsplit("@", 1)
            argv[k] = f"{name}@{max(1, int(step) * most // n)}"
    return argv


def reduced(argv: list[str]) -> list[str]:
    """``argv`` with :data:`REDUCED`'s additions after each flag it names."""
    out = []
    for a in argv:
        out += [a, *REDUCED.get(a, [])]
    return out


def runnable(part: str, full: bool = False) -> list[str] | None:
    """The argv this test runs for one ``&&`` part; None for a setup command (checked, not run). ``full``:
    without the default run's reductions (:data:`REDUCED`)."""
    argv = shlex.split(part)
    if part.startswith(SETUP):
        return None
    if argv[0] == "optcheck":
        return [sys.executable, "-m", "optcheck", *(scaled(argv[1:]) if full else reduced(scaled(argv[1:])))]
    if argv[0] in ("python", "python3"):
        return [sys.executable, *scaled(argv[1:])]
    raise AssertionError(f"not a command this test runs: {part}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for name in ("examples", "scripts", "tests", "pyproject.toml"):
        (d / name).symlink_to(ROOT / name)
    return d


def _norm(text: str) -> str:
    return re.sub(r"step \d+", "step N", text)


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.line[:60] for c in COMMANDS])
def test_readme_command_runs_and_exits_as_the_readme_says(cmd, workdir):
    """Every README command, in the default run (long ones reduced: :data:`REDUCED`)."""
    _run_and_check(cmd, workdir, full=False)


LONG = [c for c in COMMANDS if any(flag in shlex.split(c.line) for flag in REDUCED)]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", LONG, ids=[c.line[:60] for c in LONG])
def test_a_long_readme_command_in_full(cmd, workdir):
    """The README lines :data:`REDUCED` shortens in the default run, as the README shows them (scaled)."""
    _run_and_check(cmd, workdir, full=True)


def test_the_reduced_lines_are_the_long_ones():
    assert [c.line.split()[:2] for c in LONG] == [["optcheck", "upgrade"]]
    line = shlex.split(LONG[0].line)
    assert runnable(LONG[0].line, full=True)[3:] == scaled(line[1:])
    assert "--scenario-steps" in runnable(LONG[0].line)


def _run_and_check(cmd: Command, workdir, full: bool) -> None:
    parts = [p.strip() for p in cmd.line.split("&&")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = None
    for part in parts:
        if part.startswith(SETUP):
            assert subprocess.run(["bash", "-n", "-c", cmd.line]).returncode == 0, cmd.line
            assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "setup.sh")]).returncode == 0
            assert part in (SETUP, f"{SETUP} --test"), part
            continue
        if part == THE_SUITE:
            assert "[tool.pytest.ini_options]" in (ROOT / "pyproject.toml").read_text()
            continue
        proc = subprocess.run(runnable(part, full), cwd=workdir, env=env, capture_output=True, text=True,
                              timeout=1800)  # a hang guard, far beyond what a 300-step soak takes
        if proc.returncode != 0:
            break
    if proc is None:
        return
    said = f"{cmd.line}\nrc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode in cmd.exits, said
    if proc.returncode == 2:   # bad input / missing tool: one line on stderr, never a traceback
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, said
    else:
        assert "Traceback" not in proc.stderr, said
    printed = _norm(proc.stdout + proc.stderr)
    for line in cmd.output:
        want = _norm(line.split("...", 1)[0]).rstrip(", ")
        assert want in printed, f"README output line not printed: {want!r}\n{said}"
    if "soak" in cmd.line and "--inject param-rebind" in cmd.line:
        assert "next: " in proc.stdout, said    # what fails next, in the closing table
    if cmd.line.startswith("optcheck check"):
        assert "\n  next: " in proc.stdout, said
