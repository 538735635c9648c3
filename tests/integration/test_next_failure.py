""""next:" is true (issue 33, item 5): each rule's faulty loop is run twice — under
``optcheck.Monitor``, which gives the finding and its prediction (``next_failure``), and
without optcheck, let run on past the fault — and the prediction is checked against what
really happened: the exception raised (its type and words), the process's death by a signal,
which tensors kept their values, the optimizer's state. PyTorch rules here, on a small
encoder/decoder and ``transformers`` models; TorchSharp's from its recorded runs, which ran on
to their crash (``tests/fixtures/torchsharp/0.107.0-runs``). CPU, one thread."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import optcheck  # noqa: E402
from optcheck.engine import check_stream  # noqa: E402
from optcheck.rules.autograd import PREDICTED_AT_WRITE  # noqa: E402
from optcheck.errors import StepStopped  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUG_AT, STEPS = 4, 10


@pytest.fixture(autouse=True)
def _quiet():
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class EncDec(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc, self.mid, self.dec = nn.Embedding(20, 8), nn.Linear(8, 8), nn.Linear(8, 20, bias=False)
        self.cut = False

    def forward(self, x):
        h = torch.tanh(self.mid(self.enc(x)))
        return self.dec(h.detach() if self.cut else h)


class Rebinding(torch.optim.Optimizer):
    """A hand-written SGD whose update rebinds a local name instead of writing the parameter."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p = p - group["lr"] * p.grad  # noqa: PLW2901 - the bug: the parameter is never written


class Run:
    """One faulty loop: ``bug(run, step, where)`` is called at ``where`` in {"forward", "backward",
    "step"} (before the forward, between backward and step, after the step) of every step."""

    def __init__(self, bug, monitor: bool, opt="adamw", clear=True, backward_only=False, loss_hook=None):
        torch.manual_seed(0)
        self.model = m = EncDec()
        self.opt = (torch.optim.AdamW(m.parameters(), lr=1e-2) if opt == "adamw" else
                    Rebinding(m.parameters(), lr=0.05) if opt == "rebinding" else torch.optim.SGD(m.parameters(), lr=0.05))
        self.x, self.y = torch.randint(0, 20, (16,)), torch.randint(0, 20, (16,))
        self.bug, self.clear, self.backward_only, self.loss_hook = bug, clear, backward_only, loss_hook
        self.mon = optcheck.Monitor(m, self.opt, every=1, on_finding="ignore") if monitor else None
        self.losses, self.seen, self.exc = [], {}, None
        try:
            for step in range(1, STEPS + 1):
                self.step(step)
        except (StepStopped, RuntimeError, KeyError, ValueError) as e:
            self.exc = e
        if self.mon is not None:
            self.mon.close()

    def step(self, step):
        self.bug(self, step, "forward")
        loss = F.cross_entropy(self.model(self.x), self.y)
        if self.loss_hook is not None:
            loss = self.loss_hook(self, step, loss)
        if self.clear(step) if callable(self.clear) else self.clear:
            self.opt.zero_grad()
        loss.backward()
        self.bug(self, step, "backward")
        if not self.backward_only:
            self.opt.step()
        self.losses.append(loss.item())
        self.bug(self, step, "step")

    def finding(self, code):
        found = [f for f in self.mon.findings if f.code == code]
        assert found, (code, [(f.code, f.step) for f in self.mon.findings])
        return found[0]


def keep(run, name, tensor):
    """Remember a copy of ``tensor`` and the tensor itself under ``name``."""
    run.seen[name] = (tensor, tensor.detach().clone())


def changed(run, name) -> bool:
    tensor, before = run.seen[name]
    return not torch.equal(tensor.detach(), before)


def both(bug, **kw):
    return Run(bug, True, **kw), Run(bug, False, **kw)


# ----------------------------------------------------------------------------- references
def retie(run, step, where):
    if step == BUG_AT and where == "forward":  # a decoder re-tied to the encoder's weight mid-run
        keep(run, "old dec", run.model.dec.weight)
        run.model.dec.weight = run.model.enc.weight
        keep(run, "enc", run.model.enc.weight)


def test_oc101_a_weight_re_tied_mid_run_still_trains_through_the_tensor_it_is_tied_to():
    watched, plain = both(retie)
    f = watched.finding("OC101")
    assert f.step == BUG_AT and "dec.weight is now enc.weight's tensor, which the optimizer steps" in f.next_failure
    assert "in no param group" not in f.next_failure and "get no gradient" in f.next_failure
    assert plain.exc is None and changed(plain, "enc") and not changed(plain, "old dec")  # as predicted


