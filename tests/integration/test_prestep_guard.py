"""PreStepGuard (dotnet/Probe/PreStepGuard.cs): the worker's pre-step check for C# loops run
without optcheck, called before optimizer.step().

Real: Mono runs a C# training loop (tests/dotnet/guard_check/GuardCheck.cs) that calls
PreStepGuard.Check() before every step; the guard, ProbeCore and StateReader are the shipped
dotnet/Probe sources. Stand-in: the model and optimizer are tests/dotnet/TestLoop.cs (a TorchSharp
stand-in whose AdamW looks its state up by handle as TorchSharp's does), because TorchSharp's
native libraries cannot be installed here. TorchSharpTarget / TorchSharpGuard.For (the TorchSharp
side of the same guard) are compile-checked against TorchSharp 0.107.0 in
tests/unit/test_torchsharp_own_model.py.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "dotnet"))
from build import harness_or_skip, run_harness  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("mono") is None or shutil.which("mcs") is None,
                                reason="mono/mcs not installed (Debian mono-runtime, mono-mcs)")


@pytest.fixture(scope="module")
def guard_exe(tmp_path_factory) -> Path:
    return harness_or_skip(REPO / "tests" / "dotnet" / "guard_check" / "GuardCheck.cs", tmp_path_factory.mktemp("guard"))


run = run_harness


def test_clean_loop_passes_the_guard_and_checks_in_full_once(guard_exe):
    rc, out = run(guard_exe, "OptCheckTest.LazyTrainer", "60")
    assert rc == 0 and "guard_step" not in out
    first, last = map(float, re.findall(r"loss (\S+) -> (\S+)", out["clean"][0])[0])
    assert last < first  # it trained
    assert out["full_checks"] == ["1"]  # afterwards one fingerprint per step


def test_replaced_parameter_is_named_with_the_key_the_step_would_throw(guard_exe):
    rc, out = run(guard_exe, "OptCheckTest.LazyTrainer", "30", "param-replaced@10")
    assert rc == 3 and out["guard_step"] == ["10"]
    assert out["guard_type"] == ["OptCheck.Contract.PreStepCheckException"]
    problem = out["guard_problem"][0]
    m = re.fullmatch(r"1 optimizer member\(s\) have no state, the next step\(\) throws KeyNotFoundException for key "
                     r"(\d+): lm_head\.weight \(handle (\d+)\)", problem)
    assert m and m.group(1) == m.group(2), problem
    assert out["guard_code"][0] == "OC108"  # PreStepCheckException.Problems: structured, in the lines' order
    # without the guard, the step throws KeyNotFoundException for exactly that key
    thrown = re.search(r"KeyNotFoundException: The given key '(\d+)'", out["step_threw"][0])
    assert thrown and thrown.group(1) == m.group(1)


def test_module_to_names_every_parameter(guard_exe):
    rc, out = run(guard_exe, "OptCheckTest.LazyTrainer", "30", "module-to-after-optimizer@7")
    assert rc == 3 and out["guard_step"] == ["7"]
    names = re.findall(r"([\w.]+) \(handle \d+\)", out["guard_problem"][0])
    assert sorted(names) == ["lm_head.bias", "lm_head.weight", "ln_f.bias", "ln_f.weight", "wte.weight"]


def test_materialised_groups_are_stopped_although_the_step_would_not_throw(guard_exe):
    rc, out = run(guard_exe, "OptCheckTest.EagerTrainer", "30", "module-to-after-optimizer@5")
    assert rc == 3 and out["guard_step"] == ["5"]
    text = "\n".join(out["guard_problem"])
    assert "2 trainable model parameter(s) in no param group, never trained: ln_f.weight" in text
    assert out["step_threw"] == ["nothing"]  # silent wrong training without the guard
