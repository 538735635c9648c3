"""Rules on real runs recorded on TorchSharp (``tests/fixtures/torchsharp/``), for the
rules no PyTorch run can make fire: a recorded run is the real run the catalogue test
(``test_catalogue.py::REAL_RUNS``) points at."""

from __future__ import annotations

from optcheck.engine import check_stream
from optcheck.torchsharp_bridge.fixtures import load_all


def test_to_float64_on_0996_makes_the_plain_parameter_fields_non_leaf_members():
    """TorchSharp 0.99.6, ``model.to(Float64)`` after the optimizer was built: the plain
    ``Parameter`` fields (``ln_f``) are rebuilt as ``param.to(dtype)``, results of an op
    (TorchSharp #1148): OC105 at the pre-step check of step 20, where the fault was planted."""
    run = load_all()["to-float64"]
    fault = run.faults[0]["step"]
    found = [f for f in check_stream(run.snapshots) if f.code == "OC105"]
    assert [(f.step, f.phase, sorted(f.subjects)) for f in found] == [(fault, "pre-step", ["ln_f.bias", "ln_f.weight"])]
    assert fault == 20 and len(found[0].detail["refs"]) == 2


def test_clean_0996_record_has_no_non_leaf_member():
    assert [f for f in check_stream(load_all()["clean"].snapshots) if f.code == "OC105"] == []
