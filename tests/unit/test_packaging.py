"""pyproject.toml's packaging claims hold: every package-data entry names files that
exist (``py.typed`` was listed but absent), matplotlib is the optional ``plot`` extra,
and what the tests import (pillow, matplotlib) is in the ``test`` extra."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_data_entry_exists():
    for pattern in PYPROJECT["tool"]["setuptools"]["package-data"]["optcheck"]:
        assert list((ROOT / "optcheck").glob(pattern)), pattern


def test_matplotlib_is_an_extra_and_the_test_extra_has_what_the_tests_import():
    deps = " ".join(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "matplotlib" not in deps and any(d.startswith("matplotlib") for d in extras["plot"])
    assert {"pillow", "matplotlib"} <= {d.split(">")[0].split("=")[0] for d in extras["test"]}
