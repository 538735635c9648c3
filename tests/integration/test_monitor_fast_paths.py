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
from compile_forms import Dynamo  # noqa: E402  (what Dynamo did while a block ran)

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


class _Block(nn.Module):
    """A pre-norm causal self-attention and MLP block written here (not a ``torch.nn`` layer: Dynamo
    compiles a user's own block as a frame of its own when it is ``.compile()``d in place)."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.n2(x))


class _OwnBlocks(nn.Module):
    """The causal model of :class:`_Causal` built from :class:`_Block` (compiled block by block)."""

    def __init__(self, seq=16, width=32):
        super().__init__()
        self.tok = nn.Embedding(64, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList([_Block(width), _Block(width)])
        self.head = nn.Linear(width, 64)

    def forward(self, x):
        h = self.tok(x) + self.pos
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _compiled(hazards, order="before", steps=14):
    """The causal Transformer trained ``steps`` steps under ``torch.compile`` (aot_eager; inductor
    builds C++ per graph, minutes here), the Monitor (``hazards``; None: no Monitor) made in
    ``order``: "before" ``torch.compile(model)`` (nanoGPT's order), "after" it (the Monitor gets
    the ``OptimizedModule``), "in-place" (``model.compile()`` after the Monitor), "blocks" (each
    block of a model of the test's own blocks ``.compile()``d in place after the Monitor, torchtitan's
    way: the rest eager)."""
    torch.manual_seed(0)
    model = _OwnBlocks() if order == "blocks" else _Causal()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with Dynamo() as dynamo:
        def watch(m):
            return None if hazards is None else optcheck.Monitor(m, opt, every=3, hazards=hazards,
                                                                 on_finding="ignore", ignore_config=False)
        if order == "after":
            run = torch.compile(model, backend="aot_eager")
            mon = watch(run)
        else:
            mon = watch(model)
            if order == "before":
                run = torch.compile(model, backend="aot_eager")
            elif order == "in-place":
                model.compile(backend="aot_eager")
                run = model
            else:
                for block in model.blocks:
                    block.compile(backend="aot_eager")
                run = model
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            x = torch.randint(0, 64, (4, 16), generator=g)
            loss = F.cross_entropy(run(x).reshape(-1, 64), torch.roll(x, -1, 1).reshape(-1))
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        if mon is not None:
            mon.close()
    return mon, dynamo


@pytest.fixture(scope="module")
def without_optcheck():
    """Dynamo's counts without a Monitor, per way of compiling (the same for "before", "after"
    and "in-place": the whole model is one compiled region)."""
    whole, blocks = _compiled(None, "before")[1], _compiled(None, "blocks")[1]
    assert whole.counts["unique_graphs"] == 1 and whole.counts["graph_breaks"] == 0
    assert blocks.counts["frames"] >= 1 and blocks.counts["graph_breaks"] == 0  # the blocks really compile
    return {"whole": whole.counts, "blocks": blocks.counts}


@pytest.mark.parametrize("order,hazards", [("before", "auto"), ("after", "auto"), ("in-place", "auto"),
                                           ("blocks", "auto"),
                                           pytest.param("before", "always", marks=pytest.mark.slow),
                                           pytest.param("in-place", "always", marks=pytest.mark.slow),
                                           pytest.param("blocks", "always", marks=pytest.mark.slow),
                                           pytest.param("before", False, marks=pytest.mark.slow)])
def test_dynamo_traces_and_recompiles_none_of_optcheck_under_torch_compile(without_optcheck, order, hazards):
    """Issue 34: no optcheck function is traced by Dynamo (as a frame of its own or inlined),
    and the compiled model gets as many frames, recompilations, graph breaks and graphs as
    without the Monitor, in each order of Monitor and compile, armed or not."""
    mon, dynamo = _compiled(hazards, order)
    assert dynamo.optcheck == [], dynamo.optcheck
    assert dynamo.counts == without_optcheck["blocks" if order == "blocks" else "whole"], \
        (dynamo.counts, without_optcheck)
    assert mon.findings == [] and mon.step_count == 14
    if hazards == "auto":  # armed on the first step and after snapshots: the toggling costs no frame
        assert mon.summary()["hazards"]["armed_steps"] >= 4
    if hazards:
        assert any("OC203" in s for s in mon.summary()["not_checked"])  # what the probes do not see, said
