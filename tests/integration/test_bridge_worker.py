"""The TorchSharp worker driving the .NET stand-in training loop (tests/dotnet/TestLoop.cs,
compiled with mcs) through pythonnet, on CoreCLR (PyPI dotnetcore2) and Mono: real
runtimes, real subprocesses, real run directories."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from optcheck.config import (ChecksConfig, DataConfig, Injection, ModelConfig, OptimizerConfig, RunConfig, SoakConfig,

                             TorchSharpConfig)
from optcheck.errors import InputError
from optcheck.drivers.protocol import read_messages
from optcheck.record.snapshot import validate
from optcheck.record.check import read_snapshots
from optcheck.torchsharp_bridge import runtime

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dotnet"))
from build import BuildUnavailable, build_testloop  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KNF = "System.Collections.Generic.KeyNotFoundException"
pytestmark = pytest.mark.dotnet


@pytest.fixture(scope="module")
def dll() -> Path:
    try:
        return build_testloop()
    except BuildUnavailable as e:
        pytest.skip(str(e))


def need(kind: str) -> str:
    try:
        runtime.select(kind)
    except InputError as e:
        pytest.skip(f"{kind}: {e}")
    return kind


def config(dll: Path, kind: str = "coreclr", trainer: str = "OptCheckTest.LazyTrainer", steps: int = 300,
           inject: list[str] = (), **trainer_options) -> SoakConfig:
    """A small soak of the stand-in: 16-wide embedding, 4 x 16 tokens a batch, lr 1e-2."""
    return SoakConfig(model=ModelConfig(n_embd=16, n_head=2, block_size=16), optimizer=OptimizerConfig(lr=1e-2),
                      data=DataConfig(batch_size=4, val_every=100),
                      run=RunConfig(backend="torchsharp", steps=steps, every=100),
                      checks=ChecksConfig(inject=[Injection.parse(i) for i in inject]),
                      torchsharp=TorchSharpConfig(runtime=kind, assembly=str(dll), trainer=trainer),
                      trainer_options=trainer_options)


def soak(cfg: SoakConfig, out: Path):
    from optcheck.drivers.soak import run_soak

    return run_soak(cfg, out, progress=False)


@pytest.mark.slow
def test_worker_over_a_pipe(dll, tmp_path):
    """The worker spawned by hand, as the supervisor does: hello, snapshots, metrics, done."""
    need("coreclr")
    cfg = config(dll)
    cfg.run.run_id, cfg.run.work_dir = "pipe", str(tmp_path)
    (tmp_path / "config.json").write_text(cfg.to_json())
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "optcheck.torchsharp_bridge.worker", "--config",
                             str(tmp_path / "config.json"), "--stream-fd", str(w)], pass_fds=(w,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    os.close(w)
    with os.fdopen(r, encoding="utf-8") as f:
        msgs = list(read_messages(f))
    err = proc.stderr.read().decode()
    assert proc.wait() == 0, err
    assert "Traceback" not in err
    types = [m["type"] for m in msgs]
    assert types[0] == "hello" and types[-1] == "done" and "garbled" not in types
    hello = msgs[0]
    assert hello["backend"] == "torchsharp" and hello["versions"]["dotnet_runtime"] == "coreclr"
    snaps = [validate(m["snapshot"]) for m in msgs if m["type"] == "snapshot"]
    assert [s["step"] for s in snaps] == [0, 100, 200, 300]
    assert all(s["backend"] == "torchsharp" and s["optimizer"]["state_init"] == "eager" for s in snaps)
    last = snaps[-1]
    assert [p["name"] for p in last["params"]] == ["wte.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight",
                                                   "lm_head.bias"]
    assert {m["ref"] for g in last["groups"] for m in g["members"]} == {s["ref"] for s in last["state"]}
    assert all(s["step"] == 300 for s in last["state"])
    assert last["prestep_findings"] == []     # ProbeCore's pre-step check ran and found nothing
    # value_norm and checksum per parameter (dotnet/Probe/ValueStats.cs): present, and the values moved
    prev = {p["name"]: p for p in snaps[-2]["params"]}
    for p in last["params"]:
        assert p["value_norm"] > 0 and isinstance(p["checksum"], int), p
        assert p["checksum"] != prev[p["name"]]["checksum"] and p["value_norm"] != prev[p["name"]]["value_norm"]
    done = msgs[-1]
    assert done["loss_last"] < done["loss_first"] - 1.5, done     # real arithmetic: the loss falls


@pytest.mark.parametrize("kind", ["coreclr", "mono"])
def test_clean_soak_writes_the_run_directory_and_check_reruns_the_rules(dll, tmp_path, kind):
    need(kind)
    res = soak(config(dll, kind, steps=200), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 0 and s["status"] == "clean" and s["findings"] == 0, s
    assert s["versions"]["dotnet_runtime"] == kind
    assert s["loss_last"] < s["loss_first"] - 1.5
    for name in ("snapshots.jsonl", "findings.jsonl", "metrics.jsonl", "events.jsonl", "summary.json", "worker.log"):
        assert (res.out / name).exists(), name
    snaps = read_snapshots(res.out / "snapshots.jsonl")
    assert len(snaps) == 3 and all(x["backend"] == "torchsharp" for x in snaps)
    rc = subprocess.run([sys.executable, "-m", "optcheck.cli", "check", str(res.out)], cwd=ROOT,
                        capture_output=True, text=True).returncode
    assert rc == 0


def test_replaced_parameter_is_flagged_at_its_step_before_the_keynotfound(dll, tmp_path):
    need("coreclr")
    res = soak(config(dll, steps=520, inject=["param-replaced@500"]), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 3 and s["status"] == "crashed"
    crash = s["crash"]
    assert crash["exc_type"] == KNF and crash["step"] == 500
    assert "OptCheckTest.HandleAdamW.Step" in crash["stack"]
    key = re.search(r"'(\d+)'", crash["message"]).group(1)
    at500 = [f for f in res.findings if f.step == 500]
    assert at500 and all(f.phase == "pre-step" for f in at500)
    assert {f.code for f in at500} >= {"OC103", "OC104", "OC108"}
    oc108 = next(f for f in at500 if f.code == "OC108")
    assert oc108.subjects == ["lm_head.weight"]
    assert oc108.detail["predicted_key"] == key                    # the prediction names the key that threw
    # ... and it is the worker's own pre-step check (ProbeCore.PreStepProblems) that made it
    (pre,) = [x for x in read_snapshots(res.out / "snapshots.jsonl") if x["step"] == 500 and x["phase"] == "pre-step"]
    (c,) = [f for f in pre["prestep_findings"] if f["code"] == "OC108"]
    assert c["predicted_key"] == key and c["names"] == ["lm_head.weight"]
    assert c["predicted_exception"] == KNF and oc108.detail["refs"] == c["refs"]
    assert s["lead_time"]["flagged_step"] == 500 and s["lead_time"]["failed_step"] == 500
    assert s["lead_time"]["exception"] == KNF
    out = subprocess.run([sys.executable, "-m", "optcheck.cli", "check", "--json", str(res.out)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert any(json.loads(ln)["code"] == "OC108" for ln in out.stdout.splitlines() if ln.startswith("{"))


def test_eager_list_flags_only_the_rebuilt_plain_fields(dll, tmp_path):
    need("mono")
    res = soak(config(dll, "mono", "OptCheckTest.EagerTrainer", steps=200, inject=["eager-param-list@150"]),
               tmp_path / "run")
    assert res.summary["status"] == "findings" and res.summary["crash"] is None   # nothing throws
    lost = [f for f in res.findings if f.code in ("OC101", "OC102", "OC104")]
    assert {f.code for f in lost} == {"OC101", "OC102", "OC104"}
    assert all(set(f.subjects) == {"ln_f.weight", "ln_f.bias"} and f.step == 150 for f in lost)
    assert not any(f.code == "OC108" for f in res.findings)
    # OC101 and OC102 are the worker's own pre-step check (ProbeCore.PreStepProblems): the same handles; the C#
    # cannot name members the model no longer has ("<handle N>"), the rule names them by their former names
    (at150,) = [x for x in read_snapshots(res.out / "snapshots.jsonl") if x["step"] == 150]
    pre = {e["code"]: e for e in at150["prestep_findings"]}
    (f101,), (f102,) = ([f for f in lost if f.code == c] for c in ("OC101", "OC102"))
    assert f101.detail["refs"] == pre["OC101"]["refs"] and len(f101.detail["refs"]) == 2
    assert pre["OC101"]["names"] == [f"<handle {r}>" for r in pre["OC101"]["refs"]]
    assert f102.detail["refs"] == pre["OC102"]["refs"] and f102.subjects == pre["OC102"]["names"]


def test_disposed_members_are_named_and_the_invalid_operation_predicted(dll, tmp_path):
    """TorchSharp 0.107.0's Module.to disposes the tensors an eager optimizer list still holds
    (stand-in: DisposingTrainer): OC109 names them by the names they had, the pre-step check says
    what zero_grad() will throw, no handle-0 artefacts (OC101/OC105/OC106/OC108), and the crash that
    follows is linked to the finding."""
    need("mono")
    res = soak(config(dll, "mono", "OptCheckTest.DisposingTrainer", steps=200, inject=["eager-param-list@150"]),
               tmp_path / "run")
    (oc109,) = [f for f in res.findings if f.code == "OC109"]
    assert oc109.step == 150 and set(oc109.subjects) == {
        "wte.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight", "lm_head.bias"}
    assert "InvalidOperationException" in oc109.next_failure
    assert not {"OC101", "OC105", "OC106", "OC108"} & {f.code for f in res.findings}
    crash = res.summary["crash"]
    assert res.exit_code == 3 and crash["step"] == 150 and "InvalidOperationException" in crash["exc_type"]
    lead = res.summary["lead_time"]
    assert lead and "OC109" in json.dumps(lead)
    snaps = read_snapshots(res.out / "snapshots.jsonl")
    (pre,) = [x for x in snaps if x["step"] == 150 and x.get("phase") == "pre-step"]
    lines = [f["line"] for f in pre["prestep_findings"]]
    assert pre["prestep_findings"][0]["code"] == "OC109"
    assert lines[0].startswith("5 optimizer member(s) are disposed tensors (empty handle)")
    assert not any("key 0" in ln or "<handle 0>" in ln for ln in lines), lines


def test_parameters_never_stepped_are_stalled_by_their_checksums(dll, tmp_path):
    """optimizer.step() never called (stand-in NoStepTrainer): the probe's checksums stay bit-for-bit
    equal while gradients are set, and OC205 fires after two snapshot intervals (the clean soaks above
    are its silent side). Without checksums the TorchSharp snapshot could not tell."""
    need("coreclr")
    res = soak(config(dll, trainer="OptCheckTest.NoStepTrainer", steps=300), tmp_path / "run")
    (oc205,) = [f for f in res.findings if f.code == "OC205"]
    assert oc205.step == 300 and set(oc205.subjects) == {"wte.weight", "ln_f.weight", "ln_f.bias", "lm_head.weight",
                                                         "lm_head.bias"}
    assert "from step 100 to step 300" in oc205.message


def test_tied_weight_is_a_duplicate(dll, tmp_path):
    need("coreclr")
    res = soak(config(dll, trainer="OptCheckTest.TiedTrainer", steps=100), tmp_path / "run")
    assert [f.code for f in res.findings] == ["OC106"]
    assert set(res.findings[0].subjects) == {"wte.weight", "lm_head.weight"} and res.findings[0].step == 0


def test_failfast_kills_the_worker_and_leaves_the_run_readable(dll, tmp_path):
    need("coreclr")
    res = soak(config(dll, steps=300, failfast_at=250), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 3 and s["status"] == "crashed"
    assert s["crash"]["signal"] == "SIGABRT" and s["crash"]["exit_code"] in (-6, 134)
    snaps = read_snapshots(res.out / "snapshots.jsonl")
    assert [x["step"] for x in snaps] == [0, 100, 200]
    assert json.loads((res.out / "summary.json").read_text())["status"] == "crashed"


@pytest.mark.parametrize("kind", ["coreclr", "mono"])
def test_a_nan_gradient_is_oc501_at_its_step(dll, tmp_path, kind):
    """The stand-in puts a NaN into lm_head.bias's gradient at step 100 and skips that step
    (as GradScaler does), so the parameters stay finite: the probe writes the measured NaN
    norm as "nan" (not null, which would hide it), the bridge reads it back as a float, and
    OC501 names the parameter at step 100. The same run without the NaN stays clean."""
    import math

    need(kind)
    res = soak(config(dll, kind, steps=150, nan_grad_at=100), tmp_path / "run")
    s = res.summary
    assert res.exit_code == 1 and s["findings_by_code"] == {"OC501": 1}, s
    (f,) = res.findings
    assert (f.code, f.step, f.subjects) == ("OC501", 100, ["lm_head.bias"])
    assert f.message == "non-finite grad at step 100 in 1 parameter(s): lm_head.bias"
    line = next(x for x in (res.out / "snapshots.jsonl").read_text().splitlines() if '"step":100,' in x)
    raw = {p["name"]: p for p in json.loads(line)["params"]}
    assert raw["lm_head.bias"]["grad_norm"] == "nan" and math.isfinite(raw["lm_head.bias"]["value_norm"])
    assert all(isinstance(p["grad_norm"], float) for n, p in raw.items() if n != "lm_head.bias")
    clean = soak(config(dll, kind, steps=150), tmp_path / "clean")
    assert clean.exit_code == 0 and clean.summary["findings"] == 0, clean.summary


@pytest.mark.parametrize("change, expect", [
    ({"trainer": "OptCheckTest.NativeTrainer"},
     r"^the \.NET worker could not load native library LibOptcheckMissingNative: .* LD_LIBRARY_PATH"),
    pytest.param({"trainer": "OptCheckTest.NoSuchTrainer"},
                 r"^--dotnet-trainer OptCheckTest.NoSuchTrainer: no trainer type 'OptCheckTest.NoSuchTrainer'",
                 marks=pytest.mark.slow),
    ({"dotnet_root": "/nonexistent/dotnet"}, r"^--dotnet-root /nonexistent/dotnet: no such directory; install"),
])
def test_what_cannot_be_loaded_is_one_line(dll, tmp_path, change, expect):
    need("coreclr")
    cfg = config(dll, steps=10)
    for key, value in change.items():  # a TorchSharpConfig field
        setattr(cfg.torchsharp, key, value)
    with pytest.raises(InputError) as e:
        soak(cfg, tmp_path / "run")
    assert re.search(expect, str(e.value)), str(e.value)
    assert "\n" not in str(e.value)


def test_missing_assembly_through_the_cli_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "optcheck.cli", "soak", "--backend", "torchsharp", "--steps", "10",
                          "-q", "--dotnet-assembly", str(tmp_path / "Missing.dll"), "--out", str(tmp_path / "run")],
                         cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"optcheck: error: --dotnet-assembly {tmp_path / 'Missing.dll'}: no such file; "
                     f"build the worker assembly first (see dotnet/README.md)"]


_FINGERPRINT_SCRIPT = r"""
import json, sys
from optcheck.data import BatchSchedule, load_corpus
from optcheck.torchsharp_bridge.worker import TorchSharpBackend
from optcheck.config import DataConfig, ModelConfig, RunConfig, SoakConfig, TorchSharpConfig
cfg = SoakConfig(model=ModelConfig(n_embd=16, n_head=2, block_size=16), data=DataConfig(batch_size=4),
                 run=RunConfig(backend="torchsharp"),
                 torchsharp=TorchSharpConfig(runtime="coreclr", assembly=sys.argv[1], trainer=sys.argv[2]))
