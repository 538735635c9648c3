"""The soak's configuration: :class:`SoakConfig`, a few nested sections that each
validate themselves, and the flat JSON the supervisor hands a worker (so both
backends read the same numbers). Torch-free.

Sections (docs/guide/configuration.md): :class:`ModelConfig` (the GPT's shape),
:class:`OptimizerConfig` (AdamW/SGD and its schedule), :class:`DataConfig` (corpus,
batches, held-out loss), :class:`RunConfig` (backend, steps, seed, device, lifecycle
events), :class:`ChecksConfig` (fault injection, hazard probes, stops) and
:class:`TorchSharpConfig` (the .NET worker), plus ``trainer_options``: a user's own
TorchSharp trainer's ``--trainer-option KEY=VALUE`` settings.

The wire format stays flat (records written before the sections read back):
:meth:`SoakConfig.to_wire` writes every scalar under its old top-level name
(``steps``, ``lr``, ``n_embd``...; :data:`WIRE`), ``hazards`` + ``hazard_mode`` for
:attr:`ChecksConfig.hazards`, and the keys of :data:`EXTRA` plus the trainer options
under ``extra`` (the .NET trainer reads them as ``extra.KEY``, dotnet/Probe/TrainerOptions.cs).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from dataclasses import dataclass, field

from optcheck.errors import InputError


#: ``--seed`` range: torch.manual_seed and TorchSharp's ``long`` seed both take it;
#: numpy's batch schedule needs it non-negative.
MAX_SEED = 2**63 - 1
#: A nanoGPT ``.bin`` holds uint16 token ids: at most 65,536 distinct ones.
MAX_VOCAB = 2**16
#: ``--hazards``, one field: off (``--no-hazards``), auto or always (docs/hazards.md).
HAZARD_MODES = ("off", "auto", "always")


def max_threads() -> int:
    """Upper bound of ``--threads``: 4 per CPU core (libtorch segfaults creating
    100,000 threads; nothing gains from more than a few per core)."""
    return 4 * (os.cpu_count() or 1)


def _need(ok: bool, option: str, value, what: str) -> None:
    if not ok:
        raise InputError(f"{option} {value!r}: {what}")


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _whole(section, names: tuple[str, ...], low: int) -> None:
    """Each of ``names`` a whole number >= ``low`` (its option in the message)."""
    for name in names:
        v = getattr(section, name)
        _need(isinstance(v, int) and not isinstance(v, bool) and v >= low, _option(name), v,
              f"must be a whole number >= {low}")


@dataclass(slots=True)
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


@dataclass(slots=True)
class ModelConfig:
    """The built-in GPT's shape. Defaults (2 layers, 2 heads, 64 wide, context 64,
    byte tokens) keep a 20,000-step soak within minutes on one CPU thread.

    Attributes:
        vocab_size: for ``.bin`` data without ``meta.pkl`` beside it (None: the corpus's).
    """

    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    block_size: int = 64
    dropout: float = 0.0
    vocab_size: int | None = None

    def validate(self) -> "ModelConfig":
        _whole(self, ("n_layer", "n_head", "n_embd", "block_size"), 1)
        _need(self.n_embd % self.n_head == 0, "--n-embd", self.n_embd,
              f"must be a multiple of --n-head ({self.n_head}): each head gets n_embd / n_head channels")
        if self.vocab_size is not None:
            _need(1 <= self.vocab_size <= MAX_VOCAB, "--vocab-size", self.vocab_size,
                  f"must be in 1..{MAX_VOCAB} (a .bin holds uint16 token ids)")
        _need(isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1, "dropout", self.dropout,
              "must be in [0, 1)")
        return self


@dataclass(slots=True)
class OptimizerConfig:
    """The optimizer and its schedule (linear warmup to ``lr``, cosine down to ``min_lr``).

    Attributes:
        name: ``--optimizer``: adamw or sgd.
        grad_clip: global gradient-norm clip (0: none).
        fused: PyTorch on CUDA: the fused AdamW/SGD kernels (None: on for CUDA).
    """

    name: str = "adamw"
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    fused: bool | None = None

    def validate(self) -> "OptimizerConfig":
        _need(self.name in ("adamw", "sgd"), "--optimizer", self.name, "must be adamw or sgd")
        _whole(self, ("warmup_steps",), 0)
        for name, low in (("lr", "> 0"), ("min_lr", ">= 0"), ("weight_decay", ">= 0"), ("eps", "> 0"),
                          ("grad_clip", ">= 0")):
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and math.isfinite(v) and (v > 0 if low == "> 0" else v >= 0)
            _need(ok, _option(name), v, f"must be a finite number {low}")
        for name in ("beta1", "beta2"):
            v = getattr(self, name)
            _need(isinstance(v, (int, float)) and 0 <= v < 1, name, v, "must be in [0, 1)")
        _need(self.fused is None or isinstance(self.fused, bool), "fused", self.fused, "must be true, false or null")
        return self


@dataclass(slots=True)
class DataConfig:
    """What the GPT trains on.

    Attributes:
        path: ``--data``: a text file or nanoGPT ``.bin`` (uint16 token ids); None =
            the Python standard library's own source files.
        val_every: held-out loss every this many steps (0 = never), over ``val_batches`` batches.
    """

    path: str | None = None
    batch_size: int = 16
    val_every: int = 1000
    val_batches: int = 4

    def validate(self) -> "DataConfig":
        _whole(self, ("batch_size", "val_batches"), 1)
        _whole(self, ("val_every",), 0)
        return self


@dataclass(slots=True)
class RunConfig:
    """How the soak runs (units in names: ``_s`` seconds, steps are optimizer steps).

    Attributes:
        backend: pytorch or torchsharp.
        steps: training steps to run; ``every``: a snapshot every this many steps.
        seed: seeds init, batches and dropout.
        threads: intra-op threads of the backend (1 on 2 cores: more threads slow a
            small GPT down, docs/pytorch.md "Threads"; at most ``max_threads()``).
        device: where the GPT, its optimizer state and the batches live: "cpu",
            "cuda" or "cuda:N" (docs/gpu.md); the worker refuses a CUDA device it
            does not have (exit 2).
        step_timeout_s: the supervisor kills a worker that reports no step for
            this many seconds (0 = never).
        eval_every / checkpoint_every / resume_at: lifecycle events (0 = never).
        autocast: PyTorch: "bf16" or "fp16" runs the forward under ``torch.autocast``
            (None: full precision).
        python: ``--python``: the PyTorch worker's interpreter (None: this one).
        run_id / work_dir: set by the supervisor (the run directory's name, its work folder).
    """

    backend: str = "pytorch"
    steps: int = 20_000
    every: int = 100
    seed: int = 1337
    threads: int = 1
    device: str = "cpu"
    step_timeout_s: float = 0.0
    eval_every: int = 0
    checkpoint_every: int = 0
    resume_at: int = 0
    autocast: str | None = None
    python: str | None = None
    run_id: str = ""
    work_dir: str = ""

    def validate(self) -> "RunConfig":
        _whole(self, ("steps", "every"), 1)
        _whole(self, ("eval_every", "checkpoint_every", "resume_at"), 0)
        _need(isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED, "--seed", self.seed,
              f"must be in 0..{MAX_SEED} (2**63 - 1)")
        _need(isinstance(self.threads, int) and 1 <= self.threads <= max_threads(), "--threads", self.threads,
              f"must be in 1..{max_threads()} (4 per CPU core of this machine)")
        st = self.step_timeout_s
        _need(isinstance(st, (int, float)) and math.isfinite(st) and st >= 0, "--step-timeout", st,
              "must be a finite number of seconds >= 0 (0: no timeout)")
        _need(isinstance(self.device, str) and re.fullmatch(r"cpu|cuda(:\d+)?", self.device) is not None,
              "--device", self.device, "must be cpu, cuda or cuda:N")
        _need(self.autocast in (None, "bf16", "fp16"), "autocast", self.autocast, "must be bf16, fp16 or null")
        return self


@dataclass(slots=True)
class ChecksConfig:
    """What optcheck does to the run besides watching it.

    Attributes:
        inject: fault scenarios (``--inject NAME@STEP``).
        stop_on_finding: the worker stops before the step when its own pre-step
            check finds something.
        hazards: the autograd hazard probes (in-place on saved tensors, graph cuts,
            non-leaf ``.grad`` reads, non-finite values): "off" (``--no-hazards``),
            "auto" (their module and saved-tensor hooks armed on the steps that need
            them; a failing step is re-run armed) or "always" (every step); docs/hazards.md.
        allow_inplace: continue past an in-place write to a saved tensor (default:
            stop the step, as PyTorch's own check would have).
        grad_check_every: the probes' pass over the gradients every this many steps
            (0: never; None: never with ``grad_clip`` on, whose norm covers it, else every step).
    """

    inject: list[Injection] = field(default_factory=list)
    stop_on_finding: bool = False
    hazards: str = "auto"
    allow_inplace: bool = False
    grad_check_every: int | None = None

    def validate(self) -> "ChecksConfig":
        _need(self.hazards in HAZARD_MODES, "--hazards", self.hazards, "must be auto or always (or --no-hazards)")
        if self.grad_check_every is not None:
            _whole(self, ("grad_check_every",), 0)
        return self


@dataclass(slots=True)
class TorchSharpConfig:
    """The TorchSharp backend's .NET worker (docs/torchsharp.md).

    Attributes:
        version: ``--torchsharp``: the TorchSharp version (or a local build's folder)
            to build the worker for (None: $OPTCHECK_TORCHSHARP or the default).
        assembly: ``--dotnet-assembly``: a prebuilt worker assembly (.dll).
        trainer: ``--dotnet-trainer``: the trainer type's full name (None: its one trainer type).
        runtime: ``--dotnet-runtime``: coreclr or mono.
        dotnet_root: ``--dotnet-root``: the .NET installation to take CoreCLR from.
        same_init: a folder of the PyTorch GPT's initial weights to start from
            (``--same-init``; set by the supervisor).
    """

    version: str | None = None
    assembly: str | None = None
    trainer: str | None = None
    runtime: str = "coreclr"
    dotnet_root: str | None = None
    same_init: str | None = None

    def validate(self) -> "TorchSharpConfig":
        _need(self.runtime in ("coreclr", "mono"), "--dotnet-runtime", self.runtime, "must be coreclr or mono")
        return self


#: Flat wire name -> (section, field), in the order today's records have them.
WIRE = {
    "backend": ("run", "backend"), "steps": ("run", "steps"), "every": ("run", "every"), "seed": ("run", "seed"),
    "data": ("data", "path"), "vocab_size": ("model", "vocab_size"), "batch_size": ("data", "batch_size"),
    "block_size": ("model", "block_size"), "n_layer": ("model", "n_layer"), "n_head": ("model", "n_head"),
    "n_embd": ("model", "n_embd"), "dropout": ("model", "dropout"), "lr": ("optimizer", "lr"),
    "min_lr": ("optimizer", "min_lr"), "warmup_steps": ("optimizer", "warmup_steps"),
    "weight_decay": ("optimizer", "weight_decay"), "beta1": ("optimizer", "beta1"), "beta2": ("optimizer", "beta2"),
    "eps": ("optimizer", "eps"), "grad_clip": ("optimizer", "grad_clip"), "threads": ("run", "threads"),
    "val_every": ("data", "val_every"), "val_batches": ("data", "val_batches"), "eval_every": ("run", "eval_every"),
    "checkpoint_every": ("run", "checkpoint_every"), "resume_at": ("run", "resume_at"),
    "inject": ("checks", "inject"), "stop_on_finding": ("checks", "stop_on_finding"),
    "hazards": ("checks", "hazards"), "allow_inplace": ("checks", "allow_inplace"),
    "hazard_mode": ("checks", "hazards"), "step_timeout_s": ("run", "step_timeout_s"), "device": ("run", "device"),
    "run_id": ("run", "run_id"), "work_dir": ("run", "work_dir"),
}
#: optcheck's own keys under the wire's ``extra`` -> (section, field). The first two are
#: always written (as ``optcheck soak`` always did); the others when not None.
EXTRA = {
    "optimizer": ("optimizer", "name"), "dotnet_runtime": ("torchsharp", "runtime"), "python": ("run", "python"),
    "torchsharp": ("torchsharp", "version"), "dotnet_assembly": ("torchsharp", "assembly"),
    "dotnet_trainer": ("torchsharp", "trainer"), "dotnet_root": ("torchsharp", "dotnet_root"),
    "same_init": ("torchsharp", "same_init"), "fused": ("optimizer", "fused"), "autocast": ("run", "autocast"),
    "grad_check_every": ("checks", "grad_check_every"),
}
_ALWAYS = ("optimizer", "dotnet_runtime")


@dataclass(slots=True)
class SoakConfig:
    """Everything a worker needs to run a soak: the sections, validated together by
    :meth:`validate` before anything runs.

    Attributes:
        trainer_options: ``--trainer-option KEY=VALUE``: a user's own TorchSharp
            trainer's settings, read in its ``Setup`` as ``extra.KEY`` (text values).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=RunConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    torchsharp: TorchSharpConfig = field(default_factory=TorchSharpConfig)
    trainer_options: dict[str, str] = field(default_factory=dict)

    def validate(self) -> "SoakConfig":
        """Raise InputError naming the first bad value (as its command-line option);
        return self. Every number a worker uses is checked here, before anything
        runs: a zero layer count or batch size is the user's typo, not a training
        bug for the rules to report."""
        for section in (self.run, self.model, self.data, self.optimizer, self.checks, self.torchsharp):
            section.validate()
        for key in self.trainer_options:
            if key in EXTRA:
                raise InputError(f"--trainer-option {key}: {key} is set by optcheck itself")
        for inj in self.checks.inject:
            if inj.step > self.run.steps:
                raise InputError(f"--inject {inj.name}@{inj.step}: step is past --steps {self.run.steps}")
        return self

    def copy(self) -> "SoakConfig":
        """A deep copy (a seed's, a side's or a backend's config changes its own)."""
        return copy.deepcopy(self)

    def wire_extra(self) -> dict:
        """The wire's ``extra``: the trainer options, then optcheck's own keys (:data:`EXTRA`)."""
        out = dict(self.trainer_options)
        for key, (section, name) in EXTRA.items():
            value = getattr(getattr(self, section), name)
            if value is not None or key in _ALWAYS:
                out[key] = value
        return out

    def to_wire(self) -> dict:
        """The flat dict a worker reads and ``summary.json`` keeps (:data:`WIRE`)."""
        out = {}
        for key, (section, name) in WIRE.items():
            value = getattr(getattr(self, section), name)
            if key == "inject":
                value = [{"name": i.name, "step": i.step} for i in value]
            elif key == "hazards":
                value = value != "off"
            elif key == "hazard_mode":
                value = "always" if value == "always" else "auto"
            out[key] = value
        out["extra"] = self.wire_extra()
        return out

    @classmethod
    def from_wire(cls, d: dict) -> "SoakConfig":
        """Read :meth:`to_wire`'s dict, or a record written before the sections
        (a missing key keeps its default; an unknown one is ignored)."""
        cfg = cls()
        for key, (section, name) in WIRE.items():
            if key in d and key not in ("inject", "hazards", "hazard_mode"):
                setattr(getattr(cfg, section), name, d[key])
        cfg.checks.inject = [Injection(**i) for i in d.get("inject") or []]
        cfg.checks.hazards = "off" if d.get("hazards") is False else d.get("hazard_mode") or "auto"
        for key, value in (d.get("extra") or {}).items():
            if key in EXTRA:
                section, name = EXTRA[key]
                setattr(getattr(cfg, section), name, value)
            elif key != "same_init_dir":
                cfg.trainer_options[key] = value
        return cfg

    def to_json(self) -> str:
        return json.dumps(self.to_wire())

    @classmethod
    def from_json(cls, text: str) -> "SoakConfig":
        return cls.from_wire(json.loads(text))
