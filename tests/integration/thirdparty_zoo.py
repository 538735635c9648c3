"""Third-party optimizers in training loops written as their READMEs prescribe (NOT
with optcheck's helpers): every optimizer pytorch-optimizer's registry builds
(``get_supported_optimizers`` / ``load_optimizer``), heavyball's public optimizers,
schedule-free's, bitsandbytes' optimizers that run on a CPU, torchao's low-bit ones,
and the wrappers that hold another optimizer (SAM, Lookahead, ScheduleFreeWrapper,
SAMWrapper). Installed by the ``zoo`` extra (``pyproject.toml``).

Each :class:`Entry` says how to build the optimizer for a model and which loop its
README uses (:data:`STYLES`): ``plain`` (zero_grad / backward / step), ``closure``
(``step(closure)``), ``float_closure`` (AliG: ``step(lambda: float(loss))``),
``create_graph`` (second-order: AdaHessian, SophiaH), ``schedulefree``
(``optimizer.train()`` / ``optimizer.eval()`` around evaluation), ``two_step``
(SAM: ``first_step`` / ``second_step``, two backward passes per update), and two
where the update runs inside backward with no ``step()`` to count (issue 34):
``fused_backward`` (LOMO, AdaLOMO: ``optimizer.fused_backward(loss, lr)``) and
``gradient_release`` (optimi's ``prepare_for_gradient_release``: ``loss.backward()``
steps each parameter; ``gradient_release_step`` also calls ``step()`` and
``zero_grad()`` after it, which its README says are harmless no-ops). The only
optcheck line in :func:`run` is marked ``# optcheck``.

``swap_at=K`` plants the bug: before step K a layer of the model is replaced by a new
``nn.Linear`` the optimizer does not hold (OC101/OC102/OC104 at step K).
"""

from __future__ import annotations

import importlib
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Entry:
    """One optimizer of the zoo. ``build(model)`` returns what the user steps;
    ``skip``: why it cannot run here (then ``build`` is never called); ``xfail``: a
    known miss, with its reason; ``model``: "mlp" (Linear-Tanh-Linear with biases),
    "2d" (bias-free: optimizers for matrices only), "wide" (a 32x128 first layer: big
    enough for torchao to quantize its state, >= 4096 elements)."""

    id: str
    build: Callable | None = None
    style: str = "plain"
    model: str = "mlp"
    skip: str | None = None
    xfail: str | None = None
    context: Callable | None = None  # a context manager factory the loop runs in
    xfail_found: str | None = None  # a known miss of the replaced-layer check


STYLES = ("plain", "closure", "float_closure", "create_graph", "schedulefree", "two_step", "fused_backward",
          "gradient_release", "gradient_release_step")
LR = 1e-2  # the learning rate a fused_backward loop passes at each step


