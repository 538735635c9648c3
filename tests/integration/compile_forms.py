"""The three ways users compile besides ``torch.compile(model)`` (issue 45), on a tiny
nanoGPT (``optcheck/pytorch/gpt.py``), each run the same way with and without a Monitor:

- ``"step"``: the whole train step compiled (``@torch.compile def train_step(x, y)``:
  forward, ``backward()``, ``clip_grad_norm_``, ``step()``, ``zero_grad()``);
- ``"opt"``: ``opt.step = torch.compile(opt.step)`` (PyTorch's compiled-optimizer recipe);
- ``"fn"``: the model called from a compiled function (``torch.compile(lambda x, y: model(x, y))``).

A fault is planted by the loop itself (the user's own code, not optcheck's injector): in the
``"opt"`` and ``"fn"`` forms inside the eager step, between forward and backward; in the
``"step"`` form, where the step is one compiled function, in the loop before it is called.
:class:`Dynamo` reads Dynamo's counters (private torch names: tests only)."""

from __future__ import annotations

import os

import torch
import torch.nn as nn

import optcheck
from optcheck.pytorch.gpt import GPT, GPTConfig

FORMS = ("step", "opt", "fn")  # and "eager": the same loop uncompiled (the reference)
#: more forms, run as ``run(form, ...)`` too: ``"blocks"``: each transformer block compiled in place with
#: ``fullgraph=True`` (as torchtitan compiles a model: ``block.compile(fullgraph=True)``), the rest eager;
#: ``"fn-fullgraph"``: the ``"fn"`` form with ``fullgraph=True``; ``"step-autograd"``: the ``"step"`` form
#: under compiled autograd (``torch._dynamo.config.compiled_autograd``: Dynamo traces ``backward()`` too)
MORE_FORMS = ("blocks", "fn-fullgraph", "step-autograd")
FAULTS = ("replace", "float64", "built-before-to", "freeze", "nan")


class Dynamo:
    """What Dynamo did while the block ran: ``counts`` (``frames``: frames compiled, recompiles
    included; ``recompiles``: guard failures; ``graph_breaks``; ``unique_graphs``) and
    ``optcheck``: the optcheck functions it traced (as a frame or inlined), from each
    ``TracingContext.traced_code``."""

    def __enter__(self):
        from torch._dynamo.utils import counters, guard_failures
        from torch._guards import TracingContext

        torch._dynamo.reset()
        counters.clear()
        guard_failures.clear()
        self._contexts, init = [], TracingContext.__init__

        def record(ctx, *args, **kwargs):
            init(ctx, *args, **kwargs)
            self._contexts.append(ctx)

        self._restore = lambda: setattr(TracingContext, "__init__", init)
        TracingContext.__init__ = record
        return self

    def __exit__(self, *exc):
        from torch._dynamo.utils import counters, guard_failures

        self._restore()
        root = os.path.dirname(optcheck.__file__) + os.sep
        self.counts = {"frames": counters["frames"]["total"],
                       "recompiles": sum(len(v) for v in guard_failures.values()),
                       "graph_breaks": sum(counters["graph_break"].values()),
                       "unique_graphs": counters["stats"]["unique_graphs"]}
        self.breaks = dict(counters["graph_break"])
        self.optcheck = sorted({f"{c.co_name} ({os.path.relpath(c.co_filename, root)}:{c.co_firstlineno})"
                                for ctx in self._contexts for c in ctx.traced_code if c.co_filename.startswith(root)})
        return False


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=32, tie_weights=False))


def _fault(model, fault, where):
    """The user's own mistake, made in their step (``where``: "before-forward" / "mid")."""
    if fault == "replace":  # a layer replaced after the optimizer was built: its new weights never train
        model.h[0].mlp.c_fc = nn.Linear(32, 128)
    elif fault == "float64":
        model.to(torch.float64)
    elif fault == "freeze":
        model.h[0].mlp.c_fc.weight.requires_grad_(False)


def run(form: str, *, monitor: bool, steps: int = 12, every: int = 4, backend: str = "aot_eager",
        fault: str | None = None, at: int = 6, hazards="auto", mode: str | None = None, **kw):
    """Train the tiny GPT ``steps`` steps compiled in ``form`` (:data:`FORMS`, :data:`MORE_FORMS`)
    with ``backend`` (``mode``: torch.compile's, inductor only); ``fault`` planted at step ``at``
    (1-based). Returns ``(monitor or None, Dynamo, losses, error or None)``."""
    if form == "step-autograd":
        with torch._dynamo.config.patch(compiled_autograd=True):
            return run("step", monitor=monitor, steps=steps, every=every, backend=backend, fault=fault, at=at,
                       hazards=hazards, mode=mode, **kw)
    how = {"backend": backend, **({"mode": mode} if mode else {})}
    if form == "fn-fullgraph":
        form, how = "fn", {**how, "fullgraph": True}
    model = tiny_gpt()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if fault == "built-before-to":  # .to() after the optimizer, making new Parameter objects (as on a
        # conversion that cannot keep them): the optimizer steps the old ones, the model trains nothing
        was = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        try:
            model.to(torch.float64)
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(was)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 64, (4, 16), generator=g) for _ in range(steps)]
    losses, error = [], None
    with Dynamo() as dynamo:
        mon = optcheck.Monitor(model, opt, every=every, hazards=hazards, on_finding="ignore",
                               ignore_config=False, **kw) if monitor else None
        nan = torch.zeros(())

        def forward(x, y):
            return model(x, y)[1]

        if form == "step":
            def train_step(x, y, scale):
                loss = model(x, y)[1] + scale
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss.detach()

            train_step = torch.compile(train_step, **how)
        elif form == "opt":
            opt.step = torch.compile(opt.step, **how)
            compiled = forward
        elif form == "eager":
            compiled = forward
        elif form == "blocks":
            for block in model.h:
                block.compile(fullgraph=True, **how)
            compiled = forward
        else:
            compiled = torch.compile(lambda x, y: model(x, y)[1], **how)
        try:
            for i, xb in enumerate(batches, start=1):
                x, y = xb, torch.roll(xb, -1, 1)
                scale = torch.full((), float("nan")) if fault == "nan" and i == at else nan
                if fault in ("replace", "float64", "freeze") and i == at and form == "step":
                    _fault(model, fault, "before-forward")
                if form == "step":
                    losses.append(float(train_step(x, y, scale.to(next(model.parameters()).dtype))))
                    continue
                loss = compiled(x, y) + scale.to(next(model.parameters()).dtype)
                if fault in ("replace", "float64", "freeze") and i == at:
                    _fault(model, fault, "mid")  # between forward and backward
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(float(loss.detach()))
        except Exception as e:  # noqa: BLE001 - the test asserts on it
            error = e
        if mon is not None:
            mon.close()
    return mon, dynamo, losses, error
