"""The model's own names for parameters, buffers and modules seen through wrappers.

Wrappers that keep the user's module as a child add a level to every name below them:

- ``torch.compile``: ``OptimizedModule`` keeps the model as ``_orig_mod``
  (``torch/_dynamo/eval_frame.py``);
- FSDP1, ``torch.distributed.fsdp.FullyShardedDataParallel``: each FSDP unit keeps its
  module as ``_fsdp_wrapped_module`` (``FSDP_WRAPPED_MODULE``,
  ``torch/distributed/fsdp/_common_utils.py``), so a parameter of a model wrapped at the
  root and per block reads ``_fsdp_wrapped_module.layers.0._fsdp_wrapped_module.attn.q.weight``;
  FSDP1's own ``named_parameters`` strips it only inside ``summon_full_params``;
- ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper`` (activation
  checkpointing, used with FSDP1): ``_checkpoint_wrapped_module``
  (``_CHECKPOINT_WRAPPED_MODULE``, ``checkpoint_wrapper.py``).

:func:`model_name` drops those levels: ``layers.0.attn.q.weight``, the name in the user's
model. An FSDP1 flat parameter (``use_orig_params=False``) keeps its own name,
``_flat_param``, under the unit that holds it.
"""

from __future__ import annotations

#: the levels wrappers add (see the module docstring)
WRAPPER_LEVELS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")
FSDP1_LEVEL = "_fsdp_wrapped_module"


def model_name(name: str) -> str:
    """``name`` (``named_parameters``/``named_modules``/``named_buffers``) without the levels
    of :data:`WRAPPER_LEVELS`; ``""`` for the root itself."""
    if "_orig_mod" not in name and "_wrapped_module" not in name:
        return name
    return ".".join(part for part in name.split(".") if part not in WRAPPER_LEVELS)


def under_fsdp1(name: str) -> bool:
    """The raw name (before :func:`model_name`) lies below an FSDP1 unit, which shards it."""
    return FSDP1_LEVEL in name


def fsdp1_hidden(named: list[tuple[str, object]]) -> list[str]:
    """What FSDP1 hides from the per-parameter checks, one line each (the run's
    ``not_checked``), from the model's raw ``named_parameters()``: with
    ``use_orig_params=False`` the optimizer and the model hold one flat parameter per unit
    (``_flat_param``), not the model's parameters."""
    flat = [model_name(n) for n, _ in named if under_fsdp1(n) and n.rsplit(".", 1)[-1] == "_flat_param"]
    if not flat:
        return []
    return [f"FSDP1 (use_orig_params=False): the model and the optimizer hold {len(flat)} flat parameter(s) "
            f"({', '.join(flat[:4])}{', ...' if len(flat) > 4 else ''}), not the model's own parameters: the "
            f"per-parameter checks (gradients, state, references) see the flat parameters; a layer's own "
            f"parameters are named only when it is replaced or added (use_orig_params=True names them all)"]
