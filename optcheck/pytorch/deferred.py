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
import weakref
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


#: the one device whose values a :class:`DeviceLedger` copies into its buffers (their dicts' key)
_CPU = torch.device("cpu")

#: values per buffer of a :class:`DeviceLedger` (made at the first CPU value and kept: later values
#: are copied into it, no allocation)
CHUNK = 256


#: how many of the tensors it copied last a :class:`DeviceLedger` recognises when handed them again
#: (a step hands over the loss, then a clip total twice, then the loss again)
RECENT = 2


class Kept:
    """Where :meth:`DeviceLedger.keep` put a tensor's values: ``n`` elements from ``at`` in
    the ledger's buffers on ``device`` (the CPU)."""

    __slots__ = ("device", "at", "n")

    def __init__(self, device: torch.device, at: int, n: int):
        self.device, self.at, self.n = device, at, n


class DeviceLedger:
    """Small device tensors made at a step, read on the host at the driver's next read.

    ``add(tensor, on_read)``: keep ``tensor``'s values (nothing waits: held, or copied on the
    CPU, see below); ``on_read(values)`` is called at :meth:`read` with its elements as floats.
    :meth:`read` reads every pending value — and the ``extra`` values a driver passes (its
    losses, each a tensor or what :meth:`keep` returned) — in one transfer per device. A
    callback that raises is logged, never passed on (optcheck never breaks the run it watches).

    On the CPU the values are copied into a buffer the ledger keeps (``CHUNK`` float64 values,
    made at the first value and reused after each read): the small tensors themselves are let
    go at once. Held until the next read instead (a loss and a flag or two per step, up to a
    snapshot interval), each pinned its few bytes of the C heap among the step's large
    temporaries, and the allocator, unable to merge the space around them, took fresh pages
    from the kernel for those temporaries at every step (issue 34: 30-60 page faults a step
    more than the same loop without optcheck, a 6 ms CPU step, ``docs/guide/cost.md``; about
    0 with the copy, which costs 2-5 µs per value). A CUDA tensor's memory is the caching
    allocator's, not the C heap's, and a copy there is a kernel launch: values on other devices
    are held as they are, as is a tensor the buffer cannot take (complex, sparse, a subclass
    such as DTensor, more than ``CHUNK`` elements, a copy that fails). The same tensor handed over
    again with its version counter unmoved (the loss: the hazard probes' NaN check and the
    Monitor's loss; a clip total: OC501 and OC207) is not copied again: both read its one copy.
    """

    __slots__ = ("_items", "_bufs", "_views", "_pos", "_out", "_last")

    def __init__(self) -> None:
        self._items: list[tuple[object, Callable[[list[float]], None]]] = []
        self._bufs: dict[torch.device, list[torch.Tensor]] = {}  # device -> its buffers, CHUNK values each
        self._views: dict[torch.device, list[torch.Tensor]] = {}  # device -> a 0-d view of each of their values
        self._pos: dict[torch.device, int] = {}  # device -> values written since the last rewind
        self._out = 0  # Kept handed out by keep() and not read back yet (the buffers rewind at 0)
        # (a weak reference, its version then, where it went) for each of the last RECENT tensors copied:
        # the same tensor again, not written since, is not copied again (the loss and a clip total are
        # each handed over twice a step, by two probes); weak references, so that no tensor is held
        self._last: list[tuple] = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, tensor: torch.Tensor, on_read: Callable[[list[float]], None]) -> None:
        self._items.append((self._put(tensor), on_read))
        if len(self._items) >= MAX_PENDING:
            self.read()

    def keep(self, tensor: torch.Tensor) -> "Kept | torch.Tensor":
        """Keep ``tensor``'s values until a :meth:`read` that is handed the result in ``extra``
        (a :class:`Kept`; or ``tensor`` itself, detached, when it cannot be copied)."""
        kept = self._put(tensor)
        if type(kept) is Kept:
            self._out += 1
        return kept

    def _put(self, tensor: torch.Tensor):
        for ref, version, kept in self._last:
            if ref() is tensor and tensor._version == version:
                return kept  # (its values are in the buffers already: read from there twice)
        t = tensor.detach() if tensor.requires_grad else tensor
        # (is_cpu, not device.type: the device's type string is made anew on each read; issue 34)
        if type(t) is not torch.Tensor or not t.is_cpu or t.is_complex():  # (the class docstring)
            return t
        device = _CPU
        zero_d = t.dim() == 0
        n = 1 if zero_d else t.numel()
        if n != 1 and (n > CHUNK or n == 0 or t.layout != torch.strided):
            return t
        try:
            at = self._pos.get(device, 0)
            if at % CHUNK + n > CHUNK:  # (a value never straddles two buffers)
                at += CHUNK - at % CHUNK
            views = self._views.get(device)
            if views is None:
                views = self._views[device] = []
            while len(views) <= at:  # a new buffer, and a view of each of its values (made once, reused)
                with torch.inference_mode(False):  # (made inside inference_mode, it could never be written outside)
                    buf = torch.empty(CHUNK, dtype=torch.float64, device=device)
                    self._bufs.setdefault(device, []).append(buf)
                    views.extend(buf.unbind(0))
            if n == 1:
                views[at].copy_(t if zero_d else t.reshape(()))
            else:
                self._bufs[device][at // CHUNK].narrow(0, at % CHUNK, n).copy_(t.reshape(-1))
        except Exception as e:  # noqa: BLE001 - a dtype or layout the buffer cannot take: held as it is
            if raised_by_signal_handler(e):
                raise
            return t
        self._pos[device] = at + n
        kept = Kept(device, at, n)
        try:
            self._last = [(weakref.ref(tensor), tensor._version, kept), *self._last[:RECENT - 1]]
        except Exception as e:  # noqa: BLE001 - no weak reference, or no version counter (an inference
            if raised_by_signal_handler(e):  # tensor): not remembered, copied each time it comes
                raise
        return kept

    def read(self, extra: list = ()) -> list[list[float]]:
        """Read the pending values and ``extra`` (one transfer per device); run the
        callbacks in the order the values were added; return ``extra``'s values."""
        items, self._items = self._items, []
        extra = list(extra)
        if not items and not extra:
            return []
        sources = extra + [k for k, _ in items]
        self._out -= sum(type(k) is Kept for k in extra)
        values = self._values(sources)
        if self._out <= 0:  # every value kept is read: the buffers are written from their start again
            self._out = 0
            self._pos.clear()
            self._last = []
        for (_, on_read), v in zip(items, values[len(extra):]):
            try:
                on_read(v)
            except Exception as e:  # noqa: BLE001 - a probe's bug must not end the user's run
                if raised_by_signal_handler(e):
                    raise
                log.exception("optcheck: a deferred device check could not be read")
        return values[:len(extra)]

    def _values(self, sources: list) -> list[list[float]]:
        """The values of each source (a :class:`Kept` or a tensor): the tensors and the part of
        the buffers in use, all in one :func:`host_values` (one transfer per device)."""
        tensors = [t for t in sources if type(t) is not Kept]
        parts: dict[torch.device, int] = {}  # device -> how many buffer slices follow the tensors for it
        for device in {k.device for k in sources if type(k) is Kept}:
            used = self._pos.get(device, 0)
            bufs = self._bufs[device][:(used + CHUNK - 1) // CHUNK]
            tensors += bufs[:-1] + [bufs[-1][:used - CHUNK * (len(bufs) - 1)]]
            parts[device] = len(bufs)
        got = host_values(tensors)
        at = len(tensors) - sum(parts.values())
        flat: dict[torch.device, list[float]] = {}
        for device, n in parts.items():
            flat[device] = [v for part in got[at:at + n] for v in part]
            at += n
        held = iter(got)
        return [flat[k.device][k.at:k.at + k.n] if type(k) is Kept else next(held) for k in sources]
