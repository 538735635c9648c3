"""One rank's row of the cross-rank table, as a fixed-size int64 tensor, and back.

The layout is fixed when the Monitor attaches (the parameter and buffer names of
the model then, in ``named_parameters()`` order — the same on every rank under DDP,
which checks it at construction, and under ``fully_shard``), so every rank's
tensor has the same length and one ``all_gather`` exchanges them all::

    [rank, step, iteration, groups_keys, groups_options,      # header (HEADER values)
     checksum x P, grad count x P, state step x P, buffer checksum x B]

- checksum: ``optcheck.pytorch.probe.checksum`` of the values this rank holds
  (under FSDP2 its local shard, ``DTensor.to_local()``): the sum of the raw bit
  patterns, exact and independent of thread count; :data:`NONE` when there is none.
- grad count: backward passes since the last exchange in which autograd
  accumulated a gradient into the parameter on this rank
  (``Tensor.register_post_accumulate_grad_hook``, torch ≥ 2.1; it runs before
  DDP's all-reduce writes the averaged gradient).
- state step: ``optimizer.state[p]["step"]``, :data:`NONE` before the first step;
  :data:`EMPTY` where this rank's shard holds none of the parameter (FSDP1 with
  ``use_orig_params=True`` leaves such a parameter an empty view: no gradient, no state
  here, by design), decoded as the row's ``empty`` list of names, which the rules skip.
- groups_keys / groups_options: CRC-32 of the param groups' key names and member
  names, and of their option values (JSON, sorted keys): equal on every rank when
  the optimizers agree.

A parameter replaced after attaching is looked up by name (the new object);
a name that disappeared reads :data:`NONE`.
"""

from __future__ import annotations

import json
import zlib

import torch

from optcheck.distributed.shards import local
from optcheck.pytorch.names import model_name, under_fsdp1
from optcheck.pytorch.probe import checksum, jsonable

HEADER = 5
NONE = -(2**63)  # "no value": no storage to sum, no state yet, no such name
EMPTY = NONE + 1  # state step of a parameter this rank's shard holds none of (FSDP1, use_orig_params=True)


def crc(obj) -> int:
    return zlib.crc32(json.dumps(obj, sort_keys=True, default=repr).encode())


def group_records(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> list[dict]:
    """Per param group: its key names, member names (by ``id`` → model name; ``?`` for
    one the model does not hold) and option values (JSON-able)."""
    out = []
    for g in optimizer.param_groups:
        out.append({"keys": sorted(k for k in g if k != "param_names"),
                    "members": [names.get(id(p), "?") for p in g["params"]],
                    "options": {k: jsonable(v) for k, v in g.items() if k not in ("params", "param_names")}})
    return out


def row(*, rank: int, step: int, iteration: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
        params: list[str], buffers: list[str], grad_counts: dict[str, int]) -> tuple[torch.Tensor, list[dict]]:
    """This rank's row (int64, length ``HEADER + 3 * len(params) + len(buffers)``) and
    its group records (kept for the detail exchange when hashes differ)."""
    raw = list(model.named_parameters())
    named = {model_name(n): p for n, p in raw}
    empty = {model_name(n) for n, p in raw if under_fsdp1(n) and p.numel() == 0}  # FSDP1: no element here
    named_buffers = {model_name(n): b for n, b in model.named_buffers()}
    ids = {id(p): n for n, p in named.items()}
    groups = group_records(optimizer, ids)
    keys = crc([(g["keys"], g["members"]) for g in groups])
    options = crc([g["options"] for g in groups])
    sums: list[torch.Tensor | int] = []
    steps: list[int] = []
    for n in params:
        p = named.get(n)
        c = checksum(local(p)) if p is not None else None
        sums.append(c.long() if c is not None else NONE)
        s = optimizer.state.get(p) if p is not None else None
        v = s.get("step") if s else None
        steps.append(EMPTY if n in empty else
                     int(v.item() if isinstance(v, torch.Tensor) else v) if v is not None else NONE)
    for n in buffers:
        b = named_buffers.get(n)
        c = checksum(local(b)) if b is not None else None
        sums.append(c.long() if c is not None else NONE)
    tensors = [s if isinstance(s, torch.Tensor) else torch.tensor(s, dtype=torch.int64) for s in sums]
    values = torch.stack(tensors).tolist() if tensors else []  # one read of all checksums
    checks, buf = values[:len(params)], values[len(params):]
    head = [rank, step, iteration, keys, options]
    flat = head + checks + [grad_counts.get(n, 0) for n in params] + steps + buf
    return torch.tensor(flat, dtype=torch.int64), groups


def decode(rows: list[torch.Tensor], params: list[str], buffers: list[str]) -> list[dict]:
    """Gathered rows → the ``rows`` of the snapshot's ``ranks`` field (JSON, :data:`NONE` as None)."""
    p = len(params)
    out = []
    for t in rows:
        raw = t.tolist()
        v = [None if x == NONE else x for x in raw]
        body = v[HEADER:]
        steps = body[2 * p:3 * p]
        row = {"rank": v[0], "step": v[1], "iteration": v[2], "groups_keys": v[3], "groups_options": v[4],
               "checksums": body[:p], "grads": body[p:2 * p], "state_steps": [None if x == EMPTY else x for x in steps],
               "buffers": body[3 * p:3 * p + len(buffers)]}
        empty = [params[i] for i, x in enumerate(steps) if x == EMPTY]
        if empty:
            row["empty"] = empty
        out.append(row)
    return out
