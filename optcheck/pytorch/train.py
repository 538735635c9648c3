"""The PyTorch training step and the PyTorch ``Backend`` of the soak loop.

``Trainer`` owns model, optimizer, schedule and hazard probes; ``TorchBackend``
adapts it to ``optcheck.run.backend.Backend``. The step is the ordinary one:
``zero_grad(set_to_none=True)``, forward, ``backward()``, clip, ``step()`` — so a
post-step snapshot sees this step's gradients.

Device (``--device cpu|cuda|cuda:N``, docs/gpu.md): the GPT, the optimizer state and
every batch live there. No step reads a device value on the host: the loss stays on the
device (the worker loop reads a metrics batch of them in one transfer,
:meth:`TorchBackend.settle`), the gradients' NaN/Inf check takes the per-parameter norms
the gradient clipping computes anyway and is read with them, batches are copied from
pinned memory without waiting, and on CUDA the step time is taken with CUDA events,
read in the same batch.
Over 400 lines: the PyTorch soak trainer: model, optimizer, batches, lifecycle events and injected faults act on one shared training state.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import os
import traceback
from pathlib import Path

import torch

from optcheck.config import SoakConfig
from optcheck.data import BatchSchedule, Corpus, val_batches
from optcheck.errors import InputError, StepStopped
from optcheck.pytorch import device as devices, probe
from optcheck.pytorch.deferred import DeviceLedger, Kept
from optcheck.pytorch.gpt import GPT, GPTConfig
from optcheck.pytorch.grad_clear import GradClearProbe
from optcheck.pytorch.guard import Notes, guarded
from optcheck.pytorch.hazard_replay import run_step
from optcheck.pytorch.null_hazards import NullHazards
from optcheck.run.backend import Backend

CENSUS_EVERY = 10  # tensor census on every 10th snapshot (~1-2 ms after the first full walk; docs/memory.md)


def make_hazards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: SoakConfig,
                 ledger: DeviceLedger | None = None, hook_wrap=None):
    """The hazard probes of ``optcheck/pytorch/hazards/`` unless ``cfg.checks.hazards`` is "off" (then
    a NullHazards); their device checks go to ``ledger``, their optimizer step hooks registered through
    ``hook_wrap`` (:meth:`Trainer.own_step_hook`)."""
    checks = cfg.checks
    if checks.hazards == "off":
        return NullHazards(optimizer)
    from optcheck.pytorch.hazards import HazardProbes

    # with clipping, the gradients' NaN/Inf check reads clip_grad_norm_'s total norm (Trainer.train_step)
    # instead of a second pass over every gradient
    every = checks.grad_check_every if checks.grad_check_every is not None else 0 if cfg.optimizer.grad_clip else 1
    return HazardProbes(model, optimizer, allow_inplace=checks.allow_inplace, grad_check_every=every,
                        mode=checks.hazards, ledger=ledger, hook_wrap=hook_wrap)


def soak_device(name: str) -> torch.device:
    """The device of ``--device`` (``cpu``, ``cuda``, ``cuda:N``).

    Raises:
        InputError: not one of those, or CUDA (or device N) is not there.
    """
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise InputError(f"--device {name!r}: cpu, cuda or cuda:N") from None
    if dev.type == "cpu" and dev.index in (None, 0):
        return torch.device("cpu")
    if dev.type != "cuda":
        raise InputError(f"--device {name!r}: cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        why = "this torch was built without CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise InputError(f"--device {name}: CUDA is not available ({why}; torch {torch.__version__})")
    n = torch.cuda.device_count()
    if dev.index is not None and dev.index >= n:
        raise InputError(f"--device {name}: there are {n} CUDA device(s) (cuda:0..cuda:{n - 1})")
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


def lr_at(cfg: SoakConfig, step: int) -> float:
    """Linear warm-up for ``warmup_steps``, then cosine decay to ``min_lr`` at ``steps``."""
    o = cfg.optimizer
    if step <= o.warmup_steps:
        return o.lr * step / max(1, o.warmup_steps)
    frac = (step - o.warmup_steps) / max(1, cfg.run.steps - o.warmup_steps)
    return o.min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, frac))) * (o.lr - o.min_lr)


class Trainer:
    """Model + AdamW + step for one soak.

    Attributes:
        model: the GPT (``optcheck.pytorch.gpt``).
        optimizer: AdamW with decay / no-decay groups.
        hazards: hazard probes (or NullHazards).
        dtype: dtype the batches' float inputs would use (the model's).
    """

    def __init__(self, cfg: SoakConfig, vocab_size: int, tie_weights: bool = True):
        self.cfg = cfg
        torch.manual_seed(cfg.run.seed)
        self.gpt_config = GPTConfig(block_size=cfg.model.block_size, vocab_size=vocab_size, n_layer=cfg.model.n_layer,
                                    n_head=cfg.model.n_head, n_embd=cfg.model.n_embd, dropout=cfg.model.dropout,
                                    tie_weights=tie_weights)
        self.device = soak_device(cfg.run.device or "cpu")
        self.model = GPT(self.gpt_config).to(self.device)  # initialised on the CPU: the same weights everywhere
        self.optimizer = self.build_optimizer(self.model)
        self.ledger = DeviceLedger()  # the step's device checks, read with the losses (TorchBackend.settle)
        self.notes = Notes()  # internal errors of the probes' step hooks (own_step_hook), told in snapshots
        self.notes_told = 0
        self.hazards = make_hazards(self.model, self.optimizer, cfg, self.ledger, self.own_step_hook)
        self.grad_clear = GradClearProbe(self.optimizer, ledger=self.ledger, hook_wrap=self.own_step_hook)
        self.zero_grad = True  # the no-zero-grad scenario turns it off
        self.extra_forward = []  # scenario hooks called as f(trainer, logits, loss) -> loss
        self.work_dir = Path(cfg.run.work_dir or ".")

    def own_step_hook(self, hook):
        """A probe's optimizer step hook (``hook(optimizer, args, kwargs)``) guarded as the Monitor guards its
        own (``optcheck/pytorch/guard.py``): an internal error in it is a note (the snapshot's ``notes``) and
        the soak's step goes on; a hazard's :class:`~optcheck.errors.StepStopped` passes through."""

        @guarded(StepStopped)
        @functools.wraps(hook)
        def run(trainer, optimizer, args, kwargs):
            return hook(optimizer, args, kwargs)

        return functools.partial(run, self)

    def new_notes(self) -> list[str]:
        """The notes (:attr:`notes`) added since the last call."""
        fresh = list(self.notes[self.notes_told:])
        self.notes_told = len(self.notes)
        return fresh

    def build_optimizer(self, model: GPT) -> torch.optim.AdamW:
        o = self.cfg.optimizer
        if o.name == "sgd":
            return torch.optim.SGD(model.parameters(), lr=o.lr, momentum=0.9)
        # on CUDA, its fused AdamW kernel (``fused`` False: the per-tensor loop of the CPU)
        fused = self.device.type == "cuda" and o.fused is not False
        return model.configure_optimizers(o.lr, o.weight_decay, (o.beta1, o.beta2), o.eps, fused=fused)

    def batch(self, x, y) -> tuple[torch.Tensor, torch.Tensor]:
        """int64 arrays ``x``, ``y`` as tensors on the soak's device (CUDA: copied from pinned
        memory without waiting, so the copy is no host sync)."""
        xb, yb = torch.from_numpy(x), torch.from_numpy(y)
        if self.device.type == "cpu":
            return xb, yb
        return (xb.pin_memory().to(self.device, non_blocking=True),
                yb.pin_memory().to(self.device, non_blocking=True))

    def train_step(self, step: int, x, y) -> torch.Tensor:
        """One step on int64 arrays ``x``, ``y`` of shape (B, T); returns the loss, a
        0-d tensor on the device (detached; read later, in a batch). The ordinary step:
        learning rate, ``zero_grad``, forward and ``backward()`` (run again armed when the
        hazard probes ask: ``optcheck/pytorch/hazard_replay.py``), clip, ``step()``.

        Raises:
            optcheck.errors.StepStopped: a hazard stopped the step.
            RuntimeError: PyTorch's own failure that no probe explains.
        """
        xb, yb = self.batch(x, y)
        for g in self.optimizer.param_groups:
            g["lr"] = lr_at(self.cfg, step)
        clear = functools.partial(self.optimizer.zero_grad, set_to_none=True)
        if self.zero_grad:  # (the no-zero-grad scenario turns it off)
            clear()
        loss = run_step(self.hazards, step, lambda: self._forward_backward(step, xb, yb),
                        clear if self.zero_grad else None)
        if self.cfg.optimizer.grad_clip:
            self.clip(step)
        self.optimizer.step()
        return loss.detach()

    def clip(self, step: int) -> None:
        """``clip_grad_norm_`` in its two halves (``torch.nn.utils.get_total_norm``'s per-parameter
        norms, then ``clip_grads_with_norm_``; the same kernels, the same result) so that the
        gradients' NaN/Inf check reads the per-parameter norms it computed, with the losses,
        later: no second pass over the gradients and no host sync (torch < 2.6: one
        ``clip_grad_norm_`` and a read of its total norm)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return
        if not hasattr(torch.nn.utils, "clip_grads_with_norm_"):
            norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.optimizer.grad_clip)
            if not math.isfinite(norm):
                self.hazards.check_grads_now(step)
            return
        grads = [p.grad for p in params]
        norms = torch._foreach_norm(grads, 2.0)
        try:
            norms = torch.stack(norms)
        except RuntimeError:  # parameters on several devices
            norms = torch.stack([n.to(grads[0].device) for n in norms])
        total = torch.linalg.vector_norm(norms)
        torch.nn.utils.clip_grads_with_norm_(params, self.cfg.optimizer.grad_clip, total)
        self.hazards.check_grad_norms(step, [self._names.get(id(p), "?") for p in params], norms)

    def _autocast(self):
        """``cfg.run.autocast`` "bf16"/"fp16": the forward under ``torch.autocast`` (the GPU
        benchmark's GPT-2 small, ``benchmarks/gpu_check.py``); else nothing."""
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.cfg.run.autocast)
        return torch.autocast(self.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()

    def _forward_backward(self, step: int, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        with self.hazards.step_context(step):
            with self._autocast():
                logits, loss = self.model(xb, yb)
            for hook in self.extra_forward:
                loss = hook(self, logits, loss)
            self.hazards.check_loss(loss, step)
            loss.backward()
        self.hazards.after_backward(step)
        return loss

    @property
    def _names(self) -> dict[int, str]:
        if getattr(self, "_names_of", (None,))[0] is not self.model:
            self._names_of = (self.model, {id(p): n for n, p in self.model.named_parameters()})
        return self._names_of[1]

    @torch.no_grad()
    def val_loss(self, batches: list) -> torch.Tensor:
        """Mean held-out loss over ``batches``: a 0-d tensor on the device (read later)."""
        was_training = self.model.training
        self.model.eval()
        losses = [self.model(*(b if isinstance(b[0], torch.Tensor) else self.batch(*b)))[1] for b in batches]
        self.model.train(was_training)
        return torch.stack(losses).mean()

    # -- lifecycle events ------------------------------------------------------
    def checkpoint_path(self) -> Path:
        return self.work_dir / "checkpoint.pt"

    def lifecycle(self, kind: str, step: int, val_batches: list | None = None) -> dict:
        """Run ``eval`` (eval mode, no-grad forward, a ``model.to(same device, dtype)``
        round trip), ``checkpoint`` (save model and optimizer, load them back into the
        running objects) or ``resume`` (rebuild both from the last checkpoint, as a
        restarted job does). Returns what was done."""
        if kind == "eval":
            p = next(self.model.parameters())
            loss = float(self.val_loss(val_batches or []))  # a lifecycle event: its one read
            self.model.to(device=p.device, dtype=p.dtype)
            return {"call": f"model.eval(); no_grad forward; model.to({p.device}, {probe.dtype_name(p.dtype)})",
                    "val_loss": loss}
        if kind == "checkpoint":
            path = self.checkpoint_path()
            torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                        "step": step}, path)
            ck = torch.load(path, weights_only=True)
            self.model.load_state_dict(ck["model"])
            self.optimizer.load_state_dict(ck["optimizer"])
            return {"call": "torch.save(model, optimizer); load_state_dict back", "path": str(path)}
        if kind == "resume":
            path = self.checkpoint_path()
            if not path.exists():  # resume before any checkpoint: checkpoint now, as a job would have
                self.lifecycle("checkpoint", step)
            ck = torch.load(path, weights_only=True)
            self.hazards.remove()
            self.model = GPT(self.gpt_config).to(self.device)
            self.model.load_state_dict(ck["model"])
            self.optimizer = self.build_optimizer(self.model)
            self.optimizer.load_state_dict(ck["optimizer"])
            self.ledger.read()  # what the old probes left pending
            self.hazards = make_hazards(self.model, self.optimizer, self.cfg, self.ledger, self.own_step_hook)
            self.grad_clear.remove()
            self.grad_clear = GradClearProbe(self.optimizer, ledger=self.ledger, hook_wrap=self.own_step_hook)
            return {"call": "new GPT + AdamW, load_state_dict from the last checkpoint", "from_step": ck["step"]}
        raise ValueError(f"unknown lifecycle event {kind!r}")


