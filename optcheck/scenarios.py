"""The catalogue of fault scenarios ``--inject NAME@STEP`` can plant. Torch-free.

Metadata only: what each scenario does, which real report it reproduces, which
backends have it and which findings it must produce. Implementations live with
their backend: ``optcheck/pytorch/scenarios.py`` (reference faults, lifecycle
faults), ``optcheck/pytorch/hazard_scenarios.py`` (the autograd seeds) and the
.NET worker (``dotnet/``) for TorchSharp.
"""

from __future__ import annotations

from dataclasses import dataclass

from optcheck.errors import InputError


@dataclass(frozen=True)
class ScenarioInfo:
    """One fault scenario.

    Attributes:
        name: the NAME of ``--inject NAME@STEP``.
        backends: backends that implement it.
        summary: what is done to the run at that step.
        reproduces: the real report it reproduces (``shared/seeds/...``) or the
            real-world cause it stands for.
        expect: rule codes that must flag it (on every backend that has it).
        expect_torchsharp: codes on TorchSharp where they differ: its optimizer
            re-walks the model's parameters and creates state eagerly, so a
            replaced parameter shows as state without member and member without
            state (OC103, OC108) rather than as a stale member (OC101).
        without_optcheck: what the same run does when optcheck does not intervene.
    """

    name: str
    backends: tuple[str, ...]
    summary: str
    reproduces: str
    expect: tuple[str, ...]
    without_optcheck: str
    expect_torchsharp: tuple[str, ...] | None = None

    def expected(self, backend: str) -> tuple[str, ...]:
        """Codes that must flag this scenario on ``backend``."""
        if backend == "torchsharp" and self.expect_torchsharp is not None:
            return self.expect_torchsharp
        return self.expect


