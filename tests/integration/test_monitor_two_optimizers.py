"""Two optimizers over one model (Muon for the matrices and AdamW for the rest, a
GAN's two optimizers, SparseAdam beside a dense one): a Monitor watching one of them
does not report the other's parameters as untracked (OC102), and says once that they
are trained elsewhere (``optcheck/pytorch/other_optimizers.py``). The bugs OC102
exists for still fire: a layer replaced after both optimizers were built, and a new
optimizer built over it but never stepped. Real torch, real optimizers, real loops."""

from __future__ import annotations

import pytest
import torch

import optcheck

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 1))


def split(m: torch.nn.Module):
    """The Muon-style split: 2-D weights to one optimizer, biases and norms to another."""
    mats = [p for p in m.parameters() if p.ndim == 2]
    rest = [p for p in m.parameters() if p.ndim != 2]
    return torch.optim.SGD(mats, lr=0.02, momentum=0.95, nesterov=True), torch.optim.AdamW(rest, lr=1e-3)


def train(m, opts, steps: int, at: dict | None = None) -> None:
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    for step in range(1, steps + 1):
        if at and step in at:
            at[step]()
        for o in opts:
            o.zero_grad()
        torch.nn.functional.mse_loss(m(x[step % 8 * 8:][:8]), y[step % 8 * 8:][:8]).backward()
        for o in opts:
            o.step()


def test_each_optimizer_watched_by_its_own_monitor_is_silent(tmp_path):
    m = model()
    mats, rest = split(m)
    with optcheck.Monitor(m, mats, every=5, out=str(tmp_path / "mats"), on_finding="raise") as a, \
            optcheck.Monitor(m, rest, every=5, out=str(tmp_path / "rest"), on_finding="raise") as b:
        train(m, [mats, rest], 30)
    for mon, other in ((a, "AdamW"), (b, "SGD")):
        s = mon.summary()
        assert s["status"] == "clean" and s["findings"] == 0, s["findings_by_code"]
        said = [n for n in s["not_checked"] if "trained by another optimizer" in n]
        assert len(said) == 1 and f"({other})" in said[0], s["not_checked"]


def test_a_layer_replaced_after_both_were_built_is_still_untracked(tmp_path):
    m = model()
    mats, rest = split(m)

    def replace() -> None:
        m[3] = torch.nn.Linear(16, 1)  # in neither optimizer: it never trains

    with optcheck.Monitor(m, mats, every=5, out=str(tmp_path / "run"), on_finding="log") as mon:
        train(m, [mats, rest], 20, at={12: replace})
    found = [f for f in mon.checker.findings if f.code == "OC102"]
    assert found and found[0].step == 12 and {"3.weight", "3.bias"} <= set(found[0].subjects), found


def test_a_new_optimizer_built_over_the_new_layer_but_never_stepped_explains_nothing(tmp_path):
    m = model()
    mats, rest = split(m)
    unused = []

    def replace() -> None:
        m[3] = torch.nn.Linear(16, 1)
        unused.append(torch.optim.AdamW(m[3].parameters(), lr=1e-3))  # built, then forgotten in the loop

    with optcheck.Monitor(m, mats, every=5, out=str(tmp_path / "run"), on_finding="log") as mon:
        train(m, [mats, rest], 20, at={12: replace})
    found = [f for f in mon.checker.findings if f.code == "OC102"]
    assert found and found[0].step == 12 and {"3.weight", "3.bias"} <= set(found[0].subjects), found
