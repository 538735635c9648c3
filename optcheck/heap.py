"""Bytes the C heap has handed out and not taken back: glibc's ``mallinfo2()``.

libtorch's CPU allocator takes tensor memory from ``malloc`` / ``posix_memalign``
(PyTorch ``c10/core/impl/alloc_cpu.cpp``), and TorchSharp's native tensors are
libtorch tensors in the same process, so a tensor kept alive, with everything its
autograd graph saved, adds to this number and a freed one takes it back. Unlike
RSS it does not include memory the allocator keeps cached after ``free()``: in a
clean loop it comes back to the same byte count at every snapshot taken between
steps, which is what lets OC401 call a steady rise a leak after three snapshots
(``docs/memory.md``). Torch-free; importable by any worker.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


class _Mallinfo2(ctypes.Structure):
    # glibc >= 2.33, malloc/malloc.h: struct mallinfo2, every field a size_t
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _bind():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2
    except (OSError, AttributeError):  # not glibc (musl), or glibc < 2.33
        return None
    fn.restype, fn.argtypes = _Mallinfo2, []
    return fn


_MALLINFO2 = _bind()


def in_use_bytes() -> int | None:
    """Bytes allocated by ``malloc`` and not yet freed, in this process (int), or None
    where glibc's ``mallinfo2`` is missing (macOS, Windows, musl, glibc < 2.33).

    ``uordblks`` (in use in the arenas) plus ``hblkhd`` (in use in blocks mapped on
    their own, the large tensors). Cost: ~2 µs (measured on the default GPT).
    """
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)