def make_model(kind: str = "mlp", seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    n_in, hidden = (32, 128) if kind == "wide" else (16, 32)
    bias = kind != "2d"
    return nn.Sequential(nn.Linear(n_in, hidden, bias=bias), nn.Tanh(), nn.Linear(hidden, 4, bias=bias))


def batches(kind: str = "mlp", n: int = 8, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    n_in = 32 if kind == "wide" else 16
    w = torch.randn(n_in, 4, generator=g) / 4
    out = []
    for _ in range(n):
        x = torch.randn(32, n_in, generator=g)
        out.append((x, torch.sin(x @ w)))
    return out


# -- the optimizers ------------------------------------------------------------------------------


def _have(module: str) -> str | None:
    """None when ``module`` imports, else why not (the skip reason)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
        return f"{module} not importable ({type(e).__name__}: {str(e)[:80]}); pip install -e '.[zoo]'"
    return None


def _muon_groups(model):
    mats = [p for p in model.parameters() if p.ndim == 2]
    rest = [p for p in model.parameters() if p.ndim != 2]
    return [{"params": mats, "use_muon": True}, {"params": rest, "use_muon": False}]


#: pytorch-optimizer registry names whose constructor or loop is not ``cls(model.parameters())`` + plain
_PO_SPECIAL = {
    "adahessian": {"style": "create_graph"},
    "sophiah": {"style": "create_graph"},
    "alig": {"style": "float_closure"},
    "lbfgs": {"style": "closure"},
    "bsam": {"style": "closure", "kwargs": {"num_data": 256}},
    "ranger21": {"kwargs": {"num_iterations": 200}},
    "spectralsphere": {"model": "2d"},
    "adammini": {"model_arg": True},
    "adalomo": {"style": "fused_backward", "model_arg": True},  # the update runs inside backward
    "lomo": {"style": "fused_backward", "model_arg": True},
    "schedulefreeadamw": {"style": "schedulefree"},
    "schedulefreeradam": {"style": "schedulefree"},
    "schedulefreesgd": {"style": "schedulefree"},
    "demo": {"needs": "einops"},
    **{n: {"groups": _muon_groups} for n in ("muon", "adago", "adamuon", "normuon", "muonclip", "distributedmuon")},
    "distributedmuon": {"groups": _muon_groups, "context": "one_process_group"},
}


def _one_process_group():
    from process_group import one_process_group  # tests/process_group.py: a one-rank gloo group

    return one_process_group()


def _po_build(name: str, spec: dict):
    def build(model):
        import pytorch_optimizer as po

        cls = po.load_optimizer(name)
        kwargs = dict(spec.get("kwargs", {}))
        if spec.get("model_arg"):
            return cls(model, **kwargs)
        params = spec["groups"](model) if "groups" in spec else model.parameters()
        return cls(params, **kwargs)

    return build


def pytorch_optimizer_entries() -> list[Entry]:
    why = _have("pytorch_optimizer")
    if why:
        return [Entry("pytorch_optimizer", skip=why)]
    import pytorch_optimizer as po

    out = []
    for name in po.get_supported_optimizers():
        spec = _PO_SPECIAL.get(name, {})
        skip = spec.get("skip") or (_have(spec["needs"]) if "needs" in spec else None)
        out.append(Entry(f"pytorch_optimizer.{name}", _po_build(name, spec), style=spec.get("style", "plain"),
                         model=spec.get("model", "mlp"), skip=skip,
                         context=_one_process_group if spec.get("context") else None))
    # wrappers of another optimizer (not in the registry): SAM-style two-step ones and Lookahead & co.
    out += [
        Entry("pytorch_optimizer.SAM(AdamW)", lambda m: po.SAM(m.parameters(), torch.optim.AdamW, lr=1e-2),
              style="two_step"),
        Entry("pytorch_optimizer.WSAM(AdamW)", lambda m: po.WSAM(m, m.parameters(), torch.optim.AdamW, lr=1e-2),
              style="two_step"),
        Entry("pytorch_optimizer.Lookahead(AdamW)",
              lambda m: po.Lookahead(torch.optim.AdamW(m.parameters(), lr=1e-2), k=5, alpha=0.5)),
        Entry("pytorch_optimizer.TRAC(AdamW)", lambda m: po.TRAC(torch.optim.AdamW(m.parameters(), lr=1e-2))),
        Entry("pytorch_optimizer.OrthoGrad(AdamW)",
              lambda m: po.OrthoGrad(torch.optim.AdamW(m.parameters(), lr=1e-2))),
        Entry("pytorch_optimizer.ScheduleFreeWrapper(AdamW)",
              lambda m: po.ScheduleFreeWrapper(torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.0)),
              style="schedulefree"),
    ]
    return out


#: heavyball classes that are not optimizers a user builds from parameters alone
_HB_NOT_OPTIMIZERS = {"SplitOpt", "SAMWrapper", "PSGDBase", "SOAPBase"}


def heavyball_entries() -> list[Entry]:
    why = _have("heavyball")
    if why:
        return [Entry("heavyball", skip=why)]
    import heavyball
    import heavyball.utils

    heavyball.utils.compile_mode = None  # eager: torch.compile's CPU autotuning takes minutes per optimizer
    out = []
    for name in sorted(dir(heavyball)):
        cls = getattr(heavyball, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or name in _HB_NOT_OPTIMIZERS:
            continue
        style = "schedulefree" if name.startswith("SF") else ("closure" if "SAM" in name else "plain")
        out.append(Entry(f"heavyball.{name}", (lambda c: lambda m: c(m.parameters(), lr=1e-3))(cls), style=style))
    out.append(Entry("heavyball.SAMWrapper(AdamW)",
                     lambda m: heavyball.SAMWrapper(m.parameters(), heavyball.AdamW(m.parameters(), lr=1e-3)),
                     style="closure"))
    return out


def schedulefree_entries() -> list[Entry]:
    why = _have("schedulefree")
    if why:
        return [Entry("schedulefree", skip=why)]
    import schedulefree as sf

    out = []
    for name in sorted(dir(sf)):
        cls = getattr(sf, name)
        if not isinstance(cls, type) or name.startswith("ScheduleFreeWrapper"):
            continue
        style = "closure" if name.endswith("Closure") else "schedulefree"
        lr = 1e-2 if "SGD" not in name else 5e-2
        out.append(Entry(f"schedulefree.{name}", (lambda c, lr: lambda m: c(m.parameters(), lr=lr))(cls, lr),
                         style=style))
    for name in ("ScheduleFreeWrapper", "ScheduleFreeWrapperReference"):
        out.append(Entry(f"schedulefree.{name}(SGD)",
                         (lambda n: lambda m: getattr(sf, n)(torch.optim.SGD(m.parameters(), lr=5e-2), momentum=0.9,
                                                             weight_decay_at_y=0.0))(name),
                         style="schedulefree"))
    return out


def bitsandbytes_entries() -> list[Entry]:
    why = _have("bitsandbytes")
    if why:
        return [Entry("bitsandbytes", skip=why)]
    import bitsandbytes as bnb

    out = []
    for name in sorted(dir(bnb.optim)):
        cls = getattr(bnb.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or name in ("GlobalOptimManager",):
            continue
        skip = None
        if name.startswith("Paged"):
            skip = "paged optimizers allocate their state in CUDA unified memory: CUDA only"
        lr = 1e-1 if name.startswith(("SGD", "LARS")) else 1e-2
        kwargs = {"momentum": 0.9} if name.startswith(("SGD", "LARS", "PytorchLARS")) else {}
        out.append(Entry(f"bitsandbytes.{name}", (lambda c, lr, kw: lambda m: c(m.parameters(), lr=lr, **kw))(
            cls, lr, kwargs), model="wide", skip=skip))
    return out


def _eager():
    """torchao compiles its per-parameter step with ``torch.compile`` (tens of seconds of
    CPU autotuning per optimizer and shape): run it eagerly, same states, same ops."""
    return torch.compiler.set_stance("force_eager")


def torchao_entries() -> list[Entry]:
    why = _have("torchao.optim")
    if why:
        return [Entry("torchao", skip=why)]
    import torchao.optim as tao

    out = []
    for name in ("AdamW8bit", "Adam8bit", "AdamW4bit", "Adam4bit", "AdamWFp8", "AdamFp8"):
        out.append(Entry(f"torchao.{name}", (lambda c: lambda m: c(m.parameters(), lr=1e-2))(getattr(tao, name)),
                         model="wide", context=_eager))
    out.append(Entry("torchao.CPUOffloadOptimizer", skip="CPUOffloadOptimizer moves a CUDA model's optimizer "
                                                         "state to the CPU: CUDA only"))
    return out


def _released(cls):
    """optimi's README: ``gradient_release=True``, then ``prepare_for_gradient_release(model, opt)``."""
    def build(model):
        from optimi import prepare_for_gradient_release

        opt = cls(model.parameters(), lr=1e-2 if "SGD" not in cls.__name__ else 5e-2, gradient_release=True)
        prepare_for_gradient_release(model, opt)
        return opt

    return build


def optimi_entries() -> list[Entry]:
    """optimi's optimizers with gradient release (the step of each parameter inside backward),
    alone and with the ``step()``/``zero_grad()`` a framework's loop still calls."""
    why = _have("optimi")
    if why:
        return [Entry("optimi", skip=why)]
    import optimi

    out = []
    for name in ("Adam", "AdamW", "Adan", "Lion", "RAdam", "Ranger", "SGD", "StableAdamW"):
        cls = getattr(optimi, name)
        out.append(Entry(f"optimi.{name}(gradient_release)", _released(cls), style="gradient_release"))
    out.append(Entry("optimi.AdamW(gradient_release, step)", _released(optimi.AdamW), style="gradient_release_step"))
    return out


def lomo_optim_entries() -> list[Entry]:
    """The LOMO authors' package: ``Lomo`` and ``AdaLomo`` (``fused_backward``)."""
    why = _have("lomo_optim")
    if why:
        return [Entry("lomo_optim", skip=why)]
    import lomo_optim

    return [Entry(f"lomo_optim.{name}", (lambda c: lambda m: c(m, lr=LR))(getattr(lomo_optim, name)),
                  style="fused_backward") for name in ("Lomo", "AdaLomo")]


def entries() -> list[Entry]:
    """Every optimizer of the zoo, libraries in a fixed order."""
    return (pytorch_optimizer_entries() + heavyball_entries() + schedulefree_entries() + bitsandbytes_entries()
            + torchao_entries() + optimi_entries() + lomo_optim_entries())


# -- the loop ------------------------------------------------------------------------------------


def refused_on_cpu(exc: BaseException) -> str | None:
    """The reason when ``exc`` says the optimizer needs an accelerator, else None."""
    text = f"{type(exc).__name__}: {exc}"
    for word in ("CUDA", "cuda", "GPU", "Triton", "triton", "XPU"):
        if word in text:
            return text.splitlines()[0][:160]
    return None


def run(entry: Entry, steps: int, every: int, swap_at: int | None = None, monitor: bool = True,
        monitor_cls=None, seed: int = 0):
    """Train ``entry``'s optimizer for ``steps`` steps as its README says; returns
    ``(losses, mon, optimizer)`` (``mon`` None without the Monitor)."""
    import contextlib

    with entry.context() if entry.context is not None else contextlib.nullcontext():
        return _run(entry, steps, every, swap_at, monitor, monitor_cls, seed)


def _run(entry: Entry, steps: int, every: int, swap_at: int | None, monitor: bool, monitor_cls, seed: int):
    import optcheck

    model = make_model(entry.model, seed)
    data = batches(entry.model, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = entry.build(model)
    mon = None
    if monitor:
        mon = (monitor_cls or optcheck.Monitor)(model, opt, every=every, on_finding="ignore")  # optcheck
    losses = []
    style = entry.style
    try:
        if style == "schedulefree":
            opt.train()
        for i in range(steps):
            if swap_at is not None and i + 1 == swap_at:
                model[2] = nn.Linear(model[2].in_features, 4, bias=model[2].bias is not None)  # the planted bug
            x, y = data[i % len(data)]
            losses.append(_step(style, model, opt, x, y))
            if style == "schedulefree" and (i + 1) % 10 == 0:  # evaluate as the README says: eval() around it
                model.eval()
                opt.eval()
                with torch.no_grad():
                    F.mse_loss(model(data[0][0]), data[0][1])
                opt.train()
                model.train()
        if style == "schedulefree":
            opt.eval()
    finally:
        if mon is not None:
            mon.close()
    return losses, mon, opt


def _step(style: str, model, opt, x, y) -> float:
    if style == "plain" or style == "schedulefree":
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    elif style == "create_graph":
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(model(x), y)
        loss.backward(create_graph=True)
        opt.step()
    elif style == "closure":
        def closure():
            opt.zero_grad()
            out = F.mse_loss(model(x), y)
            out.backward()
            return out

        loss = opt.step(closure)
        loss = 0.0 if loss is None else loss  # some return nothing
    elif style == "float_closure":
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step(lambda: float(loss))
    elif style == "fused_backward":  # LOMO: backward updates the parameters, no step()
        loss = F.mse_loss(model(x), y)
        opt.fused_backward(loss, LR)
    elif style in ("gradient_release", "gradient_release_step"):  # optimi: each parameter steps in backward
        loss = F.mse_loss(model(x), y)
        loss.backward()
        if style == "gradient_release_step":
            opt.step()
            opt.zero_grad()
    elif style == "two_step":
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.first_step(zero_grad=True)
        F.mse_loss(model(x), y).backward()
        opt.second_step(zero_grad=True)
    else:
        raise ValueError(style)
    v = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    return v if math.isfinite(v) else float("nan")


def state_tensors(obj, depth: int = 0) -> int:
    """How many tensors an optimizer state holds, counted independently of optcheck
    (dicts, lists and tuples descended; tensors of any class; a param group kept in the
    state, optimi's ``state[p]["group"]``, holds the parameters, not state)."""
    if isinstance(obj, torch.Tensor):
        return 1
    if depth > 6 or (isinstance(obj, dict) and "params" in obj and "lr" in obj):
        return 0
    if isinstance(obj, dict):
        return sum(state_tensors(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_tensors(v, depth + 1) for v in obj)
    return 0
