"""The Monitor on an HF Llama-family model with PEFT LoRA (issue 46, item 1).

``LlamaModel.forward`` (transformers 5) slices ``self.layers[:n]``: a new ``ModuleList`` each
forward, into which every decoder layer is registered again (``torch/nn/modules/module.py``'s
global module-registration hooks run). Before issue 46 that armed the hazard probes on every
step (reason ``registration``); a frozen, not LoRA-targeted ``k_proj`` reading the same input
as the LoRA ``q_proj`` was taken for a graph cut (a false OC203) once a ``lora_A`` was replaced.
A tiny config (hidden 32, 2 layers), no weights downloaded, 1 thread."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import optcheck  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

STEPS, EVERY, REPLACE_AT = 40, 10, 25
LORA_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default"


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")


def lora_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(cfg)
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))


def run(tmp_path, replace_at=None, hazards="auto"):
    """A LoRA fine-tune of ``STEPS`` steps; ``replace_at``: the ``lora_A`` of layer 0's ``q_proj``
    is replaced by a new ``nn.Linear`` inside that step (after its forward began: between the
    optimizer's zero_grad and the forward of the step). Returns (summary, findings)."""
    model = lora_llama()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    mon = optcheck.Monitor(model, opt, every=EVERY, out=str(tmp_path / "run"), on_finding="ignore", hazards=hazards)
    g = torch.Generator().manual_seed(0)
    for step in range(1, STEPS + 1):
        x = torch.randint(0, 64, (4, 16), generator=g)
        opt.zero_grad(set_to_none=True)
        if step == replace_at:
            q = model.base_model.model.model.layers[0].self_attn.q_proj
            old = q.lora_A["default"]
            q.lora_A["default"] = torch.nn.Linear(old.in_features, old.out_features, bias=False)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
    summary = mon.close()
    return summary, list(read_jsonl(tmp_path / "run" / "findings.jsonl"))


def test_a_clean_lora_llama_run_is_silent_and_arms_as_rarely_as_a_plain_model(tmp_path):
    summary, found = run(tmp_path)
    assert found == []
    hz = summary["hazards"]
    assert hz["steps"] == STEPS
    # the first step and steps after snapshots, as on any model: the layers[:n] slice arms none
    assert set(hz["reasons"]) == {"start", "snapshot"}, hz
    assert hz["armed_steps"] <= STEPS // EVERY, hz


@pytest.mark.parametrize("hazards", ["auto", "always"])
def test_a_replaced_lora_a_is_found_at_its_step_and_nothing_is_called_a_graph_cut(tmp_path, hazards):
    summary, found = run(tmp_path, replace_at=REPLACE_AT, hazards=hazards)
    codes = {f["code"] for f in found}
    assert "OC203" not in codes, [f["message"] for f in found if f["code"] == "OC203"]  # k_proj is frozen, not cut
    assert {"OC101", "OC102"} <= codes
    for f in found:
        if f["code"] in ("OC101", "OC102"):
            assert f["step"] == REPLACE_AT and f"{LORA_A}.weight" in f["subjects"], f
    if hazards == "auto":  # the replacement itself arms its step (a registration into the watched tree)
        assert summary["hazards"]["armed_steps"] <= STEPS // EVERY + 2


def test_a_module_registered_into_a_container_outside_the_model_does_not_arm(tmp_path):
    """The registration hook's rule alone, on a plain model: a slice of its ModuleList (and a
    temporary Sequential of its blocks) each step arms nothing; an assignment into the model
    arms that step."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
            self.swap = False

        def forward(self, x):
            for b in self.blocks[:2]:
                x = torch.tanh(b(x))
            return torch.nn.Sequential(*self.blocks[2:])(x)

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = optcheck.Monitor(model, opt, every=100, out=str(tmp_path / "run"), on_finding="ignore")
    x = torch.randn(8, 4)
    for step in range(1, 21):
        if step == 15:
            model.blocks[1] = torch.nn.Linear(4, 4)
            opt.add_param_group({"params": list(model.blocks[1].parameters())})
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    hz = mon.close()["hazards"]
    # step 1, step 15 (the assignment), and the step after the snapshot the replacement takes
    assert hz["reasons"].get("registration") == 1 and hz["armed_steps"] <= 3, hz
