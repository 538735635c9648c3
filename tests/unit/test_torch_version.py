"""The PyTorch backend needs torch >= 2.1 (optimizer step hooks): checked before the
worker starts, from the distribution's metadata, without importing torch; and in the
worker on ``torch.__version__`` for a torch without metadata. A real older torch is
stood in for by a fake ``torch`` package / dist-info on PYTHONPATH."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck import torch_version as tv
from optcheck.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--steps", "5", "--every", "5", "--n-layer", "1", "--n-embd", "16", "--n-head", "2",
         "--block-size", "16", "--batch-size", "2"]


@pytest.mark.parametrize("version, ok", [("2.13.0+cpu", True), ("2.1.0", True), ("2.1.0a0+git34ded74", True),
                                         ("10.0", True), ("2.0.1", False), ("1.13.1", False), ("1.9", False)])
def test_supported(version, ok):
    assert tv.supported(version) is ok


def test_problem_lines():
    assert tv.problem("2.13.0", True) is None
    assert tv.problem("1.13.1", True) == ("--backend pytorch needs torch 2.1 or newer (optimizer step hooks); "
                                          "found torch 1.13.1: pip install 'torch>=2.1'")
    assert "not installed" in tv.problem(None, False)
    assert tv.problem(None, True) is None            # no metadata: the worker checks torch.__version__
    assert tv.problem("weird", True) is None
    with pytest.raises(InputError, match="found torch 1.13.1"):
        tv.require_imported("1.13.1")
    tv.require_imported("2.13.0+cpu")
    tv.require()                                        # the torch installed here is new enough


def _fake_torch(root: Path, *, package: bool, metadata: bool, version: str = "1.13.1") -> Path:
    if metadata:
        info = root / f"torch-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    if package:
        (root / "torch").mkdir(parents=True)
        (root / "torch" / "__init__.py").write_text(
            f"__version__ = {version!r}\ndef get_num_threads():\n    return 1\n"
            "def set_num_threads(n):\n    pass\n")
    return root


def _optcheck(args, fake: Path, tmp_path: Path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), str(ROOT)]), OPTCHECK_CACHE=str(tmp_path))
    return subprocess.run([sys.executable, "-m", "optcheck", *args], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=300)


def test_soak_on_an_old_torch_says_so_in_one_line_and_exits_2(tmp_path):
    fake = _fake_torch(tmp_path / "fake", package=False, metadata=True)
    res = _optcheck(["soak", "--backend", "pytorch", "--out", str(tmp_path / "run"), *SMALL], fake, tmp_path)
    assert res.returncode == 2, res.stderr
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(err) == 1, res.stderr
    assert "needs torch 2.1 or newer" in err[0] and "found torch 1.13.1" in err[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "run" / "snapshots.jsonl").exists()       # no worker was started


def test_worker_checks_a_torch_without_metadata(tmp_path):
    """An old torch module shadows the installed one, whose metadata says 2.13: the
    supervisor lets it through, the worker reads torch.__version__ and stops with exit 2."""
    fake = _fake_torch(tmp_path / "fake", package=True, metadata=False)
    res = _optcheck(["soak", "--backend", "pytorch", "--out", str(tmp_path / "run"), *SMALL], fake, tmp_path)
    assert res.returncode == 2, res.stderr
    assert "found torch 1.13.1" in res.stderr and "Traceback" not in res.stderr
    assert "register_step_pre_hook" not in res.stderr


def test_doctor_names_an_old_torch(tmp_path):
    fake = _fake_torch(tmp_path / "fake", package=True, metadata=True)
    res = _optcheck(["doctor"], fake, tmp_path)
    assert res.returncode == 0, res.stderr
    line = res.stdout.split("torch (checked in a subprocess):")[1].splitlines()[1]
    assert line.strip().startswith("1.13.1") and "too old" in line and "torch 2.1 or newer" in line
