"""Which comparison policy two runs get: a rerun, or a migration. Torch-free.

``optcheck compare`` and ``optcheck upgrade`` judge two runs that should train alike.
What "alike" means depends on what changed between them:

* **rerun** — the same backend and the same native library (``torch`` for PyTorch,
  ``libtorch`` for TorchSharp): the same seed and batches must give the same losses up to
  float rounding (``optcheck.judge.verdict.noise_tolerance``, relative 1e-5 growing with steps),
  so ``--lr`` x 1.001 is caught from step 3. Every optimizer option is compared.
* **migration** — another backend (PyTorch against TorchSharp) or another native library
  (torch 2.13 against 2.14, libtorch 2.10 against 2.13): kernels round differently and the
  difference grows chaotically, so two healthy runs from the same initial weights agree to
  7 digits for ~1,000 steps and then drift (``docs/verdict.md``: 20,000 steps of PyTorch
  2.13 against TorchSharp 0.107.0, trailing means within 1.3 %). The verdict is the
  statistical one: the ``window``-step trailing-mean losses must stay within the seed
  tolerance (``optcheck.judge.compare``: 0.03 + 5 % of A's), the same band a rerun with another
  seed stays in; where the runs leave float-rounding agreement is reported, not failed.
  Optimizer options are compared only where both sides have them, under the names of
  :data:`OPTION_NAMES`.

``choose`` picks one from the two runs' ``summary.json`` (``auto``), or takes the user's.
"""

from __future__ import annotations

import math
from pathlib import Path

RERUN, MIGRATION, AUTO = "rerun", "migration", "auto"
POLICIES = (AUTO, RERUN, MIGRATION)

#: Optimizer option names that mean the same on both backends: the snapshot's name on each
#: side -> the name compared. PyTorch's ``param_groups`` keys; TorchSharp's worker reports
#: its ``ParamGroup.Options`` under the same snake_case names (``betas`` as a pair) or its
#: C# property names. Options outside this table (PyTorch's ``foreach``, ``capturable``,
#: ``differentiable``, ``fused``, ``decoupled_weight_decay``; TorchSharp's ``initial_lr``)
#: exist on one side only and are listed as not compared.
OPTION_NAMES = {
    "lr": "lr", "LearningRate": "lr",
    "betas": "betas", "beta1": "beta1", "beta2": "beta2",
    "eps": "eps", "weight_decay": "weight_decay",
    "amsgrad": "amsgrad", "maximize": "maximize",
    "momentum": "momentum", "dampening": "dampening", "nesterov": "nesterov",
    "alpha": "alpha", "centered": "centered",
    "lr_decay": "lr_decay", "initial_accumulator_value": "initial_accumulator_value",
    "rho": "rho", "lambd": "lambd", "t0": "t0", "etas": "etas", "step_sizes": "step_sizes",
    "momentum_decay": "momentum_decay",
}

_NATIVE = {"pytorch": "torch", "torchsharp": "libtorch"}


def native_version(summary: dict) -> str | None:
    """The native library a run trained on: ``torch`` (PyTorch) or ``libtorch`` (TorchSharp)
    from its ``summary.json`` versions, the local build suffix (``+cpu``, ``.0``) kept."""
    key = _NATIVE.get(summary.get("backend") or "")
    return (summary.get("versions") or {}).get(key) if key else None


def same_native_library(summary_a: dict, summary_b: dict) -> str | None:
    """``"libtorch 2.13.0+cpu (/…/torch/lib)"`` when both runs loaded libtorch from the same folder
    (``versions["libtorch_lib"]``: PyTorch's ``torch/lib``, the folder of the ``libtorch_cpu`` a TorchSharp
    worker mapped, ``optcheck.torchsharp_bridge.libtorch``) at the same release, else None. PyTorch and a
    TorchSharp whose LibTorchSharp was built against that PyTorch then share the kernels, not the optimizer's
    arithmetic: the pair stays a migration (docs/torchsharp.md, "Parity with PyTorch")."""
    va, vb = summary_a.get("versions") or {}, summary_b.get("versions") or {}
    la, lb = va.get("libtorch_lib"), vb.get("libtorch_lib")
    if not la or not lb:
        return None
    try:
        if Path(la).resolve() != Path(lb).resolve():
            return None
    except OSError:
        return None
    na, nb = native_version(summary_a), native_version(summary_b)
    if na and nb and na != nb:
        return None
    return f"libtorch {na or nb or '?'} ({la})"


