"""``optcheck.integrations.transformers.OptcheckCallback`` on a real Hugging Face
``Trainer`` (transformers 5.x + accelerate, CPU): a tiny GPT-2 built from a
config, an in-memory dataset, nothing downloaded. Clean runs give no finding; an
``lm_head`` replaced at step K is found at step K."""

from __future__ import annotations

import json
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers not installed (pip extra 'integrations')")
pytest.importorskip("accelerate", reason="accelerate not installed (pip extra 'integrations')")
from torch import nn  # noqa: E402

from optcheck.integrations.transformers import OptcheckCallback  # noqa: E402
from optcheck.drivers.monitor import OptcheckWarning  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


class Tokens(torch.utils.data.Dataset):
    """Byte-level sequences of a repeated text: a loss that falls within 20 steps."""

    def __init__(self, n=64, ctx=16):
        text = (b"the quick brown fox jumps over the lazy dog. " * 40)
        ids = torch.tensor(list(text), dtype=torch.long)
        self.items = [ids[i:i + ctx] for i in range(0, n * 3, 3)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(cfg)


class ReplaceLmHead(transformers.TrainerCallback):
    """The planted bug: ``model.lm_head`` replaced (a fresh, untied head) before step ``at``."""

    def __init__(self, at):
        self.at = at

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at - 1:
            model.lm_head = nn.Linear(model.config.n_embd, model.config.vocab_size, bias=False)


def train(tmp_path, steps=20, callbacks=(), **args_kw):
    cb = OptcheckCallback(every=5)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4, learning_rate=3e-3,
        use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no", eval_strategy="no",
        dataloader_num_workers=0, disable_tqdm=True, seed=0, **args_kw)
    trainer = transformers.Trainer(model=gpt2(), args=args, train_dataset=Tokens(), callbacks=[cb, *callbacks])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OptcheckWarning)
        trainer.train()
    out = tmp_path / "optcheck"
    summary = json.loads((out / "summary.json").read_text())
    found = list(read_jsonl(out / "findings.jsonl"))
    assert summary["findings"] == len(found) == len(cb.findings)
    return trainer, cb, summary, found, [w for w in caught if issubclass(w.category, OptcheckWarning)]


def _clean(found, summary, cb, steps):
    assert summary["last_step"] == steps and summary["loss_last"] < summary["loss_first"]
    assert found == [] and cb.exit_code == 0 and summary["status"] == "clean", \
        [(f["code"], f["step"], f["message"]) for f in found]


def test_default_fused_adamw_clean(tmp_path):
    trainer, cb, summary, found, _ = train(tmp_path, steps=20)
    opt = cb.monitor.optimizer
    assert type(trainer.optimizer).__name__ == "AcceleratedOptimizer" and isinstance(opt, torch.optim.AdamW)
    assert opt.defaults.get("fused") is True  # the Trainer's default on torch >= 2.8
    _clean(found, summary, cb, 20)  # fused kernels leave _version alone: OC205 reads the values


def test_gradient_accumulation_clean_and_counted_as_optimizer_steps(tmp_path):
    trainer, cb, summary, found, _ = train(tmp_path, steps=8, gradient_accumulation_steps=4, optim="adamw_torch")
    assert trainer.state.global_step == 8
    _clean(found, summary, cb, 8)


def test_replaced_lm_head_is_found_at_its_step(tmp_path):
    trainer, cb, summary, found, shown = train(tmp_path, steps=12, callbacks=[ReplaceLmHead(at=7)],
                                               optim="adamw_torch")
    got = {(f["code"], f["step"]) for f in found}
    assert ("OC102", 7) in got, got  # the new head's weight is in no param group
    new = next(f for f in found if f["code"] == "OC102" and f["step"] == 7)
    assert new["subjects"] == ["lm_head.weight"] and new["phase"] == "pre-step"
    assert min(f["step"] for f in found) == 7 and cb.exit_code == 1 and summary["status"] == "findings"
    assert any("OC102" in str(w.message) for w in shown)
    assert all(w.filename == __file__ for w in shown), [(w.filename, w.lineno) for w in shown]  # trainer.train()


class WriteLmHeadInput(transformers.TrainerCallback):
    """The planted bug: from step ``at`` on, a forward hook of the user's writes ``lm_head``'s
    input in place after ``lm_head`` saved it for backward (inside the Trainer's step)."""

    def __init__(self, at):
        self.at, self.handle = at, None

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at - 1 and self.handle is None:
            def write(module, inputs, out):
                inputs[0].mul_(1.0)

            self.handle = model.lm_head.register_forward_hook(write)


@pytest.mark.parametrize("hazards", ["auto", pytest.param("always", marks=pytest.mark.slow)])
def test_a_step_optcheck_stops_closes_the_callbacks_monitor_with_the_summary(tmp_path, hazards):
    """``StepStopped`` leaves ``trainer.train()`` (the Trainer has no exception callback): the
    callback's Monitor is closed all the same, summary.json says ``stopped`` at the step, and
    the stopped step is counted (issue 46). ``auto``: found by PyTorch's check on an unarmed
    step (the re-run names the write); ``always``: by the armed probes in the forward."""
    from optcheck.errors import StepStopped

    cb = OptcheckCallback(every=5, hazards=hazards)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=4, learning_rate=3e-3, use_cpu=True,
        report_to=[], save_strategy="no", logging_strategy="no", eval_strategy="no", dataloader_num_workers=0,
        disable_tqdm=True, seed=0, optim="adamw_torch")
    trainer = transformers.Trainer(model=gpt2(), args=args, train_dataset=Tokens(), callbacks=[cb, WriteLmHeadInput(4)])
    with pytest.raises(StepStopped) as stopped:
        trainer.train()
    assert stopped.value.event["step"] == 4 and "lm_head" in str(stopped.value)
    assert cb.monitor.closed and cb.exit_code == 1
    summary = json.loads((tmp_path / "optcheck" / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["hazards"]["steps"] == 4, summary
    found = list(read_jsonl(tmp_path / "optcheck" / "findings.jsonl"))
    assert [(f["code"], f["step"]) for f in found] == [("OC301", 4)]
    assert torch.is_grad_enabled() and torch._C._autograd._top_saved_tensors_default_hooks(False) is None
