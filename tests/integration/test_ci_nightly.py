"""The shipped nightly workflows run for real, three nights in a row: clean, clean, and a
night with ``param-rebind`` planted (as a regression in the code under test would be).

- GitLab: ``examples/ci/gitlab/.gitlab-ci.yml`` under ``gitlab-ci-local`` (npm; shell
  executor, no Docker), in a git repository holding a copy of this checkout, one commit a
  night, its caches kept between nights by gitlab-ci-local itself.
- GitHub: ``examples/ci/github/optcheck-nightly.yml`` through ``gha_harness`` (every
  ``run:`` step with bash; the ``uses:`` steps by their documented effect).

Each night asserts its exit, which run is the baseline afterwards (the last *passing*
night: the planted night fails and must not become it) and the history table (a row per
night, named by date and commit; the planted night marked with its new findings).

What is scaled down, and why: soaks of 120 steps of the test suite's small GPT (a
nightly-sized variant, not 20,000 steps), ``--speed-tolerance``/``--memory-tolerance``
at 90 % (steps/s on a machine shared with other test runs is noise, issue 24; the speed
and memory checks have their own tests, this one checks the workflows' plumbing), the CPU
torch index pointed at PyPI (this machine reaches PyPI, where pip's find-links hold the
CPU wheel already installed), pip building optcheck with the setuptools already
installed (``PIP_NO_BUILD_ISOLATION=false``: no download of a build backend). The install
steps otherwise run as written: ``pip install "<checkout>[pytorch,plot]" "torch==2.13.0"``
into a fresh virtual environment (``--system-site-packages``, so torch is not downloaded),
every GitLab night, and the first GitHub night (the runner's Python environment is kept
between GitHub nights here, like the tool cache; reinstalling the same checkout would
only repeat night 1's ~20 s).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import ROOT, SMALL
from checkout_copy import copy_tracked
from gha_harness import Runner

GITHUB = ROOT / "examples" / "ci" / "github" / "optcheck-nightly.yml"
GITLAB = ROOT / "examples" / "ci" / "gitlab" / ".gitlab-ci.yml"

STEPS = "120"
COMMON = " ".join([*SMALL[:-2], "--val-every", "60", "--every", "20",
                   "--speed-tolerance", "90%", "--memory-tolerance", "90%"])
#: night -> (extra soak options, expected job exit): the third plants a lost parameter reference
NIGHTS = [("clean", "", 0), ("clean", "", 0), ("param-rebind", "--inject param-rebind@60", 1)]
PIP_ENV = {"TORCH_INDEX": "https://pypi.org/simple", "PIP_NO_BUILD_ISOLATION": "false",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
NAME = re.compile(r"^\d{4}-\d{2}-\d{2}-[0-9a-f]{8}$")


def history_rows(text: str) -> list[str]:
    """The rows of ``optcheck history``'s table (after its header, before "N night(s)")."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("night "))
    end = next(i for i, ln in enumerate(lines) if re.match(r"\d+ night\(s\)", ln))
    return lines[start + 1:end]


def check_history(text: str, nights: list[str]):
    rows = history_rows(text)
    assert [r.split()[0] for r in rows] == [n[:20] for n in nights], text
    assert [r.split()[1] for r in rows] == ["clean", "clean", "findings"], text
    assert "<-" not in rows[0] and "<-" not in rows[1], text
    assert "new findings: OC101" in rows[2], text
    assert f"{len(nights)} night(s)" in text


# -- GitLab ----------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "night", "GIT_AUTHOR_EMAIL": "n@example.com",
                               "GIT_COMMITTER_NAME": "night", "GIT_COMMITTER_EMAIL": "n@example.com"}).stdout


def _copy_checkout(dest: Path) -> None:
    copy_tracked(ROOT, dest)


