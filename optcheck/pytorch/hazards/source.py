"""Source locations for the hazard probes: the user's frame (outside torch and this
package), ``file:line`` text, and the in-place-looking statements of a function's source."""

from __future__ import annotations

import linecache
import os
import re
import sys

import torch

from optcheck.pytorch.hazards._tensors import _ptr
from optcheck.pytorch.guard import raised_by_signal_handler

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_PKG_DIR = os.path.dirname(__file__) + os.sep  # optcheck/pytorch/hazards/: the probes' own frames
_OPTCHECK_DIR = os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep  # optcheck/
# an in-place looking statement: x.add_(…), x += …, x[…] = …, out=…, inplace=True
# an in-place looking statement: x.add_(…), x += …, x[…] = …, out=…, inplace=True
_AUGMENTED = re.compile(r"(\+|-|\*|/|//|%|@|\*\*|&|\||\^|<<|>>)=")
_SETITEM = re.compile(r"\]\s*=[^=]")
_METHOD_ = re.compile(r"\.[A-Za-z]\w*_\(")
_CUTTING = re.compile(r"\.detach\(|\.data\b|no_grad|inference_mode|\.numpy\(|\.item\(|\.tolist\(")
_TARGET_METHOD = re.compile(r"(\w+)(?:\[[^\]]*\])*\.[A-Za-z]\w*_\(")
_TARGET_ASSIGN = re.compile(r"(\w+)(?:\[[^\]]*\])*\s*(?:\+|-|\*|/|//|%|@|\*\*|&|\||\^|<<|>>)?=[^=]")


def _where(code, lineno) -> str | None:
    if code is None:
        return None
    return f"{os.path.basename(code.co_filename)}:{lineno}"


def _internal(filename: str) -> bool:
    return filename.startswith(_TORCH_DIR) or filename.startswith(_PKG_DIR)


def _user_frame(f):
    """First frame outside torch and this module, walking outwards from ``f``."""
    while f is not None and _internal(f.f_code.co_filename):
        f = f.f_back
    return f


def _inplace_candidates(filename: str, first: int, last: int) -> list[tuple[int, str]]:
    """Lines in ``[first, last]`` of ``filename`` that look like in-place writes
    (``x.op_(…)``, ``x op= …``, ``x[…] = …``, ``inplace=True``, ``out=``)."""
    out = []
    for n in range(max(1, first), last + 1):
        text = linecache.getline(filename, n).strip()
        if not text or text.startswith("#"):
            continue
        code = text.split("#", 1)[0]
        if (_METHOD_.search(code) and not re.search(r"\.(requires_grad|retain_grad|register\w*)_\(", code)) \
                or _AUGMENTED.search(code) or _SETITEM.search(code) \
                or re.search(r"\binplace\s*=\s*True|\bout\s*=", code):
            out.append((n, text))
    return out


def _targets(text: str) -> set[str]:
    """Names written in place by a source line (``a.add_(``, ``a += ``, ``a[i] = ``)."""
    names = set(_TARGET_METHOD.findall(text))
    if _AUGMENTED.search(text) or _SETITEM.search(text):
        names |= set(_TARGET_ASSIGN.findall(text))
    return names


def _aliases(frame, t: torch.Tensor) -> set[str]:
    """Local names of ``frame`` bound to tensors sharing ``t``'s storage (rare path)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception as caught:  # noqa: BLE001
        if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
            raise
        return set()
    out = set()
    for name, val in frame.f_locals.items():
        if isinstance(val, torch.Tensor):
            try:
                if val.untyped_storage().data_ptr() == ptr:
                    out.add(name)
            except Exception as caught:  # noqa: BLE001
                if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                    raise
        elif isinstance(val, (tuple, list)) and len(val) < 16:
            for v in val:
                if isinstance(v, torch.Tensor) and _ptr(v) and v.untyped_storage().data_ptr() == ptr:
                    out.add(name)
    return out


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
