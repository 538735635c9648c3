"""The house rules of the code's layout (issue 26), checked on the source itself:

- no module imports another package's private (``_x``) names or modules, nor reaches into
  an object's private attribute defined in another module (``mon._record_crash``: such
  calls go through a public interface, issue 35);
- nothing in ``optcheck/pytorch/`` imports ``optcheck.distributed``, ``optcheck.rules`` or
  ``optcheck.drivers`` (the probes are the lowest layer; the drivers and the rules sit
  on top of them), except the PyTorch worker's entry module, which *is* a driver
  (``python -m optcheck.pytorch.worker`` runs ``worker_loop.run``);
- a module over 400 lines says why at its top (``Over 400 lines: ...`` in its docstring);
- no import circle anywhere in ``optcheck/`` (imports inside functions count too), and an
  import from a lower layer (:data:`LAYERS`) up to a higher one says why on its line or the
  line above (``# (upward: ...)``); the record format (``optcheck/record/``) imports
  nothing of optcheck's above the base modules (issue 35);
- one writer of ``summary.json``: ``optcheck/run/recorder.py`` alone calls the file layer's
  ``write_summary`` or ``RunDir.summary`` (issue 35).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PKG = ROOT / "optcheck"
MODULES = sorted(p for p in PKG.rglob("*.py"))
#: pytorch/ modules allowed to import a driver: the worker's entry point is itself a driver
PYTORCH_DRIVERS = {"optcheck/pytorch/worker.py"}
LOWER_FORBIDDEN = ("optcheck.distributed", "optcheck.rules", "optcheck.drivers")


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def _own_package(p: Path) -> str:
    parts = p.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1])


def _imports(p: Path, text: str | None = None):
    """``(module, names)`` of every ``from optcheck... import ...`` in ``p`` (or ``text``), at any depth."""
    for node in ast.walk(ast.parse(p.read_text(encoding="utf-8") if text is None else text)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("optcheck"):
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("optcheck"):
                    yield a.name, []


def _package_of(module: str) -> str:
    """The package ``module`` belongs to (itself when it is a package)."""
    path = ROOT.joinpath(*module.split("."))
    return module if path.is_dir() else module.rpartition(".")[0]


def private_imports(p: Path, text: str | None = None) -> list[str]:
    own = _own_package(p)
    bad = []
    for module, names in _imports(p, text):
        parts = module.split(".")
        for i, part in enumerate(parts):
            if part.startswith("_") and not part.startswith("__") and ".".join(parts[:i]) != own:
                bad.append(f"module {module}")
                break
        if _package_of(module) != own:
            bad += [f"{module}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    return bad


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_module_imports_another_packages_private_names(path):
    assert private_imports(path) == []


def test_the_private_name_check_fires_on_a_planted_import():
    planted = PKG / "distributed" / "planted_for_test.py"  # (never written: its text is given)
    text = ("from optcheck.pytorch.probe import _VERSIONS\nfrom optcheck.rules._events import events\n"
            "from optcheck.distributed._x import y\n")
    assert private_imports(planted, text) == ["optcheck.pytorch.probe._VERSIONS", "module optcheck.rules._events"]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_privates(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, assigned names and attributes."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _private(n.name):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _private(n.attr):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and _private(n.id):
            out.add(n.id)
    return out


_TREES = {p: ast.parse(p.read_text(encoding="utf-8")) for p in MODULES}
#: private names optcheck defines somewhere (an access to one of them from another module is refused)
OPTCHECK_PRIVATES = set().union(*(_defined_privates(t) for t in _TREES.values()))
#: third-party private APIs that share a name with one of optcheck's: the access is to theirs
THIRD_PARTY = {"_values": "torch.Tensor._values() of a sparse COO gradient (optcheck/pytorch/hazards/_tensors.py)"}


def private_accesses(p: Path, text: str | None = None) -> list[str]:
    """``obj._name`` in ``p`` where ``_name`` is a private optcheck defines in another module
    only (``self._x``/``cls._x`` of the module's own classes are fine)."""
    tree = _TREES[p] if text is None else ast.parse(text)
    own = _defined_privates(tree)
    bad = []
    for n in ast.walk(tree):
        if (isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in own and n.attr not in THIRD_PARTY
                and n.attr in OPTCHECK_PRIVATES and not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))):
            bad.append(f"{n.lineno}: {ast.unparse(n)}")
    return bad


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_no_module_reaches_into_another_modules_private_attributes(path):
    assert private_accesses(path) == []


