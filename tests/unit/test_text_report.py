"""optcheck.report.text.render_summary: the end-of-run table."""

from __future__ import annotations

from optcheck.report.text import WIDTH, render_summary

BASE = {"run": "r1", "backend": "pytorch", "status": "clean", "exit_code": 0, "steps_requested": 3000,
        "last_step": 3000, "snapshots": 31, "findings": 0, "findings_by_code": {}, "loss_first": 5.4204,
        "loss_last": 1.5503, "val_loss_first": 2.19, "val_loss_last": 1.71, "elapsed_s": 57.4, "steps_per_s": 52.3,
        "peak_rss_bytes": 440627200, "versions": {"python": "3.11.7", "torch": "2.13.0+cpu"}, "corpus": {},
        "config": {}, "crash": None, "stopped": None, "out": "runs/r1"}


def f(code, symbol, step, subjects, severity="error", message="msg"):
    return {"code": code, "symbol": symbol, "severity": severity, "step": step, "subjects": subjects,
            "message": message}


def test_clean_run():
    text = render_summary(BASE, [])
    lines = text.splitlines()
    assert lines[0] == "optcheck: CLEAN (exit 0)   run r1   backend pytorch"
    assert "  steps        3,000 of 3,000   (31 snapshots, 57.4 s, 52.3 steps/s)" in lines
    assert "  loss         5.4204 -> 1.5503   held-out 2.1900 -> 1.7100" in lines
    assert "  peak RSS     420.2 MiB" in lines and "Findings: none" in lines
    assert "torch 2.13.0+cpu, python 3.11.7" in text and "Crash" not in text and "Lead time" not in text
    assert lines[-1] == "Run directory: runs/r1"


def test_findings_by_code_with_first_step_and_subjects():
    findings = [f("OC104", "ref-churn", 1000, ["h.0.mlp.c_fc.weight"], message="changed identity since step 900"),
                f("OC101", "stale-param", 1000, ["h.0.mlp.c_fc.weight"]),
                f("OC101", "stale-param", 1500, ["lm_head.weight"]),
                f("OC401", "memory-growth", 700, ["rss_bytes"], "warning",
                  "RSS grows 41.2 MiB per 1,000 steps; exceeds the 4 GiB budget at step ~183,000")]
    s = {**BASE, "status": "findings", "exit_code": 1, "findings": 4,
         "findings_by_code": {"OC101": 2, "OC104": 1, "OC401": 1}}
    text = render_summary(s, findings)
    lines = text.splitlines()
    assert lines[0].startswith("optcheck: FINDINGS (exit 1)") and "Findings: 4" in lines
    rows = [ln for ln in lines if ln.startswith("  OC")]
    assert [r.split()[0] for r in rows] == ["OC401", "OC104", "OC101"]  # ordered by first step
    oc101 = next(r for r in rows if r.startswith("  OC101"))
    assert oc101.split()[:5] == ["OC101", "stale-param", "error", "2", "1,000"]
    assert oc101.endswith("h.0.mlp.c_fc.weight, lm_head.weight")
    assert "exceeds the 4 GiB budget at step ~183,000" in text
    assert all(len(ln) <= WIDTH for ln in lines)


def test_crash_with_lead_time_computed_from_findings():
    crash = {"exc_type": "System.Collections.Generic.KeyNotFoundException",
             "message": "The given key '94721149339328' was not present in the dictionary.", "stack": "...",
             "step": 10_001, "signal": None, "exit_code": 1,
             "stderr_tail": ["warning: The .grad attribute of a Tensor that is not a leaf Tensor is being accessed",
                             "", "   at TorchSharp.Modules.AdamW.step(Func`1 closure)"]}
    s = {**BASE, "status": "crashed", "exit_code": 3, "last_step": 10_000, "crash": crash, "findings": 2}
    findings = [f("OC401", "memory-growth", 300, ["rss_bytes"], "warning"),
                f("OC104", "ref-churn", 1200, ["wte.weight"]), f("OC108", "missing-state", 1200, ["wte.weight"])]
    text = render_summary(s, findings)
    assert "Crash: System.Collections.Generic.KeyNotFoundException at step 10,001 (exit code 1)" in text
    assert "The given key '94721149339328' was not present in the dictionary." in text
    assert "    at TorchSharp.Modules.AdamW.step(Func`1 closure)" in text
    assert ("Lead time: flagged at step 1,200 (OC104 ref-churn), then "
            "System.Collections.Generic.KeyNotFoundException at step 10,001, a lead of 8,801 steps") in text


