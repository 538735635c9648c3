"""The nightly workflows in ``examples/ci/`` validate against the published
GitHub Actions and GitLab CI schemas (the copies ``check-jsonschema`` ships, so
no network), say what the README promises, and a planted error fails validation."""

from __future__ import annotations

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
    text = path.read_text(encoding="utf-8")
    assert old in text
    bad = tmp_path / path.name
    bad.write_text(text.replace(old, new), encoding="utf-8")
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
    cache = steps["Cache the TorchSharp worker build and NuGet packages"]["with"]["path"]
    assert "~/.cache/optcheck" in cache and "~/.nuget/packages" in cache
    soak = steps["Soak"]["run"]
    for needle in ("--backend ${{ matrix.backend }}", "--junit junit.xml", '--summary-md "$GITHUB_STEP_SUMMARY"'):
        assert needle in soak
    assert steps["Upload the run directory"]["with"]["path"] == "run/"
    assert steps["Upload the run directory"]["if"] == "always()"
    assert steps["Last good night (baseline)"]["with"]["workflow_conclusion"] == "success"
    assert steps["Publish JUnit"]["with"]["report_paths"] == "junit.xml"
    # tonight against the last good night, when there is one
    assert 'if [ -f baseline/summary.json ]; then BASELINE="--baseline baseline"' in soak and "$BASELINE" in soak
    # the nights' summaries: restored before, saved after, whatever the soak's outcome
    names = [s.get("name") for s in job["steps"]]
    restore, save = steps["Nights so far (history)"], steps["Keep the nights"]
    assert names.index("Soak") < names.index("Nights so far (history)") < names.index("History") \
        < names.index("Keep the nights")
    assert restore["uses"].startswith("actions/cache/restore@") and save["uses"].startswith("actions/cache/save@")
    assert restore["if"] == save["if"] == steps["History"]["if"] == "always()"
    assert restore["with"]["path"] == save["with"]["path"] == "nights"
    assert save["with"]["key"] == restore["with"]["key"] and restore["with"]["key"].startswith(
        restore["with"]["restore-keys"])
    assert "optcheck history nights --plot run/history.png" in steps["History"]["run"]
    assert "cp run/summary.json" in steps["History"]["run"]


def test_gitlab_schedule_runs_both_backends_and_keeps_what_it_promises():
    ci = yaml.safe_load(GITLAB.read_text(encoding="utf-8"))
    assert {ci["soak:pytorch"]["variables"]["BACKEND"], ci["soak:torchsharp"]["variables"]["BACKEND"]} == \
        {"pytorch", "torchsharp"}
    assert "noble" in ci["soak:torchsharp"]["image"]  # Ubuntu 24.04: libstdc++ of GCC 13+
    assert {".cache/optcheck", ".nuget/packages"} <= set(ci["soak:torchsharp"]["cache"][0]["paths"])
    assert ci["variables"]["OPTCHECK_CACHE"].endswith("/.cache/optcheck")
    assert ci["variables"]["NUGET_PACKAGES"].endswith("/.nuget/packages")
    t = ci["soak:pytorch"]
    assert t["artifacts"]["reports"]["junit"] == "junit.xml" and "run/" in t["artifacts"]["paths"]
    assert "summary.md" in t["artifacts"]["paths"] and t["artifacts"]["when"] == "always"
    assert any("schedule" in r["if"] for r in t["rules"])
    assert "--summary-md summary.md" in " ".join(t["script"])
    assert any("jobs/artifacts" in line for line in t["before_script"])   # the last good night
    script = " ".join(t["script"])
    assert 'BASELINE="--baseline baseline"' in script and "--out run $BASELINE" in script
    for job, caches in (("soak:pytorch", t["cache"]), ("soak:torchsharp", ci["soak:torchsharp"]["cache"])):
        nights = [c for c in caches if c["paths"] == ["nights/"]]
        assert len(nights) == 1 and nights[0]["when"] == "always", job
        assert nights[0]["key"].endswith(job.split(":")[1])   # one history per backend
    assert "optcheck history nights" in " ".join(t["after_script"])
    assert ci["soak:torchsharp"]["script"] == t["script"] and ci["soak:torchsharp"]["artifacts"] == t["artifacts"]
