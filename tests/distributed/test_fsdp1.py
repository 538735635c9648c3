"""optcheck.Monitor under FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``) on 2 real
ranks (``torch.distributed.run``, gloo, CPU, 1 thread each; issue 46, item 2).

With ``use_orig_params=True`` a rank's view of a parameter outside its shard is empty: it never
has a gradient or optimizer state there (rank 0 of the tiny loop holds part of ``fc1.weight``
only). That was a false OC703 (state steps differ) and a false OC202 (no gradient), and every
name kept FSDP's ``_fsdp_wrapped_module.`` level. Faults are planted inside the loop's own step
(before the forward of iteration 4), on every rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optcheck.record.snapshot import validate

from test_distributed_monitor import findings, first, merged, torchrun

SCENARIOS = ("clean", "replace-layer", "dtype", "skipstep", "unfreeze")


def snapshots(run: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (run / f"rank-{rank}" / "snapshots.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def orig(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp1-orig")
    proc = torchrun(out, "--kind", "fsdp1-orig", "--scenario", ",".join(SCENARIOS), "--steps", "12", "--every", "5")
    assert all((out / s / "summary.json").exists() for s in SCENARIOS), proc.stderr[-3000:]
    return out


def test_clean_fsdp1_use_orig_params_is_silent_with_the_models_names(orig):
    run = orig / "clean"
    for rank in (0, 1):
        assert findings(run, rank) == []  # was OC703 at 6 and OC202 at 12
        snaps = snapshots(run, rank)
        for s in snaps:
            validate(s)
        names = [p["name"] for p in snaps[-1]["params"]]
        assert names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "extra.weight", "extra.bias"]
        t = snaps[-1]["ranks"]
        assert t["kind"] == "fsdp" and t["params"] == names and t["sharded"] == names
    # rank 0's shard holds part of fc1.weight only: the others are empty there, and said so
    last = snapshots(run, 0)[-1]
    empty = [p["name"] for p in last["params"] if p.get("shard_empty")]
    assert empty == ["fc1.bias", "fc2.weight", "fc2.bias", "extra.weight", "extra.bias"]
    assert last["ranks"]["rows"][0]["empty"] == empty and "empty" not in last["ranks"]["rows"][1]
    assert not [p for p in snapshots(run, 1)[-1]["params"] if p.get("shard_empty")]
    assert merged(run)["exit_code"] == 0


def test_a_layer_replaced_under_fsdp1_is_found_at_its_step_with_the_models_names(orig):
    run = orig / "replace-layer"
    for rank in (0, 1):
        for code in ("OC101", "OC102", "OC104"):
            f = first(run, rank, code)
            assert f["step"] == 4 and f["subjects"] == ["fc2.weight", "fc2.bias"], f
    assert merged(run)["exit_code"] == 1


def test_a_skipped_step_on_rank_1_is_still_OC703_under_fsdp1(orig):
    f = first(orig / "skipstep", 0, "OC703")  # skipped in iteration 4; the exchanges: iterations 1, 6, 11
    assert f["step"] == 6 and f["detail"]["ranks"] == [1]
    assert "optimizer-state step of fc1.weight differs on rank 1" in f["message"]


def test_a_cast_inside_fsdp1_is_undone_by_fsdp_and_nothing_is_reported(orig):
    """``fc2.to(float64)`` on the wrapped module: FSDP1 writes the parameters back into its
    float32 flat parameter at the next forward; training goes on in float32 (observed)."""
    run = orig / "dtype"
    for rank in (0, 1):
        assert findings(run, rank) == []
        assert {p["dtype"] for p in snapshots(run, rank)[-1]["params"]} == {"float32"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fsdp1-flat", "fsdp1-orig-grad-op", "fsdp1-flat-grad-op"])
def test_the_other_fsdp1_modes_clean_silent_and_a_replaced_layer_found(kind, tmp_path):
    torchrun(tmp_path, "--kind", kind, "--scenario", "clean,replace-layer", "--steps", "12", "--every", "5")
    for rank in (0, 1):
        assert findings(tmp_path / "clean", rank) == []
        names = [p["name"] for p in snapshots(tmp_path / "clean", rank)[-1]["params"]]
        assert not [n for n in names if "_fsdp_wrapped_module" in n]
        hidden = json.loads((tmp_path / "clean" / f"rank-{rank}" / "summary.json").read_text())["not_checked"]
        assert any("flat parameter(s) (_flat_param)" in n for n in hidden) == ("flat" in kind), hidden
        f = first(tmp_path / "replace-layer", rank, "OC102")  # the new head: in no param group
        assert f["step"] == 4 and f["subjects"] == ["fc2.weight", "fc2.bias"]


def test_a_frozen_layer_unfrozen_under_fsdp1_is_OC102_with_the_models_names(orig):
    """``extra`` frozen when the optimizer was built over the trainable parameters, unfrozen in
    iteration 4: in no param group, never trained. A ``requires_grad`` flip is not part of the
    pre-step check's fingerprint (a plain loop alike): found at the next snapshot, step 5."""
    for rank in (0, 1):
        f = first(orig / "unfreeze", rank, "OC102")
        assert f["step"] == 5 and f["subjects"] == ["extra.weight", "extra.bias"]


@pytest.mark.slow
def test_fsdp1_a_unit_per_layer_under_activation_checkpointing(tmp_path):
    """The fine-tune stack: each layer under torch's ``checkpoint_wrapper`` (non-reentrant) and its
    own FSDP1 unit (``ModuleWrapPolicy``), ``use_orig_params=True``: names carry neither
    ``_fsdp_wrapped_module`` nor ``_checkpoint_wrapped_module`` levels; clean silent, a replaced
    layer named at its step."""
    torchrun(tmp_path, "--kind", "fsdp1-orig-nested", "--scenario", "clean,replace-layer", "--steps", "12",
             "--every", "5")
    for rank in (0, 1):
        assert findings(tmp_path / "clean", rank) == []
        last = snapshots(tmp_path / "clean", rank)[-1]
        assert [p["name"] for p in last["params"]] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                                       "extra.weight", "extra.bias"]
        f = first(tmp_path / "replace-layer", rank, "OC101")
        assert f["step"] == 4 and f["subjects"] == ["fc2.weight", "fc2.bias"]
