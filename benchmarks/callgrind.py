"""Instruction counts with valgrind's callgrind: a cost measure that does not move with load.

On a shared 2-core machine a process's CPU time for the same 1,000 steps moves by
±10–15 % between rounds (docs/guide/cost.md), more than the 3 % the Monitor is allowed.
Callgrind counts the instructions the process executes (``Ir``), the same on a quiet
and a loaded machine: the same binary, inputs and environment give the same count
(``/work/.library/env/machines/python.md``: "the same total twice, once with the
other core loaded"). It says nothing about cache misses or memory stalls; the
CPU-time ratio of ``bench_small_loop.py`` is the measure that sees those.

This module is the harness both sides use:

- in the measured process, :class:`Marks` (a small C library built here with the C
  compiler, its client requests from valgrind's own ``<valgrind/callgrind.h>``):
  ``start()`` switches instrumentation on (the run starts with it off:
  ``--instr-atstart=no``, so importing torch runs at valgrind's uninstrumented speed and
  counts nothing), ``dump(label)`` writes the counts since the last dump to a file of
  their own (``CALLGRIND_DUMP_STATS_AT``); :meth:`Marks.slot` runs a Python callable
  through one of 64 distinct C functions (``oc_slot_K``), so that callgrind's
  *inclusive* cost of ``oc_slot_K`` is every instruction of that callable, the
  trampoline's own (measured with an empty callable: :meth:`Marks.calibrate`) aside.
  Outside valgrind each client request is a handful of instructions that do nothing.
- in the parent, :func:`run` starts a command under ``valgrind --tool=callgrind`` and
  returns each dump's total, and :func:`inclusive` reads one dump's inclusive cost per
  ``oc_slot_K`` (``callgrind_annotate --inclusive=yes``).

Callgrind runs the instrumented part about 50 times slower than the machine does.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

SLOTS = 64
_SOURCE = r"""
#include <valgrind/callgrind.h>
typedef void (*cb_t)(void);
void oc_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void oc_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void oc_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
void oc_zero(void) { CALLGRIND_ZERO_STATS; }
""" + "".join(f"__attribute__((noinline)) void oc_in_{k}(cb_t f) {{ f(); __asm__ volatile(\"\"); }}\n"
              f"void oc_slot_{k}(cb_t f) {{ oc_in_{k}(f); __asm__ volatile(\"\"); }}\n" for k in range(SLOTS))


def _library() -> Path:
    """Build the marks library once per source (cached under the temp folder)."""
    digest = hashlib.sha1(_SOURCE.encode()).hexdigest()[:12]
    lib = Path(tempfile.gettempdir()) / f"optcheck-callgrind-{digest}.so"
    if not lib.exists():
        src = lib.with_suffix(".c")
        src.write_text(_SOURCE)
        tmp = lib.with_suffix(f".{os.getpid()}.so")
        subprocess.run([os.environ.get("CC", "cc"), "-O0", "-fno-optimize-sibling-calls", "-shared", "-fPIC",
                        "-o", str(tmp), str(src)], check=True)
        tmp.replace(lib)
    return lib


class Marks:
    """Client requests and the slot trampolines, in the measured process."""

    _CB = ctypes.CFUNCTYPE(None)

    def __init__(self):
        self.lib = ctypes.PyDLL(str(_library()))  # PyDLL: the GIL stays held across the trampoline
        self.lib.oc_dump.argtypes = [ctypes.c_char_p]
        self._pending: list = [None] * SLOTS
        self._cbs = [self._CB(self._runner(k)) for k in range(SLOTS)]
        self._slots = [getattr(self.lib, f"oc_slot_{k}") for k in range(SLOTS)]
        for s in self._slots:
            s.argtypes = [self._CB]
        self.calls = [0] * SLOTS

    def _runner(self, k):
        pending = self._pending

        def run():
            fn, out = pending[k]
            try:
                out.append(fn())
            except BaseException as e:  # noqa: BLE001 - handed back to the caller below
                out.append(e)
                out.append(None)
        return run

    def start(self) -> None:
        self.lib.oc_start()

    def stop(self) -> None:
        self.lib.oc_stop()

    def dump(self, label: str) -> None:
        self.lib.oc_dump(label.encode())

    def slot(self, k: int, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` run inside ``oc_slot_k`` (its exception re-raised here)."""
        out: list = []
        prev = self._pending[k]
        self._pending[k] = (lambda: fn(*args, **kwargs), out)
        try:
            self._slots[k](self._cbs[k])
        finally:
            self._pending[k] = prev
        self.calls[k] += 1
        if len(out) == 2:
            raise out[0]
        return out[0]

    def calibrate(self, k: int, n: int = 200) -> None:
        """``n`` calls of an empty callable in slot ``k``: the trampoline's own cost per call."""
        for _ in range(n):
            self.slot(k, _nothing)


