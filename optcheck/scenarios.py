"""The catalogue of fault scenarios ``--inject NAME@STEP`` can plant. Torch-free.

Metadata only: what each scenario does, which real report it reproduces, which
backends have it and which findings it must produce. Implementations live with
their backend: ``optcheck/pytorch/scenarios.py`` (reference faults, lifecycle
faults), ``optcheck/pytorch/hazard_scenarios.py`` (the autograd seeds) and the
.NET worker (``dotnet/``) for TorchSharp.

What a scenario does without optcheck depends on the backend *and its version*
(TorchSharp 0.99.6 trains on silently where 0.107.0 throws): :data:`OUTCOMES` keeps
one measured line per backend version, with where it was measured.
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
        reproduces: the real report it reproduces (seed NNN, a TorchSharp
            fixture, a ``docs/`` fact) or the real-world cause it stands for.
        expect: rule codes that must flag it (on every backend that has it).
        expect_torchsharp: codes on TorchSharp where they differ: its optimizer
            re-walks the model's parameters and creates state eagerly, so a
            replaced parameter shows as state without member and member without
            state (OC103, OC108) rather than as a stale member (OC101).
        without_optcheck: what the same run does when optcheck does not intervene,
            in one line; the per-version outcomes are :meth:`outcomes`.
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

    def outcomes(self, backend: str | None = None) -> list[Outcome]:
        """The measured outcomes without optcheck (:data:`OUTCOMES`), per backend version, in
        catalogue order; for a backend with none recorded, one :class:`Outcome` with an empty
        ``version`` carrying ``without_optcheck``."""
        out = []
        for b in self.backends if backend is None else (backend,):
            mine = [o for o in OUTCOMES.get(self.name, ()) if o.backend == b]
            out += mine or [Outcome(b, "", self.without_optcheck, "")]
        return out


@dataclass(frozen=True)
class Outcome:
    """What one scenario does without optcheck on one backend version, as measured.

    Attributes:
        backend: "pytorch" or "torchsharp".
        version: the backend version it was measured on ("2.13", "0.99.6", "0.107.0");
            "" when not recorded.
        text: what happens.
        source: where it was measured (a file under ``tests/``, or a ``docs/`` page).
        flagged: the rule codes optcheck raises on that record (TorchSharp records;
            empty where none is kept), checked by ``tests/unit/test_scenarios_versions.py``.
    """

    backend: str
    version: str
    text: str
    source: str
    flagged: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``PyTorch 2.13``, ``TorchSharp 0.107.0``, ``TorchSharp (version not recorded)``."""
        name = {"pytorch": "PyTorch", "torchsharp": "TorchSharp"}.get(self.backend, self.backend)
        return f"{name} {self.version}" if self.version else f"{name} (version not recorded)"


