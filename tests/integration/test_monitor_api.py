"""The Monitor API as users meet it: optimizer wrappers, ``on_finding="raise"``,
where warnings point, a loop that dies outside ``with``, accepted findings
(``ignore``). Loops here are written inline, the ordinary way."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import optcheck  # noqa: E402
from optcheck.drivers.monitor import FindingError, OptcheckWarning  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def batch():
    return torch.randn(16, 8), torch.randint(0, 2, (16,))


def train(model, opt, steps, replace_at=None, step_opt=None):
    """A plain loop; at ``replace_at`` the head is replaced after the optimizer exists
    (the optimizer keeps stepping the old one: OC101 + OC102 + OC104 at that step)."""
    step_opt = step_opt or opt
    for i in range(1, steps + 1):
        if i == replace_at:
            model[2] = nn.Linear(16, 2)
        x, y = batch()
        loss = nn.functional.cross_entropy(model(x), y)
        step_opt.zero_grad()
        loss.backward()
        step_opt.step()


def findings(out):
    return list(read_jsonl(Path(out) / "findings.jsonl"))


def summary(out):
    return json.loads((Path(out) / "summary.json").read_text())


# ----------------------------------------------------------------- item 2: wrappers
class HoldsOptimizer:
    """A wrapper as frameworks write them: the real optimizer in ``.optimizer``."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        return self.optimizer.step(closure)


def _wrappers():
    out = [("custom .optimizer wrapper", lambda o: HoldsOptimizer(o)),
           ("wrapper of a wrapper", lambda o: HoldsOptimizer(HoldsOptimizer(o)))]
    try:
        from accelerate import Accelerator

        def accelerated(o):
            wrapped = Accelerator(cpu=True).prepare_optimizer(o)
            assert type(wrapped).__name__ == "AcceleratedOptimizer"
            return wrapped

        out.append(("accelerate AcceleratedOptimizer", accelerated))
    except ImportError:
        pass
    try:
        from lightning.pytorch.core.optimizer import LightningOptimizer

        # outside a Trainer a LightningOptimizer cannot step (no strategy): the loop steps the
        # optimizer inside it; the integration tests step it through Lightning itself
        out.append(("lightning LightningOptimizer", lambda o: LightningOptimizer(o)))
    except ImportError:
        pass
    return out


WRAPPERS = _wrappers()


def _watched_run(out, name, wrap, steps, **train_kw):
    """A fresh tiny model and AdamW, handed to the Monitor through ``wrap``, trained ``steps`` steps;
    returns (the Monitor, the inner optimizer)."""
    model = tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    wrapped = wrap(opt)
    stepper = opt if "Lightning" in name else wrapped
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptcheckWarning)
        with optcheck.Monitor(model, wrapped, every=5, out=str(out)) as mon:
            train(model, opt, steps, step_opt=stepper, **train_kw)
    return mon, opt


@pytest.mark.parametrize("name,wrap", WRAPPERS, ids=[n for n, _ in WRAPPERS])
def test_wrapped_optimizer_is_watched_clean_and_bug_found(tmp_path, name, wrap):
    mon, opt = _watched_run(tmp_path / "clean", name, wrap, 20)
    assert mon.optimizer is opt and mon.step_count == 20 and findings(tmp_path / "clean") == []
    _watched_run(tmp_path / "bug", name, wrap, 12, replace_at=7)
    got = {(f["code"], f["step"]) for f in findings(tmp_path / "bug")}
    assert {("OC101", 7), ("OC102", 7), ("OC104", 7)} <= got


