"""Memory rule OC402: TorchSharp tensors created outside any DisposeScope, left for the GC.

Reads the ``memory`` block of the snapshots (``optcheck.record.snapshot``); only a
TorchSharp run records the fields it needs, so it is silent on PyTorch.
Torch-free: numbers only.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._fixtures import Invalid, Valid, cases, memory_stream
from optcheck.rules.base import Rule, RuleContext, register
from optcheck.record.snapshot import to_float
from optcheck.units import format_bytes, format_steps

#: tensors per step created outside any scope and not disposed, at or above which it is a finding
MIN_UNDISPOSED_PER_STEP = 1.0
#: ... and at least this many in the interval (one tensor kept at a resume is not a habit)
MIN_UNDISPOSED = 50
#: peak minus post-GC live count at or above this multiple of the live count ...
PEAK_EXCESS_RATIO = 10.0
#: ... and at least this many tensors
PEAK_EXCESS_MIN = 1000


def _num(mem: dict, key: str) -> float | None:
    try:
        v = to_float(mem.get(key))
    except (TypeError, ValueError):
        return None
    return v if v is not None and v == v and v >= 0 else None


@register
class MissingDisposeScope(Rule):
    """TorchSharp tensors are created outside any ``DisposeScope`` and left for the .NET GC.

    A TorchSharp tensor owns native memory that only ``Dispose()`` (or the GC's
    finalizer, much later) frees; a step run without ``torch.NewDisposeScope()``
    leaves every temporary of forward and backward to the finalizer
    (TorchSharp issues #1278 and #252; ``docs/memory.md``). The
    snapshot count after the probe's ``GC.Collect()`` looks clean, so the leak
    rules see nothing; what shows is the native memory held in between.

    Fires (once) on either record of a TorchSharp snapshot:

    - ``tensors_created_outside_scope`` minus ``tensors_disposed_outside_scope``
      (``DisposeScopeManager.Statistics`` of the training thread, cumulative) rose
      by at least 1 per step and 50 in all since the previous snapshot, beyond what
      the post-GC live count rose by (tensors kept on purpose are not garbage);
    - ``peak_tensors`` (``Tensor.PeakCount``, the high-water mark) is at least 10x
      the post-GC ``live_tensors`` and 1,000 above it: the temporaries of many
      steps were alive at once. (A scoped GPT step peaks at ~2.7x.)

    The message gives the tensors per step (from the statistics, else from the
    peak's rise over the interval: a lower bound) and the RSS they held.

    Next: RSS stays far above what the model needs (1.6 GiB instead of 300 MiB on
    the default GPT) and grows with batch and model size until the process runs
    out of memory; GC pauses lengthen.

    Fix: wrap each training step (forward, loss, backward, ``optimizer.step()``)
    in ``using (var scope = torch.NewDisposeScope()) { ... }`` and move what must
    outlive it out with ``MoveToOuterDisposeScope()``; dispose tensors made
    outside a scope with ``using var``.
    """

    code, symbol, severity, family = "OC402", "missing-dispose-scope", "warning", "memory"
    message = "tensors are created outside any DisposeScope and left for the GC: {what}"

    @cases
    def VALID():
        return [
            Valid(memory_stream([0, 100, 200], "torchsharp", live_tensors=lambda s: 110, peak_tensors=lambda s: 293),
                  "TorchSharp: every step in a DisposeScope (peak ~2.7x the live count)"),
            Valid(memory_stream(range(100, 1001, 100), live_tensors=lambda s: 90, rss_bytes=lambda s: 300 * 2**20),
                  "PyTorch records none of the fields"),
        ]

    @cases
    def INVALID():
        return [
            Invalid(memory_stream([0, 100, 200], "torchsharp", live_tensors=lambda s: 110,
                                  peak_tensors=lambda s: 110 if s == 0 else 8693),
                    "TorchSharp: no scope from the first step (peak live-tensor count)", step=100,
                    param="DisposeScope"),
            Invalid(memory_stream(range(100, 1001, 100), "torchsharp", live_tensors=lambda s: 110,
                                  peak_tensors=lambda s: 293, tensors_disposed_outside_scope=lambda s: 26 * (s // 100),
                                  tensors_created_outside_scope=lambda s: (5000 + 84 * max(0, s - 500)
                                                                           + 26 * (s // 100))),
                    "TorchSharp: the scope dropped at step 500 (DisposeScopeManager.Statistics)", step=600,
                    param="DisposeScope"),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        memo = ctx.memo.setdefault(self.code, {})
        if memo.get("fired"):
            return []
        mem = snap.get("memory") or {}
        prev = memo.get("prev")
        memo["prev"] = (snap["step"], mem)
        if snap["step"] < 1:
            return []
        found = self._from_statistics(snap, mem, prev) or self._from_peak(snap, mem, prev)
        if found is None:
            return []
        memo["fired"] = True
        return [found]

    @staticmethod
    def _undisposed(mem: dict) -> float | None:
        c, d = _num(mem, "tensors_created_outside_scope"), _num(mem, "tensors_disposed_outside_scope")
        return None if c is None or d is None else c - d

    def _rss(self, mem: dict, prev_mem: dict | None) -> tuple[str, float | None]:
        now = _num(mem, "rss_bytes")
        if now is None:
            return "", None
        before = _num(prev_mem or {}, "rss_bytes")
        if before is not None and now - before >= 0.1 * before:
            return f"; RSS {format_bytes(before)} -> {format_bytes(now)}", now
        return f"; RSS {format_bytes(now)}", now

    def _from_statistics(self, snap: dict, mem: dict, prev) -> Finding | None:
        now = self._undisposed(mem)
        if now is None or prev is None:
            return None
        step0, mem0 = prev
        before = self._undisposed(mem0)
        span = snap["step"] - step0
        if before is None or span <= 0:
            return None
        new = now - before
        live, live0 = _num(mem, "live_tensors"), _num(mem0, "live_tensors")
        kept = max(0.0, live - live0) if live is not None and live0 is not None else 0.0
        # undisposed tensors still alive after GC.Collect() are kept on purpose (a model built at a
        # resume) or leaked (OC401's case); only the garbage among them waits for the finalizer
        if new - kept < MIN_UNDISPOSED or (new - kept) / span < MIN_UNDISPOSED_PER_STEP:
            return None
        per_step = new / span
        what = (f"{per_step:,.0f} tensors per step created outside any scope and never disposed "
                f"({new:,.0f} between steps {format_steps(step0)} and {format_steps(snap['step'])}, "
                f"DisposeScopeManager.Statistics)")
        live, peak = _num(mem, "live_tensors"), _num(mem, "peak_tensors")
        if live is not None and peak is not None:
            what += f"; peak {peak:,.0f} live tensors vs {live:,.0f} after GC.Collect()"
        rss_text, rss = self._rss(mem, mem0)
        return self._finding(snap, what + rss_text, per_step, [step0, snap["step"]], "statistics", rss)

    def _from_peak(self, snap: dict, mem: dict, prev) -> Finding | None:
        live, peak = _num(mem, "live_tensors"), _num(mem, "peak_tensors")
        if live is None or peak is None:
            return None
        excess = peak - live
        if excess < PEAK_EXCESS_MIN or excess < PEAK_EXCESS_RATIO * live:
            return None
        step0, mem0 = prev if prev is not None else (0, {})
        peak0 = _num(mem0, "peak_tensors")
        if peak0 is not None and peak > peak0 and snap["step"] > step0:
            per_step = (peak - peak0) / (snap["step"] - step0)
            window = [step0, snap["step"]]
            rise = (f"the peak live-tensor count rose from {peak0:,.0f} to {peak:,.0f} between steps "
                    f"{format_steps(step0)} and {format_steps(snap['step'])} (at least {per_step:,.0f} "
                    f"tensors per step)")
        else:
            per_step = excess / snap["step"]
            window = [0, snap["step"]]
            rise = f"the peak live-tensor count is {peak:,.0f} by step {format_steps(snap['step'])}"
        what = f"{rise} while {live:,.0f} are alive after GC.Collect()"
        rss_text, rss = self._rss(mem, mem0)
        return self._finding(snap, what + rss_text, per_step, window, "peak", rss)

    def _finding(self, snap: dict, what: str, per_step: float, window: list, source: str,
                 rss: float | None) -> Finding:
        nxt = ("native memory of every step's temporaries is held until the GC's finalizer runs: RSS stays "
               "far above what the model needs and grows with batch and model size until the process runs "
               "out of memory")
        return self.finding(snap, self.message.format(what=what), subjects=["DisposeScope"], key="DisposeScope",
                            next_failure=nxt, tensors_per_step=per_step, window=window, source=source,
                            rss_bytes=rss)
