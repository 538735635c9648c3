"""Source locations for the hazard probes: the user's frames (outside torch and this
package), ``file:line`` text, and a function's line span."""

from __future__ import annotations

import linecache
import os
import re
import sys

import torch


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(__file__) + os.sep  # optcheck/pytorch/hazards/: the probes' own frames
_OPTCHECK_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep  # optcheck/
#: the runner every probe hook is called through (optcheck/pytorch/dynamo_safe.py): one of the probes' frames
_HOOK_RUNNER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "dynamo_safe.py")
# a statement that cuts the graph (graph_cut.py reads the lines of a module's forward)
_CUTTING = re.compile(r"\.detach\(|\.data\b|no_grad|inference_mode|\.numpy\(|\.item\(|\.tolist\(")


def _where(code, lineno) -> str | None:
    if code is None:
        return None
    return f"{os.path.basename(code.co_filename)}:{lineno}"


def _internal(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename.startswith(_PKG_DIR) or filename == _HOOK_RUNNER


def _user_frame(f):
    """First frame outside torch and this module, walking outwards from ``f``."""
    while f is not None and _internal(f.f_code.co_filename):
        f = f.f_back
    return f


def _user_frames(f, internal_code: dict, n: int = 4, stop=None) -> list[tuple]:
    """``(code, line)`` of the first ``n`` frames outside torch and this package, walking
    outwards from ``f`` (the innermost is the call that ran the op) and not past a frame
    running ``stop`` (a code object). ``internal_code`` caches code object -> internal, so the
    walk does no string work for a code object seen before."""
    out = []
    while f is not None and len(out) < n:
        code = f.f_code
        if code is stop:
            break
        internal = internal_code.get(code)
        if internal is None:
            internal = internal_code[code] = _internal(code.co_filename)
        if not internal:
            out.append((code, f.f_lineno))
        f = f.f_back
    return out


def _frame_text(code, line) -> str:
    """``file:line in function`` of one frame."""
    return f"{os.path.basename(code.co_filename)}:{line} in {code.co_name}"


def _code_of(module: torch.nn.Module):
    fwd = module.forward
    fn = getattr(fwd, "__func__", fwd)
    return getattr(fn, "__code__", None)


def _function_span(code) -> tuple[int, int]:
    """(first line, last line) of a code object (last = highest line number in it)."""
    lines = [ln for _, _, ln in code.co_lines() if ln is not None] if hasattr(code, "co_lines") else []
    return code.co_firstlineno, max(lines) if lines else code.co_firstlineno


def _line_text(code, line) -> str | None:
    if code is None:
        return None
    return linecache.getline(code.co_filename, line).strip() or None


def _backward_caller() -> str | None:
    """``file:line`` of the first frame outside torch and optcheck (the user's
    ``loss.backward()``), or None."""
    pkg = _OPTCHECK_DIR
    f = sys._getframe(1)
    while f is not None and (_internal(f.f_code.co_filename) or f.f_code.co_filename.startswith(pkg)):
        f = f.f_back
    return _where(f.f_code, f.f_lineno) if f is not None else None
