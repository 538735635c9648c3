"""Parity rule OC601 (``run-divergence``): two runs that should train alike do not.

OC601 is a rule over a *comparison* of two run directories, not over one
snapshot stream: its :meth:`check` is silent on a single stream, and
``optcheck.judge.compare.compare_runs`` makes its findings. It is registered so that
``optcheck rules`` lists it and ``optcheck explain OC601`` documents it.
"""

from __future__ import annotations

from typing import Iterable

from optcheck.findings import Finding
from optcheck.rules._fixtures import Invalid, Valid, cases, loss_curve
from optcheck.rules.base import Rule, RuleContext, register


@register
class RunDivergence(Rule):
    """Two runs that should train alike have loss trajectories that differ beyond tolerance.

    Any two runs: two versions of one backend (an upgrade), two backends, two
    configurations. Until issue 12 its symbol was ``backend-divergence`` (retired;
    the code OC601 is unchanged, so findings.jsonl files of older runs still read).

    Runs of the same seed and batches (their ``summary.json`` configs say so) are
    judged step by step against the numerical-noise tolerance of
    ``optcheck.judge.verdict`` (relative 1e-5, growing with steps; ``docs/verdict.md``):
    then OC601 fires at the first step whose loss differs by more than float
    rounding explains, and names the first snapshot, parameter and option that
    differ. Runs of different seeds are judged as follows.

    ``optcheck compare RUN_A RUN_B`` aligns the two runs' training losses
    (``metrics.jsonl``) by step, smooths each with a trailing mean over
    ``--window`` steps (default 50; one batch's loss is noise, the curve is
    not), and fires at the first step where the smoothed losses differ by more
    than ``atol + rtol x |loss_A|`` (defaults: rtol 0.05, atol 0.03 — two clean
    runs of the built-in GPT with different seeds stay within it; a learning rate
    10x off or another optimizer do not). A non-finite loss in one run only counts
    as a divergence at its step.

    What it means: for an upgrade check (the same soak on two torch or
    TorchSharp versions) or a backend check (PyTorch against TorchSharp with
    ``--same-init``), the two sides do not compute the same training: a changed
    default (TorchSharp's AdamW ``weight_decay`` is 0, PyTorch's 0.01,
    ``docs/torchsharp.md``), a changed kernel or initialisation, a different learning-rate schedule,
    or a parameter the optimizer lost on one side only (then the findings
    present in one run and not the other, listed by ``optcheck compare``, name it).

    Fix: compare the two runs' ``summary.json`` configs and versions first; set
    the optimizer's options explicitly on both sides; rerun with ``--same-init``
    to separate initialisation from training differences.
    """

    code, symbol, severity, family = "OC601", "run-divergence", "error", "parity"
    message = ("loss trajectories diverge from step {step}: {window}-step mean loss {a:.4f} (A) vs {b:.4f} (B), "
               "beyond tolerance {tol:.4f}")

    @cases
    def VALID():
        return [
            Valid(losses=(loss_curve(), loss_curve(jitter=0.02)), note="two seeds of one training"),
        ]

    @cases
    def INVALID():
        return [
            Invalid(losses=(loss_curve(), loss_curve(offset_from=500)), note="B's loss jumps by 0.5 at step 500",
                    step=516),
        ]

    def check(self, snap: dict, ctx: RuleContext) -> Iterable[Finding]:
        """Nothing to say about one stream: see ``optcheck.judge.compare.compare_runs``."""
        return []
