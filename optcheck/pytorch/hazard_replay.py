"""A step run unarmed, re-run armed when the hazard probes ask (``mode="auto"``, docs/hazards.md).

The hazard probes arm their module and saved-tensor hooks on the steps that need them
only (``optcheck/pytorch/hazards/arming.py``). When a step that ran unarmed fails with
PyTorch's "modified by an inplace operation" error, stops on a loss without ``grad_fn``,
or leaves parameters without the gradient they had at the previous step, the soak runs
it again armed — same batch, the RNG state of its start, gradients cleared; the optimizer
has not stepped — so that the finding names the write site, module and line at this
step. :func:`run_step` is that policy, written once, with the probes it asks.
"""

from __future__ import annotations

from typing import Callable

import torch

from optcheck.errors import StepStopped
from optcheck.pytorch.hazards.arming import pytorch_inplace_error


def run_step(hazards, step: int, forward_backward: Callable[[], torch.Tensor],
             clear_grads: Callable[[], None] | None) -> torch.Tensor:
    """Run ``forward_backward()`` (forward and ``backward()`` of step ``step``) and return its
    loss; re-run it armed when the ``hazards`` probes ask (see the module docstring).
    ``clear_grads`` clears the gradients before the re-run; None means they must not be
    cleared (the ``no-zero-grad`` scenario keeps earlier steps' gradients in ``.grad``):
    no re-run then, the probes' next-step confirmation applies.

    Raises:
        optcheck.errors.StepStopped: a hazard stopped the step (the armed run's, when re-run).
        RuntimeError: PyTorch's own failure that no probe explains.
    """
    replayable = clear_grads is not None and hazards.can_replay
    rng = torch.get_rng_state() if replayable else None
    first: BaseException | None = None
    try:
        loss = forward_backward()
        replay = replayable and not hazards.armed and hazards.end_step(step)  # (armed: this step's state)
    except StepStopped as e:  # unarmed: a loss without grad_fn (the armed run names the module)
        if not (replayable and not hazards.armed):
            raise
        replay, first = True, e
    except RuntimeError as e:  # unarmed: PyTorch's version check (the armed run names the write)
        if not (replayable and not hazards.armed and pytorch_inplace_error(e)):
            hazards.backward_failed(e, step)
            raise
        replay, first = True, e
    if not replay:
        return loss
    torch.set_rng_state(rng)
    clear_grads()
    hazards.replay(step)
    try:
        loss = forward_backward()
    except StepStopped as e:
        e.event["detail"]["replayed"] = True
        if pytorch_inplace_error(first) and e.event["kind"] == "inplace_on_saved":
            e.event["detail"]["pytorch_error"] = str(first).split("\n", 1)[0]  # what PyTorch said
        raise
    except RuntimeError as e:
        hazards.backward_failed(e, step)
        raise
    if isinstance(first, StepStopped):  # the armed run did not reproduce it: report the unarmed one
        raise first
    if first is not None:
        hazards.backward_failed(first, step)
        raise first
    hazards.end_step(step)
    return loss
