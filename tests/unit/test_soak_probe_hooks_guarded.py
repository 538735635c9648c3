"""Issue 48 point 8: the soak's worker registers its probes' optimizer step hooks guarded, as the Monitor does
(optcheck/pytorch/guard.py): an internal error in one is a note in the next snapshot, and the soak's own step
goes on, with the same loss as a step without the error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optcheck.config import ModelConfig, RunConfig, SoakConfig
from optcheck.pytorch.train import Trainer


def _trainer() -> Trainer:
    cfg = SoakConfig(model=ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, dropout=0.0),
                     run=RunConfig(steps=4, seed=3))
    return Trainer(cfg, vocab_size=32)


def _batch():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 32, size=(2, 8), dtype=np.int64)
    return x, np.roll(x, -1, axis=1)


def test_an_internal_error_in_a_probes_step_hook_is_a_note_not_the_soaks_exception(monkeypatch):
    monkeypatch.delenv("OPTCHECK_RAISE_INTERNAL", raising=False)  # the suite raises them; a user's soak does not
    torch.set_num_threads(1)
    x, y = _batch()
    clean = _trainer()
    want = [float(clean.train_step(s, x, y)) for s in (1, 2)]

    broken = _trainer()
    # a real internal error: the gradient probe's after-step hook reads the smallest parameter's .grad
    broken.grad_clear._small = None                             # -> AttributeError in optimizer.step()'s hook
    try:
        got = [float(broken.train_step(s, x, y)) for s in (1, 2)]   # never raises out of the soak's step
    finally:
        broken.hazards.remove()
        clean.hazards.remove()
    assert got == pytest.approx(want)
    notes = broken.new_notes()
    assert notes and all("internal error in" in n and "the step went on unchecked there" in n for n in notes), notes
    assert broken.new_notes() == []                              # told once


def test_a_clean_soak_step_adds_no_note():
    t = _trainer()
    x, y = _batch()
    try:
        for s in (1, 2, 3):
            t.train_step(s, x, y)
    finally:
        t.hazards.remove()
    assert t.new_notes() == []
