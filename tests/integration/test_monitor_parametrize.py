"""Parametrizations under ``optcheck.Monitor`` (issue 11, item 5), on a plain
classifier written as a user writes it (not optcheck's GPT).

``weight_norm`` (``torch.nn.utils.parametrizations``) or a
``register_parametrization`` whose ``right_inverse`` returns two tensors, applied
after the optimizer exists, replace ``fc2.weight`` by new Parameters
``fc2.parametrizations.weight.original0/1``, one of which shares the old weight's
storage; the optimizer keeps stepping the old Parameter, which gets no gradient
any more. Found at the step it happens: OC101 names the old parameter (by its old
name), OC102 both originals, each saying a parametrization did it.
Parametrizations with a single original (``spectral_norm``, ``orthogonal``, a
plain ``register_parametrization``) keep the very Parameter object the optimizer
holds, so training goes on: silent, as is every parametrization applied before
the optimizer is built.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.utils import parametrizations, parametrize  # noqa: E402

import optcheck  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

AT = 25  # the loop step (0-based) at which the parametrization is applied: optimizer step 26


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


class Symmetric(nn.Module):
    def forward(self, X):
        return X.triu() + X.triu(1).transpose(-1, -2)


class Scaled(nn.Module):
    """W = a * b with ``right_inverse`` W -> (W, ones): two originals."""

    def forward(self, a, b):
        return a * b

    def right_inverse(self, W):
        return W, torch.ones_like(W)


KINDS = {
    "weight_norm": lambda m: parametrizations.weight_norm(m, "weight"),
    "spectral_norm": lambda m: parametrizations.spectral_norm(m, "weight"),
    "orthogonal": lambda m: parametrizations.orthogonal(m, "weight"),
    "register-symmetric": lambda m: parametrize.register_parametrization(m, "weight", Symmetric()),
    "register-two-originals": lambda m: parametrize.register_parametrization(m, "weight", Scaled()),
}


def train(kind, when, out, steps=60, every=10):
    """A 3-layer classifier on blobs; ``KINDS[kind]`` is applied to ``fc2`` either
    "before" the optimizer is built or "after", at loop step :data:`AT`."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 16, generator=g) * 2
    y = torch.randint(0, 4, (1024,), generator=g)
    x = centers[y] + torch.randn(1024, 16, generator=g)
    model = nn.Sequential()
    model.fc1, model.act, model.fc2, model.act2, model.fc3 = (nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32),
                                                              nn.ReLU(), nn.Linear(32, 4))
    if when == "before":
        KINDS[kind](model.fc2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    with optcheck.Monitor(model, opt, every=every, out=str(out), on_finding="ignore") as mon:  # optcheck
        for step in range(steps):
            if when == "after" and step == AT:
                KINDS[kind](model.fc2)
            idx = torch.randint(0, len(x), (64,), generator=g)
            opt.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, mon, list(read_jsonl(out / "findings.jsonl"))


@pytest.mark.parametrize("kind", list(KINDS))
def test_parametrization_before_the_optimizer_is_silent(tmp_path, kind):
    losses, mon, found = train(kind, "before", tmp_path / "run")
    assert found == [] and mon.exit_code == 0
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("kind", ["spectral_norm", "orthogonal", "register-symmetric"])
def test_single_original_after_the_optimizer_keeps_training_and_is_silent(tmp_path, kind):
    # the optimizer's Parameter is the parametrization's `original` itself: it gets gradients and is stepped
    losses, mon, found = train(kind, "after", tmp_path / "run")
    assert found == [] and mon.exit_code == 0
    assert sum(losses[-10:]) < sum(losses[AT - 10:AT])


@pytest.mark.parametrize("kind", ["weight_norm", "register-two-originals"])
def test_two_originals_after_the_optimizer_are_named_at_that_step(tmp_path, kind):
    _, mon, found = train(kind, "after", tmp_path / "run")
    by = {f["code"]: f for f in found}
    assert {"OC101", "OC102"} <= set(by), found
    assert by["OC101"]["step"] == by["OC102"]["step"] == AT + 1  # pre-step check of the step it happened
    assert by["OC101"]["phase"] == "pre-step"
    assert by["OC101"]["subjects"] == ["fc2.weight"]
    assert sorted(by["OC102"]["subjects"]) == ["fc2.parametrizations.weight.original0",
                                               "fc2.parametrizations.weight.original1"]
    for f in (by["OC101"], by["OC102"]):
        assert "parametrization" in f["message"] and "fc2.parametrizations.weight" in f["message"]
    assert "OC205" not in by  # the cause is named at once, not as a stall 30-140 steps later
    assert mon.exit_code == 1
