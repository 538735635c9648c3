"""Autograd hazard probes: catch, at the step and the line where they happen, the
bugs that PyTorch reports late (at ``backward()``) or never.

:class:`HazardProbes` works on any ``nn.Module`` + optimizer. It implements the
hook interface of :class:`optcheck.pytorch.null_hazards.NullHazards`:

- ``step_context(step)``: a context manager around forward *and* backward of one
  step (saved-tensor hooks + per-module flags are live inside it only, so
  ``torch.no_grad()`` evaluation passes between steps are not looked at);
  ``begin_step(step)`` / ``finish_step()`` do the same for a driver that enters and
  leaves each step from its own hooks (``optcheck.Monitor``);
- ``check_loss(loss, step, value=None)``: before ``loss.backward()``;
- ``after_backward(step)``: after ``backward()``, before ``optimizer.step()``;
- ``has_events()`` / ``drain()``: events (schema-1 Event dicts
  ``{kind, step, where, count, detail}``) recorded since the last drain;
- ``remove()``: unhook everything.

Armed on demand (``mode="auto"``, the default; ``arming.py``, docs/hazards.md): the
module and saved-tensor hooks and the write log's mode below are installed on the steps that need them only —
the first, the one after each snapshot, one whose modules changed, the one after
parameters lost their gradients, and every step once a non-reentrant checkpoint or other
saved-tensor hooks are seen. On the other steps PyTorch's own version check finds an
in-place write (:meth:`HazardProbes.backward_failed` turns its error into the OC301
event), and the loss, gradient NaN/Inf, non-leaf ``.grad`` and gradient-arrival checks
run as always; when PyTorch's error comes on an unarmed step, the step's forward passes are re-run
armed (``replay.py``) to name the writer. ``mode="always"`` arms every step.

What is recorded (event ``kind`` → rule):

``inplace_on_saved`` (OC301)
    Every tensor autograd saves for backward is recorded by a
    ``torch.autograd.graph.saved_tensors_hooks`` pack hook with its version counter
    (``Tensor._version``), the module that was running and the user source line of
    the op; the unpack hook compares the version. Installing these hooks switches
    off PyTorch's own version check (docs/hazards.md; ``torch/csrc/autograd/saved_variable.cpp``
    skips ``version_counter`` checks when hooks are set), so a mutated saved tensor
    would otherwise flow into backward silently. The *write* is seen as it
    happens: a ``__torch_function__`` mode (``writes.py``), armed with the hooks,
    hands every in-place torch call (``add_``, ``index_copy_``, ``x[i] = v``, ``+=``,
    ``out=``, ``inplace=True``) with its frame to the probe, which logs it by the
    storage it wrote and compares the saved tensors' versions: the op, its
    ``file:line`` (the innermost frame outside torch: the user's or the library's
    call), the frames around it, the module running and the phase of the step.
    The versions are also compared at every module forward pre- and post-hook (a
    C-level ``sum(map(...))``, ~35 ns per saved tensor), at ``check_loss`` and at
    unpack: a write the mode cannot see is reported with the window it happened
    in, never with a guessed line. By default the step stops at the first hook
    after the write with
    :class:`optcheck.errors.StepStopped` (the forward is aborted; no wrong
    gradient is ever computed). With ``allow_inplace=True`` the event is recorded
    and the run continues: backward then uses the *written* values (what PyTorch
    would have refused with "one of the variables needed for gradient computation
    has been modified by an inplace operation"). The finding and the exception share one
    sentence (``optcheck.rules.autograd.describe_inplace``). Inside a non-reentrant
    checkpoint's recompute, ``torch.utils.checkpoint``'s own saved-tensor hooks are
    innermost: the probes compose theirs with it (docs/hazards.md).

``graph_cut`` (OC203)
    Full cut: ``check_loss`` sees a loss without ``grad_fn``; it raises
    ``StepStopped`` (instead of backward's "element 0 of tensors does not require
    grad and does not have a grad_fn"), naming the first module whose floating
    output lost ``grad_fn`` although its inputs or parameters require grad, and
    whether autograd was recording. Partial cut: a module's output lost
    ``grad_fn`` (or a module received a detached alias — same data pointer — of an
    earlier module's output in the same call of the model) and, after
    backward, optimizer parameters at or before it got no gradient: recorded, the
    step goes on. Leaf loss: the loss is a new leaf that requires grad
    (``torch.tensor(loss.item(), requires_grad=True)``, written to make the
    error above go away): ``backward()`` runs and no parameter gets a gradient;
    recorded, the step goes on. Cut records are kept per forward pass and judged only
    when that pass's output reaches a backward (its graph, or an op that saved it) or
    the loss: a validation, generation, EMA or teacher forward is not a cut.

Modules assigned after the probes start are hooked and every name follows the
model's current structure (a module-registration hook and a children count mark it
stale; ``named_modules()`` is re-scanned then). Under ``torch.compile`` the module
hooks do nothing inside the compiled forward (no graph break); see
:data:`NOT_CHECKED_UNDER_COMPILE`.

``nonleaf_grad_access`` (OC201)
    PyTorch warns "The .grad attribute of a Tensor that is not a leaf Tensor is
    being accessed" (``torch/_tensor.py`` / ``python_variable.cpp``) on every read;
    a ``warnings.showwarning`` wrapper with an ``always`` filter for that message
    counts the reads per source line (and keeps them off stderr).

``nonfinite`` (OC501)
    NaN/Inf in the loss (every step), the gradients (every ``grad_check_every``
    steps, one fused ``torch._foreach_norm``), parameters and optimizer state (at
    each ``drain``, i.e. each snapshot).

OC202 (grad-starved) needs no event: the snapshot's params carry ``grad``.

Layout: ``hooks.py`` installs every hook and dispatches (:class:`HazardProbes`), ``arming.py``
decides which steps are armed, one mixin per probe (``inplace.py``, ``graph_cut.py``, ``nonleaf.py``, ``nonfinite.py``),
``writes.py`` is the mode that sees in-place writes, ``replay.py`` re-runs an unarmed step's forward,
``source.py`` finds user frames and source lines, ``_tensors.py`` holds tensor helpers.
"""

from __future__ import annotations

from optcheck.pytorch.hazards.graph_cut import MAX_EVAL_PASSES
from optcheck.pytorch.hazards.hooks import NOT_CHECKED_UNDER_COMPILE, HazardProbes, _inert_probes  # noqa: F401
from optcheck.pytorch.hazards.nonleaf import NONLEAF_WARNING
from optcheck.pytorch.hazards._tensors import MAX_SAMPLES

# _inert_probes: what models pickled while watched unpickle their hooks with
__all__ = ["HazardProbes", "NONLEAF_WARNING", "NOT_CHECKED_UNDER_COMPILE", "MAX_EVAL_PASSES", "MAX_SAMPLES"]