def test_lead_time_from_the_summary_wins_and_signal_crash():
    crash = {"exc_type": None, "message": "", "step": 500, "signal": "SIGKILL", "exit_code": -9, "stderr_tail": []}
    lt = {"flagged_step": 450, "flagged_phase": "pre-step", "finding": "OC108 missing-state", "failed_step": 500,
          "lead_steps": 50, "exception": "SIGKILL", "predicted": True}
    text = render_summary({**BASE, "status": "crashed", "crash": crash, "lead_time": lt}, [])
    assert "Crash: signal SIGKILL at step 500 (exit code -9)" in text
    assert "Lead time: flagged at step 450 (OC108 missing-state), then SIGKILL at step 500, a lead of 50 steps (predicted)" in text


def test_crash_without_earlier_finding_has_no_lead_time():
    crash = {"exc_type": "RuntimeError", "message": "boom", "step": 12}
    text = render_summary({**BASE, "status": "crashed", "crash": crash}, [f("OC401", "memory-growth", 40, ["rss_bytes"])])
    assert "Crash: RuntimeError at step 12" in text and "Lead time" not in text


def test_stopped_interrupted_and_sparse_summaries():
    s = {**BASE, "status": "stopped", "stopped": {"step": 1000, "reason": "OC104 ref-churn before step 1000 "
                                                                         "(--stop-on-finding)"}}
    assert "Stopped at step 1,000: OC104 ref-churn before step 1000 (--stop-on-finding)" in render_summary(s, [])
    assert render_summary({**BASE, "status": "interrupted", "exit_code": 130}, []).startswith(
        "optcheck: INTERRUPTED (exit 130)")
    sparse = render_summary({"status": "findings", "findings_by_code": {"OC202": 3}}, None)
    assert "optcheck: FINDINGS" in sparse and "  OC202" in sparse and "Findings: 3" in sparse
    assert render_summary({}, [])  # nothing known: still a table, no exception


def test_long_subjects_and_messages_are_cut_to_width():
    subjects = [f"h.{i}.attn.c_attn.weight" for i in range(40)]
    text = render_summary({**BASE, "status": "findings"}, [f("OC102", "untracked-param", 5, subjects,
                                                            message="x" * 500)])
    assert all(len(ln) <= WIDTH for ln in text.splitlines())
    assert "..." in text


def _loss_line(summary):
    return next(line for line in render_summary(summary, []).splitlines() if line.startswith("  loss"))


def test_one_held_out_evaluation_is_one_value():
    s = {**BASE, "val_loss_first": 2.2601, "val_loss_last": 2.2601, "val_step_first": 1000, "val_step_last": 1000}
    assert _loss_line(s) == "  loss         5.4204 -> 1.5503   held-out 2.2601 (step 1,000 only)"


def test_two_held_out_evaluations_are_a_change():
    s = {**BASE, "val_loss_first": 2.2846, "val_loss_last": 2.0031, "val_step_first": 1000, "val_step_last": 1500}
    assert _loss_line(s) == "  loss         5.4204 -> 1.5503   held-out 2.2846 -> 2.0031"


def test_held_out_of_a_summary_without_steps():
    """Recorded before val_step_* existed (tests/fixtures/torchsharp/0.107.0-runs/clean-1000):
    equal values were one evaluation shown twice."""
    import json
    from pathlib import Path

    rec = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "torchsharp" / "0.107.0-runs"
                      / "clean-1000" / "summary.json").read_text())
    assert "val_step_first" not in rec and rec["val_loss_first"] == rec["val_loss_last"]
    line = _loss_line(rec)
    assert line.endswith("held-out 2.2846") and "->" not in line.split("held-out")[1]
    assert _loss_line({**BASE, "val_loss_first": None, "val_loss_last": None}).endswith("1.5503")


def test_a_non_finite_peak_rss_prints_instead_of_crashing():
    text = render_summary({**BASE, "peak_rss_bytes": float("inf")}, [])
    assert "  peak RSS     inf B" in text.splitlines()


def test_what_fails_next_is_printed_under_its_code_wrapped_within_width():
    nxt = ("PyTorch: the optimizer keeps stepping the old tensors and the new ones never learn; TorchSharp: "
           "KeyNotFoundException at the next optimizer.step() naming the parameter's handle")
    findings = [{**f("OC101", "stale-param", 1000, ["wte.weight"]), "next_failure": nxt},
                {**f("OC101", "stale-param", 1100, ["wpe.weight"]), "next_failure": "something else"},
                f("OC102", "untracked-param", 1000, ["wte.weight"])]
    lines = render_summary({**BASE, "status": "findings", "exit_code": 1}, findings).splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("         next: "))
    assert lines[i - 2].startswith("  OC101")            # under its code's row and message
    told = " ".join(ln.strip() for ln in lines[i:i + 3]).removeprefix("next: ")
    assert told.startswith(" ".join(nxt.split())[:150]) and "something else" not in "\n".join(lines)
    assert sum(ln.startswith("         next: ") for ln in lines) == 1   # OC102 says nothing: no line
    assert all(len(ln) <= WIDTH for ln in lines)