class TorchBackend(Backend):
    """The soak backend (``optcheck.run.backend.Backend``) for PyTorch."""

    name = "pytorch"

    #: snapshots whose memory an out-of-memory crash reports (docs/gpu.md)
    MEMORY_TRAIL = 5

    def __init__(self):
        self.trainer: Trainer | None = None
        self.snapshots = 0
        self.steps_done = 0
        self._timed: list[tuple] = []  # (start, end) CUDA events of the steps not read yet
        self._val: tuple = (None, [])  # (the loop's held-out batches, their device copies)
        self._trail: collections.deque = collections.deque(maxlen=self.MEMORY_TRAIL)

    def setup(self, cfg: SoakConfig, corpus: Corpus) -> None:
        from optcheck.pytorch import scenarios

        torch.set_num_threads(cfg.run.threads)
        for inj in cfg.checks.inject:
            scenarios.check(inj.name)
        tie = not any(scenarios.needs_untied(i.name) for i in cfg.checks.inject)
        self.trainer = Trainer(cfg, corpus.vocab_size, tie_weights=tie)
        if cfg.data.val_every:
            self.val_batches = val_batches(corpus, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed,
                                           max(1, cfg.data.val_batches))
        else:  # --val-every 0: no held-out data at all; the eval event's forward runs on step 1's batch
            sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
            self.val_batches = [sched.batch(corpus.train, 1)]
        self.report_val = bool(cfg.data.val_every)

    def versions(self) -> dict[str, str]:
        """Library versions and the device (``optcheck.pytorch.device.describe``)."""
        return {**probe.versions(), **devices.describe(self.trainer.device if self.trainer else None)}

    def threads(self) -> int:
        return torch.get_num_threads()

    def inject(self, name: str, step: int) -> dict:
        from optcheck.pytorch import scenarios

        return scenarios.apply(name, self.trainer, step)

    def lifecycle(self, kind: str, step: int) -> dict:
        detail = self.trainer.lifecycle(kind, step, self.val_batches)
        if not self.report_val:  # --val-every 0: the eval pass's loss is no held-out loss
            detail.pop("val_loss", None)
        return detail

    def fingerprint(self):
        return probe.fingerprint(self.trainer.model, self.trainer.optimizer)

    def train_step(self, step: int, x, y):
        """The step (``Trainer.train_step``); on CUDA between two CUDA events, read in
        :meth:`step_times`. The loss stays on the device, kept by the ledger
        (``DeviceLedger.keep``): :meth:`settle` reads it."""
        if self.trainer.device.type != "cuda":
            loss = self.trainer.train_step(step, x, y)
        else:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = self.trainer.train_step(step, x, y)
            end.record()
            self._timed.append((start, end))
        self.steps_done = step
        return self.trainer.ledger.keep(loss)  # (its value copied on the device: no tensor held until settle)

    def val_loss(self, batches: list) -> torch.Tensor:
        """Held-out loss, on the device (the batches copied there once)."""
        if self._val[0] is not batches:
            self._val = (batches, [self.trainer.batch(x, y) for x, y in batches])
        return self.trainer.val_loss(self._val[1])

    def settle(self, values: list) -> list:
        """The loop's raw values (device tensors: losses, held-out losses; floats pass
        through) as floats, read with the probes' pending device checks in one transfer per
        device (``optcheck.pytorch.deferred``). A device that cannot be read any more (a
        CUDA error) gives None for its values: the batch is still written."""
        tensors = [v for v in values if isinstance(v, (torch.Tensor, Kept))]
        try:
            got = iter(self.trainer.ledger.read(tensors))
        except Exception:  # noqa: BLE001 - the crash that broke the device is reported by itself
            return [None if isinstance(v, (torch.Tensor, Kept)) else v for v in values]
        return [next(got)[0] if isinstance(v, (torch.Tensor, Kept)) else v for v in values]

    def step_times(self) -> list[float] | None:
        """CUDA: seconds of GPU time of each step since the last call (its two events' elapsed
        time, read after :meth:`settle`'s transfer, so nothing waits); None on the CPU (the
        loop's own wall-clock times are the step times there)."""
        if not self._timed:
            return None
        timed, self._timed = self._timed, []
        try:
            timed[-1][1].synchronize()  # complete already: settle's read waited for the stream
            return [round(a.elapsed_time(b) / 1e3, 6) for a, b in timed]
        except Exception:  # noqa: BLE001
            return None

    def has_events(self) -> bool:
        return self.trainer.hazards.has_events() or self.trainer.grad_clear.has_events()

    def hazard_stats(self) -> dict | None:
        """The hazard probes' arming (``HazardProbes.stats``), None with ``--no-hazards``."""
        return self.trainer.hazards.stats()

    def snapshot_body(self) -> dict:
        census = self.snapshots % CENSUS_EVERY == 0
        self.snapshots += 1
        norms = probe.Norms() if self.trainer.hazards.wants_norms else None  # one read of every tensor
        body = probe.snapshot_body(self.trainer.model, self.trainer.optimizer, census=census, norms=norms)
        body["events"] = self.trainer.hazards.drain(norms) + self.trainer.grad_clear.drain()
        body["notes"] = list(body.get("notes") or []) + self.trainer.new_notes()
        mem = body.get("memory") or {}
        self._trail.append({"after_step": self.steps_done,
                            **{k: v for k, v in mem.items() if isinstance(v, int) and not isinstance(v, bool)}})
        return body

    def exception_info(self, exc: BaseException) -> dict:
        """Type, message, stack and line of an exception out of a step; an out-of-memory
        error also carries ``oom`` (``optcheck.pytorch.device.oom_report``: what the device
        held and what rose over the last snapshots before it)."""
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else None
        info = {"exc_type": type(exc).__qualname__ if type(exc).__module__ == "builtins"
                else f"{type(exc).__module__}.{type(exc).__qualname__}",
                "message": str(exc), "stack": "".join(traceback.format_exception(exc)), "where": where}
        if devices.is_oom(exc):
            dev = self.trainer.device if self.trainer is not None else torch.device("cpu")
            info["oom"] = devices.oom_report(exc, dev, list(self._trail))
        return info
