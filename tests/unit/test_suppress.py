"""Accepted findings (``optcheck.suppress``): entry parsing, matching on rule and
parameter names, the pyproject.toml table, and the engine's ``suppressed`` count."""

from __future__ import annotations

import pytest

from optcheck.engine import RuleEngine
from optcheck.findings import Finding
from optcheck.suppress import is_suppressed, load_config, parse, resolve


def f(code, *subjects):
    return Finding(code=code, symbol="x", severity="error", step=3, message="m", subjects=list(subjects),
                   key=",".join(subjects))


def test_parse_codes_symbols_and_patterns():
    got = parse(["OC205:lm_head.*", "stale-param", " oc104 "])
    assert [(i.code, i.pattern) for i in got] == [("OC205", "lm_head.*"), ("OC101", None), ("OC104", None)]


@pytest.mark.parametrize("bad,needle", [("OC999", "no rule 'OC999'"), ("", "expected CODE or CODE:PATTERN"),
                                        ("OC205:", "empty pattern"), (5, "expected CODE")])
def test_bad_entries_name_themselves(bad, needle):
    with pytest.raises(ValueError, match=needle):
        parse([bad])


@pytest.mark.parametrize("ignore,finding,suppressed", [
    (["OC205:lm_head.*"], f("OC205", "lm_head.weight"), True),
    (["OC205:lm_head.*"], f("OC205", "lm_head.weight", "wte.weight"), False),  # one parameter not accepted
    (["OC205:lm_head.*", "OC205:wte.*"], f("OC205", "lm_head.weight", "wte.weight"), True),
    (["OC205:lm_head.*"], f("OC101", "lm_head.weight"), False),               # another rule
    (["OC205"], f("OC205", "a", "b"), True),                                  # the whole rule
    (["OC205:*"], f("OC205"), False),                                         # a pattern needs a parameter
    (["OC205:LM_HEAD.*"], f("OC205", "lm_head.weight"), False),               # case-sensitive, as names are
])
def test_matching(ignore, finding, suppressed):
    assert is_suppressed(finding, parse(ignore)) is suppressed


def test_pyproject_table_found_upwards_and_added_to_arguments(tmp_path, monkeypatch):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.optcheck]\nignore = ["OC401"]\n')
    monkeypatch.chdir(tmp_path / "a" / "b")
    assert [(i.code, i.source.endswith("pyproject.toml")) for i in load_config()] == [("OC401", True)]
    assert [i.code for i in resolve(["OC205"])] == ["OC401", "OC205"]
    assert [i.code for i in resolve(["OC205"], config=False)] == ["OC205"]
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load_config() == []
    (tmp_path / "pyproject.toml").write_text('[tool.optcheck\n')
    with pytest.raises(ValueError, match="cannot read"):
        load_config()


class _Reports:
    """A rule (the engine's plug-in interface) that reports OC205 on two parameters at every snapshot."""

    code = "OC205"

    def check(self, snap, ctx):
        return [f("OC205", "lm_head.weight"), f("OC205", "wte.weight")]


def test_engine_counts_suppressed_and_keeps_the_rest():
    eng = RuleEngine(rules=[_Reports], ignore=parse(["OC205:lm_head.*"]))
    assert [x.subjects for x in eng.feed({"step": 3})] == [["wte.weight"]]
    assert [x.subjects for x in eng.findings] == [["wte.weight"]]
    assert eng.suppressed_by_code() == {"OC205": 1}
    plain = RuleEngine(rules=[_Reports])
    assert len(plain.feed({"step": 3})) == 2 and plain.suppressed_by_code() == {}
