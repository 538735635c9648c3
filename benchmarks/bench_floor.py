"""How cheap can a per-step watcher written in Python be on the small, fast loop? (issue 34)

``bench_paired.py`` measures the Monitor in paired blocks. This benchmark puts beside it three
watchers written only for the measurement (they are not optcheck and judge nothing), in the
same pairs, so that the Monitor's cost can be read against the least a Python watcher of the
same contract costs:

- ``entry``: the Monitor's entry points and nothing in them: ``Tensor.backward`` and
  ``torch.autograd.backward`` replaced by wrappers that call the originals (told once per pass:
  ``Tensor.backward`` calls the other), ``clip_grad_norm_``
  the same, a step pre- and post-hook on the optimizer and a forward pre-hook on the model
  (the pass log's), each an empty Python function;
- ``fused``: the same entry points, each doing in one pass what a quiet step must keep for the
  per-step rules, and nothing else: before a backward pass the gradients and their version
  counters (arrival: OC202, OC203's partial cuts), after it the parameters whose gradient is new or added to,
  the loss and the clip total copied into one device buffer (OC501, read every ``every``
  steps with one host read), before the step the identity fingerprint (every module
  parameter's and param-group member's ``id`` and data pointer, compared with the last:
  OC101-OC105) and the OC207 test (the two watched gradients' version counters unmoved since
  backward), after it a step counter;
- ``fused-hazards``: ``fused`` plus the least the hazard probes must do on a step they are not
  armed for: the loss's ``grad_fn`` and the saved-tensor hooks on the stack before backward, the
  step's gradient arrival judged against the last and the arming signature (each module's
  instance ``forward`` and number of children) after the step (OC501's values are the buffer's);
- ``off``, ``auto``: ``optcheck.Monitor(every=100)`` with ``hazards=False`` and every probe, as in
  ``bench_paired.py``; ``plain``: plain against plain (the method's floor).

No snapshot, census or hazard probe runs in the three: the difference to ``off`` (``auto``) is
what the Monitor's per-step structure (and its hazard probes') costs beyond the reads any
watcher needs, plus its snapshots (one per block). Results: docs/guide/cost.md, "part 6".

    python benchmarks/bench_floor.py                          # plain, entry, fused, off, auto; 30 pairs each
    python benchmarks/bench_floor.py --configs entry,fused --pairs 60
    python benchmarks/bench_floor.py --instructions --steps 10   # a quiet step in instructions (callgrind)
    python benchmarks/bench_floor.py --configs off,auto --split 12  # first, quiet and snapshot steps apart
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
from itertools import chain, compress, repeat
from operator import attrgetter, is_not, setitem
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_paired import monitor, pairs, print_ratios  # noqa: E402
from bench_small_loop import CONFIGS  # noqa: E402

_GRAD = attrgetter("grad")
WATCHERS = ("entry", "fused", "fused-hazards")


def _own_time(entry):
    """An entry point of :class:`Watcher`: nothing unless fused; its time added to ``own_ns``
    (``time.perf_counter_ns`` before and after, as the Monitor's own timer does)."""

    @functools.wraps(entry)
    def run(self, *args):
        if not self.fused:
            return None
        t0 = time.perf_counter_ns()
        try:
            return entry(self, *args)
        finally:
            self.own_ns += time.perf_counter_ns() - t0
    return run


class Watcher:
    """One of the module docstring's watchers over ``model`` and ``opt`` (``fused``: with the
    reads, ``hazards``: and the hazard probes' least; else the empty entry points). ``close()``
    takes every wrapper and hook off."""

    def __init__(self, model, opt, every: int, fused: bool, hazards: bool = False) -> None:
        import torch

        self.torch, self.model, self.opt, self.every, self.fused = torch, model, opt, every, fused
        self.hazards = hazards
        self.steps = 0
        self.own_ns = 0  # its own time in the entry points (time.perf_counter_ns, as the Monitor's own timer)
        self.fingerprint_moved = self.nonfinite = self.cleared = 0
        self.arrived: set = set()
        self._gb = None
        self._seen = None
        self._orig = (torch.Tensor.backward, torch.autograd.backward, torch.nn.utils.clip_grad_norm_)
        orig_tensor, orig_autograd, orig_clip = self._orig
        me = self

        def wrapped(orig):
            def backward(tensors, *a, **kw):
                if me.in_backward:  # (Tensor.backward calls torch.autograd.backward: one pass, told once)
                    return orig(tensors, *a, **kw)
                me.in_backward = True
                me.before_backward(tensors if isinstance(tensors, torch.Tensor) else None)
                try:
                    return orig(tensors, *a, **kw)
                finally:
                    me.in_backward = False
                    me.after_backward()
            return backward

        self.in_backward = False
        tensor_backward, autograd_backward = wrapped(orig_tensor), wrapped(orig_autograd)

        def clip_grad_norm_(parameters, *a, **kw):
            total = orig_clip(parameters, *a, **kw)
            me.clipped(total)
            return total

        torch.Tensor.backward, torch.autograd.backward = tensor_backward, autograd_backward
        torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
        self._handles = [opt.register_step_pre_hook(self.pre_step), opt.register_step_post_hook(self.post_step),
                         model.register_forward_pre_hook(self.forward_pre)]
        self._dicts = [m._parameters for m in model.modules()]  # (the Monitor caches the same walk)
        self.params = [p for g in opt.param_groups for p in g["params"]]
        self._small = min(range(len(self.params)), key=lambda i: self.params[i].numel())
        self._large = max(range(len(self.params)), key=lambda i: self.params[i].numel())
        p0 = self.params[0]
        self.buffer = torch.zeros(2 * every, dtype=torch.float64, device=p0.device)  # loss, clip total per step
        self.slots = list(self.buffer.unbind())  # a view per slot, made once (no indexing op per copy)
        self._fp = self.fingerprint()
        mods = list(model.modules())
        self._mod_dicts, self._mod_children = [m.__dict__ for m in mods], [m._modules for m in mods]
        self._struct = self.structure()
        self._got_prev: frozenset | None = None
        self.foreign_hooks = self.arm_next = self.no_grad_fn = 0

    def close(self) -> None:
        self.torch.Tensor.backward, self.torch.autograd.backward, self.torch.nn.utils.clip_grad_norm_ = self._orig
        for h in self._handles:
            h.remove()

    def fingerprint(self) -> tuple:
        members = list(chain.from_iterable(map(dict.values, self._dicts)))
        members += chain.from_iterable(g["params"] for g in self.opt.param_groups)
        members = [p for p in members if p is not None]
        return tuple(map(id, members)), tuple(map(self.torch.Tensor.data_ptr, members))

    def structure(self) -> tuple:
        """``fused-hazards``: the arming decision's signature (each module's instance ``forward``
        and its number of children), as optcheck's hazard probes take it."""
        return tuple(map(dict.get, self._mod_dicts, repeat("forward"))), tuple(map(len, self._mod_children))

    # -- the entry points -----------------------------------------------------------------
    def forward_pre(self, module, args) -> None:
        return None

    @_own_time
    def before_backward(self, loss) -> None:
        gb = list(map(_GRAD, self.params))
        self._gb = (gb, [g._version if g is not None else -1 for g in gb]) if any(map(is_not, gb, repeat(None))) \
            else None
        if loss is not None and loss.dim() == 0:
            self.slots[2 * (self.steps % self.every)].copy_(loss.detach())
        if self.hazards:  # a cut loss (no grad_fn), someone else's saved-tensor hooks (stay armed)
            if loss is not None and loss.grad_fn is None:
                self.no_grad_fn += 1
            if self.torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
                self.foreign_hooks += 1

    @_own_time
    def after_backward(self) -> None:
        ga = list(map(_GRAD, self.params))
        if self._gb is None:
            new = list(compress(range(len(ga)), map(is_not, ga, repeat(None))))
        else:
            gb, vb = self._gb
            new = [i for i, a, b, v in zip(range(len(ga)), ga, gb, vb)
                   if a is not None and (a is not b or a._version != v)]
        self.arrived.update(new)
        gs, gl = ga[self._small], ga[self._large]
        self._seen = (gs, gs._version, gl, gl._version) if gs is not None and gl is not None else None

    @_own_time
    def clipped(self, total) -> None:
        self.slots[2 * (self.steps % self.every) + 1].copy_(total.detach())
        gs, gl = self.params[self._small].grad, self.params[self._large].grad
        self._seen = (gs, gs._version, gl, gl._version) if gs is not None and gl is not None else None

    @_own_time
    def pre_step(self, optimizer, args, kwargs) -> None:
        fp = self.fingerprint()
        if fp != self._fp:
            self.fingerprint_moved += 1
            self._fp = fp
        seen, self._seen = self._seen, None
        gs, gl = self.params[self._small].grad, self.params[self._large].grad
        if seen is None or gs is not seen[0] or gl is not seen[2] or gs._version != seen[1] \
                or gl._version != seen[3]:
            self.cleared += 1  # (the Monitor would read the two gradients here: a rare path)

    @_own_time
    def post_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        if self.hazards:  # the step's arrival judged against the last (a new gradless set arms the next
            got = frozenset(self.arrived)  # step), and the next step's arming decided (structure moved)
            if self._got_prev is not None and self._got_prev - got:
                self.arm_next += 1
            self._got_prev, self.arrived = got, set()
            struct = self.structure()
            if struct != self._struct:
                self._struct = struct
                self.arm_next += 1
        if self.steps % self.every == 0:  # the one host read per `every` steps
            values = self.buffer.tolist()
            self.nonfinite += sum(1 for v in values if v != v or v in (float("inf"), float("-inf")))
            self.arrived = set()


class NoFingerprint(Watcher):
    """``fused`` without the identity fingerprint before the step (OC207's test kept)."""

    @_own_time
    def pre_step(self, optimizer, args, kwargs) -> None:
        seen, self._seen = self._seen, None
        gs, gl = self.params[self._small].grad, self.params[self._large].grad
        if seen is None or gs is not seen[0] or gl is not seen[2] or gs._version != seen[1] \
                or gl._version != seen[3]:
            self.cleared += 1


class IdsOnly(Watcher):
    """``fused`` with a fingerprint of the objects alone (the same walk, no data pointer read)."""

    def fingerprint(self) -> tuple:
        members = list(chain.from_iterable(map(dict.values, self._dicts)))
        members += chain.from_iterable(g["params"] for g in self.opt.param_groups)
        return tuple(map(id, members))


class NoArrival(Watcher):
    """``fused`` without the gradients' maps around backward (the loss copy and OC207's two
    gradients kept)."""

    @_own_time
    def before_backward(self, loss) -> None:
        if loss is not None and loss.dim() == 0:
            self.slots[2 * (self.steps % self.every)].copy_(loss.detach())

    @_own_time
    def after_backward(self) -> None:
        gs, gl = self.params[self._small].grad, self.params[self._large].grad
        self._seen = (gs, gs._version, gl, gl._version) if gs is not None and gl is not None else None


class ArrivalHooks(NoArrival):
    """``fused`` with arrival from a post-accumulate-grad hook on each parameter
    (``functools.partial(operator.setitem, fresh, i)``, C-level, as the gradient-flow probe
    without ``per_backward``) instead of the maps."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fresh: dict = {}
        self._handles += [p.register_post_accumulate_grad_hook(functools.partial(setitem, self.fresh, i))
                          for i, p in enumerate(self.params)]

    @_own_time
    def post_step(self, optimizer, args, kwargs) -> None:
        self.arrived.update(self.fresh)
        self.fresh.clear()
        Watcher.post_step.__wrapped__(self, optimizer, args, kwargs)


class NoCopy(Watcher):
    """``fused`` without copying the loss and the clip total into its buffer."""

    @_own_time
    def before_backward(self, loss) -> None:
        gb = list(map(_GRAD, self.params))
        self._gb = (gb, [g._version if g is not None else -1 for g in gb]) if any(map(is_not, gb, repeat(None))) \
            else None

    @_own_time
    def clipped(self, total) -> None:
        gs, gl = self.params[self._small].grad, self.params[self._large].grad
        self._seen = (gs, gs._version, gl, gl._version) if gs is not None and gl is not None else None


#: ``fused`` less one of its reads (``bench_twins.py --configs fused,fused-no-fingerprint,...``): what each
#: read costs in the loop (docs/guide/cost.md, part 8)
ABLATIONS = {"fused-no-fingerprint": NoFingerprint, "fused-ids-only": IdsOnly, "fused-no-arrival": NoArrival,
             "fused-arrival-hooks": ArrivalHooks, "fused-no-copy": NoCopy}


def watch(config: str, model, opt, every: int, out: str):
    """``bench_paired.pairs``' watcher: a :class:`Watcher` for ``entry``/``fused``, else the Monitor."""
    if config in WATCHERS:
        return Watcher(model, opt, every, fused=config != "entry", hazards=config == "fused-hazards")
    return monitor(config, model, opt, every, out)


def child(config: str, steps: int) -> None:
    """Under callgrind (``--instructions``): the loop, 20 steps, the watcher, 5 steps more (the
    Monitor's armed first step among them), then ``steps`` quiet steps counted (``every`` is
    set past them: no snapshot falls among them) and dumped as "loop"."""
    import callgrind

    from bench_small_loop import build_loop

    marks = callgrind.Marks()
    model, opt, step = build_loop(steps + 40)
    for _ in range(20):
        step()
    with tempfile.TemporaryDirectory() as tmp:
        w = watch(config, model, opt, 10 * (steps + 40), tmp) if config != "plain" else None
        for _ in range(5):
            step()
        marks.start()
        for _ in range(steps):
            step()
        marks.stop()
        marks.dump("loop")
        if w is not None:
            w.close()


def instructions(configs: list[str], steps: int) -> None:
    """Each configuration's quiet step in instructions, against the plain loop's (callgrind)."""
    import callgrind

    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in ["plain"] + [c for c in configs if c != "plain"]:
            totals = callgrind.run([__file__, "--in-callgrind", c, "--steps", str(steps)], os.path.join(tmp, c))
            got[c] = totals["loop"] / steps
    print(f"{steps} quiet steps per configuration under callgrind (instructions, Ir), 1 thread")
    print("| configuration | instructions a quiet step | over the plain loop's | ratio |")
    print("|---|---:|---:|---:|")
    for c, n in got.items():
        print(f"| {c} | {n / 1e6:.3f} M | {(n - got['plain']) / 1e3:+,.0f} k | {n / got['plain']:.4f}x |")


def split(configs: list[str], blocks: int, block: int, every: int) -> None:
    """Where a watched block's time goes, step by step: blocks of ``block`` steps in turn
    (plain first), each step timed (``time.thread_time_ns``); per configuration the median
    over blocks of its first step (the Monitor's armed one), its quiet steps' mean (the 2nd to
    the next-to-last), its last step (the cadence snapshot when ``block == every``) and the
    watcher's own timer (the Monitor's ``cost.steps``, snapshots apart; the fused watcher's
    entry points timed the same way)."""
    from bench_small_loop import build_loop

    names = ["plain"] + [c for c in configs if c != "plain"]
    model, opt, step = build_loop(blocks * len(names) * block + 40)
    for _ in range(20):
        step()
    got: dict[str, list[list[int]]] = {c: [] for c in names}
    own: dict[str, list[float]] = {c: [] for c in names}  # the watcher's own timer, µs a step
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(blocks):
            for c in names:
                w = watch(c, model, opt, every, os.path.join(tmp, f"{c}-{i}")) if c != "plain" else None
                ts = []
                for _ in range(block):
                    t0 = time.thread_time_ns()
                    step()
                    ts.append(time.thread_time_ns() - t0)
                if isinstance(w, Watcher):
                    own[c].append(w.own_ns / 1e3 / block)
                elif w is not None:  # the Monitor's (summary.json's cost.steps: snapshots apart)
                    own[c].append(w.step_cost.to_dict()["mean_us"] or 0.0)
                if w is not None:
                    w.close()
                got[c].append(ts)

    def row(c):
        b = got[c]
        return (statistics.median(x[0] for x in b), statistics.median(statistics.mean(x[1:-1]) for x in b),
                statistics.median(x[-1] for x in b))

    base = row("plain")
    print(f"{blocks} blocks of {block} steps per configuration, every={every}, cpu, 1 thread, load {os.getloadavg()[0]:.2f}")
    print("| configuration | first step, µs | quiet steps' mean, µs (ratio) | last step, µs | own timer, µs a step |")
    print("|---|---:|---:|---:|---:|")
    for c in names:
        first, quiet, last = row(c)
        mine = f"{statistics.median(own[c]):.0f}" if own[c] else "-"
        print(f"| {c} | {first / 1e3:,.0f} | {quiet / 1e3:,.0f} ({quiet / base[1]:.3f}x) | {last / 1e3:,.0f} | {mine} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="plain,entry,fused,off,auto",
                    help="comma-separated: plain (the floor), entry, fused, fused-hazards, off, auto")
    ap.add_argument("--pairs", type=int, default=30, help="pairs per configuration")
    ap.add_argument("--block", type=int, default=100, help="steps per block")
    ap.add_argument("--every", type=int, default=100, help="the Monitor's every=, the fused watcher's read period")
    ap.add_argument("--instructions", action="store_true",
                    help="count a quiet step's instructions under callgrind instead (valgrind; --steps of them)")
    ap.add_argument("--steps", type=int, default=10, help="with --instructions: quiet steps counted")
    ap.add_argument("--split", type=int, metavar="BLOCKS",
                    help="time each step of BLOCKS blocks per configuration instead: first, quiet, last step")
    ap.add_argument("--in-callgrind", metavar="CONFIG", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.in_callgrind:
        child(a.in_callgrind, a.steps)
        return
    configs = a.configs.split(",")
    unknown = [c for c in configs if c not in CONFIGS and c not in WATCHERS]
    if unknown:
        raise SystemExit(f"bench_floor: unknown configuration(s) {unknown}; known: {sorted(CONFIGS) + list(WATCHERS)}")
    if a.instructions:
        instructions(configs, a.steps)
        return
    if a.split:
        split(configs, a.split, a.block, a.every)
        return
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        ratios = pairs(configs, a.pairs, a.block, a.every, tmp, watch=watch)
    print(f"{a.pairs} pairs of {a.block}-step blocks per configuration, every={a.every}, cpu, 1 thread; "
          f"load {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")
    print_ratios(ratios)


if __name__ == "__main__":
    main()
