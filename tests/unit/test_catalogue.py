"""The rule catalogue itself: every rule documented, with VALID and INVALID examples
(``test_rule_fixtures.py`` runs them), in the module of its family, and made to fire
by at least one real run — a soak, a zoo loop, a seed scenario, or a run recorded on
TorchSharp — whose test asserts its code (``REAL_RUNS``)."""

from __future__ import annotations

import ast
import textwrap

import pytest

from collected_items import collect, described
from optcheck import rules
from optcheck.findings import SEVERITIES
from optcheck.rules._fixtures import Invalid, Valid


#: code -> the pytest node id of a test that runs a real training loop (or reads a run
#: recorded on TorchSharp) and asserts that the rule fires there. OC7xx: real 2-rank
#: gloo jobs under ``torch.distributed.run`` (``tests/distributed/dist_loop.py``).
REAL_RUNS = {
    "OC101": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[load-assign]",
    "OC102": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[module-swapped]",
    "OC103": "tests/unit/test_fixtures_torchsharp.py::test_head_weight_assign_names_only_the_head",
    "OC104": "tests/integration/test_soak.py::test_injected_fault_is_flagged_at_its_step[param-rebind-expected0]",
    "OC105": "tests/unit/test_rules_real_records.py::"
             "test_to_float64_on_0996_makes_the_plain_parameter_fields_non_leaf_members",
    "OC106": "tests/unit/test_fixtures_torchsharp.py::test_tied_is_a_duplicate_by_data_pointer",
    "OC107": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[half-after-state]",
    "OC108": "tests/unit/test_fixtures_torchsharp.py::test_missing_state_predicts_the_exact_key_of_the_exception"
             "[to-float64]",
    "OC109": "tests/unit/test_fixtures_torchsharp.py::"
             "test_0107_eager_param_list_names_the_disposed_members_and_the_exception",
    "OC201": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[grad-of-intermediate]",
    "OC202": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[unused-layer]",
    "OC203": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[loss-detached]",
    "OC204": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[missing-zero-grad]",
    "OC205": "tests/integration/test_monitor_optimizers.py::test_a_hand_written_step_that_rebinds_is_stalled",
    "OC206": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[missing-step]",
    "OC207": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[zero-grad-between]",
    "OC208": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[double-step]",
    "OC209": "tests/integration/test_monitor_recipes.py::test_optimizer_swapped_mid_run_is_followed_not_reported_as_no_step",
    "OC301": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[inplace-exp]",
    "OC401": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[leak]",
    "OC402": "tests/unit/test_memory_rule.py::test_recorded_missing_dispose_scope_is_named_at_600",
    "OC501": "tests/integration/test_monitor_zoo.py::test_planted_bug_is_named[exploding-lr]",
    "OC601": "tests/integration/test_compare_soaks.py::test_ten_times_the_learning_rate_fails_through_the_cli",
    "OC701": "tests/distributed/test_distributed_monitor.py::test_no_sync_that_never_syncs_makes_replicas_diverge_OC701",
    "OC702": "tests/distributed/test_distributed_monitor.py::test_rank_1_learning_rate_changed_is_OC702_at_its_step",
    "OC703": "tests/distributed/test_distributed_monitor.py::test_a_skipped_optimizer_step_on_rank_1_is_a_finding_not_a_hang",
    "OC704": "tests/distributed/test_distributed_monitor.py::test_a_parameter_unused_on_rank_1_only_is_OC704",
    "OC705": "tests/distributed/test_distributed_monitor.py::test_diverging_batchnorm_buffers_are_OC705_info",
    "OC706": "tests/distributed/test_distributed_monitor.py::test_an_unused_parameter_under_ddp_is_OC706_one_forward_before_ddp_raises",
    "OC707": "tests/distributed/test_distributed_monitor.py::test_a_rank_killed_under_the_monitor_is_OC707_naming_it",
}


@pytest.mark.parametrize("cls", rules.catalogue(), ids=lambda c: c.code)
def test_rule_is_documented(cls):
    assert cls.code.startswith("OC") and cls.symbol and cls.severity in SEVERITIES and cls.message
    doc = cls.doc()
    assert len(doc.splitlines()) >= 3, f"{cls.code} needs a docstring: what, what fails next, how to fix"
    assert "Fix" in doc or "fix" in doc
    assert rules.get(cls.symbol) is cls and rules.get(cls.code.lower()) is cls