def test_data_parallel_model_is_watched_under_its_own_names(tmp_path):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dp = nn.DataParallel(model)  # no GPU: forwards to the module itself
    with optcheck.Monitor(dp, opt, every=5, out=str(tmp_path)) as mon:
        for _ in range(10):
            x, y = batch()
            loss = nn.functional.cross_entropy(dp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert mon.model is model and findings(tmp_path) == []
    snap = next(iter(read_jsonl(tmp_path / "snapshots.jsonl")))
    assert [p["name"] for p in snap["params"]][0] == "0.weight"


def test_ddp_model_in_a_one_process_gloo_group_is_watched_as_its_module(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = tiny()
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
        with optcheck.Monitor(ddp, opt, every=5, out=str(tmp_path / "run")) as mon:
            train(ddp, opt, 10)
    finally:
        dist.destroy_process_group()
    assert mon.model is model and findings(tmp_path / "run") == [] and mon.step_count == 10
    snap = next(iter(read_jsonl(tmp_path / "run" / "snapshots.jsonl")))
    assert [p["name"] for p in snap["params"]] == ["0.weight", "0.bias", "2.weight", "2.bias"]


@pytest.mark.parametrize("bad", [object(), [torch.zeros(1)], HoldsOptimizer(None)])
def test_anything_else_is_one_clear_type_error(bad):
    with pytest.raises(TypeError) as e:
        optcheck.Monitor(tiny(), bad)
    msg = str(e.value)
    assert "\n" not in msg and "torch.optim.Optimizer" in msg and type(bad).__qualname__ in msg
    with pytest.raises(TypeError, match="must be a torch.nn.Module, got dict"):
        optcheck.Monitor({}, torch.optim.SGD(tiny().parameters(), lr=0.1))


# ----------------------------------------------------------------- item 10: raise
def test_raise_writes_every_finding_first_and_says_the_step_did_not_run(tmp_path):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(FindingError) as e:
        with optcheck.Monitor(model, opt, every=50, out=str(tmp_path), on_finding="raise") as mon:
            old = model[2].weight
            train(model, opt, 10, replace_at=4)
    err = e.value
    written = findings(tmp_path)
    s = summary(tmp_path)
    assert {f["code"] for f in written} >= {"OC101", "OC102", "OC104"}
    assert len(written) == s["findings"] == len(mon.findings) == len(err.findings) >= 3
    assert err.finding.step == 4 and err.finding.phase == "pre-step" and err.step_ran is False
    assert "more finding(s) in findings.jsonl" in str(err)
    # the step did not run: the optimizer's steps 1-3 only (SGD has no state, so look at the
    # old head's weight, which the optimizer still holds: unchanged since step 3)
    assert mon.step_count == 3 and s["status"] == "findings" and s["crash"] is None
    assert any(p is old for g in opt.param_groups for p in g["params"])


def test_raise_from_a_post_step_finding_says_the_step_ran(tmp_path):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(FindingError) as e:
        with optcheck.Monitor(model, opt, every=1, out=str(tmp_path), on_finding="raise"):
            for _ in range(5):  # zero_grad() never called: gradients pile up (OC204)
                x, y = batch()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    assert e.value.finding.code == "OC204" and e.value.finding.phase == "post-step" and e.value.step_ran
    assert len(findings(tmp_path)) == summary(tmp_path)["findings"] >= 1


def test_after_a_caught_finding_error_the_next_steps_are_still_watched(tmp_path):
    from optcheck.drivers.worker_loop import StepStopped

    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    caught, planted = [], None
    with pytest.raises(StepStopped):
        with optcheck.Monitor(model, opt, every=1, out=str(tmp_path), on_finding="raise"):
            for i in range(1, 8):
                x, y = batch()
                h = torch.sigmoid(model[0](x))
                if caught and planted is None:  # the very next step after the caught FindingError
                    planted = i
                    h.mul_(2.0)  # in place on a tensor sigmoid saved for backward: the hazard probe stops it
                loss = nn.functional.cross_entropy(model[2](h), y)
                loss.backward()  # no zero_grad(): OC204 raised after a step, caught below
                try:
                    opt.step()
                except FindingError as e:
                    caught.append((e.finding.code, e.step_ran))
    assert caught and caught[0] == ("OC204", True)
    assert any(f["code"] == "OC301" and f["step"] == planted for f in findings(tmp_path))


# ----------------------------------------------------------------- item 11: where warnings point
def test_warning_names_the_users_step_line(tmp_path):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = optcheck.Monitor(model, opt, every=50, out=str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1, 6):
            if i == 3:
                model[2] = nn.Linear(16, 2)
            x, y = batch()
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            step_line = inspect.currentframe().f_lineno + 1
            opt.step()
    mon.close()
    ours = [w for w in caught if issubclass(w.category, OptcheckWarning)]
    assert ours and all(w.filename == __file__ and w.lineno == step_line for w in ours), \
        [(w.filename, w.lineno) for w in ours]


def test_warning_from_backward_names_the_users_backward_line(tmp_path):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with optcheck.Monitor(model, opt, every=5, out=str(tmp_path)):
            for _ in range(40):  # optimizer.step() forgotten: OC206 at a backward()
                x, y = batch()
                loss = nn.functional.cross_entropy(model(x), y)
                back_line = inspect.currentframe().f_lineno + 1
                loss.backward()
    ours = [w for w in caught if issubclass(w.category, OptcheckWarning)]
    assert any("OC206" in str(w.message) for w in ours)
    assert all(w.filename == __file__ and w.lineno == back_line for w in ours), \
        [(w.filename, w.lineno) for w in ours]


# ----------------------------------------------------------------- item 12: death outside `with`
CRASH_SCRIPT = """
import sys, torch
from torch import nn
import optcheck
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
mon = optcheck.Monitor(model, opt, every=50, out=sys.argv[1])
for i in range(1, 20):
    if i == 5:
        model[2] = nn.Linear(16, 2)   # the bug: the optimizer keeps the old head
    if i == 8:
        raise RuntimeError("loss went to pieces at iteration 8")
    loss = nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.zeros(4, dtype=torch.long))
    opt.zero_grad(); loss.backward(); opt.step()
mon.close()
"""


def test_loop_that_dies_outside_with_records_the_crash(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(CRASH_SCRIPT)
    out = tmp_path / "run"
    p = subprocess.run([sys.executable, "-W", "ignore::UserWarning", str(script), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert "RuntimeError: loss went to pieces at iteration 8" in p.stderr  # the user's traceback still shown
    s = summary(out)
    assert s["status"] == "crashed" and s["exit_code"] == 3
    assert s["crash"] == {"step": 8, "exc_type": "RuntimeError", "message": "loss went to pieces at iteration 8"}
    assert s["lead_time"]["flagged_step"] == 5 and s["lead_time"]["failed_step"] == 8
    assert s["lead_time"]["finding"].startswith("OC10")


def test_clean_exit_outside_with_keeps_the_users_excepthook_and_is_clean(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import sys, torch
        from torch import nn
        import optcheck
        torch.set_num_threads(1)
        mine = lambda *a: None
        sys.excepthook = mine
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon = optcheck.Monitor(model, opt, every=5, out=sys.argv[1])
        for _ in range(10):
            opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()
        mon.close()
        assert sys.excepthook is mine, sys.excepthook
    """))
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    s = summary(tmp_path / "run")
    assert s["status"] == "clean" and s["crash"] is None and s["lead_time"] is None


# ----------------------------------------------------------------- item 15: accepted findings
def _replaced_head(tmp_path, name, **kw):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptcheckWarning)
        with optcheck.Monitor(model, opt, every=50, out=str(tmp_path / name), **kw) as mon:
            train(model, opt, 8, replace_at=4)
    return mon, {f["code"] for f in findings(tmp_path / name)}, summary(tmp_path / name)


def test_ignore_accepts_by_rule_and_parameter(tmp_path):
    mon, codes, s = _replaced_head(tmp_path, "none", ignore_config=False)
    assert {"OC101", "OC102", "OC104"} <= codes and mon.exit_code == 1 and s["suppressed"] == {}
    # OC102 names the new head's parameters (2.weight, 2.bias): accepted by pattern
    mon, codes, s = _replaced_head(tmp_path, "oc102", ignore=["OC102:2.*"], ignore_config=False)
    assert "OC102" not in codes and {"OC101", "OC104"} <= codes and s["suppressed"] == {"OC102": 1}
    assert s["findings"] == len(mon.findings) and "OC102" not in s["findings_by_code"]
    # a pattern naming only some of its parameters accepts nothing
    mon, codes, s = _replaced_head(tmp_path, "partial", ignore=["OC102:2.weight"], ignore_config=False)
    assert "OC102" in codes and s["suppressed"] == {}
    # every finding accepted (codes and symbols): the run is clean, the summary still counts them
    mon, codes, s = _replaced_head(tmp_path, "all", ignore=["OC101", "untracked-param", "OC104:*"],
                                   ignore_config=False)
    assert codes == set() and mon.exit_code == 0 and s["status"] == "clean"
    assert s["suppressed"] == {"OC101": 1, "OC102": 1, "OC104": 1}


def test_ignore_from_pyproject(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "pyproject.toml").write_text('[tool.optcheck]\nignore = ["OC101", "OC104"]\n')
    monkeypatch.chdir(proj / "src")  # found by walking up
    mon, codes, s = _replaced_head(tmp_path, "cfg", ignore=["OC102:2.*"])
    assert codes == set() and mon.exit_code == 0 and s["suppressed"] == {"OC101": 1, "OC102": 1, "OC104": 1}
    mon, codes, s = _replaced_head(tmp_path, "cfg-off", ignore_config=False)
    assert {"OC101", "OC102", "OC104"} <= codes


def test_bad_ignore_entries_are_one_clear_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no rule 'OC999'"):
        optcheck.Monitor(tiny(), torch.optim.SGD(tiny().parameters(), lr=0.1), ignore=["OC999"])
    (tmp_path / "pyproject.toml").write_text('[tool.optcheck]\nignore = "OC101"\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="must be a list of strings"):
        optcheck.Monitor(tiny(), torch.optim.SGD(tiny().parameters(), lr=0.1))


def test_check_cli_ignore(tmp_path):
    _replaced_head(tmp_path, "run", ignore_config=False)
    run = str(tmp_path / "run")

    def check(*args):
        return subprocess.run([sys.executable, "-m", "optcheck", "check", run, *args], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    assert check().returncode == 1
    p = check("--ignore", "OC101", "--ignore", "OC102:2.*", "--ignore", "ref-churn")
    assert p.returncode == 0 and "0 finding(s)" in p.stdout, p.stdout + p.stderr
    p = check("--ignore", "OC101:nope.*")
    assert p.returncode == 1
    p = check("--ignore", "OC9")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "optcheck: error: --ignore" in p.stderr
    assert "Traceback" not in p.stderr


def test_soak_cli_ignore(tmp_path):
    from conftest import SMALL, run_cli

    def soak(name, *ignores):
        out = tmp_path / name
        args = ["soak", "-q", "--steps", "40", "--every", "20", "--inject", "tie-after-optimizer@30",
                "--out", str(out), *SMALL]
        for i in ignores:
            args += ["--ignore", i]
        rc, stdout, _ = run_cli(args)
        return rc, json.loads((out / "summary.json").read_text()), findings(out)

    rc, s, found = soak("accepted", "OC101:*.weight")  # tie-after-optimizer: OC101 names wte.weight / lm_head.weight
    assert rc == 0 and found == [] and s["status"] == "clean" and s["suppressed"] == {"OC101": 1}
    # a pattern that names another parameter accepts nothing: the same stream re-checked (one soak, not two; the
    # patterns themselves are matched in tests/unit/test_suppress.py)
    rc, stdout, _ = run_cli(["check", str(tmp_path / "accepted"), "--ignore", "OC101:ln_f.*"])
    assert rc == 1 and "OC101" in stdout, stdout


def test_reusing_an_out_folder_names_the_monitors_own_arguments(tmp_path):
    """The Monitor has no --force: its refusal of a used ``out=`` says what a Monitor user can do."""
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with optcheck.Monitor(model, opt, every=5, out=tmp_path / "run"):
        train(model, opt, 5)
    with pytest.raises(Exception) as err:
        optcheck.Monitor(model, opt, every=5, out=tmp_path / "run")
    msg = str(err.value)
    assert "already holds a run (status clean, last step 5)" in msg
    assert "--force" not in msg and "--out" not in msg and msg.startswith(f"out={tmp_path / 'run'}: ")
    assert "append=True" in msg
    with optcheck.Monitor(model, opt, every=5, out=tmp_path / "run", append=True):  # what it says works
        train(model, opt, 5)
    assert summary(tmp_path / "run")["status"] == "clean"
