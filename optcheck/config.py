"""The soak's configuration: one dataclass that the supervisor hands to a worker
as JSON (so both backends read the same numbers). Torch-free."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from optcheck.errors import InputError


@dataclass
class Injection:
    """A fault scenario to inject: ``name`` at the start of training step ``step`` (1-based)."""

    name: str
    step: int

    @classmethod
    def parse(cls, text: str) -> "Injection":
        """Parse ``NAME@STEP``. Raises InputError on anything else."""
        name, sep, step = text.partition("@")
        if not sep or not name or not step.isdigit() or int(step) < 1:
            raise InputError(f"--inject {text!r}: expected NAME@STEP with STEP >= 1, e.g. param-rebind@1000")
        return cls(name.strip(), int(step))


@dataclass
class SoakConfig:
    """Everything a worker needs to run a soak.

    Model defaults (2 layers, 2 heads, 64 wide, context 64, batch 16, byte tokens)
    keep a 20,000-step soak within minutes on one CPU thread.

    Attributes (units in names: ``_s`` seconds, steps are optimizer steps):
        steps: training steps to run.
        every: a snapshot every this many steps.
        seed: seeds init, batches and dropout.
        data: text file or nanoGPT ``.bin`` (uint16 token ids); None = the Python
            standard library's own source files.
        vocab_size: for ``.bin`` data without ``meta.pkl`` beside it.
        threads: intra-op threads of the backend (1 on 2 cores: docs/pytorch.md, "Threads").
        val_every: held-out loss every this many steps (0 = never).
        eval_every / checkpoint_every / resume_at: lifecycle events (0 = never).
        inject: fault scenarios.
        stop_on_finding: the worker stops before the step when its own
            pre-step check finds something.
        hazards: autograd hazard probes on (in-place on saved tensors, graph
            cuts, non-leaf ``.grad`` reads, non-finite values).
        allow_inplace: continue past an in-place write to a saved tensor
            (default: stop the step, as PyTorch's own check would have).
    """

    backend: str = "pytorch"
    steps: int = 20_000
    every: int = 100
    seed: int = 1337
    data: str | None = None
    vocab_size: int | None = None
    batch_size: int = 16
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    threads: int = 1
    val_every: int = 1000
    val_batches: int = 4
    eval_every: int = 0
    checkpoint_every: int = 0
    resume_at: int = 0
    inject: list[Injection] = field(default_factory=list)
    stop_on_finding: bool = False
    hazards: bool = True
    allow_inplace: bool = False
    run_id: str = ""
    work_dir: str = ""
    extra: dict = field(default_factory=dict)

    def validate(self) -> "SoakConfig":
        """Raise InputError naming the first bad value; return self."""
        if self.steps < 1:
            raise InputError(f"--steps must be at least 1, got {self.steps}")
        if self.every < 1:
            raise InputError(f"--every must be at least 1, got {self.every}")
        if self.threads < 1:
            raise InputError(f"--threads must be at least 1, got {self.threads}")
        if self.n_embd % self.n_head:
            raise InputError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        for name in ("val_every", "eval_every", "checkpoint_every", "resume_at"):
            if getattr(self, name) < 0:
                raise InputError(f"--{name.replace('_', '-')} must be >= 0")
        for inj in self.inject:
            if inj.step > self.steps:
                raise InputError(f"--inject {inj.name}@{inj.step}: step is past --steps {self.steps}")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "SoakConfig":
        d = json.loads(text)
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in d.items() if k in known}
        d["inject"] = [Injection(**i) for i in d.get("inject", [])]
        return cls(**d)
