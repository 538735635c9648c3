"""optcheck leaves no trace in what the user saves or copies of a watched model (issue 46, item 3).

pytorch/examples' word language model saves the whole model with ``torch.save(model, f)`` each
time the validation loss improves, mid-training, and loads it back with ``torch.load`` at the
end. Before issue 46 the file held optcheck's forward pre-hook (``torch.load``'s default
``weights_only=True`` refused it: "GLOBAL getattr was not an allowed global", the script
exited 1). Here: saved inside a step (after ``backward()``, before ``opt.step()``, when the
armed step's hooks are on every module) and between steps, under ``hazards="auto"`` and
``"always"``; loaded with ``weights_only`` True and False, in this process and in one that never
imports optcheck; ``pickle`` and ``copy.deepcopy`` too. The copies keep the user's own hooks,
carry none of optcheck's, and compute what the model computes."""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import optcheck

#: a module's hook dicts keyed by handle id (torch/nn/modules/module.py, register_forward_(pre_)hook)
HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
              "_forward_hooks_with_kwargs", "_forward_hooks_always_called")

#: the user's model module (importable by name in both processes): an LSTM language model as in
#: pytorch/examples/word_language_model/model.py, with a forward hook of the user's own
MODEL_PY = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class RNNModel(nn.Module):
        def __init__(self, ntoken=40, nhid=16):
            super().__init__()
            self.encoder = nn.Embedding(ntoken, nhid)
            self.rnn = nn.LSTM(nhid, nhid, 1)
            self.decoder = nn.Linear(nhid, ntoken)
            self.calls = 0

        def forward(self, x):
            out, _ = self.rnn(self.encoder(x))
            return self.decoder(out)

    def count_call(module, args, out):  # the user's own hook: it must survive save, pickle and copy
        module.calls = getattr(module, "calls", 0) + 1
        return None

    def build():
        torch.manual_seed(0)
        model = RNNModel()
        model.decoder.register_forward_hook(count_call)
        return model

    SAFE = [RNNModel, nn.Embedding, nn.LSTM, nn.Linear, count_call]
''')

#: a process that never imports optcheck loads the files and writes each model's output
LOADER_PY = textwrap.dedent('''
    import json, sys
    import torch
    torch.set_num_threads(1)
    import usermodel
    x = torch.arange(12).reshape(6, 2) % 40
    res = {}
    for path in sys.argv[1:]:
        with torch.serialization.safe_globals(usermodel.SAFE):
            m = torch.load(path)  # weights_only=True: torch's default
        res[path] = {"out": m(x).sum().item(), "user_hooks": len(m.decoder._forward_hooks),
                     "hooks": sum(len(getattr(mm, n)) for mm in m.modules() for n in ("_forward_pre_hooks",))}
    res["optcheck_imported"] = any(k.startswith("optcheck") for k in sys.modules)
    print(json.dumps(res))
