"""optcheck.report.junit: one test case per rule, a failure per finding, valid
against the JUnit 4 schema (tests/fixtures/junit.xsd)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from optcheck.errors import InputError
from optcheck.report.junit import write_junit
from optcheck.rules import catalogue, get

XSD = Path(__file__).resolve().parents[1] / "fixtures" / "junit.xsd"


@pytest.fixture(scope="module")
def schema():
    return xmlschema.XMLSchema(XSD)


def finding(code, step, subjects, severity=None, message=None):
    cls = get(code)
    return {"code": code, "symbol": cls.symbol, "severity": severity or cls.severity, "step": step,
            "phase": "pre-step", "message": message or f"{cls.symbol} of {', '.join(subjects)}",
            "subjects": subjects, "next_failure": "the next step() throws", "backend": "pytorch", "run": "r1"}


SUMMARY = {"run": "r1", "backend": "pytorch", "status": "crashed", "exit_code": 3, "steps_requested": 3000,
           "last_step": 1200, "snapshots": 13, "findings": 3, "loss_first": 5.42, "loss_last": 2.1,
           "elapsed_s": 41.25, "steps_per_s": 29.1, "peak_rss_bytes": 440627200,
           "versions": {"python": "3.11.7", "torch": "2.13.0"}, "corpus": {"sha256": "ab12", "source": "stdlib"},
           "config": {"steps": 3000, "every": 100, "inject": [{"name": "param-rebind", "step": 1000}]},
           "crash": {"exc_type": "RuntimeError", "message": "expected scalar type Double but found Float",
                     "stack": "Traceback ...\nRuntimeError: ...", "step": 1201, "signal": None, "exit_code": 1,
                     "stderr_tail": ["line 1", "RuntimeError: expected scalar type \x1b[31mDouble"]},
           "stopped": None, "out": "runs/r1"}


def test_clean_run_has_one_passing_case_per_rule(tmp_path, schema):
    path = write_junit([], tmp_path / "junit.xml", suite_name="optcheck soak runs/x")
    schema.validate(str(path))
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [f"{r.code} {r.symbol}" for r in catalogue()]
    assert suite.get("tests") == str(len(catalogue())) and suite.get("failures") == "0"
    assert root.findall(".//failure") == [] and root.findall(".//error") == []
    assert {c.get("classname") for c in cases} >= {"optcheck.references", "optcheck.memory", "optcheck.parity"}


def test_a_failure_per_finding_with_step_and_subjects(tmp_path, schema):
    findings = [finding("OC101", 1000, ["h.0.mlp.c_fc.weight"]), finding("OC104", 1000, ["h.0.mlp.c_fc.weight"]),
                finding("OC101", 2000, ["lm_head.weight", "wte.weight"]),
                finding("OC401", 2900, ["rss_bytes"], message="RSS grows 41.2 MiB per 1,000 steps; exceeds "
                                                              "the 4 GiB budget at step ~183,000")]
    path = write_junit(findings, tmp_path / "sub" / "junit.xml", suite_name="s", summary=SUMMARY)
    schema.validate(str(path))
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    oc101 = suite.find("testcase[@name='OC101 stale-param']")
    fails = oc101.findall("failure")
    assert len(fails) == 2
    assert fails[0].get("type") == "OC101 stale-param" and fails[0].get("message") == "stale-param of h.0.mlp.c_fc.weight"
    assert "at step 1000 (pre-step)" in fails[0].text and "subjects: h.0.mlp.c_fc.weight" in fails[0].text
    assert "subjects: lm_head.weight, wte.weight" in fails[1].text
    assert "~183,000" in suite.find("testcase[@name='OC401 memory-growth']/failure").get("message")
    # 3 failing rules + the crashed run as an error
    assert suite.get("failures") == "3" and suite.get("errors") == "1"
    assert suite.get("tests") == str(len(catalogue()) + 1) and suite.get("time") == "41.250"
    err = suite.find("testcase[@name='run']/error")
    assert err.get("type") == "RuntimeError" and "at step 1201" in err.text and "line 1" in err.text
    assert "\x1b" not in err.text  # control characters are not XML
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["versions.torch"] == "2.13.0" and props["status"] == "crashed" and props["corpus.sha256"] == "ab12"
    assert props["config.every"] == "100" and props["peak_rss_bytes"] == "440627200"


def test_below_fail_on_goes_to_system_out(tmp_path, schema):
    path = write_junit([finding("OC401", 10, ["rss_bytes"])], tmp_path / "j.xml", fail_on="error")
    schema.validate(str(path))
    case = ET.parse(path).getroot().find(".//testcase[@name='OC401 memory-growth']")
    assert case.find("failure") is None and "OC401 memory-growth [warning]" in case.find("system-out").text


def test_unknown_code_and_a_subset_of_rules(tmp_path, schema):
    path = write_junit([finding("OC101", 5, ["a"]), {"code": "OC999", "symbol": "future-rule", "severity": "error",
                                                     "step": 7, "message": "m", "subjects": []}],
                       tmp_path / "j.xml", rules=[get("OC101")])
    schema.validate(str(path))
    names = [c.get("name") for c in ET.parse(path).getroot().iter("testcase")]
    assert names == ["OC101 stale-param", "OC999 future-rule"]


def test_schema_rejects_what_ci_would(tmp_path, schema):
    """The schema is not a rubber stamp: a case without a name, a failure without a
    type and a zoned timestamp are all refused."""
    for bad in ('<testsuite name="s" tests="1"><testcase classname="c"/></testsuite>',
                '<testsuite name="s" tests="1"><testcase name="n" classname="c"><failure/></testcase></testsuite>',
                '<testsuite name="s" tests="1" timestamp="2026-01-01T00:00:00Z"/>',
                '<testsuite tests="1"/>'):
        assert not schema.is_valid(bad), bad


def test_unwritable_path_is_input_error(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="--junit"):
        write_junit([], tmp_path / "f" / "j.xml")
