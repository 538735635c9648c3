"""Device values read on the host later, all in one transfer: no host sync per step.

On a CUDA device every host read of a device value (``float(loss)``, ``.item()`` on a
norm, ``bool()`` of a NaN check) waits for the GPU to drain its queue of kernels: a
*sync*. The soak's worker loop and ``optcheck.Monitor`` make none on a step that
takes no snapshot (docs/gpu.md). What they need to know at every step — the loss,
whether the loss and the gradients are finite, whether the gradients were cleared
— is computed on the device as a small tensor and handed to a :class:`DeviceLedger`
with what to do with its value; the driver reads the whole ledger at its next
snapshot or metrics batch (``Sequencer.take`` flushes first), in one transfer per
device, and each callback then records its event *at the step the tensor was made
at*. A finding is thus dated by its cause, and written a few steps later (at most
one metrics batch: 200 steps or 1 s in the soak; one snapshot interval in the
Monitor).

On the CPU the same code runs (a read there costs no sync), so the CPU tests prove the
path: ``optcheck.pytorch.hostreads`` counts host reads, and ``tests/`` assert there are
none outside a snapshot or a metrics batch.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from optcheck.pytorch.guard import raised_by_signal_handler
log = logging.getLogger("optcheck")

#: pending tensors after which :meth:`DeviceLedger.add` reads the ledger itself (a
#: Monitor with ``every=100_000`` must not hold a million small tensors)
MAX_PENDING = 4096


def host_values(tensors: list[torch.Tensor]) -> list[list[float]]:
    """Every element of each tensor as Python floats (bools as 0.0/1.0), in one
    device-to-host transfer per device: the tensors are flattened and concatenated on
    their device (float64; float32 on MPS, which has no float64) and read with one
    ``.tolist()``.

    Returns:
        one list per tensor, in order (``[]`` for an empty tensor).
    """
    out: list[list[float] | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for device, idx in by_device.items():
        wide = torch.float32 if device.type == "mps" else torch.float64
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i in idx:
            by_dtype.setdefault(tensors[i].dtype, []).append(i)
        order = [i for group in by_dtype.values() for i in group]
        with torch.no_grad():  # one cat per dtype, one widening each, one cat, one read
            parts = [torch.cat([tensors[i].detach().reshape(-1) for i in group]).to(wide)
                     for group in by_dtype.values()]
            values = (torch.cat(parts) if len(parts) > 1 else parts[0]).tolist()  # the one transfer
        at = 0
        for i in order:
            n = tensors[i].numel()
            out[i] = values[at:at + n]
            at += n
    return out  # type: ignore[return-value]


class DeviceLedger:
    """Small device tensors made at a step, read on the host at the driver's next read.

    ``add(tensor, on_read)``: keep ``tensor`` (detached; it is computed on the device
    already, nothing waits); ``on_read(values)`` is called at :meth:`read` with its
    elements as floats. :meth:`read` reads every pending tensor — and the ``extra``
    tensors a driver passes (its losses) — in one transfer per device. A callback that
    raises is logged, never passed on (optcheck never breaks the run it watches).
    """

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[tuple[torch.Tensor, Callable[[list[float]], None]]] = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, tensor: torch.Tensor, on_read: Callable[[list[float]], None]) -> None:
        self._items.append((tensor.detach() if tensor.requires_grad else tensor, on_read))
        if len(self._items) >= MAX_PENDING:
            self.read()

    def read(self, extra: list[torch.Tensor] = ()) -> list[list[float]]:
        """Read the pending tensors and ``extra`` (one transfer per device); run the
        callbacks in the order the tensors were added; return ``extra``'s values."""
        items, self._items = self._items, []
        extra = list(extra)
        if not items and not extra:
            return []
        values = host_values(extra + [t for t, _ in items])
        for (_, on_read), v in zip(items, values[len(extra):]):
            try:
                on_read(v)
            except Exception as e:  # noqa: BLE001 - a probe's bug must not end the user's run
                if raised_by_signal_handler(e):
                    raise
                log.exception("optcheck: a deferred device check could not be read")
        return values[:len(extra)]
