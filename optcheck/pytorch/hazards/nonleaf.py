"""OC201: ``.grad`` read on a non-leaf tensor (mixin of :class:`HazardProbes`): PyTorch's
warning for each read, counted per source line."""

from __future__ import annotations

import linecache
import os
import warnings

NONLEAF_WARNING = "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed"
_NONLEAF_RE = r"The \.grad attribute of a Tensor that is not a leaf Tensor is being accessed"


class NonleafGradProbe:
    """Non-leaf ``.grad`` reads (OC201): the ``nonleaf_grad_access`` event."""

    def _install_warning_hook(self) -> None:
        self._orig_showwarning = warnings.showwarning
        probes = self

        def showwarning(message, category, filename, lineno, file=None, line=None):
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
