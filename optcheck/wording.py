"""Sentences shared by a probe and a rule, so that what stops a step and the finding
written for it say the same thing (no torch import: the rules run in TorchSharp workers
too).

- :func:`describe_inplace`: OC301's finding and the ``StepStopped`` raised by the PyTorch
  hazard probes (``optcheck/pytorch/hazards/``) for an ``inplace_on_saved`` event.
"""

from __future__ import annotations


def describe_inplace(event: dict) -> str:
    """The one sentence for an ``inplace_on_saved`` event (a schema-1 event dict):
    used by OC301's finding and by the ``StepStopped`` the PyTorch probes raise, so
    both name the same write site. The write site is ``detail.written.where`` (the
    statement that wrote in place); when the probes could not find it, the sentence
    says so and gives the window it happened in, never the line that saved the tensor. A
    write the probes saw (``detail.written.seen``) carries the op, the innermost frame outside
    torch (``where``, ``code``) and up to three more (``stack``), and the phase of the step."""
    d = event.get("detail") or {}
    t, saved, written = d.get("tensor") or {}, d.get("saved_by") or {}, d.get("written") or {}
    if d.get("found_by") == "pytorch" and d.get("rerun") == "forward":  # named by the armed re-run
        return (describe_inplace({**event, "detail": {**d, "found_by": None}}) +
                "; found by PyTorch's own version check in backward() on a step optcheck's probes did not watch, "
                "named by re-running the step's forward with them")
    if d.get("found_by") == "pytorch":  # PyTorch's own check fired: the probes were not armed on this step
        made = f", output {t.get('output_nr')} of {t['grad_fn']}," if t.get("grad_fn") else ""
        why = ("the probes' hooks did not see it (saved outside the step they watch)" if d.get("armed") else
               "optcheck's probes were not armed on this step, and re-running the step's forward with them "
               "showed no write inside the model's forward: it is outside it (the loop between the forward and "
               "backward(), a loss function, a hook in backward()), or depends on state the re-run does not "
               "restore (Monitor(hazards=\"always\") or soak --hazards always names it)"
               if str(d.get("rerun", "")).startswith("forward:") else
               "optcheck's probes were not armed on this step (Monitor(hazards=\"always\") or soak "
               "--hazards always names them)")
        return (f"{t.get('type') or 'tensor'} {t.get('shape')}{made} saved for backward was written in place "
                f"before backward() used it (version {d.get('saved_version')} -> {d.get('version')}; found by "
                f"PyTorch's own version check in backward()); the op, module and line that wrote it are not "
                f"known: {why}")
    if saved.get("kept_by"):  # an input a checkpoint keeps for its recompute (pytorch/hazards/checkpoints.py)
        saved_part = (f"{t.get('type') or t.get('dtype', 'tensor')} {t.get('shape')} kept by "
                      f"{saved['kept_by']} for its recompute ({saved.get('argument')}; checkpoint called "
                      + (f"in {saved['module']}" if saved.get("module") else "outside every module")
                      + f" at {saved.get('where') or 'a line not known'})")
    else:
        saved_part = (f"{t.get('type') or t.get('dtype', 'tensor')} {t.get('shape')} saved by "
                      f"{saved.get('op') or 'an op'} "
                      + (f"in {saved['module']}" if saved.get("module") else "outside every module")
                      + f" ({saved.get('where') or 'line not known'})")
    versions = f"(version {d.get('saved_version')} -> {d.get('version')})"
    if written.get("where"):
        msg = (f"{saved_part} was written in place by {written.get('op') or 'an in-place op'} at {written['where']}"
               + (f": {written['code']}" if written.get("code") else "")
               + f" ({_phase_text(written, d)}) {versions}")
        outer = (written.get("stack") or [])[1:3]
        if outer:
            msg += "; called from " + " <- ".join(outer)
    else:
        if str(written.get("detected_at", "")).startswith("unpack") and not written.get("between"):
            window = "before backward() needed it"
        else:
            window = f"between {written['between']}" if written.get("between") else "at an unseen place"
        msg = (f"{saved_part} was written in place {versions}; the write itself was not seen (not a torch call "
               f"made from Python while the probes watched: an op of a C++ extension or torch.ops, a tensor hook "
               f"or a custom Function's backward inside backward()); it happened {window}"
               + (f", inside {written['module']}" if written.get("module") else ""))
    if str(d.get("phase", "")).startswith("backward") and "recompute" not in msg:
        msg += " (during the checkpoint recompute in backward)"
    if d.get("parameter"):
        msg += (f"; it is (a view of) {d['parameter']}" if written.get("where") else
                f"; it is (a view of) {d['parameter']}: an optimizer.step() or a weight load between "
                f"this forward and its backward() wrote it")
    return msg


def _phase_text(written: dict, d: dict) -> str:
    """Where in the step a seen write ran: a module's forward, the loop, a recompute."""
    phase, module = str(written.get("phase") or ""), written.get("module")
    if phase.startswith("backward"):
        how = {"non-reentrant": "a non-reentrant checkpoint's", "reentrant": "a reentrant checkpoint's"}.get(
            d.get("checkpoint"), "a checkpoint's")
        return (f"in {how} recompute of {module}'s forward during backward()" if module else
                "during backward(), outside every module")
    if phase == "forward":
        return f"in {module}'s forward" if module else "in the forward"
    if phase.startswith("after"):
        return "outside the model, after its forward and before backward(): the training loop"
    if phase.startswith("before"):
        return "outside the model, before its forward"
    return phase or "in the step"