def _nothing():
    return None


def python() -> str:
    """The interpreter itself (not a pyenv shim, which valgrind would measure instead)."""
    exe = Path(sys.executable).resolve()
    return str(exe) if exe.exists() else sys.executable


#: ``--cache-sim``: callgrind's cache simulation, set to this project's machine (AMD EPYC, per core 32 KiB
#: 8-way L1 data and instruction caches, 1 MiB 8-way L2 as the "last level": the L3 is shared with
#: other tenants); each dump then counts misses as well (:func:`events`); about 4 times slower again
CACHE_SIM = ("--cache-sim=yes", "--D1=32768,8,64", "--I1=32768,8,64", "--LL=1048576,8,64")


def run(args: list[str], out_dir: str, env: dict | None = None) -> dict[str, int]:
    """Run ``python args...`` under callgrind (instrumentation off until ``Marks.start``);
    returns ``{label: instructions}`` of each ``Marks.dump(label)``, and the dump files
    by label in ``run.files`` (``{label: path}``). :func:`run_full` returns all three
    (for runs made in parallel threads)."""
    totals, files, stdout = run_full(args, out_dir, env)
    run.files, run.stdout = files, stdout
    return totals


def run_full(args: list[str], out_dir: str, env: dict | None = None,
             tool_args: tuple = ()) -> tuple[dict, dict, str]:
    """:func:`run`'s ``(totals, files, stdout)``; ``tool_args``: more valgrind options (:data:`CACHE_SIM`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = out / "callgrind.out"
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", *tool_args, f"--callgrind-out-file={base}.%p",
           python(), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"callgrind run failed ({p.returncode}): {p.stderr[-2000:]}")
    totals, files = {}, {}
    for f in sorted(out.glob("callgrind.out.*")):
        text = f.read_text(errors="replace")
        m = re.search(r"^desc: Trigger: Client Request: (.*)$", text, re.M)
        t = re.search(r"^totals: (\d+)", text, re.M) or re.search(r"^summary: (\d+)", text, re.M)
        if m and t:
            totals[m.group(1).strip()] = int(t.group(1))
            files[m.group(1).strip()] = f
    return totals, files, p.stdout


def events(path: Path) -> dict[str, int]:
    """Every event's total in one dump file: ``{"Ir": ..., "D1mr": ..., ...}`` (with :data:`CACHE_SIM`:
    instructions, data reads and writes, and the misses of each cache level)."""
    text = Path(path).read_text(errors="replace")
    names = re.search(r"^events: (.*)$", text, re.M)
    total = re.search(r"^summary: (.*)$", text, re.M) or re.search(r"^totals: (.*)$", text, re.M)
    if not names or not total:
        return {}
    return dict(zip(names.group(1).split(), map(int, total.group(1).split())))


def inclusive(path: Path) -> dict[int, int]:
    """Inclusive instructions of each ``oc_slot_K`` in one dump file: ``{K: Ir}``."""
    p = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(path)],
                       capture_output=True, text=True, check=True)
    out = {}
    for line in p.stdout.splitlines():
        m = re.match(r"\s*([\d,]+)\s+.*\boc_in_(\d+)\b", line)
        if m:
            out[int(m.group(2))] = int(m.group(1).replace(",", ""))
    return out


def trampoline_ns(n: int = 100_000, repeats: int = 3) -> float:
    """CPU ns of one empty :meth:`Marks.slot` call outside valgrind (the least of ``repeats``
    rounds of ``n``): with its instruction count (``calibrate``, printed by the
    ``--instructions --components`` mode of ``bench_small_loop.py``), the rate at which this
    machine runs Python-level code like optcheck's hooks, against the plain training
    loop's (mostly torch kernels)."""
    import time

    marks, best = Marks(), float("inf")
    for _ in range(repeats):
        t = time.thread_time_ns()
        for _ in range(n):
            marks.slot(0, _nothing)
        best = min(best, (time.thread_time_ns() - t) / n)
    return best


__all__ = ["Marks", "SLOTS", "run", "run_full", "inclusive", "python", "trampoline_ns"]
if sysconfig.get_platform().startswith("win"):  # pragma: no cover - valgrind is Linux/macOS only
    raise ImportError("callgrind needs valgrind (Linux)")

if __name__ == "__main__":  # python benchmarks/callgrind.py: one trampoline call's CPU time here
    print(f"{trampoline_ns():.0f} ns CPU per empty slot call (1 thread; load {os.getloadavg()[0]:.2f})")