CATALOGUE: dict[str, ScenarioInfo] = {s.name: s for s in (
    ScenarioInfo(
        "param-rebind", ("pytorch",),
        "model.load_state_dict(state, assign=True) after the optimizer exists: every parameter becomes a new "
        "object with new data",
        "identity breakers (docs/parameter-identity.md); the PyTorch form of seed 003",
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
        "PyTorch: c_fc.weight never trains; TorchSharp: KeyNotFoundException at the next step() (all versions)",
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
        "registering a parameter after the optimizer: 31 parameters vs 30 state keys (docs/torchsharp.md)",
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
        "fixture torchsharp-0.99.6-eager-to-float64; 0.107.0-runs/eager-param-list-1000 (docs/torchsharp.md)",
        ("OC101", "OC102", "OC104"),
        "0.99.6: nothing throws, ln_f silently stops training; 0.107.0: InvalidOperationException at the next "
        "zero_grad()"),
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
    ScenarioInfo(
        "perturb-param", ("pytorch",),
        "test-only: h.0.mlp.c_fc.weight scaled in place by 1.001 (no identity change, no finding)",
        "a silent numerical change in one parameter, as a kernel or initialisation change in an upgrade makes; "
        "optcheck compare / upgrade must name the parameter and the step",
        (),
        "trains on; a same-seed run departs from the unperturbed one at that step (OC601 in optcheck compare, "
        "naming h.0.mlp.c_fc.weight)"),
    # -- distributed (optcheck soak --nproc 2+ only; optcheck/distributed/worker.py) --------------------------
    ScenarioInfo(
        "rank1-param-replaced", ("pytorch",),
        "--nproc only: rank 1 assigns a new Parameter (a copy) to h.0.mlp.c_fc.weight after backward",
        "a rank-local re-initialisation or load; the DDP form of seed 003",
        # OC701 (the replicas differ) only if a cross-rank exchange falls between the replacement and
        # DDP's error two forwards later (--every 1); rank 1's own checks always see it
        ("OC104", "OC706"),
        "rank 1 raises 'Expected to have finished reduction in the prior iteration' at the next forward; "
        "rank 0 waits in the all-reduce until the collective timeout"),
    ScenarioInfo(
        "rank1-lr", ("pytorch",),
        "--nproc only: rank 1 trains with 10x the learning rate from that step on",
        "a scheduler or option set on one rank only",
        ("OC702", "OC701"),
        "trains on silently: the replicas diverge, rank 0's checkpoint is not what rank 1 trained"),
    ScenarioInfo(
        "no-sync-forever", ("pytorch",),
        "--nproc only: every backward from that step on runs under DDP's no_sync() (accumulation never synced)",
        "gradient accumulation that never leaves no_sync() for the last micro-batch",
        ("OC701",),
        "trains on silently: gradients are never averaged, each rank trains its own model"),
    ScenarioInfo(
        "rank1-skip-step", ("pytorch",),
        "--nproc only: rank 1 skips optimizer.step() at that step (as a rank-local NaN check would)",
        "a skip decided per rank (a local isfinite check) instead of collectively",
        ("OC703", "OC701"),
        "trains on silently: rank 1 is one step behind from then on, its replica differs"),
    ScenarioInfo(
        "ddp-unused-param", ("pytorch",),
        "--nproc only: block 0's MLP output replaced by zeros on every rank (its parameters get no gradient)",
        "a branch switched off under DDP without find_unused_parameters",
        ("OC706",),
        "the next forward raises RuntimeError 'Expected to have finished reduction in the prior iteration', "
        "naming parameter indices only"),
    ScenarioInfo(
        "rank1-kill", ("pytorch",),
        "--nproc only: rank 1 SIGKILLs itself at the start of that step",
        "a rank lost to the OOM killer or a node failure",
        (),
        "torch.distributed.run stops the other ranks and exits 1; with a launcher that does not, the others "
        "block in the all-reduce until the process group's timeout (30 min by default on gloo)"),
    ScenarioInfo(
        "rank1-hang", ("pytorch",),
        "--nproc only: rank 1 sleeps for good at the start of that step",
        "a rank stuck in I/O or a deadlock",
        (),
        "every rank blocks: rank 1 sleeps, the others wait in the all-reduce until the collective timeout"),
)}


_PT = "2.13"   # the torch of tests/integration (test_seeds_pytorch.py, test_soak.py) and the benchmarks
_RUNS = "tests/fixtures/torchsharp/0.107.0-runs/"
_DIST_SOAK = "tests/distributed/test_distributed_soak.py"
_DIST_MON = "tests/distributed/test_distributed_monitor.py"
_TS099 = "tests/fixtures/torchsharp/torchsharp-0.99.6-"


def _pt(text: str, source: str):
    return Outcome("pytorch", _PT, text, source)


