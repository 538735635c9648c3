"""Issue 50: what a test treats as the repository is what git tracks, never a user's environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from checkout_copy import copy_tracked
from conftest import ROOT


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                   check=True, capture_output=True)


def test_copy_tracked_leaves_a_users_venv_and_untracked_files_out(tmp_path):
    src, dest = tmp_path / "clone", tmp_path / "copy"
    src.mkdir()
    _git(src, "init", "-q")
    (src / "pkg").mkdir()
    (src / "pkg" / "a.py").write_text("A = 1\n")
    _git(src, "add", "pkg/a.py")
    _git(src, "commit", "-qm", "one")
    # a real venv in the clone, not ignored by this repository (no .gitignore), and a stray file
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(src / ".venv")], check=True)
    (src / "notes.txt").write_text("mine\n")
    n = copy_tracked(src, dest)
    assert n == 1
    assert (dest / "pkg" / "a.py").read_text() == "A = 1\n"
    assert not (dest / ".venv").exists() and not (dest / "notes.txt").exists()


def test_gitignore_covers_the_usual_local_environments():
    names = [".venv/bin/python", "venv/bin/python", "env/bin/python", ".tox/py311/x", ".nox/s/x",
             ".conda/x", "ENV/bin/python"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *names], cwd=ROOT, capture_output=True,
                          text=True)
    assert sorted(proc.stdout.split()) == sorted(names), proc.stdout + proc.stderr
