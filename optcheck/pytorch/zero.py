"""DeepSpeed ZeRO stages 1 and 2 seen through the model's parameters.

``deepspeed.initialize(model=..., optimizer=..., config={"zero_optimization": {"stage": 1|2}})``
returns a ``DeepSpeedEngine`` (an ``nn.Module`` keeping the user's model as ``.module``) and a
``DeepSpeedZeroOptimizer`` (``deepspeed/runtime/zero/stage_1_and_2.py``) wrapping the user's
optimizer as ``.optimizer``. That inner optimizer no longer holds the model's parameters: per
param group it holds one flat fp32 tensor, this rank's partition of the group's parameters laid
end to end (``single_partition_of_fp32_groups[i]``), and its state (``exp_avg``...) is that
partition's. The model's parameters of group ``i`` are ``bit16_groups[i]`` (the same
``Parameter`` objects the model holds, in order); ``engine.step()`` calls the ZeRO optimizer's
``step()``, which reduces the gradients into the partitions, steps the inner optimizer and
copies the partitions back into the parameters (an all-gather).

Read as it is, the inner optimizer steps a tensor the model does not hold (OC101) and holds
none of the model's parameters (OC102), on a clean run. :class:`optcheck.pytorch.unwrap.ZeroOptimizer` shows the ZeRO
optimizer as what it trains: param group ``i`` holds ``bit16_groups[i]`` with the inner group's
options (a scheduler's ``lr`` seen as set), so a layer replaced, a parameter registered late
or a member frozen is named with the model's names. What ZeRO hides is said once in the run's
``not_checked`` (:func:`hidden`): per-parameter optimizer state does not exist
(the state of a partition spans several parameters, parts of them), so the checks of state
against parameters (OC103, OC107, OC108: a dtype change included) do not run; and since ZeRO
moves each gradient out of ``.grad`` into its partitions during backward, neither does OC207
(gradients cleared before ``step()``).

Stage 3 (``DeepSpeedZeroOptimizer_Stage3``) partitions the parameters themselves and is not
read here (``docs/optimizers.md``).
"""

from __future__ import annotations

#: what marks a ZeRO stage 1/2 optimizer (deepspeed/runtime/zero/stage_1_and_2.py)
MARKS = ("bit16_groups", "single_partition_of_fp32_groups", "optimizer")


#: what marks a ZeRO stage 3 optimizer (deepspeed/runtime/zero/stage3.py)
MARKS3 = ("fp16_groups", "fp32_partitioned_groups_flat", "optimizer")


def is_zero(obj: object) -> bool:
    """A DeepSpeed ZeRO optimizer (``DeepSpeedZeroOptimizer``, stages 1/2, or
    ``DeepSpeedZeroOptimizer_Stage3``), by its attributes and module (deepspeed itself is not
    imported)."""
    return type(obj).__module__.startswith("deepspeed.") and (all(hasattr(obj, a) for a in MARKS)
                                                              or all(hasattr(obj, a) for a in MARKS3))


def stage(obj: object) -> int | None:
    """The ZeRO stage a ZeRO optimizer runs, read from it (stage 3: its partitioned fp32 groups;
    ``partition_gradients``: True at stage 2), None when unreadable."""
    if hasattr(obj, "fp32_partitioned_groups_flat"):
        return 3
    pg = getattr(obj, "partition_gradients", None)
    return None if pg is None else 2 if pg else 1


def model_groups(obj: object) -> list:
    """The model's parameters of each param group: ``bit16_groups`` (stages 1/2) or
    ``fp16_groups`` (stage 3), ZeRO's own lists."""
    return obj.fp16_groups if stage(obj) == 3 else obj.bit16_groups


def partitions(obj: object) -> list:
    """This rank's flat fp32 partition of each param group (what the inner optimizer steps)."""
    return obj.fp32_partitioned_groups_flat if stage(obj) == 3 else obj.single_partition_of_fp32_groups


def hidden(obj: object) -> list[str]:
    """What ZeRO hides from the checks, one line each (the run's ``not_checked``)."""
    parts = partitions(obj)
    n = sum(t.numel() for t in parts)
    return [f"DeepSpeed ZeRO stage {stage(obj) or '1/2'}: the optimizer state is kept per flat partition "
            f"({len(parts)} tensor(s), {n} elements on this rank), not per parameter: the checks of optimizer "
            f"state against parameters (OC103, OC107, OC108; a dtype change) do not run",
            "DeepSpeed ZeRO moves each gradient out of .grad into its partitions during backward: whether the "
            "gradients were cleared before optimizer.step() (OC207) is not checked"]
