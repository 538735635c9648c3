"""``optcheck scenarios``: what each scenario does without optcheck, per backend version,
each line checked against the record it cites (the TorchSharp 0.107.0 run directories)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import run_cli
from optcheck import scenarios
from optcheck.scenarios import CATALOGUE, OUTCOMES, Outcome, ScenarioInfo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_backend_of_every_scenario_has_a_measured_outcome(name):
    s = CATALOGUE[name]
    for backend in s.backends:
        outs = s.outcomes(backend)
        assert outs and all(o.version for o in outs), f"{name} on {backend}: no version recorded"
    assert {o.backend for o in OUTCOMES[name]} <= set(s.backends) | {"torchsharp"}


def test_every_source_exists():
    for name, outs in OUTCOMES.items():
        for o in outs:
            path = o.source.split(" ")[0].rstrip(",")
            assert (ROOT / path).exists(), f"{name} {o.label}: {o.source}"


def test_torchsharp_versions_differ_where_the_records_differ():
    eager = {o.version: o.text for o in CATALOGUE["eager-param-list"].outcomes("torchsharp")}
    assert set(eager) == {"0.99.6", "0.107.0"}
    assert eager["0.99.6"].startswith("nothing throws")
    assert "zero_grad() throws InvalidOperationException" in eager["0.107.0"]


@pytest.mark.parametrize("name,outcome", [(n, o) for n, outs in OUTCOMES.items() for o in outs
                                          if o.source.startswith("tests/fixtures/torchsharp/0.107.0-runs/")])
def test_0107_outcome_matches_its_run(name, outcome):
    summary = json.loads((ROOT / outcome.source / "summary.json").read_text())
    assert summary["versions"]["torchsharp"] == outcome.version == "0.107.0"
    assert any(i.startswith(f"{name}@") for i in summary["inject"])
    crash = summary.get("crash")
    if crash:
        assert crash["exc_type"].rsplit(".", 1)[-1] in outcome.text
        key = re.search(r"key (\d+)", outcome.text)
        if key:
            assert f"'{key.group(1)}'" in crash["message"]
    else:
        assert re.search(r"(?<!nothing )throws", outcome.text) is None


def test_0996_outcome_matches_its_record():
    from optcheck.torchsharp_bridge.fixtures import load_fixture

    for name, outs in OUTCOMES.items():
        for o in outs:
            if not o.source.endswith(".jsonl"):
                continue
            run = load_fixture(ROOT / o.source)
            assert o.version == "0.99.6" and "0.99.6" in json.dumps(run.meta)
            throws = re.search(r"(?<!nothing )throws", o.text) is not None
            assert bool(run.exceptions) == throws, (name, o.text)


def test_a_scenario_without_outcomes_says_its_version_is_not_recorded(monkeypatch):
    s = ScenarioInfo("made-up", ("torchsharp",), "x", "y", (), "it breaks")
    monkeypatch.setitem(scenarios.OUTCOMES, "made-up", ())
    assert s.outcomes() == [Outcome("torchsharp", "", "it breaks", "")]
    assert s.outcomes()[0].label == "TorchSharp (version not recorded)"


def test_cli_shows_which_version_a_line_describes():
    rc, out, _ = run_cli(["scenarios", "--backend", "torchsharp", "--sources"])
    assert rc in (0, None)
    block = out.split("eager-param-list  [torchsharp]")[1].split("\n", 1)[1]
    block = block.split("\n", 5)
    text = "\n".join(block)
    assert "TorchSharp 0.99.6   nothing throws" in text
    assert "TorchSharp 0.107.0  the old parameters are disposed" in text
    assert "(measured: tests/fixtures/torchsharp/0.107.0-runs/eager-param-list-1000)" in out
    assert "PyTorch 2." not in out  # no PyTorch outcome line (descriptions may name both backends)
    rc, out, _ = run_cli(["scenarios", "--backend", "pytorch"])
    assert "PyTorch 2.13  trains silently" in out and "TorchSharp 0." not in out


@pytest.mark.parametrize("name,outcome", [(n, o) for n, outs in OUTCOMES.items() for o in outs if o.flagged])
def test_flagged_codes_are_what_the_rules_find_on_the_record(name, outcome):
    from optcheck.commands.check import check_file
    from optcheck.engine import check_stream
    from optcheck.torchsharp_bridge.fixtures import load_fixture

    src = ROOT / outcome.source
    found = check_file(src)[0] if src.is_dir() else check_stream(load_fixture(src).snapshots)
    assert tuple(sorted({f.code for f in found})) == outcome.flagged


def test_cli_shows_what_optcheck_flags_on_each_version():
    _, out, _ = run_cli(["scenarios", "--backend", "torchsharp"])
    assert "[optcheck: OC101, OC102, OC104]" in out and "[optcheck: OC102, OC104, OC107, OC109]" in out
