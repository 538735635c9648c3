"""PyTorch against TorchSharp judged as a migration (issue 28 item 4), on real records:
``tests/fixtures/parity/`` holds the two 20,000-step runs of the built-in GPT from the same
initial weights and batches (PyTorch 2.13.0, TorchSharp 0.107.0 on libtorch 2.10; every
metrics line, 6 of the 201 snapshots; README there). Their losses agree to 7 digits for
~1,000 steps and drift apart from ~6,900 (rounding): healthy, so the pair passes, with the
policy named; the same pair with a fault planted in one side's records fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli
from optcheck.run import exitcodes
from optcheck.judge.compare import compare_runs
from optcheck.errors import InputError
from optcheck.judge.policy import MIGRATION, RERUN, choose, option_differences
from optcheck.judge.verdict import DIVERGED, WITHIN_SEED_BAND

PAIR = Path(__file__).resolve().parents[1] / "fixtures" / "parity"
PT, TS = PAIR / "pytorch-2.13.0", PAIR / "torchsharp-0.107.0"


@pytest.fixture(scope="module")
def clean():
    return compare_runs(PT, TS)


def test_the_healthy_pair_passes_as_a_migration(clean):
    v = clean.verdict
    assert clean.exit_code == exitcodes.CLEAN and clean.policy == MIGRATION, clean.render()
    assert v.kind == WITHIN_SEED_BAND and v.basis == "migration" and v.policy_why == "backends differ: pytorch vs torchsharp"
    assert v.steps == 20_000 and v.smoothing == 50 and 0.005 < v.max_rel_diff < 0.02  # 1.3 % at worst
    assert 1_000 < v.rounding_until < 7_000  # float-rounding agreement holds for thousands of steps
    text = clean.render()
    assert text.splitlines()[1].startswith("WITHIN THE SEED BAND (migration, backends differ: pytorch vs torchsharp: "
                                           "inside 0.03 + 5% of A's 50-step trailing mean)")
    assert "  policy: migration (backends differ: pytorch vs torchsharp)" in text
    assert text.rstrip().endswith("PASS (exit 0)")
    # PyTorch-only options are listed, not compared; the shared ones agree (0 == False across backends)
    assert v.where.options == [] and "foreach (A only)" in v.where.not_compared
    assert "options not compared (one side only): capturable (A only)" in text


def _copy_pair(tmp_path) -> tuple[Path, Path]:
    a, b = tmp_path / PT.name, tmp_path / TS.name
    shutil.copytree(PT, a)
    shutil.copytree(TS, b)
    for f in (*a.iterdir(), *b.iterdir()):
        f.chmod(0o644)
    return a, b


def test_a_diverging_loss_in_one_side_fails(tmp_path):
    """TorchSharp's loss raised by 20 % from step 12,000 (a training bug late in the run)."""
    a, b = _copy_pair(tmp_path)
    lines = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    for m in lines:
        if m["step"] >= 12_000:
            m["loss"] *= 1.2
    (b / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    res = compare_runs(a, b)
    v = res.verdict
    assert res.exit_code == exitcodes.FINDINGS and v.kind == DIVERGED and v.basis == "migration", res.render()
    assert 12_000 <= v.first_step < 12_050 and res.findings[0].code == "OC601"
    assert res.render().splitlines()[1].startswith(f"DIVERGED from step {v.first_step:,}: 50-step trailing-mean loss")


def test_a_finding_in_one_side_fails(tmp_path):
    a, b = _copy_pair(tmp_path)
    finding = {"code": "OC101", "symbol": "stale-param", "severity": "error", "step": 8000, "phase": "pre-step",
               "subjects": ["h.0.mlp.c_fc.weight"], "message": "planted", "backend": "torchsharp"}
    (b / "findings.jsonl").write_text(json.dumps(finding) + "\n")
    res = compare_runs(a, b)
    assert res.verdict.kind == WITHIN_SEED_BAND and [f["code"] for f in res.only_in_b] == ["OC101"]
    assert res.exit_code == exitcodes.FINDINGS and "FAIL (exit 1): findings only in B" in res.render()


def test_a_shared_option_that_differs_fails(tmp_path):
    """TorchSharp trained with another weight decay: an option both backends have."""
    a, b = _copy_pair(tmp_path)
    snaps = [json.loads(x) for x in (b / "snapshots.jsonl").read_text().splitlines()]
    for s in snaps:
        s["groups"][0]["options"]["weight_decay"] = 0.01
    (b / "snapshots.jsonl").write_text("".join(json.dumps(s) + "\n" for s in snaps))
    res = compare_runs(a, b)
    assert res.exit_code == exitcodes.FINDINGS, res.render()
    assert res.mismatch == ["options differ where both sides have them, at snapshot step 0: weight_decay 0.1 vs "
                            "0.01 on group 0"]


def test_rerun_policy_on_the_pair_is_what_it_was(clean, tmp_path):
    """Forced to the rerun policy the pair fails on float rounding (OC601 from step 4,700), as
    optcheck compare did before the policies: the policy, not the records, decides."""
    res = compare_runs(PT, TS, policy=RERUN)
    assert res.exit_code == exitcodes.FINDINGS and res.verdict.basis == "same-seed"
    assert res.verdict.first_step == clean.verdict.rounding_until


def test_compare_cli_names_the_policy_and_refuses_different_steps(tmp_path):
    rc, out, err = run_cli(["compare", str(PT), str(TS)])
    assert rc == exitcodes.CLEAN and "policy: migration" in out, out + err
    a, b = _copy_pair(tmp_path)
    s = json.loads((b / "summary.json").read_text())
    s["config"]["steps"] = 10_000
    (b / "summary.json").write_text(json.dumps(s))
    rc, out, err = run_cli(["compare", str(a), str(b)])
    assert rc == exitcodes.USAGE and "different --steps (20,000 vs 10,000)" in err and "schedule" in err
    assert "Traceback" not in err and out == ""


def test_choose_policy_from_versions():
    pt = {"backend": "pytorch", "versions": {"torch": "2.13.0+cpu"}}
    assert choose(pt, pt) == (RERUN, "same backend and native library (pytorch 2.13.0+cpu)")
    new = {"backend": "pytorch", "versions": {"torch": "2.14.1+cu130"}}
    assert choose(pt, new) == (MIGRATION, "torch 2.13.0+cpu vs 2.14.1+cu130")
    ts = {"backend": "torchsharp", "versions": {"libtorch": "2.10.0.0"}}
    assert choose(pt, ts)[0] == MIGRATION and choose(pt, new, "rerun")[0] == RERUN
    with pytest.raises(ValueError):
        choose(pt, pt, "lenient")


def test_a_pair_on_one_libtorch_is_said_to_share_its_native_library(tmp_path):
    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    pt = {"backend": "pytorch", "versions": {"torch": "2.13.0+cpu", "libtorch_lib": str(lib)}}
    ts = {"backend": "torchsharp", "versions": {"libtorch": "2.13.0+cpu", "libtorch_lib": str(lib / ".." / "lib"),
                                                "torchsharp_libtorch": "2.10.0.0"}}
    policy, why = choose(pt, ts)
    assert policy == MIGRATION and why == (f"backends differ: pytorch vs torchsharp, on the same native library, "
                                           f"libtorch 2.13.0+cpu ({lib})")
    # another folder, another release, or a run that does not say: no such claim
    other = {**ts, "versions": {**ts["versions"], "libtorch_lib": str(tmp_path)}}
    older = {**ts, "versions": {**ts["versions"], "libtorch": "2.10.0"}}
    for b in (other, older, {"backend": "torchsharp", "versions": {"libtorch": "2.13.0+cpu"}}):
        assert choose(pt, b) == (MIGRATION, "backends differ: pytorch vs torchsharp")


ONE_LIBTORCH = Path(__file__).resolve().parents[1] / "fixtures" / "parity-one-libtorch"


def test_the_pair_on_one_libtorch_names_the_shared_library_and_stays_a_migration():
    """tests/fixtures/parity-one-libtorch: the same soak with TorchSharp over PyTorch's own libtorch. compare says the
    two share their native library, and judges the pair as a migration (it leaves float-rounding agreement as
    early as the pair across libtorch builds: the optimizers round differently, README there)."""
    res = compare_runs(ONE_LIBTORCH / "pytorch-2.13.0", ONE_LIBTORCH / "torchsharp-0.107.0")
    v = res.verdict
    assert res.exit_code == exitcodes.CLEAN and res.policy == MIGRATION and v.kind == WITHIN_SEED_BAND, res.render()
    lib = json.loads((ONE_LIBTORCH / "pytorch-2.13.0" / "summary.json").read_text())["versions"]["libtorch_lib"]
    assert v.policy_why == f"backends differ: pytorch vs torchsharp, on the same native library, libtorch 2.13.0+cpu ({lib})"
    assert 1_000 < v.rounding_until < 7_000 and 0.005 < v.max_rel_diff < 0.02

    def losses(side):
        return {json.loads(ln)["step"]: json.loads(ln)["loss"] for ln in (ONE_LIBTORCH / side / "metrics.jsonl").open()}

    a, b = losses("pytorch-2.13.0"), losses("torchsharp-0.107.0")
    assert [a[k] == b[k] for k in (1, 2, 3, 4)] == [True, True, True, False]  # the first update that rounds apart
    assert max(abs(a[k] - b[k]) for k in range(1, 1001)) < 1e-5


def test_option_names_map_across_backends():
    pt = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False, "foreach": False}
    ts = {"LearningRate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "amsgrad": 0,
          "initial_lr": 1e-3}
    assert option_differences(pt, ts, MIGRATION) == ([], ["foreach (A only)", "initial_lr (B only)"])
    ts["amsgrad"] = 1
    assert option_differences(pt, ts, MIGRATION)[0] == [("amsgrad", False, 1)]


def test_bad_policy_is_input_error():
    with pytest.raises(InputError, match="--policy"):
        compare_runs(PT, PT, policy="lenient")
