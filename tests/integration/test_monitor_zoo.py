"""Acceptance zoo: ``optcheck.Monitor`` on training loops written independently of
optcheck (``monitor_zoo.py``): every clean loop gives no finding at all and exit
code 0; every planted bug is named by its rule code."""

from __future__ import annotations

import copy
import io
import math
import warnings

import pytest

torch = pytest.importorskip("torch")

import monitor_zoo as zoo  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402
from optcheck.drivers.worker_loop import StepStopped  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def run(tmp_path, loop, bug=None, every=10, **kw):
    """Run one zoo loop under a Monitor writing to ``tmp_path``; returns
    (losses, monitor, findings from findings.jsonl, optcheck warnings shown, exception)."""
    out = tmp_path / f"{loop}-{bug or 'clean'}"
    losses, mon, exc = [], None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            losses, mon = zoo.LOOPS[loop](bug=bug, monitor={"every": every, "out": str(out)}, **kw)
        except StepStopped as e:
            exc = e
    shown = [str(w.message) for w in caught if "optcheck:" in str(w.message)]
    found = list(read_jsonl(out / "findings.jsonl"))
    return losses, mon, found, shown, exc


# (loop, keyword arguments, every): a variety of optimizers, schedulers and habits
CLEAN = [
    ("mlp", {}, 10),                           # SGD momentum+nesterov, wd, StepLR, model.zero_grad(), with-form
    ("cnn", {}, 10),                           # BN + Dropout, torchvision-style in-place residual, AdamW, eval
    #                                            pass under no_grad, best model kept with copy.deepcopy, mon.step()
    ("lstm", {}, 10),                          # truncated BPTT with .detach(), clip_grad_norm_, Adam
    ("gpt", {}, 5),                            # SDPA, tied head, 4 micro-batches, LambdaLR warm-up, bf16 autocast,
    #                                            zero_grad(set_to_none=True) after step
    ("frozen", {"optim": "adam"}, 10),         # frozen embedding, two param groups, Adam(amsgrad=True)
    ("frozen", {"optim": "rmsprop"}, 10),      # filter(lambda p: p.requires_grad, ...), RMSprop
    ("frozen", {"optim": "adagrad"}, 10),      # Adagrad
    ("regression", {}, 10),                    # val loss without no_grad, checkpoint save/load mid-run
    ("contrastive", {}, 1),                    # two views through one BatchNorm encoder, every=1
    ("gan", {"watch": "D"}, 10),               # DCGAN tutorial order, the discriminator watched
    ("gan", {"watch": "G"}, 10),               # ... the generator watched
    ("leaky", {"steps": 200}, 1),              # the leak case's clean twin, every=1
    ("recsys", {}, 10),                        # sparse embedding gradients, SparseAdam
]


@pytest.mark.parametrize("loop,kw,every", CLEAN, ids=[f"{c[0]}-{c[1].get('optim') or c[1].get('watch') or c[2]}"
                                                      for c in CLEAN])
def test_clean_loop_has_no_finding(tmp_path, loop, kw, every):
    losses, mon, found, shown, exc = run(tmp_path, loop, every=every, **kw)
    assert exc is None and found == [] and shown == [], found
    assert mon.exit_code == 0 and mon.summary()["status"] == "clean"
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]


