"""Count the host reads of tensor values a piece of code makes: the syncs it would make on a GPU.

On CUDA, ``torch.cuda.set_sync_debug_mode("warn")`` names every synchronising call. It
needs a GPU. :class:`HostReadCounter` finds the same calls on any device, the CPU
included, so a test without a GPU can prove that a code path reads nothing back from the
device: while it is active it watches

- through a ``TorchFunctionMode``: ``Tensor.tolist``, ``.numpy``, ``.cpu``, ``__array__``
  and ``.to`` onto the CPU from another device (copies to the host: on the CPU they move
  nothing, on a GPU they wait for it);
- through a ``TorchDispatchMode``: ``aten._local_scalar_dense`` (what ``.item()``,
  ``float()``, ``int()`` and ``bool()`` of a tensor come down to), and the ops whose
  output size depends on the values (``nonzero``, ``masked_select``, ``unique``,
  ``equal``, ``is_nonzero``: each reads the device on CUDA).

Each read is put down to the Python code that asked for it: the innermost frame outside
torch's own dispatch machinery (``torch/overrides.py``, ``torch/_tensor.py``,
``torch/utils/_python_dispatch.py``, ``torch/_ops.py``, the ``torch._dynamo`` wrapper
that disables compilation around them) and this module. Its ``by`` is
"optcheck" (a file in the optcheck package), "torch" (torch itself: e.g. a non-fused
AdamW reading its CPU ``step`` counter) or "user". A read made while a function of
``exempt`` is on the stack (a snapshot, a metrics batch) is marked ``exempt``.

Cost: every torch call goes through two Python modes while it is active (a test or debug
tool, not something to leave on in a run). Usage::

    with HostReadCounter(exempt=[Sequencer.take]) as reads:
        train()
    assert reads.count(by="optcheck", exempt=False) == 0, reads.report()
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable, Iterable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_OPTCHECK = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # optcheck/
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_HERE = os.path.abspath(__file__)
#: torch's files that only pass a call on (the read is the caller's)
_PASS_THROUGH = tuple(os.path.join(_TORCH, f) for f in ("overrides.py", "_tensor.py", "_ops.py",
                                                        os.path.join("utils", "_python_dispatch.py"),
                                                        os.path.join("_dynamo", "eval_frame.py"), "_compile.py"))
#: Tensor methods that copy values to the host
HOST_COPIES = frozenset({"tolist", "numpy", "cpu", "__array__"})
#: aten ops that read device values on the host (``OpOverloadPacket`` names)
HOST_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                      "unique_consecutive", "equal", "is_nonzero"})


@dataclasses.dataclass
class Read:
    """One host read: the op, who asked (``by``: "optcheck", "torch" or "user"), where
    (``file:line function``) and whether an exempt function was on the stack."""

    op: str
    by: str
    where: str
    exempt: bool


def _classify(frame) -> tuple[str, str]:
    """(by, where) of the innermost frame outside the pass-through files and this module."""
    f = frame
    while f is not None:
        fn = f.f_code.co_filename
        if fn != _HERE and not fn.startswith(_PASS_THROUGH):
            break
        f = f.f_back
    if f is None:
        return "user", "?"
    fn = os.path.abspath(f.f_code.co_filename)
    by = "optcheck" if fn.startswith(_OPTCHECK) else "torch" if fn.startswith(_TORCH) else "user"
    return by, f"{os.path.relpath(fn) if by != 'torch' else fn[len(_TORCH):]}:{f.f_lineno} {f.f_code.co_name}"


class _Functions(TorchFunctionMode):
    def __init__(self, counter: "HostReadCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in HOST_COPIES or (name == "to" and args and _to_host(args, kwargs)):
            self.counter._seen(name, sys._getframe(1))
        return func(*args, **kwargs)


def _to_host(args, kwargs) -> bool:
    """``t.to(...)`` that copies a non-CPU tensor onto the CPU."""
    t = args[0]
    if not isinstance(t, torch.Tensor) or t.device.type == "cpu":
        return False
    for a in list(args[1:]) + [kwargs.get("device")]:
        if isinstance(a, (str, torch.device)):
            try:
                return torch.device(a).type == "cpu"
            except (RuntimeError, TypeError):
                return False
    return False


class _Dispatch(TorchDispatchMode):
    def __init__(self, counter: "HostReadCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_OPS:
            self.counter._seen(f"aten.{name}", sys._getframe(1))
        return func(*args, **(kwargs or {}))


class HostReadCounter:
    """A context manager recording every host read made while it is active (see the
    module docstring).

    Args:
        exempt: functions inside which a read is expected (marked ``exempt``), e.g.
            ``Sequencer.take`` (a snapshot reads every tensor once).

    Attributes:
        reads: the :class:`Read` records, in order.
    """

    def __init__(self, exempt: Iterable[Callable] = ()):
        self._exempt = {getattr(f, "__code__", None) for f in exempt} - {None}
        self.reads: list[Read] = []
        self._modes: list = []
        self._inside = False

    def _seen(self, op: str, frame) -> None:
        if self._inside:  # a read made by the counter's own bookkeeping
            return
        self._inside = True
        try:
            by, where = _classify(frame)
            f, exempt = frame, False
            while f is not None and not exempt:
                exempt = f.f_code in self._exempt
                f = f.f_back
            self.reads.append(Read(op, by, where, exempt))
        finally:
            self._inside = False

    def __enter__(self) -> "HostReadCounter":
        self._modes = [_Functions(self), _Dispatch(self)]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for m in reversed(self._modes):
            m.__exit__(*exc)
        self._modes = []

    def select(self, by: str | None = None, exempt: bool | None = None) -> list[Read]:
        """The reads made by ``by`` (None: anyone), exempt or not (None: both)."""
        return [r for r in self.reads if (by is None or r.by == by) and (exempt is None or r.exempt == exempt)]

    def count(self, by: str | None = None, exempt: bool | None = None) -> int:
        return len(self.select(by, exempt))

    def report(self, by: str | None = None, exempt: bool | None = None, limit: int = 20) -> str:
        """One line per distinct (op, by, where, exempt) with its count, most frequent first."""
        tally: dict[tuple, int] = {}
        for r in self.select(by, exempt):
            key = (r.op, r.by, r.where, r.exempt)
            tally[key] = tally.get(key, 0) + 1
        lines = [f"{n:6d}  {op:24s} {who:8s} {'exempt ' if ex else ''}{where}"
                 for (op, who, where, ex), n in sorted(tally.items(), key=lambda kv: -kv[1])[:limit]]
        return "\n".join(lines) or "(no host reads)"
