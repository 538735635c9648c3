"""Live tensors and their bytes, without walking every Python object at every census.

The census counts the tensors Python holds (``torch.Tensor`` objects and
subclasses, ``nn.Parameter`` included) and the bytes of their storages, each storage
once. PyTorch keeps no count of its live tensors or CPU storages that can be read
(the CPU allocator's ``ProfiledCPUMemoryReporter``, ``c10/core/CPUAllocator.cpp``,
counts only while a memory profiler runs; ``torch.cuda.memory_stats`` is CUDA's), so
the objects are found through the garbage collector, as before, but not all of them
every time (``docs/memory.md``, "Census"):

1. The first census collects (``gc.collect()``), finds every tensor alive then with
   one walk of ``gc.get_objects()`` and keeps a weak reference to each, then calls
   ``gc.freeze()`` (CPython ``Modules/gcmodule.c``): every object alive at that moment
   moves to the permanent generation, which later collections and
   ``gc.get_objects()`` skip. The modules of torch, lightning or transformers, the
   user's data and the model no longer cost anything.
2. Every later census collects and walks only the objects created since (what the
   training loop made and still holds), and adds the first census's tensors still
   alive (their weak references). ``gc.collect()`` first, as before: tensors only
   waiting for the cycle collector are garbage, not a leak (commit 70eccfc).

Cost on the default soak GPT (1 thread): the first census one full walk (as every
census did before, 30–400 ms depending on what is imported); each later one a
fraction of a millisecond up to a few ms, independent of the objects that existed
before (``benchmarks/bench_snapshot.py``). Nothing is added to the training step.

A program that froze objects itself before the first census (``gc.freeze()``: a
pre-fork server, a training script that freezes its set-up to cut collection pauses)
is left as it is: the census then freezes nothing, collects and walks at each census
only what the program left unfrozen, and counts no tensor inside what it froze;
:func:`release` unfreezes nothing (``gc.unfreeze()`` would unfreeze the program's
objects too). ``gc.get_freeze_count()`` tells, once per first census: it walks the
frozen objects (~40 ms for 450k), where a first census in normal mode costs a full
collection and walk (0.3–0.8 s in a process that imported transformers).

Side effect, and how it ends: while frozen, a reference cycle among objects that
existed at the first census is not collected (refcounting still frees everything
else). :func:`release` (``optcheck.Monitor.close``) unfreezes; a census after
someone else unfroze starts again from step 1 (it notices by finding, in its walk, an
object it made just before freezing: ``gc.get_freeze_count()`` would itself walk
every frozen object).
"""

from __future__ import annotations

import gc
import weakref

import torch

from optcheck.pytorch.guard import raised_by_signal_handler


class Census:
    """(count, bytes) of live tensors; see the module docstring for how."""

    def __init__(self) -> None:
        self._before: dict[int, weakref.ref] = {}  # tensors alive at the freeze, by id
        self._frozen = False
        self._theirs: bool | None = None  # the program froze objects before the first census (None: not asked yet)
        self._sentinel: list = [None]

    def __call__(self) -> tuple[int, int]:
        """Live tensors (int) and the bytes of their storages (int, each storage once)."""
        if not self._frozen:
            if self._theirs is None:
                self._theirs = gc.get_freeze_count() > 0
            if not self._theirs:  # (the program's own freeze: walk what it left unfrozen, freeze nothing)
                self._freeze()
        gc.collect()  # the unfrozen generations: what was made since the freeze
        objects = gc.get_objects()
        if self._frozen and any(obj is self._sentinel for obj in objects):  # someone called gc.unfreeze(): start again
            del objects
            self._freeze()
            gc.collect()
            objects = gc.get_objects()
        before = [t for t in (r() for r in list(self._before.values())) if t is not None]
        return _count(before + _tensors(objects))

    def _freeze(self) -> None:
        gc.collect()
        self._before = {}
        for t in _tensors(gc.get_objects()):
            try:
                self._before[id(t)] = weakref.ref(t, self._forget_cb(id(t)))
            except TypeError:  # a subclass without weak references: walked like a new object
                continue
        self._sentinel = [None]  # gc-tracked: frozen with the rest, seen again by a walk after an unfreeze
        gc.freeze()
        self._frozen = True

    def _forget_cb(self, key: int):
        before = self._before

        def forget(ref: weakref.ref) -> None:
            if before.get(key) is ref:
                del before[key]
        return forget

    def release(self) -> None:
        """Unfreeze what the first census froze (a no-op when nothing is frozen, or when the
        program had frozen objects itself: the census froze nothing then)."""
        self._theirs = None
        if self._frozen:
            gc.unfreeze()
            self._frozen, self._before = False, {}


def _tensors(objects: list) -> list:
    is_tensor: dict[type, bool] = {}
    out = []
    for obj in objects:
        tp = type(obj)
        hit = is_tensor.get(tp)
        if hit is None:
            hit = is_tensor[tp] = issubclass(tp, torch.Tensor)
        if hit:
            out.append(obj)
    return out


def _count(tensors: list) -> tuple[int, int]:
    seen, nbytes = set(), 0
    for t in tensors:
        try:
            st = t.untyped_storage()
            if st.device.type == "meta":  # a meta or fake tensor (torch.compile's FakeTensor): no memory;
                continue  # and reading its data pointer warns (an error in a later PyTorch)
            ptr = st.data_ptr()
            if ptr not in seen:
                seen.add(ptr)
                nbytes += st.nbytes()
        except Exception as caught:  # noqa: BLE001 - no storage: a wrapper subclass, a lazy module's UninitializedParameter
            if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                raise
    return len(tensors), nbytes


CENSUS = Census()


def release() -> None:
    """Unfreeze the objects the process-wide census froze (``optcheck.Monitor.close``)."""
    CENSUS.release()
