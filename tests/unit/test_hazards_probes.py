"""HazardProbes on ordinary, independently written training loops (not our GPT):
each hazard is caught where it happens, and clean loops stay silent."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from optcheck.pytorch.hazards import HazardProbes
from optcheck.drivers.worker_loop import StepStopped

torch.set_num_threads(1)


class Net(nn.Module):
    """A small conv/BN/dropout net with a frozen sub-module; ``mode`` plants one bug."""

    def __init__(self, mode: str = "clean"):
        super().__init__()
        self.mode = mode
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.conv = nn.Conv1d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(4)
        self.fc1 = nn.Linear(32, 16)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        x = self.frozen(x)  # frozen: output requires no grad, no params train
        h = F.relu(self.bn(self.conv(x.unsqueeze(1))), inplace=True)  # in place on a fresh tensor: fine
        h = h.flatten(1)
        h = self.fc1(h)
        if self.mode == "detach":
            h = h.detach()
        if self.mode == "inplace":
            s = torch.sigmoid(h)  # sigmoid saves its output for backward
            s.mul_(2)  # ...which this writes in place
            h = s
        else:
            h = torch.sigmoid(h)
        return self.fc2(self.drop(h))


def loop(model, probes, steps=4, *, nograd_loss=False, read_nonleaf=False, nan_at=None):
    # the optimizer the probes watch: its step pre-hook runs the gradients' NaN/Inf check
    opt = probes.optimizer
    torch.manual_seed(0)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    for step in range(1, steps + 1):
        model.train()
        opt.zero_grad(set_to_none=True)
        with probes.step_context(step):
            if nograd_loss:
                with torch.no_grad():
                    loss = F.cross_entropy(model(x), y)
            else:
                out = model(x)
                if read_nonleaf:
                    _ = out.grad  # reading .grad of a non-leaf
                loss = F.cross_entropy(out, y)
                if nan_at == step:
                    loss = loss * float("nan")
            probes.check_loss(loss, step)
            loss.backward()
        probes.after_backward(step)
        opt.step()
        model.eval()
        with torch.no_grad():  # an evaluation pass between steps
            model(x)
    return opt


def make(mode="clean", **kw):
    torch.manual_seed(0)
    model = Net(mode)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    return model, HazardProbes(model, opt, **kw)


def test_clean_loop_is_silent():
    model, probes = make()
    loop(model, probes, steps=5)
    assert probes.drain() == [] and not probes.has_events()
    probes.remove()


def test_inplace_on_saved_stops_at_the_write_with_module_and_line():
    model, probes = make("inplace")
    with pytest.raises(StepStopped) as exc:
        loop(model, probes)
    ev = exc.value.event
    d = ev["detail"]
    assert ev["kind"] == "inplace_on_saved" and ev["step"] == 1 and d["stopped"]
    assert d["saved_by"]["op"] == "SigmoidBackward0" and d["saved_by"]["code"] == "s = torch.sigmoid(h)  # sigmoid saves its output for backward"
    assert d["written"]["code"].startswith("s.mul_(2)") and ev["where"].startswith("test_hazards_probes.py:")
    assert d["written"]["module"] == "Net" and (d["saved_version"], d["version"]) == (0, 1)
    assert "is at version 1; expected version 0 instead." in d["pytorch_error"]
    # PyTorch itself, without the probes, fails later, in backward, with that text
    torch.manual_seed(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        F.cross_entropy(Net("inplace")(torch.randn(16, 8)), torch.zeros(16, dtype=torch.long)).backward()
    probes.remove()


def test_allow_inplace_records_and_continues():
    model, probes = make("inplace", allow_inplace=True)
    loop(model, probes, steps=3)
    assert probes.has_events()
    (ev,) = probes.drain()
    assert ev["kind"] == "inplace_on_saved" and ev["count"] == 3 and not ev["detail"]["stopped"]
    probes.remove()


def test_detach_in_the_middle_is_a_partial_cut_naming_the_starved_parameters():
    model, probes = make("detach")
    loop(model, probes, steps=2)
    (ev,) = probes.drain()
    d = ev["detail"]
    assert ev["kind"] == "graph_cut" and d["cut"] == "partial"
    assert d["first_module"]["module"] == "drop" and d["first_module"]["how"] == "detached-input"
    assert d["first_module"]["code"] == "h = h.detach()" and ev["where"].startswith("test_hazards_probes.py:")
    assert sorted(d["params_without_grad"]) == ["bn.bias", "bn.weight", "conv.bias", "conv.weight",
                                                 "fc1.bias", "fc1.weight"]


def test_loss_under_no_grad_stops_before_backward():
    model, probes = make()
    with pytest.raises(StepStopped) as exc:
        loop(model, probes, nograd_loss=True)
    d = exc.value.event["detail"]
    assert d["cut"] == "full" and d["first_module"]["module"] == "conv"  # frozen's output never had grad
    assert not d["first_module"]["grad_enabled"] and d["n_params_without_grad"] == 8
    probes.remove()


def test_nonleaf_grad_reads_are_counted_per_line_and_kept_off_stderr():
    model, probes = make()
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("default")
        probes.remove()
        model, probes = make()
        loop(model, probes, steps=3, read_nonleaf=True)
    (ev,) = probes.drain()
    assert ev["kind"] == "nonleaf_grad_access" and ev["count"] == 3
    assert ev["where"].startswith("test_hazards_probes.py:") and ev["detail"]["code"] == "_ = out.grad  # reading .grad of a non-leaf"
    assert not [w for w in shown if "not a leaf" in str(w.message)]
    probes.remove()


def test_nonfinite_loss_and_state_are_recorded():
    model, probes = make()
    loop(model, probes, steps=3, nan_at=2)
    kinds = {(e["kind"], e["detail"]["what"]) for e in probes.drain()}
    assert ("nonfinite", "loss") in kinds and ("nonfinite", "grad") in kinds
    assert ("nonfinite", "param") in kinds  # AdamW wrote the NaN gradient into the weights
    probes.remove()


def test_remove_unhooks_everything():
    model, probes = make("inplace")
    probes.remove()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loop(model, probes, steps=1)  # PyTorch's own version check is back
