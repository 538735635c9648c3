"""An unarmed step's forward passes, re-run armed to name the writer (mixin of
:class:`HazardProbes`; docs/hazards.md, "Unarmed steps").

On an unarmed step only PyTorch's own version check is on: ``backward()`` raises "one of the
variables needed for gradient computation has been modified by an inplace operation",
naming the tensor but not the op or the line. By then the forward has run, so the write can
only be seen again: one forward pre-hook on the watched model (``with_kwargs=True``; the only
module hook of an unarmed step, one call of ``Module._call_impl``'s hook path per forward)
keeps the arguments of the model's calls since the last backward (at most
:data:`MAX_PASSES`, references only). When PyTorch's error comes, those calls are run again,
in order, with every probe armed (module and saved-tensor hooks, the write log's mode), under
the grad mode each had. A write inside the model's forward is then seen with its op and line,
at the step it happened, before ``StepStopped`` is raised.

What the re-run leaves as it was: the RNG (``torch.random.fork_rng``) and the model's buffers
(copied before, written back after). What it changes once more: state the forward keeps
outside buffers (a cache object passed in, a Python counter); only a run that catches
``StepStopped`` and goes on sees that. Not re-run: a compiled model, a job with more than one
rank (a forward may run collectives), a pass whose arguments were written since (the re-run
sees their values now). A write outside the model's forward (the loop between the forward and
``backward()``, a loss function, a hook in backward) is not in the re-run: the finding says so
and names the window.
"""

from __future__ import annotations

import sys

import torch

from optcheck.errors import StepStopped
from optcheck.pytorch.hazards import unsaved
from optcheck.pytorch.hazards.compiled import EntryHook
from optcheck.pytorch.guard import raised_by_signal_handler

MAX_PASSES = 4  # calls of the watched model kept since the last backward


class ForwardReplay:
    """The pass log and the armed re-run (see the module docstring)."""

    def _init_replay(self) -> None:
        self._passes: list[tuple] = []
        self._replay_code = ForwardReplay._replay_passes.__code__  # a write's frames stop there (inplace.py)
        # the model's first hook on every call, outside Dynamo when the call is compiled (compiled.py)
        # (unsaved.py: none of optcheck's hooks in what torch.save, pickle or deepcopy make of the model)
        unsaved.install()
        self._pass_hook = unsaved.own(self.model.register_forward_pre_hook(EntryHook(self, "_log_pass"),
                                                                           with_kwargs=True))

    def _log_pass(self, module, args, kwargs):
        if module is not self.model:
            return None  # (a deepcopy of the model copies this hook: its calls are not the model's)
        if self._hooks_on:  # armed: the module hooks come off the modules that run compiled (arming.py)
            self._leave_compiled(sys._getframe())
        if self.compiled or self._replaying:
            return None
        passes = self._passes
        if len(passes) >= MAX_PASSES:
            del passes[0]
        passes.append((args, kwargs, torch.is_grad_enabled()))
        return None

    def _forget_passes(self) -> None:
        self._passes = []

    def _replay_passes(self) -> dict | None:
        """Re-run the logged passes armed; the event of the first write the probes saw, or None
        (nothing to re-run, or no write seen). Never raises (optcheck's own errors are noted)."""
        passes, self._passes = self._passes, []
        if not passes or self.compiled or self._removed or _ranks() > 1:
            return None
        model = self.model
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
        devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
        state = (self.armed, self.armed_reason, self._active, self._fresh, self.on_stop, self._hooks_on)
        found = None
        self.on_stop, self._replaying = None, True
        try:
            with torch.random.fork_rng(devices=devices):
                self._hooks_on = True
                self._hook_modules()
                self._reset_step()
                self.armed, self._active = True, True
                with torch.autograd.graph.saved_tensors_hooks(self._pack_hook, self._unpack_hook):
                    for args, kwargs, grad in passes:
                        with torch.set_grad_enabled(grad):
                            model(*args, **kwargs)
                    if self._pending is not None:
                        self._raise_pending()
                    self._check_versions("check_loss (the end of the re-run forward)")
        except StepStopped as e:
            found = e.event
        except Exception as e:  # noqa: BLE001 - the re-run is optcheck's, never the user's error
            if raised_by_signal_handler(e):
                raise
            note = f"the armed re-run of the forward failed ({type(e).__name__}: {str(e)[:120]})"
            if note not in self.faults:
                self.faults.append(note)
        finally:
            self._slot.pop()
            self._replaying = False
            (self.armed, self.armed_reason, self._active, self._fresh, self.on_stop, self._hooks_on) = state
            if not self._hooks_on:
                self._unhook_modules()
            self._reset_step()
            with torch.no_grad():
                for b, copy in buffers:
                    if b.shape == copy.shape:
                        b.copy_(copy)
        return found


def _ranks() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
