"""Which torch the PyTorch backend would import, checked without importing it.

The PyTorch worker and ``optcheck.Monitor`` hook ``Optimizer.register_step_pre_hook``
and ``register_step_post_hook`` (torch 2.0, ``torch/optim/optimizer.py``); optcheck
declares torch >= 2.1 (``pyproject.toml``; ``docs/pytorch.md``). On an older torch (Debian 12's ``python3-torch`` is 1.13.1) the
worker used to die at step 0 with ``'AdamW' object has no attribute
'register_step_pre_hook'``. The supervisor checks the installed distribution's version
(``importlib.metadata``) before it starts a worker, so the user gets one line and exit 2.
Torch-free: a process that may load .NET must never import torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.version import InvalidVersion, Version

from optcheck.errors import InputError

#: The oldest torch the PyTorch backend runs on (major, minor).
MIN_TORCH = (2, 1)
INSTALL_HINT = "pip install 'torch>=2.1'"


def installed() -> str | None:
    """The version of the ``torch`` distribution the next ``import torch`` would find
    (its ``dist-info``/``egg-info`` metadata), or None when there is none."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def supported(version: str) -> bool:
    """True when ``version`` ("2.13.0+cpu", "1.13.1", "2.1.0a0+git") is at least
    :data:`MIN_TORCH`, comparing the release numbers only (a 2.1 pre-release has the hooks).

    Raises:
        ValueError: not a version number.
    """
    try:
        release = Version(version).release
    except InvalidVersion:
        raise ValueError(f"not a version number: {version!r}") from None
    return tuple(release[:2]) >= MIN_TORCH


def problem(version: str | None, importable: bool) -> str | None:
    """The one line that says why the PyTorch backend cannot run, or None when it can.

    Args:
        version: the installed torch version (:func:`installed`), or None.
        importable: whether ``import torch`` would find a module (checked without importing it).
    """
    need = f"torch {MIN_TORCH[0]}.{MIN_TORCH[1]} or newer"
    if version is None:
        if importable:
            return None  # a torch without metadata (a source build): the worker checks torch.__version__
        return f"--backend pytorch needs {need}; torch is not installed: {INSTALL_HINT}"
    try:
        ok = supported(version)
    except ValueError:
        return None  # an unreadable local version string: let the worker check torch.__version__
    if ok:
        return None
    return (f"--backend pytorch needs {need} (optimizer step hooks); found torch {version}: {INSTALL_HINT}")


def require() -> None:
    """Raise InputError when the torch that ``import torch`` would load cannot run the
    PyTorch backend. Imports nothing of torch.

    Raises:
        InputError: torch missing or older than :data:`MIN_TORCH` (the message is the line to print).
    """
    msg = problem(installed(), importlib.util.find_spec("torch") is not None)
    if msg:
        raise InputError(msg)


def require_imported(version: str) -> None:
    """The same check on ``torch.__version__`` inside a worker that has imported torch
    (for a torch whose distribution metadata is missing or unreadable).

    Raises:
        InputError: older than :data:`MIN_TORCH`.
    """
    try:
        ok = supported(version)
    except ValueError:
        return
    if not ok:
        raise InputError(problem(version, True) or version)
