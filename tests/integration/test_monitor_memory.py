"""optcheck.Monitor on a small nanoGPT-style loop written here, not for optcheck:
clean -> no finding; a loss history that keeps every step's graph alive -> OC401;
a parameter replaced after the optimizer exists -> OC101/OC102/OC104."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import optcheck  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

VOCAB, CTX, WIDTH = 64, 32, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):  # (B, T, C)
        mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CTX, WIDTH)
        self.block, self.ln_f = Block(), nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx):  # (B, T) -> (B, T, V)
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        return self.head(self.ln_f(self.block(x)))


def train(out, steps, bug=None, every=10, leak_from=0):
    """A plain loop; optcheck is the three marked lines. ``bug="loss-history"`` keeps
    each step's loss tensor, graph and all, from step ``leak_from`` on."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = torch.randint(0, VOCAB, (50_000,))
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = []
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        mon = optcheck.Monitor(model, opt, every=every, out=str(out))          # optcheck 1
        for step in range(steps):
            ix = torch.randint(0, len(data) - CTX - 1, (16,))
            x = torch.stack([data[i:i + CTX] for i in ix])
            y = torch.stack([data[i + 1:i + CTX + 1] for i in ix])
            if bug == "param-replaced" and step == 100:
                model.head.weight = nn.Parameter(model.head.weight.detach().clone())
            loss = F.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.step(loss)                                                      # optcheck 2
            history.append(loss if bug == "loss-history" and step >= leak_from else loss.item())
        mon.close()                                                             # optcheck 3
    found = list(read_jsonl(out / "findings.jsonl"))
    return found, [str(w.message) for w in shown if "optcheck" in str(w.message)]


def in_fresh_process(out, steps, **kw):
    """``train`` run as a user runs it, in a fresh process: the RSS and heap of a pytest
    process that has run hundreds of tests before drift on their own, which is not what
    OC401 is about."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
            "from test_monitor_memory import train; "
            "print(json.dumps(train(Path(sys.argv[2]), int(sys.argv[3]), **json.loads(sys.argv[4]))))")
    proc = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(out), str(steps), json.dumps(kw)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("every", [10, 50])
def test_clean_loop_is_silent(tmp_path, every):
    found, shown = in_fresh_process(tmp_path / "clean", 600, every=every)
    assert found == [] and shown == []


def test_loss_history_leak_at_every_50_is_found_within_300_steps_of_onset(tmp_path):
    """The users'-loops measurement: each step's loss kept with its graph from step 100 on;
    every=50 used to find nothing in 400 steps. The malloc heap in use rises by the same
    ~35 KiB per step at every snapshot: found by step 400 (measured: 250)."""
    found, shown = in_fresh_process(tmp_path / "leak50", 400, bug="loss-history", every=50, leak_from=100)
    assert [f["code"] for f in found] == ["OC401"], found
    f = found[0]
    assert 100 < f["step"] <= 400 and f["detail"]["shape"] == "steady", f
    assert f["subjects"][0] in ("heap_in_use_bytes", "live_tensors")
    assert "per step at every snapshot" in f["message"] and "KiB per step" in f["message"]
    assert any("OC401 memory-growth" in s for s in shown)


def test_loss_history_keeping_graphs_is_memory_growth(tmp_path):
    found, shown = train(tmp_path / "leak", 600, bug="loss-history")
    growth = [f for f in found if f["code"] == "OC401"]
    assert growth and {f["code"] for f in found} == {"OC401"}, found
    assert growth[0]["subjects"][0] in ("heap_in_use_bytes", "live_tensors")
    assert "per step at every snapshot" in growth[0]["message"] and growth[0]["step"] <= 200
    assert any("OC401 memory-growth" in s for s in shown)


def test_parameter_replaced_after_the_optimizer_is_named(tmp_path):
    found, _ = train(tmp_path / "replaced", 200, bug="param-replaced")
    codes = {f["code"] for f in found}
    assert {"OC101", "OC102", "OC104"} <= codes, found
    assert all(f["step"] >= 100 for f in found)
    assert any("head.weight" in f["subjects"] for f in found if f["code"] == "OC102")
