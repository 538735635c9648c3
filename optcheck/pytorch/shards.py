"""A sharded (FSDP2 / DTensor) tensor's part on this rank.

``torch.distributed.fsdp.fully_shard`` replaces each parameter by a ``DTensor``
whose local shard is ``DTensor.to_local()`` (``torch/distributed/tensor/_api.py``);
its gradient and its optimizer state (``exp_avg``...) are DTensors too. Reading
values from a DTensor either needs a collective or fails (``.tolist()`` is not
supported for tensor subclasses), so the probe and the cross-rank table read the
local shard: what this rank holds (``docs/distributed.md``).
"""

from __future__ import annotations


def local(t):
    """``t.detach().to_local()`` for a DTensor, ``t`` itself otherwise (None stays None)."""
    if t is None or getattr(t, "to_local", None) is None:
        return t
    return t.detach().to_local()