def test_the_private_access_check_fires_on_planted_accesses():
    text = ("def end(mon, h):\n    mon._step_done()\n    h.monitor._losses.clear()\n"
            "    return self._own\n")  # (privates of optcheck/drivers/monitor.py)
    assert private_accesses(PKG / "integrations" / "_common.py", text) == [
        "2: mon._step_done", "3: h.monitor._losses"]
    # the issue's own check, on the source: no Monitor private reached from outside
    import re
    hits = [f"{_rel(p)}: {m.group(0)}" for p in MODULES for m in re.finditer(
        r"\b(mon|self\.monitor)\._[a-z_]+", p.read_text(encoding="utf-8"))]
    assert hits == []


@pytest.mark.parametrize("path", [p for p in MODULES if _rel(p).startswith("optcheck/pytorch/")], ids=_rel)
def test_the_probes_import_no_driver_and_no_rule(path):
    if _rel(path) in PYTORCH_DRIVERS:
        pytest.skip("the PyTorch worker's entry module is a driver")
    up = [m for m, _ in _imports(path) if m.startswith(LOWER_FORBIDDEN)]
    assert up == [], f"{_rel(path)} imports {up}"


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_a_module_over_400_lines_says_why(path):
    text = path.read_text(encoding="utf-8")
    if len(text.splitlines()) <= 400:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert "Over 400 lines:" in doc, f"{_rel(path)}: {len(text.splitlines())} lines and no reason at its top"


#: what the run (optcheck/run/) may not import: the drivers and commands sit on top of it
RUN_FORBIDDEN = ("optcheck.drivers", "optcheck.distributed", "optcheck.commands", "optcheck.integrations",
                 "optcheck.pytorch", "optcheck.torchsharp_bridge")


@pytest.mark.parametrize("path", [p for p in MODULES if _rel(p).startswith("optcheck/run/")], ids=_rel)
def test_the_run_imports_no_driver_and_no_backend(path):
    up = [m for m, _ in _imports(path) if m.startswith(RUN_FORBIDDEN)]
    assert up == [], f"{_rel(path)} imports {up}"


def test_the_layering_check_fires_on_a_planted_import():
    text = "from optcheck.drivers.monitor import Monitor\nimport optcheck.pytorch.probe\n"
    planted = PKG / "run" / "planted_for_test.py"  # (never written: its text is given)
    assert [m for m, _ in _imports(planted, text) if m.startswith(RUN_FORBIDDEN)] == [
        "optcheck.drivers.monitor", "optcheck.pytorch.probe"]
    assert [m for m, _ in _imports(planted, text) if m.startswith(LOWER_FORBIDDEN)] == ["optcheck.drivers.monitor"]


#: optcheck's packages and top modules from the lowest layer up; an import points down (or sideways)
LAYERS = (
    ("errors", "units", "wording", "findings", "series", "heap", "userframe", "torch_version", "config", "data",
     "scenarios"),                               # base: no run, no rule, no backend
    ("record",),                                 # the record format the rules and every reader read
    ("rules", "suppress", "engine"),             # the rule catalogue and the engine running it
    ("run",),                                    # the run's writer: recorder, run directory, sequencer
    ("report",),                                 # reading runs back, and what is printed of them
    ("pytorch", "torchsharp_bridge"),            # the backends' probes
    ("drivers", "distributed", "autowatch"),     # what runs a training and feeds its recorder
    ("judge",),                                  # two runs judged (upgrade runs soaks)
    ("commands", "integrations", "cli", "__init__", "__main__"),
)
_LAYER = {u: i for i, units in enumerate(LAYERS) for u in units}


def _module_name(p: Path) -> str:
    parts = p.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_NAMES = {_module_name(p): p for p in MODULES}


def _target(module: str) -> str | None:
    """The optcheck module (or package) an import names: ``optcheck.run.exitcodes.CLEAN`` -> the module."""
    while module and module not in _NAMES:
        module = module.rpartition(".")[0]
    return module or None


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def import_edges(p: Path, text: str | None = None):
    """``(line, target module)`` of every optcheck import in ``p`` (``from a import b`` counts
    ``a.b`` when it is a module), at any depth."""
    tree = _TREES[p] if text is None else ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("optcheck"):
            targets = {_target(f"{node.module}.{a.name}") for a in node.names}
        elif isinstance(node, ast.Import):
            targets = {_target(a.name) for a in node.names if a.name.startswith("optcheck")}
        else:
            continue
        for t in targets - {None, _module_name(p)}:
            yield node.lineno, t


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_optcheck():
    edges = {_module_name(p): {t for _, t in import_edges(p)} for p in MODULES}
    assert import_cycles(edges) == []