@functools.lru_cache(maxsize=1)
def _gitlab_ci_local_missing() -> str:
    """Why gitlab-ci-local cannot run here, or "" when it can."""
    if shutil.which("gitlab-ci-local") is None or shutil.which("rsync") is None:
        return ("gitlab-ci-local (npm) and rsync are not installed: `bash scripts/setup.sh --test` installs them "
                "(root, apt-get and npm)")
    try:
        proc = subprocess.run(["gitlab-ci-local", "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"gitlab-ci-local does not start: {e}"
    if proc.returncode != 0:  # e.g. a release that needs a newer Node than this machine's
        return f"gitlab-ci-local does not start: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"
    return ""


@pytest.mark.skipif(bool(_gitlab_ci_local_missing()), reason=_gitlab_ci_local_missing() or "-")
def test_gitlab_pipeline_three_nights_under_gitlab_ci_local(tmp_path):
    repo = tmp_path / "project"
    _copy_checkout(repo)
    shutil.copy2(GITLAB, repo / ".gitlab-ci.yml")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "remote", "add", "origin", "https://gitlab.example.com/team/project.git")
    names = []
    for i, (what, extra, want) in enumerate(NIGHTS):
        (repo / "NIGHT").write_text(f"night {i + 1}: {what}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"night {i + 1}")
        sha = _git(repo, "rev-parse", "HEAD").strip()
        cmd = ["gitlab-ci-local", "--force-shell-executor", "--shell-isolation", "--concurrency", "1",
               "--ignore-predefined-vars", "CI_PIPELINE_SOURCE", "--variable", "CI_PIPELINE_SOURCE=schedule",
               "--variable", f"STEPS={STEPS}", "--variable", f"SOAK_ARGS={COMMON} {extra}".strip(),
               *[a for k, v in PIP_ENV.items() for a in ("--variable", f"{k}={v}")], "soak:pytorch"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "PYTEST", "VIRTUAL_ENV"))}
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=1200)
        log = proc.stdout + proc.stderr
        assert (proc.returncode == 0) == (want == 0), log[-6000:]
        assert (" PASS  soak:pytorch" in log) == (want == 0) and (" FAIL  soak:pytorch" in log) == (want != 0), \
            log[-4000:]
        arts = repo / ".gitlab-ci-local" / "artifacts" / "soakOgpytorch"
        runs = [p for p in (arts / "night").iterdir() if p.is_dir()]  # tonight's run, named by date and commit
        assert len(runs) == 1 and NAME.match(runs[0].name) and runs[0].name.endswith(sha[:8]), runs
        night = runs[0].name
        names.append(night)
        summary = json.loads((runs[0] / "summary.json").read_text())
        assert summary["run"] == night and summary["last_step"] == int(STEPS)
        assert (runs[0] / "plot.png").stat().st_size > 0 and (runs[0] / "history.png").stat().st_size > 0
        assert ET.parse(arts / "junit.xml").getroot() is not None
        md = (runs[0] / "summary.md").read_text()
        said = "soak:pytorch > first night, no baseline yet"   # the job's output line, not its echoed command
        if i == 0:
            assert said in log, log[-4000:]
        else:
            assert said not in log and "Against the baseline" in md, md
        if i == 2:  # the history table, as the job wrote it into the night's artifact
            check_history((runs[0] / "history.txt").read_text(), names)
        # the last good night: the baseline cache holds the newest passing night
        cached = repo / ".gitlab-ci-local" / "cache" / "optcheck-baseline-pytorch" / "baseline" / "summary.json"
        assert json.loads(cached.read_text())["run"] == names[min(i, 1)]
        nights_cache = repo / ".gitlab-ci-local" / "cache" / "optcheck-nights-pytorch" / "nights"
        assert sorted(p.name for p in nights_cache.iterdir()) == sorted(names)
    assert len(set(names)) == 3


# -- GitHub ----------------------------------------------------------------------------

def test_github_workflow_three_nights_through_the_harness(tmp_path):
    runner = Runner(GITHUB, ROOT, tmp_path / "runner", {"backend": "pytorch"}, env=PIP_ENV,
                    overrides={"STEPS": STEPS})
    names = []
    for i, (what, extra, want) in enumerate(NIGHTS):
        runner.overrides["SOAK_ARGS"] = f"{COMMON} {extra}".strip()
        if i:  # the runner's Python environment already holds this checkout's optcheck (night 1 installed it)
            runner.skip = {"Install optcheck from the checkout (CPU torch)": "installed on night 1"}
        sha = f"{i + 1:x}" * 40
        night = runner.run_night(sha)
        log = "\n".join(f"--- {s.name}: {s.outcome} {s.rc}\n{s.output[-3000:]}" for s in night.steps)
        soak = night.step("Soak")
        assert soak.rc == want and night.conclusion == ("success" if want == 0 else "failure"), log
        failed = [s.name for s in night.steps if s.outcome == "failure"]
        assert failed == ([] if want == 0 else ["Soak"]), log
        if i == 0:
            assert night.step("Install optcheck from the checkout (CPU torch)").outcome == "success", log
            py = runner.venv / "bin" / "python"
            where = subprocess.run([str(py), "-c", "import optcheck; print(optcheck.__file__)"], cwd=tmp_path,
                                   capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                                        if k != "PYTHONPATH"}).stdout
            assert where.startswith(str(runner.venv)), where  # the checkout's optcheck, installed by the step
        name = night.env["NIGHT"]
        assert NAME.match(name) and name.endswith(sha[:8]), name
        names.append(name)
        run = night.workspace / "night" / name
        assert json.loads((run / "summary.json").read_text())["run"] == name
        # always-steps ran after the failing soak: history, caches, JUnit, upload, job summary
        for step in ("History", "Keep the nights", "Publish JUnit", "Upload the run directory", "Job summary"):
            assert night.step(step).outcome == "success", log
        art = night.artifacts["optcheck-run-pytorch"]
        assert (art / "plot.png").is_file() and (art / "history.png").is_file() and (art / "summary.json").is_file()
        url = f"https://github.example/actions/runs/{night.run_id}/artifacts/optcheck-run-pytorch"
        assert f"]({url})" in night.summary and "plot.png" in night.summary, night.summary
        assert "![" not in night.summary and str(night.workspace) not in night.summary, night.summary
        baseline = night.workspace / "baseline" / "summary.json"
        if i == 0:
            assert not baseline.exists() and "first night: no baseline yet" in soak.output
        else:  # tonight against the newest successful night
            assert json.loads(baseline.read_text())["run"] == names[min(i - 1, 1)]
            assert "Against the baseline" in night.summary, night.summary
        if i == 2:
            check_history(night.step("History").output, names)
            assert "```" in night.summary and history_rows(night.summary.split("```")[1])
    # what the next night would download: the last good night, not the planted one
    good = [n for n in runner.nights if n.conclusion == "success"]
    assert json.loads((good[-1].artifacts["optcheck-run-pytorch"] / "summary.json").read_text())["run"] == names[1]