# (loop, bug, expected code, keyword arguments, every, the step is stopped): the code was written
# down before the loop first ran; other codes may follow from the same bug (e.g. OC501 after OC204)
BUGS = [
    ("mlp", "module-swapped", "OC102", {}, 10, False),           # model.fc = nn.Linear(...) after the optimizer
    ("regression", "load-assign", "OC101", {}, 10, False),       # load_state_dict(sd, assign=True)
    ("frozen", "optimizer-missing-module", "OC102", {}, 10, False),  # param groups forgot model.norm
    ("mlp", "missing-zero-grad", "OC204", {}, 10, False),
    ("cnn", "zero-grad-between", "OC207", {}, 10, False),        # zero_grad() between backward() and step()
    ("mlp", "double-step", "OC208", {}, 10, False),
    ("lstm", "missing-step", "OC206", {}, 10, False),
    ("gpt", "loss-detached", "OC203", {}, 5, True),              # loss = loss.detach() before backward()
    ("regression", "loss-from-item", "OC203", {}, 10, False),    # torch.tensor(loss.item(), requires_grad=True)
    ("cnn", "forward-under-no-grad", "OC203", {}, 10, True),
    ("gpt", "inplace-exp", "OC301", {}, 5, True),                # g = torch.exp(h); g.add_(1)
    ("lstm", "inplace-tanh", "OC301", {}, 10, True),             # h = torch.tanh(x); h.mul_(0.5)
    ("gan", "d-step-before-g-backward", "OC301", {}, 10, True),  # optimizerD.step() before errG.backward()
    ("lstm", "grad-of-intermediate", "OC201", {}, 10, False),    # logits.grad
    ("mlp", "exploding-lr", "OC501", {}, 10, False),
    ("mlp", "unused-layer", "OC202", {}, 10, False),
    ("leaky", "leak", "OC401", {"steps": 200}, 1, False),        # losses.append(loss): one tensor kept a step
    ("mlp", "half-after-state", "OC107", {}, 10, False),         # model.half() once SGD has momentum buffers
    ("cnn", "double-after-state", "OC107", {}, 10, False),       # model.double() once AdamW has moments
]


@pytest.mark.parametrize("loop,bug,code,kw,every,stops", BUGS, ids=[b[1] for b in BUGS])
def test_planted_bug_is_named(tmp_path, loop, bug, code, kw, every, stops):
    try:
        _, mon, found, shown, exc = run(tmp_path, loop, bug, every=every, **kw)
    except RuntimeError as e:  # PyTorch's own failure after the finding (AdamW on float64 params, float32 state)
        assert bug == "double-after-state" and "dtype" in str(e)
        found = list(read_jsonl(tmp_path / f"{loop}-{bug}" / "findings.jsonl"))
        mon = exc = None
        shown = ["raised"]
    codes = {f["code"] for f in found}
    assert code in codes, found
    assert shown
    if stops:
        assert exc is not None and exc.event["kind"] in ("graph_cut", "inplace_on_saved")
        assert found[0]["code"] == code
        assert_no_hooks_left()
    elif mon is not None:
        assert mon.exit_code == 1


def assert_no_hooks_left():
    """PyTorch's own version check works again: no saved-tensor hooks of a stopped
    monitor are left installed (a stop inside backward() must not leak them)."""
    x = torch.ones(3, requires_grad=True)
    y = x.exp()
    y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_named_subjects_are_the_users_names(tmp_path):
    _, _, found, _, _ = run(tmp_path, "mlp", "module-swapped")
    by = {f["code"]: f for f in found}
    assert by["OC102"]["subjects"] == ["fc.weight", "fc.bias"] and by["OC102"]["step"] == 21
    assert "fc.weight (replaced)" in by["OC101"]["message"]
    _, _, found, _, _ = run(tmp_path, "lstm", "inplace-tanh")
    assert "h.mul_(0.5)" in found[0]["message"]
    _, _, found, _, _ = run(tmp_path, "regression", "loss-from-item")
    cut = next(f for f in found if f["code"] == "OC203")
    assert cut["step"] == 1 and cut["detail"]["cut"] == "full"
    assert "monitor_zoo.py:" in cut["message"] and "no parameter gets a gradient" in cut["next_failure"]


def test_the_monitor_does_not_change_the_loop(tmp_path):
    plain, _ = zoo.train_gpt(steps=6)
    watched, _, found, _, _ = run(tmp_path, "gpt", steps=6, every=2)
    assert found == [] and plain == pytest.approx(watched, abs=1e-6)


def test_a_watched_model_can_be_copied_and_pickled(tmp_path):
    import optcheck

    model = zoo.MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = zoo.blobs(64)
    with optcheck.Monitor(model, opt, every=2, out=str(tmp_path / "m")) as mon:
        for _ in range(6):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            twin = copy.deepcopy(model)  # EMA / best-model copy
            twin(x).sum().backward()
        buf = io.BytesIO()
        torch.save(model, buf)  # whole-model save while watched
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    assert torch.equal(loaded(x), model(x))
    assert mon.findings == [] and mon.exit_code == 0