def replace(run, step, where):
    if step == BUG_AT and where == "forward":  # model.mid = nn.Linear(...) after the optimizer was built
        keep(run, "old mid", run.model.mid.weight)
        run.model.mid = nn.Linear(8, 8)
        keep(run, "new mid", run.model.mid.weight)


def test_oc101_oc102_a_replaced_layer_never_trains_and_the_old_one_is_not_stepped():
    watched, plain = both(replace)
    stale, untracked = watched.finding("OC101"), watched.finding("OC102")
    assert "mid.weight, mid.bias of the model are in no param group and never train" in stale.next_failure
    assert untracked.next_failure == "these parameters keep their initial values for the rest of the run"
    assert plain.exc is None and not changed(plain, "new mid") and not changed(plain, "old mid")


def churn(run, step, where):
    if step == BUG_AT and where == "forward":  # a new Parameter object for the same name
        keep(run, "old", run.model.mid.weight)
        run.model.mid.weight = nn.Parameter(run.model.mid.weight.detach().clone())
        keep(run, "new", run.model.mid.weight)


def test_oc104_a_new_parameter_object_never_trains_and_nothing_raises():
    watched, plain = both(churn)
    f = watched.finding("OC104")
    assert f.next_failure.startswith("nothing raises") and "they never train" in f.next_failure
    assert plain.exc is None and not changed(plain, "new") and not changed(plain, "old")


def orphan(run, step, where):
    if step == BUG_AT and where == "step":  # a member removed from its group, its state left behind
        group = run.opt.param_groups[0]
        group["params"] = [p for p in group["params"] if p is not run.model.mid.bias]
    if step == STEPS and where == "step":
        run.opt.state_dict()  # the checkpoint save at the end of the run


def test_oc103_orphan_state_lets_training_go_on_until_the_next_state_dict():
    watched, plain = both(orphan)
    f = watched.finding("OC103")
    assert "the next optimizer.state_dict() (a checkpoint save) raises KeyError" in f.next_failure
    assert isinstance(plain.exc, KeyError) and len(plain.losses) == STEPS  # every step ran, then the save failed


def nonleaf(run, step, where):
    if step == BUG_AT and where == "forward":
        group = run.opt.param_groups[0]["params"]
        i = next(i for i, p in enumerate(group) if p is run.model.mid.weight)
        group[i] = run.model.mid.weight * 1.0  # an op's result, not a leaf
        keep(run, "member", group[i])


def test_oc105_a_non_leaf_member_never_trains_and_every_read_warns():
    watched, plain = both(nonleaf)
    f = watched.finding("OC105")
    assert f.next_failure == "their .grad stays empty (with a warning on every read); they never train"
    assert plain.exc is None and not changed(plain, "member")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert plain.seen["member"][0].grad is None
    assert any("not a leaf" in str(x.message) for x in w)


def duplicate(run, step, where):
    if step == BUG_AT and where == "forward":
        run.opt.param_groups[0]["params"].append(run.model.mid.weight)  # the same tensor twice in one group
    if where == "step" and step in (BUG_AT - 1, STEPS):
        run.seen[f"count {step}"] = run.opt.state[run.model.mid.weight]["step"].item()


def test_oc106_a_tensor_listed_twice_is_updated_twice_per_step_from_one_state():
    watched, plain = both(duplicate)
    f = watched.finding("OC106")
    assert "PyTorch: one state keyed by the tensor, whose step count advances as many times" in f.next_failure
    assert plain.exc is None
    assert plain.seen[f"count {STEPS}"] - plain.seen[f"count {BUG_AT - 1}"] == 2 * (STEPS - BUG_AT + 1)


def to_double(run, step, where):
    if step == BUG_AT and where == "step":
        run.model.double()  # after the optimizer made float32 state


def test_oc107_a_dtype_change_after_the_state_was_made_raises_at_the_next_step():
    watched, plain = both(to_double)
    f = watched.finding("OC107")
    assert "expected dtype float for `end` but got dtype double" in f.next_failure
    assert isinstance(plain.exc, RuntimeError) and "expected dtype float for `end` but got dtype double" in str(plain.exc)