CATALOGUE: dict[str, ScenarioInfo] = {s.name: s for s in (
    ScenarioInfo(
        "param-rebind", ("pytorch",),
        "model.load_state_dict(state, assign=True) after the optimizer exists: every parameter becomes a new "
        "object with new data",
        "DESIGN.md §5 identity breakers; the PyTorch form of seed 003",
        ("OC101", "OC102", "OC104"),
        "trains silently: the optimizer steps the old tensors, the model's parameters never change again"),
    ScenarioInfo(
        "tie-after-optimizer", ("pytorch",),
        "model.wte.weight = model.lm_head.weight after the optimizer exists (weights tied too late)",
        "nanoGPT weight tying done after configure_optimizers",
        ("OC101",),
        "trains silently: the old embedding stays in the optimizer, stepped for nothing, its state held forever"),
    ScenarioInfo(
        "param-replaced", ("pytorch", "torchsharp"),
        "a new Parameter assigned to h.0.mlp.c_fc.weight after the optimizer exists",
        "seed 003 (assigning a new Parameter); fixture …-head-weight-assign",
        ("OC101", "OC102", "OC104"),
        "PyTorch: c_fc.weight never trains; TorchSharp: KeyNotFoundException at the next step()",
        expect_torchsharp=("OC103", "OC104", "OC108")),
    ScenarioInfo(
        "module-to-after-optimizer", ("pytorch", "torchsharp"),
        "model.to(float64) after the optimizer exists (dtype change)",
        "seed 003: Module.to(...) after the optimizer was built",
        ("OC107",),
        "PyTorch: the next step() raises a dtype mismatch in AdamW; TorchSharp: KeyNotFoundException",
        expect_torchsharp=("OC103", "OC104", "OC105", "OC108")),
    ScenarioInfo(
        "param-registered-late", ("pytorch", "torchsharp"),
        "an extra trainable parameter registered on ln_f after the optimizer exists",
        "DESIGN.md §6: registering a parameter after the optimizer → 31 parameters vs 30 state keys",
        ("OC102",),
        "PyTorch: the parameter never trains; TorchSharp: KeyNotFoundException at the next step()",
        expect_torchsharp=("OC108",)),
    ScenarioInfo(
        "no-zero-grad", ("pytorch",),
        "optimizer.zero_grad() dropped from the loop: gradients accumulate across steps",
        "the most common hand-written training-loop bug",
        ("OC204",),
        "trains on the running sum of all gradients; the loss stalls or diverges"),
    ScenarioInfo(
        "eager-param-list", ("torchsharp",),
        "optimizer built from a materialised parameter list, then model.to(float64)",
        "fixture …-eager-to-float64 (DESIGN.md §6)",
        ("OC101", "OC102", "OC104"),
        "nothing throws; ln_f.weight and ln_f.bias silently stop training"),
    ScenarioInfo(
        "kv-cache-inplace", ("pytorch",),
        "a KV cache updated with index_copy_ during a training forward",
        "seed 000 (mini-omni, Lightning Fabric)",
        ("OC301",),
        "fails at the injection step in backward with seed 000's text: RuntimeError: one of the variables "
        "needed for gradient computation has been modified by an inplace operation: [torch.LongTensor [1]] is "
        "at version 1; expected version 0 instead. (optcheck flags the earlier write to the KV cache, "
        "index_copy_, in the forward of the same step)"),
    ScenarioInfo(
        "mask-inplace", ("pytorch",),
        "a cached attention mask written in place, with gradient checkpointing re-running the forward",
        "seed 001 (Mistral-7B fine-tune)",
        ("OC301",),
        "fails at the injection step in backward, while the checkpoint re-runs the last block: RuntimeError: "
        "one of the variables needed for gradient computation has been modified by an inplace operation: "
        "[torch.FloatTensor [1, 1, T, T]] is at version n_layer+1; expected version n_layer instead."),
    ScenarioInfo(
        "fp32-cast-nograd", ("pytorch",),
        "an RMSNorm-style float32 cast run where autograd is not recording",
        "seed 002 (LLaMA-Factory, Qwen2RMSNorm)",
        ("OC203",),
        "trains silently without gradients to every parameter before ln_f but the tied wte/lm_head "
        "(27 of 28 on the default 2-layer GPT): nothing fails, the body stops learning"),
    ScenarioInfo(
        "detached-loss", ("pytorch",),
        "logits and loss computed without a graph although every parameter requires grad",
        "seed 004 (Lightning + HF T5)",
        ("OC203",),
        "fails at the injection step in backward with seed 004's text: RuntimeError: element 0 of tensors does "
        "not require grad and does not have a grad_fn"),
    ScenarioInfo(
        "nonleaf-grad-read", ("pytorch",),
        ".grad read on non-leaf tensors every step",
        "seed 003's warning: The .grad attribute of a Tensor that is not a leaf Tensor is being accessed",
        ("OC201",),
        "nothing fails: a UserWarning (The .grad attribute of a Tensor that is not a leaf Tensor is being "
        "accessed) at every step, and the value read is always None"),
    ScenarioInfo(
        "state-leak", ("pytorch", "torchsharp"),
        "something kept alive every step: PyTorch, a copy of ln_f's output appended to a history list; "
        "TorchSharp, each step's loss tensor kept in a list, graph and all (losses.Add(loss))",
        "a leaking cache or an appended loss history",
        ("OC401",),
        "memory grows until the process is killed. TorchSharp 0.107.0, measured (3,000 steps, planted at 500): "
        "live tensors +1 per step (110 -> 2,611), RSS +2.2 MiB per step (5.3 GiB at step 3,000)"),
    ScenarioInfo(
        "no-dispose-scope", ("torchsharp",),
        "the training step run without `using (torch.NewDisposeScope())`: every temporary of forward and "
        "backward waits for the .NET GC's finalizer",
        "TorchSharp issues #1278 and #252: its users' most common memory complaint",
        ("OC402",),
        "nothing fails at once. TorchSharp 0.107.0, measured (3,000 steps, planted at 500): RSS 303 MiB -> "
        "1.6 GiB within 100 steps and stays there, the peak tensor count 293 -> 8,693 (~84 temporaries per "
        "step waiting for the GC) while 110 are alive after GC.Collect(); a bigger model or batch runs out "
        "of memory"),
)}


def get(name: str, backend: str) -> ScenarioInfo:
    """The scenario ``name`` for ``backend``.

    Raises:
        InputError: unknown scenario, or one this backend does not have.
    """
    info = CATALOGUE.get(name)
    if info is None:
        raise InputError(f"unknown scenario {name!r}; `optcheck scenarios` lists them: "
                         + ", ".join(sorted(CATALOGUE)))
    if backend not in info.backends:
        raise InputError(f"scenario {name!r} is not available on {backend} (only {', '.join(info.backends)})")
    return info
