"""Memory scenarios for ``--inject`` (``optcheck/scenarios.py`` has the catalogue).

``state-leak``: from the injection step on, a forward hook on ``ln_f`` keeps a
copy of its output in a list that is never cleared — the "cache that only
grows" of real code (per-step history, an activation cache keyed by step).
Each step keeps B·T·C float32 values alive: 256 KiB with the default model.
"""

from __future__ import annotations

from optcheck.pytorch.scenario_registry import implements


@implements("state-leak")
def state_leak(trainer, step: int) -> dict:
    kept: list = []
    trainer.leaked = kept

    def keep(module, args, out):
        kept.append(out.detach().clone())

    trainer.model.ln_f.register_forward_hook(keep)
    return {"call": "history.append(hidden.detach().clone()) every step (never cleared)"}
