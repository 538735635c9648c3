"""``--summary-md``: the Markdown job summary of real short soaks (clean, and a
planted ``param-rebind``), and of ``optcheck check`` over the recorded stream."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import SMALL, run_cli, run_clis
from optcheck.run import exitcodes


EARLIER = "# earlier step\n"


@pytest.fixture(scope="module")
def soaks(tmp_path_factory):
    """The module's two soaks, independent of each other, run side by side once:
    {name: (folder holding run/ and the Markdown file, exit code, stdout)}. The fault soak's Markdown file is
    also its ``$GITHUB_STEP_SUMMARY``, which an earlier step of the job wrote to: appended to, not replaced."""
    root = tmp_path_factory.mktemp("summary_md")
    clean, fault = root / "clean", root / "fault"
    for d in (clean, fault):
        d.mkdir()
    (fault / "summary.md").write_text(EARLIER, encoding="utf-8")
    done = run_clis({
        "clean": ["soak", "-q", "--steps", "60", "--every", "20", "--val-every", "30", "--out", str(clean / "run"),
                  "--summary-md", str(clean / "summary.md"), "--plot", str(clean / "run.png"),
                  *[a for a in SMALL if a not in ("--val-every", "100")]],
        "fault": (["soak", "-q", "--steps", "60", "--every", "20", "--inject", "param-rebind@40",
                   "--out", str(fault / "run"), "--summary-md", str(fault / "summary.md"), *SMALL],
                  {"GITHUB_STEP_SUMMARY": str(fault / "summary.md")}),
    })
    return {name: (root / name, rc, stdout) for name, (rc, stdout, _) in done.items()}


def test_clean_soak_writes_a_markdown_summary(soaks):
    tmp_path, rc, stdout = soaks["clean"]
    md = tmp_path / "summary.md"
    assert rc == exitcodes.CLEAN, stdout
    text = md.read_text(encoding="utf-8")
    assert text.startswith("## ✅ optcheck soak: CLEAN (exit 0)")
    assert "**Verdict:** no findings" in text and "### Findings" not in text
    assert "| loss | " in text and " → " in text
    assert "| held-out loss | " in text and "| steps/s | " in text and "| peak RSS | " in text
    assert "| versions | torch 2." in text
    assert "![loss, step time and memory](run.png)" in text  # relative to the Markdown file


def test_planted_fault_names_code_step_and_parameter(soaks, tmp_path):
    folder, rc, stdout = soaks["fault"]
    out, md = folder / "run", folder / "summary.md"
    assert rc == exitcodes.FINDINGS, stdout
    text = md.read_text(encoding="utf-8").removeprefix(EARLIER)  # (the job's earlier step: see below)
    assert text.startswith("## ❌ optcheck soak: FINDINGS (exit 1)")
    rows = [line for line in text.splitlines() if line.startswith("| OC")]
    assert {r.split(" | ")[0][2:] for r in rows} == {"OC101", "OC102", "OC104"}
    assert all(r.split(" | ")[3] == "40" for r in rows)
    assert any("`wte.weight`" in r for r in rows)
    assert "| injected | param-rebind@40 |" in text
    # the same stream re-checked: the same codes and step, exit 1
    md2 = tmp_path / "check.md"
    rc, _, _ = run_cli(["check", str(out), "--summary-md", str(md2)])
    assert rc == exitcodes.FINDINGS
    text2 = md2.read_text(encoding="utf-8")
    assert text2.startswith("## ❌ optcheck check: FINDINGS (exit 1)")
    assert {line.split(" | ")[0][2:] for line in text2.splitlines() if line.startswith("| OC")} == \
        {"OC101", "OC102", "OC104"}


def test_github_step_summary_is_appended_to(soaks):
    folder, rc, stdout = soaks["fault"]
    md = folder / "summary.md"  # written with GITHUB_STEP_SUMMARY set to it
    assert rc == exitcodes.FINDINGS, stdout
    text = md.read_text(encoding="utf-8")
    assert text.startswith(EARLIER + "## ❌ optcheck soak: FINDINGS (exit 1)") and text.count("optcheck soak:") == 1


@pytest.mark.parametrize("target,needle", [
    ("missing/summary.md", "--summary-md missing/summary.md: the folder missing does not exist"),
    (".", "'--summary-md': File '.' is a directory"),
])
def test_bad_summary_path_is_refused_before_the_run(tmp_path, target, needle):
    proc = subprocess.run([sys.executable, "-m", "optcheck", "soak", "-q", "--steps", "20", "--out", "run",
                           "--summary-md", target, *SMALL], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == exitcodes.USAGE, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
