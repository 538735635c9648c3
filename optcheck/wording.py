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
    says so and gives the window it happened in, never the line that saved the tensor."""
    d = event.get("detail") or {}
    t, saved, written = d.get("tensor") or {}, d.get("saved_by") or {}, d.get("written") or {}
    if d.get("found_by") == "pytorch":  # PyTorch's own check fired: the probes were not armed on this step
        made = f", output {t.get('output_nr')} of {t['grad_fn']}," if t.get("grad_fn") else ""
        why = ("the probes' hooks did not see it (saved outside the step they watch)" if d.get("armed") else
               "optcheck's probes were not armed on this step (Monitor(hazards=\"always\") or soak "
               "--hazards always names them)")
        return (f"{t.get('type') or 'tensor'} {t.get('shape')}{made} saved for backward was written in place "
                f"before backward() used it (version {d.get('saved_version')} -> {d.get('version')}; found by "
                f"PyTorch's own version check in backward()); the op, module and line that wrote it are not "
                f"known: {why}")
    if written.get("where"):
        where = written["where"]
    elif str(written.get("detected_at", "")).startswith("unpack"):
        where = "a line before backward() (found when backward needed it)"
    else:
        where = "an unknown line" + (f" ({written['between']})" if written.get("between") else "")
    msg = (f"{t.get('type') or t.get('dtype', 'tensor')} {t.get('shape')} saved by {saved.get('op') or 'an op'} "
           f"in {saved.get('module') or '?'} ({saved.get('where') or '?'}) was written in place by "
           f"{written.get('module') or 'code outside the model'} at {where} "
           f"(version {d.get('saved_version')} -> {d.get('version')})")
    if written.get("code"):
        msg += f": {written['code']}"
    if str(d.get("phase", "")).startswith("backward"):
        msg += " (during the checkpoint recompute in backward)"
    if d.get("parameter"):
        msg += (f"; it is (a view of) {d['parameter']}: an optimizer.step() or a weight load between "
                f"this forward and its backward() wrote it")
    return msg
