"""The interface of a soak backend (PyTorch: ``optcheck.pytorch.train.TorchBackend``,
TorchSharp: ``optcheck.torchsharp_bridge.worker.TorchSharpBackend``), as the soak loop
(``optcheck/drivers/worker_loop.py``) drives it and the run's sequencer
(``optcheck.run.sequencer.Probe``) reads it. Torch-free: a base class with no-op
defaults for what a backend may lack, below the backends that implement it."""

from __future__ import annotations

from typing import Any

from optcheck.config import SoakConfig
from optcheck.data import Corpus


class Backend:
    """What a backend implements for the soak loop (``optcheck.drivers.worker_loop.run``);
    steps are 1-based. The methods without a body here must be implemented (they raise
    NotImplementedError); the others are no-ops a backend overrides when it has the feature
    (device values read in a batch, device step times, blocks of steps, an in-step check,
    hazard-probe statistics), so the loop never asks which ones a backend has."""

    name: str

    def setup(self, cfg: SoakConfig, corpus: Corpus) -> None:
        """Build model, optimizer and probes. Raise InputError for bad input."""
        raise NotImplementedError

    def versions(self) -> dict[str, str]:
        """Library versions for the snapshot (python, torch/torchsharp, dotnet, ...)."""
        raise NotImplementedError

    def threads(self) -> int:
        """Intra-op threads in use."""
        raise NotImplementedError

    def inject(self, name: str, step: int) -> dict:
        """Plant fault scenario ``name`` now; return what was done ({"call": ...}).
        Raise InputError for a scenario this backend does not have."""
        raise NotImplementedError

    def lifecycle(self, kind: str, step: int) -> dict:
        """Run lifecycle event ``kind`` ("eval", "checkpoint", "resume"); return details."""
        raise NotImplementedError

    def fingerprint(self) -> Any:
        """A cheap, comparable value that changes when the model's parameters, the
        optimizer's members or (eager optimizers) its state keys change identity."""
        raise NotImplementedError

    def train_step(self, step: int, x, y) -> float:
        """One training step on inputs/targets ``x``, ``y`` (int64, shape (B, T));
        return the loss: a float, or a value only :meth:`settle` reads (a device value the
        PyTorch backend keeps, ``optcheck.pytorch.deferred.DeviceLedger.keep``). May raise
        :class:`StepStopped`."""
        raise NotImplementedError

    def val_loss(self, batches: list) -> float:
        """Mean loss over held-out ``(x, y)`` batches, without gradients (a float, or a
        device value that :meth:`settle` reads)."""
        raise NotImplementedError

    # -- optional, no-ops by default ------------------------------------------------
    def settle(self, values: list) -> list:
        """Read the device values among the losses ``train_step`` and ``val_loss`` returned (and the
        probes' pending checks) in one transfer; a backend returning floats (TorchSharp) needs none."""
        return list(values)

    def step_times(self) -> list[float] | None:
        """The device time of the steps since the last call (CUDA events), or None (host timing)."""
        return None

    def max_block(self, b: int, t: int) -> int:
        """Most steps one :meth:`train_block` call may take (0: no blocks, one step a call)."""
        return 0

    def block_inputs(self, count: int, b: int, t: int):
        """The (count, B, T) input and target arrays of a block to fill (blocks only)."""
        raise NotImplementedError

    def train_block(self, first: int, count: int, b: int, t: int, reference: int, budget_s: float) -> int:
        """Steps ``first``.. of a block; returns the steps done (blocks only)."""
        raise NotImplementedError

    def block_done(self) -> int:
        """Steps of the block done when one of its steps threw (blocks only)."""
        raise NotImplementedError

    def block_results(self, n: int) -> tuple[list[float], list[float]]:
        """The losses and seconds of the first ``n`` steps of the block (blocks only)."""
        raise NotImplementedError

    def in_step(self) -> bool:
        """Whether an in-step check (TorchSharp's guarded optimizer) found something in the step."""
        return False

    def hazard_stats(self) -> dict | None:
        """The hazard probes' arming (``summary.json``'s ``hazards``), when the backend has probes."""
        return None

    # -- required (as those above the optional ones) ---------------------------------------
    def has_events(self) -> bool:
        """True when a hazard probe recorded events since the last snapshot."""
        raise NotImplementedError

    def snapshot_body(self) -> dict:
        """The backend part of a snapshot: params, groups, state, optimizer, memory,
        events (drained), notes."""
        raise NotImplementedError

    def exception_info(self, exc: BaseException) -> dict:
        """``{"exc_type", "message", "stack"}`` for an exception out of a step."""
        raise NotImplementedError
