"""The ``torch.optim.Optimizer`` and ``nn.Module`` inside the wrappers users hold.

Training frameworks hand the user a wrapper, not the optimizer itself; each keeps
the real one in ``.optimizer`` and forwards ``step()`` to it, so hooks registered
on the inner optimizer see every step the wrapper really takes:

- accelerate's ``AcceleratedOptimizer`` (``accelerate/optimizer.py``; what a
  Hugging Face ``Trainer`` and ``accelerator.prepare`` return). Under gradient
  accumulation its ``step()`` skips the inner step until gradients are synced, so
  steps are counted as the optimizer really takes them.
- Lightning's ``LightningOptimizer`` (``lightning/pytorch/core/optimizer.py``;
  ``self.optimizers()`` in a LightningModule) and Fabric's ``_FabricOptimizer``.
- anything else with the same ``.optimizer`` attribute (e.g. Lightning's
  ``_MockOptimizer`` is a real Optimizer and needs no unwrapping).

Models: ``DistributedDataParallel`` and ``DataParallel`` keep the user's module in
``.module`` (``torch/nn/parallel/distributed.py``); parameter names are then the
user's own, without the ``module.`` prefix.
"""

from __future__ import annotations

import torch

_MAX_DEPTH = 8  # wrappers of wrappers (e.g. Lightning around accelerate) are a few deep at most


def unwrap_optimizer(optimizer: object) -> torch.optim.Optimizer:
    """Follow ``.optimizer`` until a ``torch.optim.Optimizer``.

    Raises:
        TypeError: no ``torch.optim.Optimizer`` at the end of the chain (the message
            names the type given and what is accepted).
    """
    seen, obj = [], optimizer
    for _ in range(_MAX_DEPTH):
        # AcceleratedOptimizer subclasses Optimizer without running its __init__ (no hook
        # dicts): go on inward while there is an inner optimizer, then require a real one
        inner = getattr(obj, "optimizer", None)
        if inner is None or inner is obj:
            if isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "_optimizer_step_pre_hooks"):
                return obj
            seen.append(type(obj).__qualname__)
            break
        seen.append(type(obj).__qualname__)
        obj = inner
    raise TypeError(
        f"optcheck.Monitor: optimizer must be a torch.optim.Optimizer or a wrapper holding one in "
        f".optimizer (accelerate's AcceleratedOptimizer, Lightning's LightningOptimizer); got "
        f"{' -> '.join(seen)}")


def unwrap_model(model: object) -> torch.nn.Module:
    """The user's module inside ``DistributedDataParallel`` / ``DataParallel``.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"optcheck.Monitor: model must be a torch.nn.Module, got {type(model).__qualname__}")
    parallel = (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)
    while isinstance(model, parallel):
        model = model.module
    return model
