"""PyTorch implementations of the fault scenarios in ``optcheck/scenarios.py``.

Each implementation is ``fn(trainer, step) -> dict`` and does to the running
``Trainer`` exactly what the real-world bug does, returning ``{"call": ...}``:
the line of user code it stands for. The autograd seeds live in
``optcheck/pytorch/hazard_scenarios.py`` and ``memory_scenarios.py``; all register
through ``optcheck/pytorch/scenario_registry.py``.
"""

from __future__ import annotations


import torch
import torch.nn as nn

from optcheck import scenarios as catalogue
from optcheck.pytorch.scenario_registry import IMPLEMENTATIONS, implements

NEEDS_UNTIED = {"tie-after-optimizer"}


def _load_all() -> None:
    try:  # the autograd seed scenarios, when present
        import optcheck.pytorch.hazard_scenarios  # noqa: F401
    except ImportError:
        pass
    try:
        import optcheck.pytorch.memory_scenarios  # noqa: F401
    except ImportError:
        pass


def check(name: str) -> None:
    """Raise InputError unless ``name`` is a scenario PyTorch can inject."""
    catalogue.get(name, "pytorch")
    _load_all()
    if name not in IMPLEMENTATIONS:
        from optcheck.errors import InputError

        raise InputError(f"scenario {name!r} has no PyTorch implementation yet")


def needs_untied(name: str) -> bool:
    """True when the model must be built with separate embedding and head weights."""
    return name in NEEDS_UNTIED


def apply(name: str, trainer, step: int) -> dict:
    check(name)
    return IMPLEMENTATIONS[name](trainer, step)


@implements("param-rebind")
def param_rebind(trainer, step: int) -> dict:
    # assign=True makes the loaded tensors the module's parameters: new objects, new data
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.model.load_state_dict(state, assign=True)
    return {"call": "model.load_state_dict(state_dict, assign=True)"}


@implements("tie-after-optimizer")
def tie_after_optimizer(trainer, step: int) -> dict:
    trainer.model.wte.weight = trainer.model.lm_head.weight
    return {"call": "model.wte.weight = model.lm_head.weight"}


@implements("param-replaced")
def param_replaced(trainer, step: int) -> dict:
    lin = trainer.model.h[0].mlp.c_fc
    lin.weight = nn.Parameter(lin.weight.detach().clone())
    return {"call": "model.h[0].mlp.c_fc.weight = nn.Parameter(...)"}


@implements("module-to-after-optimizer")
def module_to(trainer, step: int) -> dict:
    trainer.model.to(torch.float64)
    return {"call": "model.to(torch.float64)"}


@implements("param-registered-late")
def param_registered_late(trainer, step: int) -> dict:
    ln = trainer.model.ln_f
    ln.register_parameter("gain", nn.Parameter(torch.ones_like(ln.weight)))
    orig = type(ln).forward

    def forward(x, _ln=ln):  # the new parameter takes part in the forward
        return orig(_ln, x) * _ln.gain

    ln.forward = forward
    return {"call": "model.ln_f.register_parameter('gain', nn.Parameter(...))"}


@implements("perturb-param")
def perturb_param(trainer, step: int) -> dict:
    w = trainer.model.h[0].mlp.c_fc.weight
    with torch.no_grad():  # in place: same tensor, same data pointer; only the values move
        w.mul_(1.001)
    return {"call": "model.h[0].mlp.c_fc.weight *= 1.001 (test-only perturbation)"}


@implements("no-zero-grad")
def no_zero_grad(trainer, step: int) -> dict:
    trainer.zero_grad = False
    return {"call": "optimizer.zero_grad() no longer called"}