@pytest.mark.parametrize("cls", rules.catalogue(), ids=lambda c: c.code)
def test_rule_has_valid_and_invalid_examples(cls):
    assert cls.VALID and all(type(c) is Valid for c in cls.VALID), f"{cls.code} needs VALID examples"
    assert cls.INVALID and all(type(c) is Invalid for c in cls.INVALID), f"{cls.code} needs INVALID examples"


@pytest.mark.parametrize("cls", rules.catalogue(), ids=lambda c: c.code)
def test_rule_lives_in_the_module_of_its_family(cls):
    module = cls.__module__.rsplit(".", 1)[1]
    assert cls.family and (module == cls.family or module.startswith(cls.family + "_")), (cls.code, module, cls.family)


# -- every rule fires in a real run ---------------------------------------------------------

def _own_id(item) -> str:
    """``item``'s node id as written in :data:`REAL_RUNS`: under ``--dist loadgroup`` pytest-xdist appends
    ``@<group>`` to the node id of every item with an ``xdist_group`` marker (tests/conftest.py gives each one)."""
    marker = item.get_closest_marker("xdist_group")
    group = (marker.args[0] if marker.args else marker.kwargs.get("name")) if marker else None
    suffix = f"@{group}"
    return item.nodeid[:-len(suffix)] if group and item.nodeid.endswith(suffix) else item.nodeid


@pytest.fixture(scope="module")
def collected(request, tmp_path_factory):
    """Each real run's test: its function's source and parametrize values. From this session's own
    items when it selected every one of them (a full run: one collecting subprocess less, about 6 CPU-s),
    else from ``pytest --collect-only`` over their files (tests/collected_items.py) — the default selection
    either way, so a real run moved under ``-m slow`` is missing in both."""
    mine = {_own_id(item): item for item in request.session.items}
    if all(node in mine for node in REAL_RUNS.values()):
        return {node: described(mine[node]) for node in REAL_RUNS.values()}
    files = sorted({node.split("::")[0] for node in REAL_RUNS.values()})
    return collect(tmp_path_factory.mktemp("collect") / "items.json", *files)


def asserts_code(source: str, params: dict[str, str], code: str) -> bool:
    """True when the test function's code (not its docstring, not a comment) holds
    ``code`` in a string, or uses a parameter whose value for this item holds it."""
    fn = ast.parse(textwrap.dedent(source)).body[0]
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and \
        isinstance(fn.body[0].value, ast.Constant) else fn.body
    nodes = [n for stmt in body for n in ast.walk(stmt)]
    if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and code in n.value for n in nodes):
        return True
    used = {n.id for n in nodes if isinstance(n, ast.Name)}
    return any(name in used and code in value for name, value in params.items())


def test_every_rule_has_a_real_run():
    assert sorted(REAL_RUNS) == sorted(cls.code for cls in rules.catalogue()), \
        "every rule needs a real run (a soak, a zoo loop, a seed scenario, a recorded TorchSharp run) in REAL_RUNS"


@pytest.mark.parametrize("code", sorted(REAL_RUNS))
def test_the_real_run_exists_and_asserts_the_code(code, collected):
    node = REAL_RUNS[code]
    assert node in collected, f"{code}: no test {node}"
    item = collected[node]
    assert asserts_code(item["source"], item["params"], code), f"{node} does not assert {code}"


def test_asserts_code_reads_code_not_comments_or_docstrings():
    src = 'def test_x(code):\n    """OC999 in a docstring."""\n    # OC998 in a comment\n    assert code in found\n'
    assert not asserts_code(src, {}, "OC999") and not asserts_code(src, {}, "OC998")
    assert asserts_code(src, {"code": "'OC997'"}, "OC997") and not asserts_code(src, {"bug": "'OC997'"}, "OC997")
    assert asserts_code('def test_y():\n    assert f.code == "OC996"\n', {}, "OC996")
