"""A fault inside the user's own Step is named at that step, before TorchSharp throws.

A user's bug (model.to(Float64), a replaced Parameter, register_parameter after the optimizer
exists, an optimizer over parameters().ToList() followed by model.to(Float64), a disposed tensor)
sits inside their Step, before their own zero_grad() / step(): a check between two steps cannot
see it. ModuleTrainer hands Step a GuardedOptimizer whose zero_grad() and step() run the pre-step
check first (dotnet/Worker/ModuleTrainer.cs); under optcheck the check records the snapshot body
read at that moment, and the worker sends it as a snapshot ``phase="in-step"`` before the crash.

Real: the optcheck worker process, pythonnet on CoreCLR and Mono, the shipped dotnet/Probe sources,
the supervisor and its rules, the run directory. Stand-in: the model and optimizer
(tests/dotnet/TestLoop.cs, whose AdamW looks its state up by handle and whose zero_grad() throws
on a disposed member, as TorchSharp 0.107's do), and its InStepTrainer, whose optimizer runs
PreStepGuard.Before as GuardedOptimizer does on TorchSharp. The TorchSharp side (GuardedOptimizer,
ModuleTrainer, and a trainer planting the same five bugs) is compiled against TorchSharp 0.107.0's
own reference assembly in tests/unit/test_torchsharp_instep_sources.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from optcheck.record.check import read_snapshots

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
sys.path.insert(0, str(ROOT / "tests" / "dotnet"))
from build import harness_or_skip, run_harness  # noqa: E402
from test_bridge_worker import config, dll, need, soak  # noqa: E402,F401  (dll: the module fixture)

KNF = "System.Collections.Generic.KeyNotFoundException"
IOE = "System.InvalidOperationException"
pytestmark = pytest.mark.dotnet

#: bug -> (the finding that names it, its subjects, what the step then throws, the call the check ran at)
BUGS = {
    "to-float64": ("OC108", {"wte.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight", "lm_head.bias"}, KNF, "step()"),
    "param-replaced": ("OC108", {"lm_head.weight"}, KNF, "step()"),
    "register-late": ("OC108", {"extra.gain"}, KNF, "step()"),
    "eager-to-float64": ("OC109", {"wte.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight", "lm_head.bias"}, IOE,
                         "zero_grad()"),
    "dispose": ("OC109", {"lm_head.bias"}, IOE, "zero_grad()"),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_bug_inside_the_users_step_is_named_at_that_step_before_the_exception(dll, tmp_path, bug):  # noqa: F811
    code, subjects, exc, call = BUGS[bug]
    kind = need("mono" if bug in ("register-late", "dispose") else "coreclr")
    res = soak(config(dll, kind, "OptCheckTest.InStepTrainer", steps=200, bug=bug, bug_at=150), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 3 and s["status"] == "crashed", s
    crash = s["crash"]
    assert crash["step"] == 150 and crash["exc_type"] == exc
    # named at that step, from inside the step
    named = [f for f in res.findings if f.code == code]
    assert named and named[0].step == 150 and named[0].phase == "in-step", [(f.code, f.step, f.phase) for f in res.findings]
    assert set(named[0].subjects) == subjects
    assert all(f.step == 150 and f.phase == "in-step" for f in res.findings)  # nothing before: the bug is in the step
    if code == "OC108":  # the key it predicts is the key that was thrown
        assert f"'{named[0].detail['predicted_key']}'" in crash["message"]
    assert exc.rsplit(".", 1)[-1] in named[0].next_failure
    lead = s["lead_time"]
    assert lead["flagged_step"] == 150 and lead["flagged_phase"] == "in-step" and lead["predicted"]
    # the in-step snapshot: read before the optimizer call ran, and it says so
    (snap,) = [x for x in read_snapshots(res.out / "snapshots.jsonl") if x["phase"] == "in-step"]
    assert snap["step"] == 150 and snap["trigger"] == "check"
    assert snap["notes"][0].startswith(f"in-step check: found inside the trainer's Step at step 150, before its "
                                       f"optimizer.{call} ran")
    assert code in {f["code"] for f in snap["prestep_findings"]}
    # ... and the crash report names what the checks find on the live objects after the exception
    assert crash["diagnosis"] and any(ln.startswith(code) for ln in crash["diagnosis"]), crash["diagnosis"]
    assert "[optcheck, on the live objects after it:" in crash["message"]
    if code == "OC108":
        key = named[0].detail["predicted_key"]
        assert any(f"the key {key} is the handle of model parameter" in ln for ln in crash["diagnosis"])


def test_the_clean_in_step_guarded_loop_is_silent(dll, tmp_path):  # noqa: F811
    need("coreclr")
    res = soak(config(dll, "coreclr", "OptCheckTest.InStepTrainer", steps=300), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 0 and s["status"] == "clean" and s["findings"] == 0, s
    snaps = read_snapshots(res.out / "snapshots.jsonl")
    assert not [x for x in snaps if x["phase"] == "in-step"]
    assert s["loss_last"] < s["loss_first"] - 1.5


def test_a_crash_with_nothing_wrong_in_model_or_optimizer_says_so(dll, tmp_path):  # noqa: F811
    need("coreclr")
    res = soak(config(dll, "coreclr", "OptCheckTest.InStepTrainer", steps=200, bug="throw", bug_at=120),
               tmp_path / "run")
    crash = res.summary["crash"]
    assert res.exit_code == 3 and crash["step"] == 120 and crash["exc_type"] == IOE
    assert crash["diagnosis"] == ["nothing to name: the model's parameters, the optimizer's members and its state "
                                  "keys agree, and no member is disposed"]
    assert not res.findings


def test_an_injected_fault_between_steps_is_still_the_pre_step_checks(dll, tmp_path):  # noqa: F811
    """--inject plants the fault between two steps: the pre-step check names it (phase pre-step); the
    in-step check then sees the same state and does not report it twice."""
    need("coreclr")
    res = soak(config(dll, "coreclr", "OptCheckTest.InStepTrainer", steps=200, inject=["param-replaced@150"]),
               tmp_path / "run")
    oc108 = [f for f in res.findings if f.code == "OC108"]
    assert oc108 and oc108[0].step == 150 and oc108[0].phase == "pre-step"
    assert res.summary["crash"]["exc_type"] == KNF


# -- the guard's one-line form, without optcheck -------------------------------------------------

@pytest.fixture(scope="module")
def wrapped_exe(tmp_path_factory) -> Path:
    return harness_or_skip(ROOT / "tests" / "dotnet" / "guard_check" / "WrappedGuardCheck.cs", tmp_path_factory.mktemp("w"))


run_wrapped = run_harness


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_wrapped_guard_throws_the_named_problems_before_the_optimizer_would(wrapped_exe, bug):
    code, subjects, exc, call = BUGS[bug]
    rc, out = run_wrapped(wrapped_exe, "60", f"{bug}@40")
    assert rc == 3 and out["guard_step"] == ["40"] and out["guard_call"] == [call]
    assert code in out["guard_code"]
    (names,) = [v for v in out["guard_names"] if v.startswith(code + " ")]
    assert set(names.split(" ", 1)[1].split(",")) == subjects
    assert f"{code} {exc}" in out["guard_predicts"]
    assert out["guard_message"][0].startswith(f"optcheck pre-step check at optimizer.{call}")
    # without the guard the same step throws what the guard predicted
    assert out["unguarded_threw"] == [exc]
    if code == "OC108":
        assert f"'{out['guard_key'][0]}'" in out["unguarded_message"][0]


def test_the_wrapped_guard_is_silent_on_the_clean_loop(wrapped_exe):
    rc, out = run_wrapped(wrapped_exe, "80")
    assert rc == 0 and out["clean"] == ["80"] and "guard_step" not in out


# -- an optimizer whose members and state cannot be read (libtorch's native LBFGS) --------------

def test_an_optimizer_it_cannot_read_gives_no_finding_and_says_so(dll, tmp_path):  # noqa: F811
    """The stand-in's optimizer read as TorchSharpTarget reads a native one (members and state not
    readable): no OC108 "no state", no OC102 "in no group" from what was not read; the snapshots say
    why. That the TorchSharp adapter never enumerates a native optimizer's tensors is checked against
    TorchSharp's own assembly in tests/unit/test_torchsharp_instep_sources.py."""
    need("coreclr")
    res = soak(config(dll, "coreclr", "OptCheckTest.NativeOptimizerTrainer", steps=200), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 0 and s["status"] == "clean" and s["findings"] == 0, [f.message for f in res.findings]
    snaps = read_snapshots(res.out / "snapshots.jsonl")
    assert all(x["state"] is None and x["prestep_findings"] == [] for x in snaps)
    assert all(g["members"] == [] and g["members_readable"] is False for x in snaps for g in x["groups"])
    assert all(x["notes"][0].startswith("optimizer state not readable") for x in snaps)
