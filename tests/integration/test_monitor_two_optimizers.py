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
from optcheck.record.snapshot import read_jsonl

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
    # both record every step's loss (issue 35: the first Monitor opened recorded none)
    assert metrics(tmp_path / "mats") == metrics(tmp_path / "rest") and len(metrics(tmp_path / "mats")) == 30


def metrics(out) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_jsonl(out / "metrics.jsonl")]


def test_two_monitors_on_one_optimizer_both_record_the_run(tmp_path):
    """Issue 35: the first recorded 0 losses and said clean."""
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    seen = []
    with optcheck.Monitor(m, opt, every=5, out=str(tmp_path / "a")) as a, \
            optcheck.Monitor(m, opt, every=7, out=str(tmp_path / "b")) as b:
        x, y = torch.randn(8, 8), torch.randn(8, 1)
        for _ in range(12):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            seen.append(loss.item())
            opt.step()
    for mon, out in ((a, "a"), (b, "b")):
        s = mon.summary()
        assert (s["status"], s["last_step"], s["findings"]) == ("clean", 12, 0), s["findings_by_code"]
        assert s["loss_first"] == seen[0] and s["loss_last"] == seen[-1]
        assert metrics(tmp_path / out) == list(enumerate(seen, 1))


def test_a_gan_with_a_monitor_per_network_records_each_networks_own_loss(tmp_path):
    """The DCGAN order (D's step on real and fake, then G's through D): each Monitor's
    loss at its step is the loss its own optimizer stepped on, although G's backward
    also runs through D (and D's runs while G's Monitor is open)."""
    torch.manual_seed(0)
    G = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    D = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
    opt_g, opt_d = torch.optim.Adam(G.parameters(), lr=2e-4), torch.optim.Adam(D.parameters(), lr=2e-4)
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    d_losses, g_losses = [], []
    with optcheck.Monitor(G, opt_g, every=4, out=str(tmp_path / "g"), on_finding="raise"), \
            optcheck.Monitor(D, opt_d, every=4, out=str(tmp_path / "d"), on_finding="raise"):
        for _ in range(10):
            real, z = torch.randn(16, 8) + 2, torch.randn(16, 4)
            fake = G(z)
            D.zero_grad()
            d_loss = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
            d_loss.backward()
            opt_d.step()
            G.zero_grad()
            g_loss = bce(D(fake), torch.ones(16, 1))
            g_loss.backward()
            opt_g.step()
            d_losses.append(d_loss.item())
            g_losses.append(g_loss.item())
    assert_recorded(tmp_path, d=d_losses, g=g_losses)


def assert_recorded(tmp_path, **losses) -> None:
    """Each run directory ``tmp_path/<name>`` holds exactly ``losses[name]``, one a step from step 1."""
    for name, seen in losses.items():
        assert metrics(tmp_path / name) == list(enumerate(seen, 1)), name


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


def test_two_networks_backward_before_either_steps_each_keep_their_own_loss(tmp_path):
    """Both losses' backward passes run before either optimizer steps: every Monitor hears both,
    and keeps the loss of the pass that reached its own parameters."""
    torch.manual_seed(0)
    a_net, b_net = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
    opt_a, opt_b = torch.optim.SGD(a_net.parameters(), lr=0.1), torch.optim.SGD(b_net.parameters(), lr=0.1)
    la, lb = [], []
    with optcheck.Monitor(a_net, opt_a, every=3, out=str(tmp_path / "a")), \
            optcheck.Monitor(b_net, opt_b, every=3, out=str(tmp_path / "b")):
        for _ in range(6):
            x = torch.randn(8, 4)
            loss_a, loss_b = a_net(x).pow(2).mean(), (b_net(x) - 1).pow(2).mean()
            opt_a.zero_grad()
            opt_b.zero_grad()
            loss_a.backward()
            loss_b.backward()
            opt_a.step()
            opt_b.step()
            la.append(loss_a.item())
            lb.append(loss_b.item())
    assert_recorded(tmp_path, a=la, b=lb)