def resize_loop(monitor: bool, fused: bool = False):
    """A GPT-2 of ``transformers`` trained with AdamW; at step 3, between backward() and step(),
    new tokens are added (``resize_token_embeddings``: the embedding's ``.data`` is swapped for a
    larger one, the optimizer's state is not). (monitor or None, the exception or None)."""
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **({"fused": True} if fused else {"foreach": False}))
    mon = optcheck.Monitor(model, opt, every=1, on_finding="ignore") if monitor else None
    x = torch.randint(0, 64, (2, 8))
    exc = None
    try:
        for step in range(1, 6):
            loss = model(x, labels=x).loss
            opt.zero_grad()
            loss.backward()
            if step == 3:
                model.resize_token_embeddings(80)
            opt.step()
    except RuntimeError as e:
        exc = e
    if mon is not None:
        mon.close()
    return mon, exc


FUSED = textwrap.dedent("""
    import sys, warnings
    sys.path.insert(0, sys.argv[1])
    warnings.simplefilter("ignore")
    import torch
    torch.set_num_threads(1)
    from test_next_failure import resize_loop
    print("raised:", resize_loop(False, fused=True)[1], flush=True)
""")


@pytest.mark.slow
def test_oc107_resize_token_embeddings_mid_run_raises_or_crashes_the_process_as_predicted():
    pytest.importorskip("transformers")
    watched, exc = resize_loop(True)
    f = watched.findings and [f for f in watched.findings if f.code == "OC107"][0]
    assert f.step == 3 and "size-mismatch RuntimeError" in f.next_failure and "crash the process" in f.next_failure
    _, plain = resize_loop(False)  # torch's single-tensor AdamW: a RuntimeError on the sizes
    assert isinstance(plain, RuntimeError) and "must match the size" in str(plain)
    # the fused CPU kernel writes past the old state: the process dies (in its own process)
    fused = subprocess.run([sys.executable, "-c", FUSED, str(Path(__file__).parent)], capture_output=True, text=True,
                           timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert fused.returncode in (-signal.SIGSEGV, -signal.SIGABRT) or "must match the size" in fused.stdout, \
        (fused.returncode, fused.stdout[-300:], fused.stderr[-300:])


# ----------------------------------------------------------------------------- gradients and updates
def test_oc201_a_non_leaf_grad_read_gives_none():
    def read(run, step, where):
        if step == BUG_AT and where == "backward":
            run.seen["read"] = run.seen["h"].grad

    def loss_hook(run, step, loss):
        run.seen["h"] = loss
        return loss

    watched, plain = both(read, loss_hook=loss_hook)
    f = watched.finding("OC201")
    assert f.next_failure.startswith("the value read is None")
    assert plain.exc is None and plain.seen["read"] is None


def unused_decoder(run, step, where):
    if step == 1 and where == "forward":
        run.model.cut = True  # dec's input detached: enc and mid get no gradient from here on
        keep(run, "mid", run.model.mid.weight)


def test_oc202_oc203_parameters_cut_off_keep_their_values_and_nothing_raises():
    watched, plain = both(unused_decoder)
    cut = watched.finding("OC203")
    assert cut.next_failure.endswith("silently stop training")
    starved = [f for f in watched.mon.findings if f.code == "OC202"]
    for f in starved:
        assert "keep their values" in f.next_failure and "nothing raises" in f.next_failure
    assert plain.exc is None and not changed(plain, "mid") and len(plain.losses) == STEPS


def test_oc203_a_loss_without_grad_fn_raises_what_was_predicted():
    def nograd_loss(run, step, loss):
        return loss.detach() if step == BUG_AT else loss

    watched, plain = both(lambda *a: None, loss_hook=nograd_loss)
    f = watched.finding("OC203")
    assert isinstance(plain.exc, RuntimeError)
    assert f.next_failure == f"backward() raises RuntimeError: {str(plain.exc).splitlines()[0]}"


def test_oc204_gradients_never_cleared_are_the_sum_of_every_step_and_the_run_departs():
    def grads(run, step, where):
        if where == "backward":
            run.seen.setdefault("grads", []).append(run.model.mid.weight.grad.detach().clone())

    watched, plain = both(grads, clear=lambda step: step < BUG_AT)
    f = watched.finding("OC204")
    assert "uses the sum of every gradient since the last clear" in f.next_failure
    _, cleared = both(grads)
    gs, fresh = plain.seen["grads"], cleared.seen["grads"]
    assert plain.exc is None and not torch.allclose(gs[-1], fresh[-1])
    # .grad after the last step is the sum of that step's gradient and every earlier one since the clear
    per_step = [gs[BUG_AT - 2]] + [b - a for a, b in zip(gs[BUG_AT - 2:], gs[BUG_AT - 1:])]
    assert torch.allclose(sum(per_step), gs[-1], atol=1e-6)
    assert plain.losses[:BUG_AT] == cleared.losses[:BUG_AT] and plain.losses[-1] != cleared.losses[-1]


def test_oc205_a_step_that_never_writes_the_parameters_leaves_them_where_they_were():
    def start(run, step, where):
        if step == 1 and where == "forward":
            keep(run, "mid", run.model.mid.weight)

    watched, plain = both(start, opt="rebinding")
    f = watched.finding("OC205")
    assert f.next_failure == "the run goes on to the end without these parameters learning anything"
    assert plain.exc is None and not changed(plain, "mid") and len(plain.losses) == STEPS


def test_oc206_without_optimizer_steps_the_weights_never_change():
    def start(run, step, where):
        if step == 1 and where == "forward":
            keep(run, "dec", run.model.dec.weight)

    watched = Run(start, True, backward_only=True)
    plain = Run(start, False, backward_only=True)
    f = [f for f in watched.mon.findings if f.code == "OC206"]
    assert f and f[0].next_failure == "the model keeps its initial weights for the whole run"
    assert plain.exc is None and not changed(plain, "dec")


def test_oc207_gradients_cleared_before_the_step_leave_the_loss_where_it_was():
    def clear_early(run, step, where):
        if where == "backward" and step >= BUG_AT:
            run.opt.zero_grad()

    watched, plain = both(clear_early)
    f = watched.finding("OC207")
    assert f.next_failure == "no update uses a gradient: the loss does not fall"
    tail = plain.losses[BUG_AT:]
    assert plain.exc is None and max(tail) - min(tail) < 1e-6


def test_oc208_a_step_without_a_fresh_gradient_repeats_the_update():
    def twice(run, step, where):
        if where == "backward" and step >= BUG_AT:
            run.opt.step()  # and the loop's own step() after it
        if where == "step" and step in (BUG_AT - 1, STEPS):
            run.seen[step] = run.opt.state[run.model.mid.weight]["step"].item()

    watched, plain = both(twice)
    f = watched.finding("OC208")
    assert f.next_failure.startswith("updates are repeated")
    assert plain.exc is None and plain.seen[STEPS] - plain.seen[BUG_AT - 1] == 2 * (STEPS - BUG_AT + 1)


def test_oc209_a_second_optimizer_swapped_in_changes_nothing_else():
    def swap(run, step, where):
        if step == BUG_AT and where == "forward":
            run.opt = torch.optim.SGD(run.model.parameters(), lr=0.05)
            keep(run, "dec", run.model.dec.weight)

    watched, plain = both(swap)
    f = watched.finding("OC209")
    assert f.next_failure.startswith("none from the swap")
    assert plain.exc is None and changed(plain, "dec") and len(plain.losses) == STEPS


def test_oc501_a_nan_loss_writes_nan_into_the_parameters_and_every_later_loss():
    def nan_loss(run, step, loss):
        return loss * float("nan") if step == BUG_AT else loss

    watched, plain = both(lambda *a: None, loss_hook=nan_loss)
    f = watched.finding("OC501")
    assert f.next_failure == "the next optimizer step writes NaN into the parameters; every later loss is NaN"
    assert plain.exc is None and all(math.isnan(v) for v in plain.losses[BUG_AT - 1:])
    assert torch.isnan(plain.model.mid.weight).all()


def test_oc301_the_error_predicted_is_the_error_pytorch_raises():
    def scaled(run, step, loss):
        if step == BUG_AT:
            s = torch.sigmoid(loss)
            s.mul_(2.0)  # sigmoid saved its output
            return s
        return loss

    watched, plain = both(lambda *a: None, loss_hook=scaled)
    f = watched.finding("OC301")
    assert isinstance(plain.exc, RuntimeError)
    # word for word, PyTorch's hint (when the finding quotes PyTorch's own message) aside
    predicted, said = f.next_failure.split(" Hint:")[0], str(plain.exc).split(" Hint:")[0]
    # PyTorch's own message where it raised it (auto's check), else predicted at the write and said so
    suffix = "" if f.detail.get("found_by") == "pytorch" else PREDICTED_AT_WRITE
    assert predicted == "backward() raises RuntimeError: " + said + suffix


# ----------------------------------------------------------------------------- TorchSharp: recorded runs
RUNS = ROOT / "tests" / "fixtures" / "torchsharp" / "0.107.0-runs"


@pytest.mark.parametrize("run", sorted(p.name for p in RUNS.iterdir() if p.is_dir()))
def test_torchsharp_predictions_name_the_exception_the_recorded_run_died_of(run):
    """TorchSharp soaks that ran on past their fault (the worker does not stop on a finding):
    every error finding up to the crash that names an exception names the one that came."""
    crash = json.loads((RUNS / run / "summary.json").read_text()).get("crash")
    found = [f for f in check_stream(read_jsonl(RUNS / run / "snapshots.jsonl")) if f.severity == "error"]
    if not crash or not crash.get("exc_type"):
        assert not [f for f in found if "throws" in f.next_failure], run
        return
    died_of = crash["exc_type"].rsplit(".", 1)[-1]
    before = [f for f in found if f.step <= crash["step"]]
    assert before, run
    for f in before:
        named = {e for e in ("KeyNotFoundException", "InvalidOperationException") if e in f.next_failure}
        assert not named or died_of in named, (f.code, f.next_failure, died_of)
        assert "nothing raises" not in f.next_failure, (f.code, f.next_failure)
    assert any(died_of in f.next_failure for f in before)


# ----------------------------------------------------------------------------- memory
def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * __import__("os").sysconf("SC_PAGE_SIZE")


def leaky(monitor, steps, budget=None):
    """Losses kept with their graphs (``losses.append(loss)``): about 2 MB of saved activations a
    step. Returns (monitor, RSS after each step)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon = optcheck.Monitor(model, opt, every=2, on_finding="ignore",
                           rule_config=optcheck.rules.RuleConfig(memory_budget_bytes=budget)) if monitor else None
    kept, sizes = [], []
    for _ in range(steps):
        x = torch.randn(256, 64)
        loss = F.cross_entropy(model(x), x[:, :10].argmax(1))
        opt.zero_grad()
        loss.backward(retain_graph=True)  # the graph and its saved activations stay with the kept loss
        opt.step()
        kept.append(loss)
        sizes.append(rss())
    if mon is not None:
        mon.close()
    return mon, sizes


def test_oc401_a_leak_run_on_grows_by_the_bytes_per_step_the_projection_uses():
    """The steady leak's finding gives the bytes kept per step its projection to the budget (and
    to the end of the machine's memory) is made of; the same loop run on without optcheck, twice
    as long, keeps growing by that much a step (within a third; RSS, not the heap it measured)."""
    budget = rss() + 2 * 2**30
    watched, _ = leaky(True, 100, budget)
    f = next(f for f in watched.findings if f.code == "OC401" and f.detail.get("bytes_per_step"))
    assert f"budget around step" in f.next_failure and "killed (OOM) or allocation fails" in f.next_failure
    _, sizes = leaky(False, 200)
    slope = (sizes[-1] - sizes[49]) / (len(sizes) - 50)
    assert abs(slope - f.detail["bytes_per_step"]) <= f.detail["bytes_per_step"] / 3, (slope, f.detail["bytes_per_step"])
    assert all(b >= a for a, b in zip(sizes[50::25], sizes[75::25]))  # it never stops growing


def test_oc402_temporaries_left_to_the_gc_keep_rss_far_above_the_model_and_growing():
    """TorchSharp without a DisposeScope (the recorded run went on to its last step): RSS several
    times the clean run's on the same model, and higher at the end than where it was flagged."""
    run = RUNS / "no-dispose-scope-500"
    (f,) = [f for f in check_stream(read_jsonl(run / "snapshots.jsonl")) if f.code == "OC402"]
    assert "RSS stays far above what the model needs" in f.next_failure
    rss_at = {s["step"]: s["memory"]["rss_bytes"] for s in read_jsonl(run / "snapshots.jsonl")}
    clean = json.loads((RUNS / "clean-1000" / "summary.json").read_text())["peak_rss_bytes"]
    assert rss_at[max(rss_at)] > 4 * clean and rss_at[max(rss_at)] > rss_at[f.step]
