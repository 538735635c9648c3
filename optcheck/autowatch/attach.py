"""Watch every optimizer of a process without editing its script: :class:`AutoWatch`.

``AutoWatch(out).install()`` registers two of torch's *global* hooks (public APIs):

- ``torch.nn.modules.module.register_module_forward_pre_hook``: every module whose
  ``forward`` runs is remembered (a weak reference by ``id``; one dict lookup per call);
- ``torch.optim.optimizer.register_optimizer_step_pre_hook``: at an optimizer's first
  ``step()`` its model is found: the *top-level* modules whose forward ran (no other
  module that ran has them as a child) and that own the optimizer's parameters, fewest
  first covering them all (a ``DistributedDataParallel``/``OptimizedModule``/PEFT wrapper
  is such a top-level module; the Monitor unwraps it, ``optcheck/pytorch/unwrap.py``).

Once every optimizer that stepped is watched, the forward hook is removed (module calls take
torch's fast path again, ``benchmarks/bench_run_startup.py --forward``); an optimizer that
steps later registers it again, so its model is found at its first or a following step.

The ``optcheck.Monitor`` for that pair is opened at the next module forward (torch
copies the global forward hooks before calling them, while a hook that registers a
step hook inside ``Optimizer.step``'s own hook loop would change the dict torch is
iterating): it starts counting at the steps already taken (``state={"step": n}``), so
step numbers are the optimizer's own; the first step itself is not checked.

Each optimizer gets its own Monitor (a GAN: two), one created later too (a second
``fit()``); an optimizer whose parameters an open Monitor already watches (a wrapper
stepping an inner optimizer, an optimizer swapped in over the same model) is left to
that Monitor, which follows it (``optcheck/pytorch/step_hooks.py``). An optimizer stepped
with no module forward seen, or whose parameters no module that ran owns, gets a note
(:attr:`AutoWatch.notes`), never an exception. Steps taken inside a backward pass
(optimizer-in-backward) are not attached to.

Where the streams go (``out`` the run directory): a process outside ``torch.distributed``
writes ``out/proc-<pid>`` (its second optimizer ``out/proc-<pid>-opt1``...); a rank of a
``torchrun`` job hands ``out`` to the Monitor, which writes ``out/rank-K``
(``optcheck.distributed.attach``), its second optimizer ``out/opt-1/rank-K``. The
launcher (``optcheck/autowatch/launch.py``) folds them. Nothing of this raises into the
user's program: an error of optcheck's own is a note and a ``logging`` warning.
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from pathlib import Path

import torch

from optcheck.pytorch.guard import RAISE_INTERNAL_ENV

log = logging.getLogger("optcheck")
#: inside a graph torch.compile traces, the forward hook does nothing (torch >= 2.1; before: never compiling)
_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
#: the start of the warning torch.compile gives while a global module hook is registered (``torch/_dynamo/eval_frame.py``)
COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
#: steps an optimizer is given to find its model before it is given up on (a note)
FIND_TRIES = 3


class AutoWatch:
    """Open an ``optcheck.Monitor`` for every optimizer a process steps (module docstring).

    Args:
        out: the run directory the streams go under (see the module docstring); None keeps
            every Monitor in memory.
        every, hazards, fail_on, on_finding, ignore: as ``optcheck.Monitor``'s, for each Monitor.

    Attributes:
        monitors: the Monitors opened so far (open or closed), in order; each has
            ``optimizer`` and ``run_id``.
        notes: what could not be watched, one line each ("optimizer SGD stepped with no
            module forward seen: not watched").
    """

    def __init__(self, out: str | os.PathLike | None, *, every: int = 100, hazards: bool | str = "auto",
                 fail_on: str = "warning", on_finding: str = "warn", ignore: list[str] | None = None):
        self.out = Path(out) if out is not None else None
        self.every, self.hazards, self.fail_on = every, hazards, fail_on
        self.on_finding, self.ignore = on_finding, list(ignore or [])
        self.monitors: list = []
        self.notes: list[str] = []
        self._seen: dict[int, weakref.ref] = {}  # id(module) -> module, every module whose forward ran
        self._prune_at = 1024  # dead entries are dropped when the dict grows past this
        self._known: dict[int, weakref.ref] = {}  # id(optimizer) -> optimizer: attached, pending or given up
        self._tries: dict[int, int] = {}  # id(optimizer) -> steps it was looked at without a model found
        self._done: dict[int, int] = {}  # id(optimizer) -> steps it completed before its Monitor opened
        self._pending: list[tuple] = []  # (model, optimizer) to open at the next forward
        self._stepping: set[int] = set()  # id(optimizer) of the steps under way (a closure's forward runs in one)
        self._tracked: dict[int, weakref.ref] = {}  # id(optimizer) -> optimizer, for _tries/_done (ids are reused)
        self._handles: list = []
        self._forward = None  # the forward pre-hook's handle while it is registered
        self._lock = threading.RLock()
        self._busy = False  # opening a Monitor: its own forwards/steps are not the user's
        self.installed = False
        self._pid = os.getpid()

    # -- public -----------------------------------------------------------------
    def install(self) -> "AutoWatch":
        """Register the global hooks (idempotent). Returns self."""
        if self.installed:
            return self
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        # torch.compile's OptimizedModule warns at each call while any global module hook exists (its hooks
        # would fire twice: harmless here, both are remembered); the program must not see optcheck's
        warnings.filterwarnings("ignore", message=COMPILE_WARNING, category=UserWarning)
        self._handles = [register_optimizer_step_pre_hook(self._step_pre),
                         register_optimizer_step_post_hook(self._step_post)]
        self.installed = True
        self._arm()
        return self

    def _arm(self) -> None:
        """Register the global forward pre-hook (until every optimizer that stepped is watched)."""
        if self._forward is None and self.installed:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._forward = register_module_forward_pre_hook(self._forward_pre)

    def _disarm(self) -> None:
        """Remove it: torch's module calls take their fast path again (no global hook left of ours)."""
        if self._forward is not None:
            self._forward.remove()
            self._forward = None

    def uninstall(self) -> list[dict]:
        """Remove the hooks and close every Monitor (each writes its summary); returns their
        summaries. Idempotent; never raises (an error closing one is logged)."""
        summaries = []
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - never into the user's program
                pass
        self._handles = []
        try:
            self._disarm()
        except Exception:  # noqa: BLE001
            pass
        self.installed = False
        try:
            self._open_pending()  # stepped, never reached another forward: still a record of its steps
        except Exception as e:  # noqa: BLE001
            self._note(f"optcheck: {type(e).__name__} opening a watch at exit: {e}")
        for mon in self.monitors:
            try:
                summaries.append(mon.close())
            except Exception as e:  # noqa: BLE001
                log.warning("optcheck: %s closing the watch of %s: %s", type(e).__name__, mon.run_id, e)
        self._write_notes()
        return summaries

    def _write_notes(self) -> None:
        """``out/notes-<pid>.txt``: this process's notes, for the launcher's summary (best effort)."""
        if self.out is None or not self.notes or os.getpid() != self._pid:
            return
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / f"notes-{self._pid}.txt").write_text("".join(n + "\n" for n in self.notes), encoding="utf-8")
        except OSError:
            pass

    def leave(self, optimizer) -> None:
        """Never watch ``optimizer`` (its steps then cost one dict lookup in each step hook):
        an optimizer the program steps that is not to be judged, e.g. the unwatched twin of
        ``benchmarks/bench_twins.py``'s ``run`` configuration. Never raises."""
        with self._lock:
            self._forget(optimizer)

    def findings(self) -> list:
        """Every Monitor's findings (``optcheck.findings.Finding``), in the Monitors' order."""
        return [f for mon in self.monitors for f in mon.findings]

    # -- the hooks ----------------------------------------------------------------
    def _forward_pre(self, module, args) -> None:
        if _compiling():
            return None
        r = self._seen.get(id(module))
        if r is None or r() is not module:
            self._seen[id(module)] = weakref.ref(module)
            if len(self._seen) > self._prune_at:  # modules made per call (DataParallel's replicas) die
                self._prune()
        if self._pending and not self._busy:
            self._guarded(self._open_pending)
        return None

    def _prune(self) -> None:
        self._seen = {k: r for k, r in self._seen.items() if r() is not None}
        self._prune_at = 2 * len(self._seen) + 1024

    def _step_pre(self, optimizer, args, kwargs) -> None:
        key = id(optimizer)
        if key in self._done:
            self._stepping.add(key)
        r = self._known.get(key)
        if r is not None and r() is optimizer:
            return None
        if self._busy or torch._C._current_graph_task_id() != -1:  # optcheck's own, or a step inside backward
            return None
        self._guarded(self._first_step, optimizer)
        return None

    def _step_post(self, optimizer, args, kwargs) -> None:
        key = id(optimizer)
        if key in self._done:
            self._stepping.discard(key)
            self._done[key] += 1
            if key in self._tries and not self._busy:  # its closure ran the forward inside step() (LBFGS, Lightning)
                self._guarded(self._first_step, optimizer, False)
        if self._forward is not None and not self._pending and not self._tries and self.monitors and not self._busy:
            self._disarm()  # every optimizer that stepped is watched: module calls cost nothing of optcheck's
        return None

    # -- finding the model ---------------------------------------------------------
    def _first_step(self, optimizer, count: bool = True) -> None:
        """Find ``optimizer``'s model (pending then) or count one more try (``count``) at giving up."""
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker stepping nothing, multiprocessing)
            self._pid = os.getpid()
            self.monitors, self._pending, self._done, self._tries = [], [], {}, {}
        params = {id(p) for g in optimizer.param_groups for p in g["params"]}
        name = type(optimizer).__name__
        r = self._tracked.get(id(optimizer))
        if r is not None and r() is not optimizer:  # a dead optimizer's id, reused: its counts are not this one's
            self._forget(optimizer)
            self._known.pop(id(optimizer), None)
        if not params:
            self._give_up(optimizer, f"optimizer {name} has no parameters: not watched")
            return
        self._arm()  # (a new optimizer after the others were watched: module forwards are remembered again)
        if self._watched(params):  # a wrapper's inner optimizer, or one swapped in: its Monitor follows it
            self._forget(optimizer)
            return
        self._done.setdefault(id(optimizer), 0)
        self._tracked[id(optimizer)] = weakref.ref(optimizer)
        model = self._model_of(params)
        if model is None:
            tries = self._tries.get(id(optimizer), 0) + count
            self._tries[id(optimizer)] = tries
            if tries >= FIND_TRIES:
                why = "no module forward seen" if not self._alive() else \
                    "its parameters are owned by no module whose forward ran"
                self._give_up(optimizer, f"optimizer {name} stepped {tries} times with {why}: not watched")
            return
        self._known[id(optimizer)] = weakref.ref(optimizer)
        self._tries.pop(id(optimizer), None)
        self._pending.append((model, optimizer))

    def _alive(self) -> list:
        return [m for m in (r() for r in list(self._seen.values())) if m is not None]

    def _model_of(self, params: set[int]):
        """The module (or a ``ModuleDict`` of modules) that ran and owns ``params``: the top-level
        ones (no module that ran has them as a child), fewest first covering most; None when none."""
        ran = self._alive()
        children = {id(c) for m in ran for c in m.children()}
        roots = []
        for m in ran:
            if id(m) in children:
                continue
            owned = {id(p) for p in m.parameters()} & params
            if owned:
                roots.append((m, owned))
        roots.sort(key=lambda mo: -len(mo[1]))
        chosen, covered = [], set()
        for m, owned in roots:
            if owned - covered:
                chosen.append(m)
                covered |= owned
        if not chosen:
            return None
        if len(chosen) == 1:
            return chosen[0]
        names: dict[str, int] = {}
        parts = {}
        for m in chosen:
            base = type(m).__name__.lower()
            names[base] = names.get(base, 0) + 1
            parts[base if names[base] == 1 else f"{base}{names[base] - 1}"] = m
        return torch.nn.ModuleDict(parts)  # (held by the Monitor only; the user's modules are not touched)

    def _watched(self, params: set[int]) -> bool:
        for mon in self.monitors:
            if not mon.closed and params & {id(p) for g in mon.optimizer.param_groups for p in g["params"]}:
                return True
        return any(params & {id(p) for g in opt.param_groups for p in g["params"]} for _, opt in self._pending)

    # -- opening the Monitors ------------------------------------------------------
    def _open_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            for model, optimizer in pending:
                # opened inside a step() (its closure's forward): the Monitor's hooks see only its end, which
                # it does not count (optcheck/pytorch/step_hooks.py): that step is counted here
                key = id(optimizer)
                self._open(model, optimizer, self._done.pop(key, 0) + (key in self._stepping))
                self._stepping.discard(key)
                self._tracked.pop(key, None)

    def _open(self, model, optimizer, steps: int) -> None:
        from optcheck.drivers.monitor import Monitor

        k = sum(1 for m in self.monitors if getattr(m, "autowatch_pid", None) == os.getpid())
        out, distributed = self._where(k)
        self._busy = True
        saved = os.environ.get("OPTCHECK_DISTRIBUTED")
        try:
            if k and distributed is False:
                os.environ["OPTCHECK_DISTRIBUTED"] = "0"
            mon = Monitor(model, optimizer, every=self.every, out=None if out is None else str(out),
                          hazards=self.hazards, fail_on=self.fail_on, on_finding=self.on_finding,
                          ignore=self.ignore, ignore_config=True, state={"step": steps} if steps else None)
        except Exception as e:  # noqa: BLE001 - a watch that cannot open is a note, not the user's error
            if os.environ.get(RAISE_INTERNAL_ENV) == "1":
                raise
            self._note(f"optimizer {type(optimizer).__name__}: not watched ({type(e).__name__}: {e})")
            return
        finally:
            self._busy = False
            if saved is None:
                os.environ.pop("OPTCHECK_DISTRIBUTED", None)
            else:
                os.environ["OPTCHECK_DISTRIBUTED"] = saved
        mon.autowatch_pid = os.getpid()
        mon.autowatch_model = type(model).__name__
        self.monitors.append(mon)

    def _where(self, k: int) -> tuple[Path | None, bool | None]:
        """The ``out`` of this process's ``k``-th Monitor, and whether it is a rank of a torchrun job."""
        if self.out is None:
            return None, None
        ranked = _in_process_group() and os.environ.get("OPTCHECK_DISTRIBUTED", "1") != "0"
        if ranked:
            return (self.out if k == 0 else self.out / f"opt-{k}"), True
        pid = os.getpid()
        return self.out / (f"proc-{pid}" if k == 0 else f"proc-{pid}-opt{k}"), False

    # -- notes ----------------------------------------------------------------------
    def _give_up(self, optimizer, line: str) -> None:
        self._forget(optimizer)
        self._note(line)

    def _forget(self, optimizer) -> None:
        """Never look at ``optimizer`` again (watched by another's Monitor, or given up on)."""
        self._known[id(optimizer)] = weakref.ref(optimizer)
        self._tries.pop(id(optimizer), None)
        self._done.pop(id(optimizer), None)
        self._tracked.pop(id(optimizer), None)
        self._stepping.discard(id(optimizer))

    def _note(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)
            log.warning("optcheck: %s", line)

    def _guarded(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - never into the user's program
            if os.environ.get(RAISE_INTERNAL_ENV) == "1":  # optcheck's own tests: a bug fails them
                raise
            self._note(f"{type(e).__name__} in optcheck's hook: {e}")


def _in_process_group() -> bool:
    """Whether this process is a rank of an initialised process group of more than one rank."""
    import torch.distributed as dist

    try:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except Exception:  # noqa: BLE001
        return False


__all__ = ["AutoWatch", "FIND_TRIES"]
