"""One ``summary.json`` for the soak and the Monitor (issue 17): a real soak's and a real
Monitor run's summary validate against the one published schema
(``optcheck schema summary``: the frame ``optcheck/schemas/summary-1.json`` and, for
``summary_version`` 2, every field of ``Summary`` present and typed),
carry what optcheck cost the run, and a summary written before the shared type (no
``summary_version``) still validates. Also ``--val-every 0``: no held-out loss anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from conftest import SMALL, run_cli
from optcheck.run import exitcodes
from optcheck.report.reader import read_summary
from optcheck.record.summary import SUMMARY_VERSION, Summary
from optcheck.record.snapshot import read_jsonl, schema_document
from optcheck.record.check import read_snapshots

SCHEMA = schema_document("summary")
FIXTURES = Path(__file__).parents[1] / "fixtures" / "torchsharp" / "0.107.0-runs"


def validate(summary: dict) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(summary)


def check_cost(s: dict) -> None:
    snaps, checks = s["cost"]["snapshots"], s["cost"]["checks"]
    assert snaps["count"] == checks["count"] == s["snapshots"] > 0
    assert 0 < snaps["median_s"] <= snaps["total_s"] and 0 < checks["median_s"] <= checks["total_s"]
    assert snaps["total_s"] + checks["total_s"] < s["elapsed_s"] * 2  # measured, not made up
    steps = s["cost"]["steps"]  # the hooks' own time per step (optcheck.run.sequencer.StepCost), measured
    assert steps["count"] == s["last_step"] and 0 < steps["total_s"] < s["elapsed_s"]
    assert steps["mean_us"] == pytest.approx(steps["total_s"] / steps["count"] * 1e6, rel=0.01, abs=0.02)


def test_a_real_soak_summary_validates_and_says_what_optcheck_cost(tmp_path):
    out = tmp_path / "soak"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "60", "--every", "20", "--out", str(out), *SMALL])
    assert rc == exitcodes.CLEAN, stdout
    s = json.loads((out / "summary.json").read_text())
    validate(s)
    assert s["summary_version"] == SUMMARY_VERSION and s["source"] == "soak" and s["status"] == "clean"
    assert s["schema"] == "optcheck.summary/1" and read_summary(out)["run"] == "soak"
    check_cost(s)
    assert s["snapshots"] == 4  # start, 20, 40, final 60
    (line,) = [ln for ln in stdout.splitlines() if ln.startswith("optcheck cost:")]
    assert f"{s['cost']['snapshots']['count']} snapshots {s['cost']['snapshots']['total_s']:.3f} s" in line
    assert f"{s['cost']['checks']['count']} rule checks" in line
    assert f"{s['cost']['steps']['mean_us']:.0f} µs a step over 60 steps" in line
    assert 0 < s["cost"]["train_cpu_s"] < s["elapsed_s"] * 4  # the worker's training loop, on <= 4 threads


def test_a_real_monitor_summary_validates_against_the_same_schema(tmp_path):
    torch = pytest.importorskip("torch")
    import optcheck

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    with optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "mon"), ignore_config=False) as mon:
        running = json.loads((tmp_path / "mon" / "summary.json").read_text())
        for _ in range(12):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    validate(running)  # the "running" summary written at the start is a full one too
    assert running["status"] == "running"
    s = json.loads((tmp_path / "mon" / "summary.json").read_text())
    validate(s)
    assert s["summary_version"] == SUMMARY_VERSION and s["source"] == "monitor" and s["status"] == "clean"
    assert s["last_step"] == 12 and s["snapshots"] == 4  # start, 5, 10, final 12
    assert s == {**mon.summary(), "schema": "optcheck.summary/1", "finished": s["finished"],
                 "elapsed_s": s["elapsed_s"], "steps_per_s": s["steps_per_s"]}
    check_cost(s)
    assert s["cost"]["train_cpu_s"] is None  # a soak's only: the worker's process is its training loop


def test_the_schema_requires_every_field_of_a_version_2_summary():
    s = Summary(run="r", backend="pytorch", source="soak").to_dict()
    validate(s)
    for field in ("cost", "source", "last_step"):
        with pytest.raises(jsonschema.ValidationError):
            validate({k: v for k, v in s.items() if k != field})
    with pytest.raises(jsonschema.ValidationError):
        validate({**s, "source": "notebook"})


def test_summaries_written_before_the_shared_type_still_validate():
    old = json.loads((FIXTURES / "clean-1000" / "summary.json").read_text())
    assert "summary_version" not in old
    validate(old)
    assert read_summary(FIXTURES / "clean-1000")["status"] == old["status"]


def test_val_every_0_computes_no_held_out_loss(tmp_path):
    out = tmp_path / "noval"
    args = [a for a in SMALL]
    args[args.index("--val-every") + 1] = "0"
    rc, stdout, _ = run_cli(["soak", "-q", "--steps", "40", "--every", "20", "--eval-every", "20",
                             "--out", str(out), *args])
    assert rc == exitcodes.CLEAN, stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["val_loss_first"] is None and s["val_loss_last"] is None and s["val_step_first"] is None
    assert all(snap["val_loss"] is None for snap in read_snapshots(out / "snapshots.jsonl"))
    evals = [e for e in read_jsonl(out / "events.jsonl") if e.get("name") == "eval"]
    assert len(evals) == 2 and all("val_loss" not in e for e in evals)  # the eval pass ran, no held-out loss
    assert "held-out" not in stdout
