"""Parameters of the model that another optimizer trains.

Models are often trained by two optimizers at once: Muon for the matrices and AdamW
for embeddings, norms and biases (modded-nanogpt), a GAN's generator and
discriminator optimizers over one module tree, an embedding under ``SparseAdam``
beside a dense optimizer. A Monitor watches one optimizer; a trainable parameter
that is in none of *its* param groups but in a param group of another live
``torch.optim.Optimizer`` is not lost (OC102 untracked-param), it is trained there.

:func:`owners` finds those parameters: first among the optimizers it found before
(weakly held), then, for what is still unexplained, among every live
``torch.optim.Optimizer`` instance (``gc.get_objects()``: optimizers are ordinary
Python objects tracked by the cycle collector; about 10–50 ms in a process with
PyTorch loaded, so it runs only when some parameter is in no group of the watched
optimizer, and again only when that set of parameters changes or every
:data:`RESCAN_EVERY` calls). Objects frozen by the census are not listed by
``gc.get_objects()``; what a Monitor watched or a scan found before is kept in
:data:`_SEEN`. An optimizer that was built and dropped is not alive
and explains nothing: the "optimizer built before the layer was replaced" bug still
fires, since the old optimizer holds the *old* tensors; and once the watched optimizer
has stepped, only an optimizer seen stepping counts (one built over the new
parameters but never stepped explains nothing). Never raises.
"""

from __future__ import annotations

import gc
import weakref

import torch

from optcheck.pytorch.dynamo_safe import EagerHook  # the global step hook: run eagerly, traced as nothing
from optcheck.pytorch.guard import raised_by_signal_handler

#: Calls between two ``gc`` scans while the same parameters stay unexplained.
RESCAN_EVERY = 10


#: Every optimizer a Monitor watched or a scan found, weakly held, shared by all Monitors:
#: the census (``optcheck/pytorch/census.py``) freezes the objects alive at its first
#: walk, and ``gc.get_objects()`` no longer lists frozen ones, so what was seen before is
#: remembered here (a second Monitor, built after the first froze, finds the first's
#: optimizer this way).
_SEEN: "weakref.WeakSet" = weakref.WeakSet()


#: Optimizers whose ``step()`` ran since the first parameter outside the watched groups
#: was seen (``torch.optim.optimizer.register_optimizer_step_post_hook``, a global hook,
#: registered then and only then: one Python call per ``step()``).
_STEPPED: "weakref.WeakSet" = weakref.WeakSet()
_HOOK: list = []


def _stepped(optimizer, args, kwargs) -> None:
    try:
        _STEPPED.add(optimizer)
    except TypeError:
        pass


def _watch_steps() -> None:
    if not _HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _HOOK.append(register_optimizer_step_post_hook(EagerHook(_stepped)))


def _remember(optimizer: object) -> None:
    try:
        _SEEN.add(optimizer)
    except TypeError:  # not weakly referenceable
        pass


class OtherOptimizers:
    """Per watched optimizer: which other optimizers train its model's parameters."""

    def __init__(self) -> None:
        self._last_scan: tuple[frozenset, int] | None = None  # (unexplained refs, calls since)

    def owners(self, candidates: list[torch.Tensor], watched: object) -> dict[int, str]:
        """``{id(param): optimizer class name}`` for each of ``candidates`` held in a param
        group of a live optimizer other than ``watched`` (nor an object wrapping it, whose
        groups are the watched optimizer's own list). {} when there are no candidates."""
        _remember(watched)
        if not candidates:
            self._last_scan = None
            return {}
        _watch_steps()
        # once the watched optimizer has stepped, only an optimizer that steps too trains anything
        # (one built over the new parameters and never stepped is the bug, not the explanation)
        stepping = watched in _STEPPED
        want = {id(p) for p in candidates}
        found = self._search(list(_SEEN), want, watched, stepping)
        missing = frozenset(want - set(found))
        if missing:
            last = self._last_scan
            if last is None or last[0] != missing or last[1] >= RESCAN_EVERY:
                others = self._live(watched)
                for o in others:
                    _remember(o)
                found.update(self._search(others, set(missing), watched, stepping))
                self._last_scan = (frozenset(want - set(found)), 0)
            else:
                self._last_scan = (last[0], last[1] + 1)
        return found

    @staticmethod
    def _live(watched: object) -> list:
        base = torch.optim.Optimizer
        try:  # type(), not isinstance(): a lazy module's __class__ property may warn or raise
            return [o for o in gc.get_objects() if issubclass(type(o), base) and o is not watched]
        except Exception as caught:  # noqa: BLE001 - never into the user's loop: then nothing is explained
            if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                raise
            return []

    @staticmethod
    def _search(optimizers: list, want: set[int], watched: object, stepping: bool) -> dict[int, str]:
        mine = getattr(watched, "param_groups", None)
        found: dict[int, str] = {}
        for o in optimizers:
            if stepping and o not in _STEPPED:
                continue
            try:
                groups = o.param_groups
                if groups is mine:  # a wrapper sharing the watched optimizer's groups (SAM, Lookahead)
                    continue
                for g in groups:
                    for p in g.get("params", ()):
                        if id(p) in want:
                            found.setdefault(id(p), type(o).__name__)
            except Exception as caught:  # noqa: BLE001 - an optimizer whose groups cannot be read explains nothing
                if raised_by_signal_handler(caught):  # a signal handler's exception is the user's
                    raise
                continue
        return found