def _release(version: str | None) -> tuple:
    """``2.13.0+cpu`` -> (2, 13, 0); ``2.10.0.0`` -> (2, 10, 0): the release, no build tag."""
    if not version:
        return ()
    head = str(version).split("+")[0]
    parts = []
    for p in head.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def choose(summary_a: dict, summary_b: dict, requested: str = AUTO) -> tuple[str, str]:
    """(policy, why) for runs A and B: ``requested`` when it is ``rerun`` or ``migration``;
    with ``auto``, migration when the backends differ or their native libraries differ
    (``torch`` 2.13.0+cpu vs 2.14.1+cu130 counts as a change: another build rounds
    differently), else rerun.

    Raises:
        ValueError: ``requested`` is not one of :data:`POLICIES`.
    """
    if requested not in POLICIES:
        raise ValueError(f"policy {requested!r}: one of {', '.join(POLICIES)}")
    ba, bb = summary_a.get("backend") or "", summary_b.get("backend") or ""
    if ba != bb:
        why = f"backends differ: {ba or '?'} vs {bb or '?'}"
        same = same_native_library(summary_a, summary_b)
        if same:
            why += f", on the same native library, {same}"
    else:
        na, nb = native_version(summary_a), native_version(summary_b)
        why = f"{_NATIVE.get(ba, 'native library')} {na} vs {nb}" if na and nb and na != nb else ""
    if requested != AUTO:
        return requested, (f"--policy {requested}" + (f" ({why})" if why else ""))
    if why:
        return MIGRATION, why
    return RERUN, f"same backend and native library ({ba or '?'} {native_version(summary_a) or ''})".replace(" )", ")")


def _same(x, y) -> bool:
    """Option values equal across backends: booleans against 0/1, lists against tuples,
    floats to 1e-9 relative (a C# double printed with another number of digits)."""
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    if isinstance(x, (bool, int, float)) and isinstance(y, (bool, int, float)) and x is not None and y is not None:
        fx, fy = float(x), float(y)
        if math.isnan(fx) or math.isnan(fy):
            return math.isnan(fx) and math.isnan(fy)
        return fx == fy or abs(fx - fy) <= 1e-9 * max(abs(fx), abs(fy))
    return x == y


def mapped_options(options: dict) -> dict:
    """``options`` (one param group's) under the compared names of :data:`OPTION_NAMES`;
    ``betas`` also as ``beta1``/``beta2`` so a side that reports them apart still matches."""
    out = {}
    for k, v in (options or {}).items():
        name = OPTION_NAMES.get(k)
        if name is None:
            continue
        if name == "betas" and isinstance(v, (list, tuple)) and len(v) == 2:
            out["beta1"], out["beta2"] = v
        else:
            out[name] = v
    return out


def option_differences(oa: dict, ob: dict, policy: str) -> tuple[list[tuple[str, object, object]], list[str]]:
    """(options that differ as (name, A's, B's), option names compared on one side only).

    ``rerun``: every key of either side, compared exactly. ``migration``: only the names of
    :data:`OPTION_NAMES` both sides have, compared as :func:`_same` does; the rest are
    returned as not compared ("foreach (A only)")."""
    if policy != MIGRATION:
        return [(k, oa.get(k, "-"), ob.get(k, "-")) for k in sorted(set(oa) | set(ob)) if oa.get(k) != ob.get(k)], []
    ma, mb = mapped_options(oa), mapped_options(ob)
    diffs = [(k, ma[k], mb[k]) for k in sorted(set(ma) & set(mb)) if not _same(ma[k], mb[k])]
    lone = [f"{k} ({side} only)" for side, mine, theirs in (("A", oa, mb), ("B", ob, ma)) for k in sorted(mine)
            if not set(mapped_options({k: mine[k]})) or not set(mapped_options({k: mine[k]})) <= set(theirs)]
    return diffs, lone
