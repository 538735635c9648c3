"""The soak's configuration: one dataclass that the supervisor hands to a worker
as JSON (so both backends read the same numbers). Torch-free."""

from __future__ import annotations

import json
import math
import re
import os
from dataclasses import asdict, dataclass, field, fields

from optcheck.errors import InputError


#: ``--seed`` range: torch.manual_seed and TorchSharp's ``long`` seed both take it;
#: numpy's batch schedule needs it non-negative.
MAX_SEED = 2**63 - 1
#: A nanoGPT ``.bin`` holds uint16 token ids: at most 65,536 distinct ones.
MAX_VOCAB = 2**16


def max_threads() -> int:
    """Upper bound of ``--threads``: 4 per CPU core (libtorch segfaults creating
    100,000 threads; nothing gains from more than a few per core)."""
    return 4 * (os.cpu_count() or 1)


@dataclass
class Injection:
    """A fault scenario to inject: ``name`` at the start of training step ``step`` (1-based)."""

    name: str
    step: int

    @classmethod
    def parse(cls, text: str) -> "Injection":
        """Parse ``NAME@STEP``; STEP is ASCII digits only (``str.isdigit`` would take
        "²"). Raises InputError on anything else."""
        name, sep, step = text.partition("@")
        if not sep or not name.strip() or not (step.isascii() and step.isdecimal()) or int(step) < 1:
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
        threads: intra-op threads of the backend (1 on 2 cores: more threads
            slow a small GPT down, docs/pytorch.md "Threads"; at most ``max_threads()``).
        val_every: held-out loss every this many steps (0 = never).
        eval_every / checkpoint_every / resume_at: lifecycle events (0 = never).
        inject: fault scenarios.
        stop_on_finding: the worker stops before the step when its own
            pre-step check finds something.
        hazards: autograd hazard probes on (in-place on saved tensors, graph
            cuts, non-leaf ``.grad`` reads, non-finite values).
        allow_inplace: continue past an in-place write to a saved tensor
            (default: stop the step, as PyTorch's own check would have).
        hazard_mode: "auto" (the probes' module and saved-tensor hooks armed on the
            steps that need them; a failing step is re-run armed) or "always" (every
            step); docs/hazards.md.
        step_timeout_s: the supervisor kills a worker that reports no step for
            this many seconds (0 = never).
        device: where the GPT, its optimizer state and the batches live: "cpu",
            "cuda" or "cuda:N" (docs/gpu.md); the worker refuses a CUDA device it
            does not have (exit 2).
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
    hazard_mode: str = "auto"
    step_timeout_s: float = 0.0
    device: str = "cpu"
    run_id: str = ""
    work_dir: str = ""
    extra: dict = field(default_factory=dict)

    def validate(self) -> "SoakConfig":
        """Raise InputError naming the first bad value (as its command-line option);
        return self. Every number a worker uses is checked here, before anything
        runs: a zero layer count or batch size is the user's typo, not a training
        bug for the rules to report."""
        def need(ok: bool, option: str, value, what: str) -> None:
            if not ok:
                raise InputError(f"{option} {value!r}: {what}")

        for name in ("steps", "every", "n_layer", "n_head", "n_embd", "block_size", "batch_size", "val_batches"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 1, "--" + name.replace("_", "-"), v,
                 "must be a whole number >= 1")
        for name in ("val_every", "eval_every", "checkpoint_every", "resume_at", "warmup_steps"):
            v = getattr(self, name)
            need(isinstance(v, int) and v >= 0, "--" + name.replace("_", "-"), v, "must be a whole number >= 0")
        need(self.n_embd % self.n_head == 0, "--n-embd", self.n_embd,
             f"must be a multiple of --n-head ({self.n_head}): each head gets n_embd / n_head channels")
        need(self.hazard_mode in ("auto", "always"), "--hazards", self.hazard_mode, "must be auto or always")
        need(0 <= self.seed <= MAX_SEED, "--seed", self.seed, f"must be in 0..{MAX_SEED} (2**63 - 1)")
        need(1 <= self.threads <= max_threads(), "--threads", self.threads,
             f"must be in 1..{max_threads()} (4 per CPU core of this machine)")
        if self.vocab_size is not None:
            need(1 <= self.vocab_size <= MAX_VOCAB, "--vocab-size", self.vocab_size,
                 f"must be in 1..{MAX_VOCAB} (a .bin holds uint16 token ids)")
        for name, low in (("lr", "> 0"), ("min_lr", ">= 0"), ("weight_decay", ">= 0"), ("eps", "> 0"),
                          ("grad_clip", ">= 0")):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 if low == "> 0" else v >= 0)
            need(ok, "--" + name.replace("_", "-"), v, f"must be a finite number {low}")
        for name in ("beta1", "beta2", "dropout"):
            v = getattr(self, name)
            need(isinstance(v, (int, float)) and 0 <= v < 1, name, v, "must be in [0, 1)")
        st = self.step_timeout_s
        need(isinstance(st, (int, float)) and math.isfinite(st) and st >= 0, "--step-timeout", st,
             "must be a finite number of seconds >= 0 (0: no timeout)")
        need(isinstance(self.device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", self.device) is not None,
             "--device", self.device, "must be cpu, cuda or cuda:N")
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
