"""The Monitor's per-step shortcuts (issue 34, part 2) keep what the rules need.

- OC207 (gradients cleared between ``backward()`` and ``optimizer.step()``) reads no
  gradient when the last backward pass, or ``clip_grad_norm_``'s total after it, tells
  the answer (``optcheck/pytorch/grad_clear.py``): the clearing is still found
  whatever the order of ``zero_grad``, the clip and the step, and a clean loop with a
  clip stays silent.
- Under ``torch.compile`` (nanoGPT's order: the Monitor on the plain model, then
  ``torch.compile``), a small causal Transformer compiles to as many graphs, with as
  many recompilations and graph breaks, with the Monitor as without it, whether the
  hazard probes arm on demand or on every step.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import optcheck  # noqa: E402

torch.set_num_threads(1)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))


def _loop(order: str, steps: int = 12, every: int = 4):
    """``order``: the calls after the forward, in the user's order ("b" backward, "z"
    zero_grad(set_to_none=False), "n" zero_grad(set_to_none=True), "c" clip_grad_norm_,
    "s" step)."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    mon = optcheck.Monitor(model, opt, every=every, on_finding="ignore", ignore_config=False)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        for c in order:
            if c == "b":
                loss.backward()
            elif c == "z":
                opt.zero_grad(set_to_none=False)
            elif c == "n":
                opt.zero_grad(set_to_none=True)
            elif c == "c":
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            elif c == "s":
                opt.step()
    mon.close()
    return [(f.code, f.step) for f in mon.findings], mon


@pytest.mark.parametrize("order", ["bzcs", "bczs", "bncs", "bzs", "bns"])
def test_gradients_cleared_before_the_step_are_found_with_or_without_a_clip(order):
    found, mon = _loop(order)
    oc207 = [f for f in mon.findings if f.code == "OC207"]
    assert oc207 and oc207[0].detail["first_step"] == 1, found


@pytest.mark.parametrize("order", ["bcsn", "bcsz", "bsz", "nbcs", "zbs"])
def test_a_clean_order_is_silent(order):
    found, mon = _loop(order)
    assert found == [] and mon.step_count == 12


class _Causal(nn.Module):
    """A character-level causal Transformer (pre-norm encoder layers, a causal mask)."""

    def __init__(self, seq=16, width=32):
        super().__init__()
        self.tok = nn.Embedding(64, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 64)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, x):
        return self.head(self.body(self.tok(x) + self.pos, mask=self.mask, is_causal=True))


def _fresh_dynamo():
    """Dynamo's caches and counters emptied; returns the counters."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    return counters


def _compiled(hazards, steps=14):
    counters = _fresh_dynamo()
    torch.manual_seed(0)
    model = _Causal()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # nanoGPT's order: optimizer, Monitor, then torch.compile (inductor: a C++ build per graph, minutes here)
    mon = None if hazards is None else optcheck.Monitor(model, opt, every=3, hazards=hazards, on_finding="ignore",
                                                        ignore_config=False)
    cmodel = torch.compile(model, backend="aot_eager")
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x = torch.randint(0, 64, (4, 16), generator=g)
        loss = F.cross_entropy(cmodel(x).reshape(-1, 64), torch.roll(x, -1, 1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    if mon is not None:
        mon.close()
    c = {k: dict(v) for k, v in counters.items()}
    return mon, (c.get("stats", {}).get("unique_graphs"), c.get("recompiles", {}), c.get("graph_break", {}))


@pytest.fixture(scope="module")
def without_optcheck():
    return _compiled(None)[1]


@pytest.mark.parametrize("hazards", ["auto", pytest.param("always", marks=pytest.mark.slow),
                                     pytest.param(False, marks=pytest.mark.slow)])
def test_a_compiled_transformer_compiles_the_same_with_the_monitor(without_optcheck, hazards):
    mon, with_optcheck = _compiled(hazards)
    assert with_optcheck == without_optcheck == (1, {}, {}), (with_optcheck, without_optcheck)
    assert mon.findings == [] and mon.step_count == 14
    if hazards == "auto":  # armed on the first step and after each snapshot: the toggling costs no graph
        assert mon.summary()["hazards"]["armed_steps"] >= 4