''')


@pytest.fixture
def usermodel(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    (tmp_path / "usermodel.py").write_text(MODEL_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("usermodel", None)
    import usermodel as um
    yield um
    sys.modules.pop("usermodel", None)


X = (torch.arange(12).reshape(6, 2) % 40)


def hook_entries(model) -> dict:
    """Every module's hook dicts, as (module name, dict name) -> the hooks (their names)."""
    return {(n, d): [getattr(v, "__name__", type(v).__name__) for v in getattr(m, d).values()]
            for n, m in model.named_modules() for d in HOOK_DICTS if getattr(m, d)}


def train(um, tmp_path, hazards, saves, model=None):
    """10 steps of the word language model's loop (``model``: ``um.build()``'s by default);
    ``saves``: step -> "in-step" (after backward, before opt.step: an armed step's hooks are on)
    or "between" (after opt.step). Returns (model, monitor still open, {step: (file, the
    model's state_dict then)})."""
    model = um.build() if model is None else model
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    mon = optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "run"), on_finding="ignore", hazards=hazards)
    g = torch.Generator().manual_seed(0)
    files = {}
    for step in range(1, 11):
        x = torch.randint(0, 40, (7, 4), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[:-1]).reshape(-1, 40), x[1:].reshape(-1))
        loss.backward()
        if saves.get(step) == "in-step":
            files[step] = save(model, tmp_path / f"model{step}.pt")
        opt.step()
        if saves.get(step) == "between":
            files[step] = save(model, tmp_path / f"model{step}.pt")
    return model, mon, files


def save(model, path):
    with open(path, "wb") as f:  # as the word language model does
        torch.save(model, f)
    return path, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("hazards", ["auto", "always"])
def test_torch_save_while_watched_loads_with_torch_load_here_and_without_optcheck(usermodel, tmp_path, hazards):
    saves = {1: "in-step", 3: "in-step", 6: "between"}  # step 1 armed (start), 3 unarmed under auto
    model, mon, files = train(usermodel, tmp_path, hazards, saves)
    if hazards == "always":
        assert hook_entries(model) != hook_entries(usermodel.build())  # optcheck's hooks are on the live model
    user = hook_entries(usermodel.build())
    for f, state in files.values():
        raw = f.read_bytes()
        assert b"optcheck" not in raw and b"getattr" not in raw
        for weights_only in (True, False):
            with torch.serialization.safe_globals(usermodel.SAFE):
                m = torch.load(f, weights_only=weights_only)
            assert hook_entries(m) == user  # the user's hook, nothing else
            before = m.decoder.calls
            ref = usermodel.RNNModel()
            ref.load_state_dict(state)
            assert torch.equal(m(X), ref(X))  # the weights as they were when saved
            assert m.decoder.calls == before + 1  # the user's hook runs on the loaded model
    p = subprocess.run([sys.executable, "-c", LOADER_PY, *(str(f) for f, _ in files.values())],
                       capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res.pop("optcheck_imported") is False
    assert all(r["user_hooks"] == 1 and r["hooks"] == 0 for r in res.values()), res
    mon.close()


def test_pickle_and_deepcopy_of_a_watched_model_carry_none_of_optchecks_hooks(usermodel, tmp_path):
    model, mon, _ = train(usermodel, tmp_path, "always", {})
    ours = hook_entries(model)
    user = hook_entries(usermodel.build())
    assert ours != user  # the probes' hooks are on the live model (always armed)
    raw = pickle.dumps(model)
    assert b"optcheck" not in raw
    for copied in (pickle.loads(raw), copy.deepcopy(model)):
        assert hook_entries(copied) == user
        assert torch.equal(copied(X), model(X))
    assert hook_entries(model) == ours  # the live model keeps optcheck's hooks until close()
    ema = copy.deepcopy(model)  # an EMA model beside the watched one: optcheck's hooks are not on it
    assert hook_entries(ema) == user
    summary = mon.close()
    assert summary["status"] == "clean" and not (tmp_path / "run" / "findings.jsonl").read_text().strip()
    assert hook_entries(model) == user  # after close(): only the user's
    buf = io.BytesIO()
    torch.save(model, buf)
    assert b"optcheck" not in buf.getvalue()


@pytest.mark.parametrize("hazards", ["auto", "always"])
def test_trace_and_export_of_a_watched_model_work_and_script_works_after_close(usermodel, tmp_path, hazards):
    """``torch.jit.trace`` and ``torch.export`` run the model as Python: they work while it is
    watched. ``torch.jit.script`` compiles every forward hook of a module and cannot compile
    optcheck's (docs/hazards.md, limits): it works once the Monitor is closed."""
    model, mon, _ = train(usermodel, tmp_path, hazards, {}, model=usermodel.RNNModel())  # (no Python hook of
    model.eval()  # the user's: TorchScript compiles hooks)
    with torch.no_grad():
        want = model(X)
        assert torch.equal(torch.jit.trace(model, X, check_trace=False)(X), want)
    exported = torch.export.export(model, (X,)).module()
    with torch.no_grad():
        assert torch.allclose(exported(X), want, atol=1e-6)  # (export decomposes the LSTM: float rounding)
    mon.close()
    with torch.no_grad():
        assert torch.equal(torch.jit.script(model)(X), want)


def test_the_reducer_touches_no_other_ordered_dict(usermodel, tmp_path):
    """Only the hook dicts optcheck put a hook in are filtered: an ``OrderedDict`` of the user's
    whose keys equal the ids of optcheck's hooks pickles and copies whole."""
    from collections import OrderedDict

    model, mon, _ = train(usermodel, tmp_path, "always", {})
    ids = [k for m in model.modules() for k in m._forward_pre_hooks]  # optcheck's (the user has none there)
    assert ids
    mine = OrderedDict((k, True) for k in ids)
    assert pickle.loads(pickle.dumps(mine)) == mine and copy.deepcopy(mine) == mine
    assert torch.load(io.BytesIO(_saved(mine))) == mine
    assert pickle.loads(pickle.dumps(model.state_dict())).keys() == model.state_dict().keys()
    mon.close()


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()