#: What each scenario does without optcheck, per backend version, as measured (see
#: :class:`Outcome`). TorchSharp lines come from the real records in ``tests/fixtures/torchsharp``
#: (their READMEs) and ``docs/torchsharp.md``; PyTorch lines from this repository's tests on torch 2.13.
OUTCOMES: dict[str, tuple[Outcome, ...]] = {
    "param-rebind": (_pt("trains silently: the optimizer steps the old tensors, the model's parameters never "
                         "change again", "tests/integration/test_soak.py"),),
    "tie-after-optimizer": (_pt("trains silently: the old embedding stays in the optimizer, stepped for nothing, "
                                "its state held forever", "tests/integration/test_soak.py"),),
    "param-replaced": (
        _pt("h.0.mlp.c_fc.weight never trains: the optimizer keeps stepping the old tensor",
            "tests/unit/test_rules_references.py (real GPT)"),
        Outcome("torchsharp", "0.99.6", "the next step() throws KeyNotFoundException for the new handle "
                "(recorded with lm_head.weight)", _TS099 + "head-weight-assign.jsonl", ("OC103", "OC104", "OC108")),
        Outcome("torchsharp", "0.107.0", "the next step() throws KeyNotFoundException for the new handle "
                "(key 275163968 in the recorded run)", _RUNS + "param-replaced-1000", ("OC103", "OC104", "OC108")),
    ),
    "module-to-after-optimizer": (
        _pt("the next step() raises a dtype mismatch in AdamW (parameters keep their identity)",
            "tests/integration/test_soak.py"),
        Outcome("torchsharp", "0.99.6", "every handle changes and ln_f.weight/bias become non-leaf; the next step() "
                "throws KeyNotFoundException for the first new handle", _TS099 + "to-float64.jsonl",
                ("OC103", "OC104", "OC105", "OC108")),
        Outcome("torchsharp", "0.107.0", "every handle changes, nothing becomes non-leaf; the next step() throws "
                "KeyNotFoundException for the first new handle (key 1124667216 in the recorded run)",
                _RUNS + "module-to-after-optimizer-1000", ("OC103", "OC104", "OC108")),
    ),
    "param-registered-late": (
        _pt("the new parameter gets gradients but never trains", "tests/unit/test_rules_references.py (real GPT)"),
        Outcome("torchsharp", "0.99.6", "31 parameters vs 30 state keys: the next step() throws "
                "KeyNotFoundException", "docs/torchsharp.md (a 0.99.6 run)"),
        Outcome("torchsharp", "0.107.0", "the next step() throws KeyNotFoundException for the new parameter's "
                "handle (key 1082564624 in the recorded run)", _RUNS + "param-registered-late-1000", ("OC108",)),
    ),
    "no-zero-grad": (_pt("trains on the running sum of all gradients; the loss stalls or diverges",
                         "tests/integration/test_monitor_plain_loop.py"),),
    "eager-param-list": (
        Outcome("torchsharp", "0.99.6", "nothing throws: the 27 parameters of native modules keep training "
                "(converted in place), ln_f.weight and ln_f.bias (plain Parameter fields) silently stop",
                _TS099 + "eager-to-float64.jsonl", ("OC101", "OC102", "OC104")),
        Outcome("torchsharp", "0.107.0", "the old parameters are disposed: the next zero_grad() throws "
                "InvalidOperationException: Tensor invalid -- empty handle", _RUNS + "eager-param-list-1000",
                ("OC102", "OC104", "OC107", "OC109")),
    ),
    "kv-cache-inplace": (_pt(CATALOGUE["kv-cache-inplace"].without_optcheck, "tests/integration/test_seeds_pytorch.py"),),
    "mask-inplace": (_pt(CATALOGUE["mask-inplace"].without_optcheck, "tests/integration/test_seeds_pytorch.py"),),
    "fp32-cast-nograd": (_pt(CATALOGUE["fp32-cast-nograd"].without_optcheck, "tests/integration/test_seeds_pytorch.py"),),
    "detached-loss": (_pt(CATALOGUE["detached-loss"].without_optcheck, "tests/integration/test_seeds_pytorch.py"),),
    "nonleaf-grad-read": (_pt(CATALOGUE["nonleaf-grad-read"].without_optcheck,
                              "tests/integration/test_seeds_pytorch.py"),),
    "perturb-param": (_pt(CATALOGUE["perturb-param"].without_optcheck, "tests/integration/test_upgrade.py"),),
    "state-leak": (
        _pt("memory grows by what each step keeps until the process is killed", "tests/integration/test_soak_memory.py"),
        Outcome("torchsharp", "0.107.0", "live tensors +1 and RSS +2.2 MiB per step (2,611 tensors, 5.3 GiB after "
                "3,000 steps) until the process is killed", _RUNS + "state-leak-500", ("OC401",)),
    ),
    # distributed: measured with `python -m optcheck.distributed.worker --no-monitor` (2 ranks, gloo, 40 steps)
    "rank1-lr": (_pt("exits 0 after all 40 steps; the replicas' parameters differ at the end (last loss 5.06 on "
                     "rank 0, 3.43 on rank 1)", _DIST_SOAK),),
    "no-sync-forever": (_pt("exits 0 after all 40 steps; the replicas' parameters differ at the end", _DIST_SOAK),),
    "rank1-skip-step": (_pt("exits 0 after all 40 steps; the replicas' parameters differ at the end", _DIST_SOAK),),
    "ddp-unused-param": (_pt("the next forward raises RuntimeError 'Expected to have finished reduction in the prior "
                             "iteration before starting a new one' on every rank", _DIST_MON),),
    "rank1-param-replaced": (_pt("rank 1 raises RuntimeError 'Expected to have finished reduction...' at the next "
                                 "forward; rank 0 fails in the all-reduce ('Connection closed by peer')", _DIST_MON),),
    "rank1-kill": (_pt("torch.distributed.run sees the rank die and stops the others (exit 1); rank 0's all-reduce "
                       "fails with 'Connection closed by peer'", _DIST_SOAK),),
    "rank1-hang": (_pt("every rank blocks: the others wait in the all-reduce until the process group's timeout "
                       "('Timed out waiting ... for recv' on gloo; 30 min by default)", _DIST_MON),),
    "no-dispose-scope": (
        Outcome("torchsharp", "0.107.0", "nothing fails at once: RSS 303 MiB -> 1.6 GiB within 100 steps and "
                "stays, the peak tensor count 293 -> 8,693 (~84 temporaries per step left to the GC) while 110 "
                "are alive after GC.Collect(); a bigger model or batch runs out of memory",
                _RUNS + "no-dispose-scope-500", ("OC401", "OC402")),
    ),
}


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
