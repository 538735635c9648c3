"""``--summary-md``: the Markdown job summary of real short soaks (clean, and a
planted ``param-rebind``), and of ``optcheck check`` over the recorded stream."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import SMALL, run_cli
from optcheck import exitcodes


def test_clean_soak_writes_a_markdown_summary(tmp_path):
    out, md = tmp_path / "run", tmp_path / "summary.md"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "60", "--every", "20", "--val-every", "30",
                             "--out", str(out), "--summary-md", str(md), "--plot", str(tmp_path / "run.png"),
                             *[a for a in SMALL if a not in ("--val-every", "100")]])
    assert rc == exitcodes.CLEAN, stdout
    text = md.read_text(encoding="utf-8")
    assert text.startswith("## ✅ optcheck soak: CLEAN (exit 0)")
    assert "**Verdict:** no findings" in text and "### Findings" not in text
    assert "| loss | " in text and " → " in text
    assert "| held-out loss | " in text and "| steps/s | " in text and "| peak RSS | " in text
    assert "| versions | torch 2." in text
    assert "![loss, step time and memory](run.png)" in text  # relative to the Markdown file


def test_planted_fault_names_code_step_and_parameter(tmp_path):
    out, md = tmp_path / "run", tmp_path / "summary.md"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "60", "--every", "20", "--inject", "param-rebind@40",
                             "--out", str(out), "--summary-md", str(md), *SMALL])
    assert rc == exitcodes.FINDINGS, stdout
    text = md.read_text(encoding="utf-8")
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


def test_github_step_summary_is_appended_to(tmp_path, monkeypatch):
    out, md = tmp_path / "run", tmp_path / "step_summary"
    md.write_text("# earlier step\n", encoding="utf-8")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(md))
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "20", "--every", "10", "--out", str(out),
                             "--summary-md", str(md), *SMALL])
    assert rc == exitcodes.CLEAN, stdout
    text = md.read_text(encoding="utf-8")
    assert text.startswith("# earlier step\n## ✅ optcheck soak: CLEAN")


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
