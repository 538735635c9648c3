"""A user's own ModuleTrainer on real TorchSharp, each identity bug planted INSIDE its own Step, before its own
``optimizer.step()`` / ``zero_grad()``: optcheck names it at that step, phase in-step, before TorchSharp throws
(and the key it predicts is the key TorchSharp throws). The clean loop is silent; a NaN written into a weight is
OC501 at the first NaN loss; the bug in the middle of a block of steps run inside .NET keeps every step before it.
Without optcheck, the same bugs in a plain .NET loop whose optimizer is wrapped once (``TorchSharpGuard.Wrap``)
throw PreStepCheckException naming them, where the unwrapped optimizer throws TorchSharp's own exception.

The user code is tests/dotnet/real/RealTrainers.cs (TinyLm, a small transformer LM; BugTrainer) and GuardLoop.cs,
compiled with mcs against TorchSharp 0.107.0's own TorchSharp.dll with optcheck's sources; everything runs on
CoreCLR against a real libtorch (tests/torchsharp_real/realts.py).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import run_clis
from optcheck.run import exitcodes
from optcheck.record.check import read_snapshots
from optcheck.record.snapshot import read_jsonl
from realts import real_ts  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.torchsharp_real
KNF = "System.Collections.Generic.KeyNotFoundException"
IOE = "System.InvalidOperationException"
AT = 37  # inside the block of steps 21..40 (a snapshot every 20)
ALL = {"scale", "tok.weight", "pos.weight", "ln_1.weight", "ln_1.bias", "q.weight", "q.bias", "k.weight",
       "v.weight", "v.bias", "proj.weight", "proj.bias", "ln_2.weight", "ln_2.bias", "fc.weight", "fc.bias",
       "fc_out.weight", "fc_out.bias", "ln_f.weight", "ln_f.bias", "head.weight", "head.bias"}
#: bug -> (the finding that names it, its subjects, what TorchSharp then throws, the call the check ran at)
BUGS = {
    "retyped": ("OC108", ALL, KNF, "step()"),
    "param-replaced": ("OC108", {"head.weight"}, KNF, "step()"),
    "registered-late": ("OC108", {"late_bias"}, KNF, "step()"),
    # the embeddings keep their tensors through to(float64): only the rest of the materialised list is disposed
    "eager-to-float64": ("OC109", ALL - {"tok.weight", "pos.weight"}, IOE, "zero_grad()"),
}


def same_members(got: set, want: set, bug: str) -> bool:
    """``got`` names ``want``; after ``to(float64)`` a new wrapper may land on the address of a freed one whose
    handle is still a state key (docs/torchsharp.md, "Handles are reused"), so that member has state and is not named."""
    if bug == "retyped":
        return got <= want and len(got) >= len(want) - 3
    return got == want


SOAK = ["--steps", "60", "--every", "20", "--n-embd", "32", "--block-size", "16", "--batch-size", "4",
        "--val-every", "0"]


@pytest.fixture(scope="module")
def runs(real_ts, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("own")
    commands = {bug: (real_ts.trainer_args("BugTrainer", *SOAK, "--out", str(base / bug),
                                           options={"bug": bug, "bug_at": AT}), real_ts.env)
                for bug in [*BUGS, "nan-weight"]}
    commands["clean"] = (real_ts.trainer_args("BugTrainer", *SOAK, "--out", str(base / "clean")), real_ts.env)
    # the shipped example, as its README runs it (its one trainer type found without --dotnet-trainer)
    example = ["soak", "-q", "--backend", "torchsharp", "--dotnet-assembly", str(real_ts.example), *SOAK,
               "--trainer-option", "n_hidden=64"]
    commands["example"] = ([*example, "--out", str(base / "example")], real_ts.env)
    commands["example-fault"] = ([*example, "--inject", "module-to-after-optimizer@30", "--out",
                                  str(base / "example-fault")], real_ts.env)
    return base, run_clis(commands, jobs=2)


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_bug_inside_the_users_step_is_named_at_that_step_before_torchsharp_throws(runs, bug):
    code, subjects, exc, call = BUGS[bug]
    base, results = runs
    rc, stdout, stderr = results[bug]
    assert rc == exitcodes.CRASHED and "Traceback" not in stdout + stderr, stdout + stderr
    out = base / bug
    s = json.loads((out / "summary.json").read_text())
    crash = s["crash"]
    assert crash["step"] == AT and crash["exc_type"] == exc, crash
    findings = list(read_jsonl(out / "findings.jsonl"))
    named = [f for f in findings if f["code"] == code]
    assert named and named[0]["step"] == AT and named[0]["phase"] == "in-step", findings
    assert same_members(set(named[0]["subjects"]), subjects, bug), named[0]["subjects"]
    assert all(f["step"] == AT and f["phase"] == "in-step" for f in findings)  # nothing before: the bug is in the step
    if code == "OC108":  # the key it predicts is the key TorchSharp threw
        assert f"The given key '{named[0]['detail']['predicted_key']}' was not present" in crash["message"]
    else:
        assert "Tensor invalid -- empty handle" in crash["message"]
    assert exc.rsplit(".", 1)[-1] in named[0]["next_failure"]
    assert s["lead_time"]["flagged_phase"] == "in-step" and s["lead_time"]["predicted"]
    (snap,) = [x for x in read_snapshots(out / "snapshots.jsonl") if x["phase"] == "in-step"]
    assert snap["step"] == AT and snap["notes"][0].startswith(
        f"in-step check: found inside the trainer's Step at step {AT}, before its optimizer.{call} ran")
    # every step before it is kept (the steps ran in one block inside .NET), none after
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == list(range(1, AT))


def test_a_nan_written_into_a_weight_inside_step_is_oc501_at_the_first_nan_loss(runs):
    base, results = runs
    rc, stdout, stderr = results["nan-weight"]
    assert rc == exitcodes.FINDINGS and "Traceback" not in stdout + stderr, stdout + stderr
    out = base / "nan-weight"
    oc501 = [f for f in read_jsonl(out / "findings.jsonl") if f["code"] == "OC501"]
    assert oc501 and oc501[0]["step"] == AT + 1 and "loss" in oc501[0]["subjects"], oc501
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "findings" and s["last_step"] == 60 and s["loss_last"] == "nan"


def test_the_users_clean_loop_is_silent(runs):
    base, results = runs
    rc, stdout, stderr = results["clean"]
    assert rc == exitcodes.CLEAN, stdout + stderr
    s = json.loads((base / "clean" / "summary.json").read_text())
    assert s["status"] == "clean" and s["findings"] == 0 and s["loss_last"] < s["loss_first"]
    assert not [x for x in read_snapshots(base / "clean" / "snapshots.jsonl") if x["phase"] == "in-step"]


def test_the_shipped_example_trains_clean_and_predicts_module_to_after_optimizer(runs):
    """examples/torchsharp-own-model/OwnModel.cs (compiled with mcs against the real TorchSharp.dll) under optcheck."""
    base, results = runs
    rc, stdout, stderr = results["example"]
    assert rc == exitcodes.CLEAN, (stdout + stderr)[-3000:]
    s = json.loads((base / "example" / "summary.json").read_text())
    assert s["status"] == "clean" and s["loss_last"] < s["loss_first"] and s["config"]["extra"]["n_hidden"] == "64"
    names = [x["name"] for x in read_snapshots(base / "example" / "snapshots.jsonl")[-1]["params"]]
    assert names == ["emb.weight", "hidden.weight", "hidden.bias", "head.weight", "head.bias"], names
    rc, stdout, stderr = results["example-fault"]
    assert rc == exitcodes.CRASHED and "Traceback" not in stdout + stderr, (stdout + stderr)[-3000:]
    s = json.loads((base / "example-fault" / "summary.json").read_text())
    (oc108,) = [f for f in read_jsonl(base / "example-fault" / "findings.jsonl") if f["code"] == "OC108"]
    assert oc108["step"] == 30 and f"'{oc108['detail']['predicted_key']}'" in s["crash"]["message"]
    assert s["crash"]["exc_type"] == KNF


# -- the guard's one-line form in a plain .NET loop, no optcheck run, no Python ------------------------------------

@pytest.fixture(scope="module")
def guarded(real_ts):  # noqa: F811
    def one(bug):
        res = real_ts.guard("40", *([f"{bug}@25"] if bug else []))
        out: dict[str, list[str]] = {}
        for ln in res.stdout.splitlines():
            k, _, v = ln.partition(" ")
            out.setdefault(k, []).append(v)
        return res.returncode, out, res.stdout + res.stderr

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([*BUGS, ""], pool.map(one, [*BUGS, ""])))


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_wrapped_guard_names_the_bug_where_torchsharp_would_throw(guarded, bug):
    code, subjects, exc, call = BUGS[bug]
    rc, out, text = guarded[bug]
    assert rc == 3 and out["guard_step"] == ["25"] and out["guard_call"] == [call], text
    (names,) = [v for v in out["guard_names"] if v.startswith(code + " ")]
    assert same_members(set(names.split(" ", 1)[1].split(",")), subjects, bug), names
    assert f"{code} {exc}" in out["guard_predicts"]
    assert out["guard_message"][0].startswith(f"optcheck pre-step check at optimizer.{call}")
    # the same call on the optimizer itself throws what the guard predicted, with the key it named
    assert out["unguarded_threw"] == [exc], text
    if code == "OC108":
        assert f"'{out['guard_key'][0]}'" in out["unguarded_message"][0]


def test_the_wrapped_guard_is_silent_on_the_clean_loop(guarded):
    rc, out, text = guarded[""]
    assert rc == 0 and out["clean"] == ["40"] and "guard_step" not in out, text
    first, last = map(float, out["loss"][0].split())
    assert last < first and out["torchsharp"] == ["0.107.0.0"]