def test_the_circle_check_fires_on_a_planted_circle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _says_why(lines: list[str], n: int) -> bool:
    """``(upward: ...)`` on import line ``n`` (1-based), or above the block of imports it is in."""
    i = n - 1
    while True:
        if "(upward:" in lines[i]:
            return True
        if i == 0 or not lines[i - 1].lstrip().startswith(("from optcheck", "import optcheck", "# (upward:")):
            return i > 0 and "(upward:" in lines[i - 1]
        i -= 1


def upward_imports(p: Path, text: str | None = None) -> list[str]:
    """Imports of ``p`` into a higher layer without ``(upward: ...)`` on their line or above their block."""
    lines = (p.read_text(encoding="utf-8") if text is None else text).splitlines()
    me = _LAYER[_unit(_module_name(p))]
    return [f"{n}: {t}" for n, t in import_edges(p, text) if _LAYER[_unit(t)] > me and not _says_why(lines, n)]


@pytest.mark.parametrize("path", MODULES, ids=_rel)
def test_every_import_points_down_or_says_why(path):
    assert _unit(_module_name(path)) in _LAYER, f"{_rel(path)}: its package has no layer in LAYERS"
    assert upward_imports(path) == []


def test_the_upward_check_fires_on_a_planted_import():
    text = ("from optcheck.errors import InputError\nfrom optcheck.rules import catalogue\n"
            "# (upward: a reason)\nfrom optcheck.run.exitcodes import CLEAN\nfrom optcheck.run import rundir\n\n"
            "from optcheck.engine import RuleEngine\n")
    assert upward_imports(PKG / "record" / "summary.py", text) == ["2: optcheck.rules", "7: optcheck.engine"]


@pytest.mark.parametrize("path", [p for p in MODULES if _rel(p).startswith("optcheck/record/")], ids=_rel)
def test_the_record_format_imports_only_the_base(path):
    up = [t for _, t in import_edges(path) if _LAYER[_unit(t)] > _LAYER["record"]]
    assert up == [], f"{_rel(path)} imports {up}"


SUMMARY_WRITER = "optcheck/run/recorder.py"


def summary_writes(p: Path, text: str | None = None) -> list[str]:
    """Calls in ``p`` that put a ``summary.json`` on disk: the file layer's ``write_summary``, or
    ``RunDir.summary`` (``<...>rundir.summary(...)``); its own definitions left out."""
    tree = _TREES[p] if text is None else ast.parse(text)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        on_rundir = isinstance(f, ast.Attribute) and f.attr == "summary" and (
            (isinstance(f.value, ast.Attribute) and f.value.attr == "rundir")
            or (isinstance(f.value, ast.Name) and f.value.id == "rundir"))
        if name == "write_summary" or on_rundir:
            out.append(f"{node.lineno}: {ast.unparse(f)}")
    return out


def test_one_writer_of_summary_json():
    writers = {_rel(p): w for p in MODULES if (w := summary_writes(p))}
    # the file layer itself (RunDir.summary calls write_summary) and the recorder; nothing else
    assert set(writers) <= {SUMMARY_WRITER, "optcheck/run/rundir.py"}, writers
    assert all(w.endswith(": write_summary") for w in writers.get("optcheck/run/rundir.py", [])), writers
    # the issue's own look at the source: the lines that write summary.json are the recorder's
    import re
    hits = {_rel(p) for p in MODULES for line in p.read_text(encoding="utf-8").splitlines()
            if "summary.json" in line and re.search("write", line, re.I)}
    assert hits == {SUMMARY_WRITER}, hits


def test_the_writer_check_fires_on_planted_writes():
    text = ("from optcheck.run import rundir as rd\nrd.write_summary(out, s)\nrec.rundir.summary(s, final=False)\n"
            "rundir.summary(s)\nrec.summary()\n")
    assert summary_writes(PKG / "distributed" / "soak.py", text) == [
        "2: rd.write_summary", "3: rec.rundir.summary", "4: rundir.summary"]


def test_the_readme_is_a_guide_of_at_most_250_lines():
    """README.md is the user's guide (issue 26): measurements and design live in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail to docs/"
