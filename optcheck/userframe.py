"""Where in the user's code a warning belongs.

A finding is found inside a hook (an optimizer step hook, a backward wrapper, a
Lightning or Trainer callback), many frames below the user's own line.
:func:`user_stacklevel` counts those frames so ``warnings.warn(...,
stacklevel=...)`` names the user's ``optimizer.step()``, ``loss.backward()`` or
``trainer.fit()`` line, as PyTorch's own warnings do. Torch-free.
"""

from __future__ import annotations

import os
import sys

# packages whose frames sit between the user's line and optcheck's hooks
FRAMEWORKS = ("optcheck", "torch", "lightning", "pytorch_lightning", "lightning_fabric", "transformers",
              "accelerate")


def _prefixes() -> tuple[str, ...]:
    out = []
    for name in FRAMEWORKS:
        mod = sys.modules.get(name)
        f = getattr(mod, "__file__", None)
        if f:
            out.append(os.path.dirname(os.path.abspath(f)) + os.sep)
    return tuple(out)


def user_stacklevel(skip_stdlib: tuple[str, ...] = ("contextlib.py", "functools.py")) -> int:
    """The ``stacklevel`` for a ``warnings.warn`` called by this function's caller that
    points at the first frame outside optcheck, torch and the training frameworks
    (and outside ``contextlib``/``functools`` helpers they call through). Falls back
    to the outermost frame."""
    prefixes = _prefixes()
    frame = sys._getframe(1)  # the caller of this function: stacklevel 1
    level = 1
    while frame is not None:
        fn = os.path.abspath(frame.f_code.co_filename)
        if not fn.startswith(prefixes) and os.path.basename(fn) not in skip_stdlib and not fn.startswith("<frozen"):
            return level
        if frame.f_back is None:
            return level
        frame, level = frame.f_back, level + 1
    return level