corpus = load_corpus(None)
be = TorchSharpBackend()
be.setup(cfg, corpus)
sched = BatchSchedule(corpus.train.size, cfg.model.block_size, cfg.data.batch_size, cfg.run.seed)
out = {"before": be.fingerprint()}
for step in (1, 2, 3):
    be.train_step(step, *sched.batch(corpus.train, step))
out["cached"], out["fresh"] = be.fingerprint(), int(be.driver.Fingerprint())
be.inject("param-replaced", 4)
out["after_inject"], out["fresh_after_inject"] = be.fingerprint(), int(be.driver.Fingerprint())
print(json.dumps(out))
"""


@pytest.mark.parametrize("trainer", ["OptCheckTest.LazyTrainer", "OptCheckTest.InStepTrainer"])
def test_the_fingerprint_a_step_returns_is_the_pre_step_check_of_the_next(dll, trainer):
    """StepBound writes ProbeCore.Fingerprint after the step, so the per-step pre-step check needs
    no second .NET call; anything run in between (here an injected fault) makes the backend ask again.
    A guarded trainer (InStepTrainer: its optimizer's step() runs the in-step check) hands on the
    fingerprint that check computed: the same value, no second computation."""
    need("coreclr")
    res = subprocess.run([sys.executable, "-c", _FINGERPRINT_SCRIPT, str(dll), trainer], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["cached"] == out["fresh"] == out["before"]  # a clean step keeps every identity
    assert out["after_inject"] == out["fresh_after_inject"] != out["cached"]
