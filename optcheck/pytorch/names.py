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
