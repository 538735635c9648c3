"""OC201: ``.grad`` read on a non-leaf tensor (mixin of :class:`HazardProbes`): PyTorch's
warning for each read, counted per source line."""

from __future__ import annotations

import linecache
import os
import sys
import warnings

from optcheck.pytorch.hazards import writes
from optcheck.pytorch.hazards.source import _internal

#: the file of the write log's mode: a warning a torch call raises inside it is the caller's (writes.py)
WATCH_FILE = writes.__file__


def _caller_outside() -> tuple[str, int]:
    """``(file, line)`` of the first frame outside torch, the probes and ``warnings``."""
    f = sys._getframe(1)
    while f is not None and (_internal(f.f_code.co_filename) or f.f_code.co_filename == warnings.__file__):
        f = f.f_back
    return (f.f_code.co_filename, f.f_lineno) if f is not None else (WATCH_FILE, 0)

NONLEAF_WARNING = "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"
_NONLEAF_RE = r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed"


class NonleafGradProbe:
    """Non-leaf ``.grad`` reads (OC201): the ``nonleaf_grad_access`` event."""

    def _install_warning_hook(self) -> None:
        self._orig_showwarning = warnings.showwarning
        probes = self

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if filename == WATCH_FILE:  # raised by a torch call the write log's mode ran: the caller's line
                filename, lineno = _caller_outside()
            if issubclass(category, UserWarning) and str(message).startswith(NONLEAF_WARNING):
                probes._nonleaf_read(filename, lineno)
                return None
            return probes._orig_showwarning(message, category, filename, lineno, file, line)

        self._showwarning = showwarning
        warnings.showwarning = showwarning
        warnings.filterwarnings("always", message=_NONLEAF_RE, category=UserWarning)
        self._filter = warnings.filters[0]

    def _remove_warning_hook(self) -> None:
        if warnings.showwarning is self._showwarning:
            warnings.showwarning = self._orig_showwarning
        try:
            warnings.filters.remove(self._filter)
            warnings._filters_mutated()
        except (ValueError, AttributeError):
            pass

    def _nonleaf_read(self, filename: str, lineno: int) -> None:
        where = f"{os.path.basename(filename)}:{lineno}"
        self._record({"kind": "nonleaf_grad_access", "step": self._step, "where": where, "count": 1,
                      "detail": {"file": filename, "code": linecache.getline(filename, lineno).strip(),
                                 "value": "None (autograd populates .grad on leaf tensors only)"}},
                     key=("nonleaf_grad_access", where))
