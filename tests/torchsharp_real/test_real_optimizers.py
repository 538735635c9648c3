"""Every built-in TorchSharp optimizer and the recipes users write, on real TorchSharp: silent on a clean run,
and ``module-to-after-optimizer`` (``model.to(ScalarType.Float64)`` after the optimizer exists, seed 003)
predicted with the exact key TorchSharp's ``step()`` then throws; libtorch's native LBFGS neither killed by the
probe nor falsely flagged.

The optimizers (SGD, SGD + Nesterov, Adam, AdamW, AdamW amsgrad, RMSProp centered, Adagrad, Adadelta, Adamax,
NAdam, RAdam, ASGD, Rprop) and recipes (two ParamGroups, named parameters, StepLR / CosineAnnealingLR /
OneCycleLR through the guarded optimizer, gradient clipping, a frozen embedding, model + optimizer save/load,
eval/train switches, gradient accumulation) are tests/dotnet/real/RealTrainers.cs's ZooTrainer over TinyLm.
The default run soaks the whole zoo in one soak (a new optimizer every 12 steps), LBFGS, and three recipes with
the fault; ``-m slow`` soaks each optimizer and each recipe on its own with the fault.
"""

from __future__ import annotations

import json

import pytest

from conftest import run_clis
from optcheck.run import exitcodes
from optcheck.record.check import read_snapshots
from optcheck.record.snapshot import read_jsonl
from realts import real_ts  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.torchsharp_real
KNF = "System.Collections.Generic.KeyNotFoundException"
OPTIMIZERS = ["sgd", "sgd-nesterov", "adam", "adamw", "adamw-amsgrad", "rmsprop-centered", "adagrad", "adadelta",
              "adamax", "nadam", "radam", "asgd", "rprop"]
RECIPES = ["two-groups", "named", "steplr", "cosine", "onecycle", "clip", "frozen-embedding", "save-load", "eval",
           "accumulation"]
DEFAULT_RECIPES = ["two-groups", "onecycle", "accumulation"]
SOAK = ["--n-embd", "32", "--block-size", "16", "--batch-size", "4", "--val-every", "0"]
FAULT_AT = 40


def soak_commands(real_ts, base, names):  # noqa: F811
    """{name: command}: the optimizer or recipe ``name`` for 50 steps, the fault planted at step 40."""
    commands = {}
    for name in names:
        options = {"recipe": name, "optim": "adamw"} if name in RECIPES else {"optim": name}
        commands[name] = (real_ts.trainer_args("ZooTrainer", *SOAK, "--steps", "50", "--every", "10", "--inject",
                                               f"module-to-after-optimizer@{FAULT_AT}", "--out", str(base / name),
                                               options=options), real_ts.env)
    return commands


def check_predicted(base, results, name):
    """Silent until the fault; then OC108 before the step, with the key that step() throws."""
    rc, stdout, stderr = results[name]
    assert rc == exitcodes.CRASHED and "Traceback" not in stdout + stderr, stdout + stderr
    out = base / name
    s = json.loads((out / "summary.json").read_text())
    findings = list(read_jsonl(out / "findings.jsonl"))
    assert all(f["step"] >= FAULT_AT for f in findings), [(f["code"], f["step"]) for f in findings]  # clean before it
    (oc108,) = [f for f in findings if f["code"] == "OC108"]
    assert oc108["step"] == FAULT_AT and oc108["phase"] == "pre-step", oc108
    crash = s["crash"]
    assert crash["exc_type"] == KNF and crash["step"] >= FAULT_AT, crash  # accumulation steps one step later
    assert f"The given key '{oc108['detail']['predicted_key']}' was not present" in crash["message"]
    assert s["lead_time"]["predicted"]
    snaps = read_snapshots(out / "snapshots.jsonl")
    before = [x for x in snaps if x["step"] < FAULT_AT]
    assert len(before) >= 4 and all(x["state"] for x in before[1:])  # its state read at every snapshot before


@pytest.fixture(scope="module")
def runs(real_ts, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("zoo")
    commands = soak_commands(real_ts, base, DEFAULT_RECIPES)
    commands["rotation"] = (real_ts.trainer_args("ZooTrainer", *SOAK, "--steps", str(12 * len(OPTIMIZERS)), "--every",
                                                 "6", "--out", str(base / "rotation"), options={"rotate": 12}),
                            real_ts.env)
    commands["lbfgs"] = (real_ts.trainer_args("ZooTrainer", *SOAK, "--steps", "40", "--every", "10", "--out",
                                              str(base / "lbfgs"), options={"optim": "lbfgs"}), real_ts.env)
    return base, run_clis(commands, jobs=2)


def test_every_builtin_optimizer_is_silent_on_a_clean_run(runs):
    base, results = runs
    rc, stdout, stderr = results["rotation"]
    out = base / "rotation"
    findings = list(read_jsonl(out / "findings.jsonl"))
    assert rc == exitcodes.CLEAN and findings == [], (stdout + stderr)[-3000:]
    snaps = read_snapshots(out / "snapshots.jsonl")
    types = [x["optimizer"]["type"].rsplit(".", 1)[-1] for x in snaps]
    assert {"SGD", "Adam", "AdamW", "RMSProp", "Adagrad", "Adadelta", "Adamax", "NAdam", "RAdam", "ASGD",
            "Rprop"} <= set(types), types
    # each optimizer's state read by handle, one entry per member
    assert all(len(x["state"]) == len(x["params"]) for x in snaps if x["step"] > 0), [len(x["state"]) for x in snaps]


@pytest.mark.parametrize("recipe", DEFAULT_RECIPES)
def test_a_recipe_is_silent_and_predicts_module_to_after_optimizer(runs, recipe):
    check_predicted(*runs, recipe)


def test_lbfgs_is_neither_killed_nor_flagged(runs):
    base, results = runs
    rc, stdout, stderr = results["lbfgs"]
    assert rc == exitcodes.CLEAN, (stdout + stderr)[-3000:]
    out = base / "lbfgs"
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "clean" and s["findings"] == 0 and s["last_step"] == 40 and s["loss_last"] < s["loss_first"]
    snaps = read_snapshots(out / "snapshots.jsonl")
    assert len(snaps) >= 5 and all(x["state"] is None for x in snaps)
    assert all(g["members"] == [] and g["members_readable"] is False for x in snaps for g in x["groups"])
    assert all(x["notes"][0].startswith("optimizer state not readable") for x in snaps)


@pytest.fixture(scope="module")
def every_one(real_ts, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("zoo-all")
    names = OPTIMIZERS + [r for r in RECIPES if r not in DEFAULT_RECIPES]
    return base, run_clis(soak_commands(real_ts, base, names), jobs=2)


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIMIZERS + [r for r in RECIPES if r not in DEFAULT_RECIPES])
def test_each_optimizer_and_recipe_predicts_module_to_after_optimizer(every_one, name):
    check_predicted(*every_one, name)
