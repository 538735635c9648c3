"""``optcheck.integrations.lightning.OptcheckCallback`` on real Lightning 2.x runs
(CPU, tiny models, in-memory data): clean runs give no finding; a layer replaced
by a callback at step K is found at step K."""

from __future__ import annotations

import json
import warnings

import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch", reason="lightning not installed (pip extra 'integrations')")
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from optcheck.integrations.lightning import OptcheckCallback  # noqa: E402
from optcheck.drivers.monitor import OptcheckWarning  # noqa: E402
from optcheck.record.snapshot import read_jsonl  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def loader(n=256, batch=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, :2].sum(1) > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True, generator=g)


class Classifier(L.LightningModule):
    """The Lightning docs' shape: automatic optimization, AdamW, a cosine schedule."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.CosineAnnealingLR(opt, 100)}


class ValidatedClassifier(Classifier):
    """With a validation loop (Lightning runs it under no_grad, mid-epoch here)."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))


class ManualClassifier(Classifier):
    """Manual optimization with accumulation by hand (step every 2 batches)."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y) / 2
        self.manual_backward(loss)
        if (batch_idx + 1) % 2 == 0:
            opt.step()
            opt.zero_grad()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class GAN(L.LightningModule):
    """Two optimizers (the Lightning GAN example's manual loop) on 2-D points."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        real = batch[0][:, :2] * 0.5 + 1.0
        opt_g, opt_d = self.optimizers()
        bce = nn.functional.binary_cross_entropy_with_logits
        z = torch.randn(real.shape[0], 4)
        g_loss = bce(self.discriminator(self.generator(z)), torch.ones(real.shape[0], 1))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        fake = self.generator(z).detach()
        d_loss = (bce(self.discriminator(real), torch.ones(real.shape[0], 1))
                  + bce(self.discriminator(fake), torch.zeros(real.shape[0], 1))) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()

    def configure_optimizers(self):
        return (torch.optim.Adam(self.generator.parameters(), lr=2e-3, betas=(0.5, 0.999)),
                torch.optim.Adam(self.discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999)))


class ReplaceHead(L.Callback):
    """The planted bug: the head replaced (as a fine-tuning script swaps it) before step ``at``."""

    def __init__(self, at):
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.at - 1 and not getattr(self, "done", False):
            self.done = True
            pl_module.net[2] = nn.Linear(32, 2)


def fit(tmp_path, module, steps=40, callbacks=(), **trainer_kw):
    cb = OptcheckCallback(every=10)
    kw = {"limit_val_batches": 0, **trainer_kw}
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), callbacks=[cb, *callbacks], **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OptcheckWarning)
        trainer.fit(module, loader(), loader(64, seed=1) if kw["limit_val_batches"] else None)
    out = tmp_path / "optcheck"
    summary = json.loads((out / "summary.json").read_text())
    found = list(read_jsonl(out / "findings.jsonl"))
    assert summary["findings"] == len(found) == len(cb.findings)
    return cb, summary, found, [w for w in caught if issubclass(w.category, OptcheckWarning)]


@pytest.mark.parametrize("module,kw,steps", [
    (Classifier, {}, 40),                                   # automatic optimization, LR scheduler
    (Classifier, {"accumulate_grad_batches": 4}, 10),       # gradient accumulation
    (Classifier, {"precision": "bf16-mixed"}, 30),          # bf16 autocast
    (ManualClassifier, {}, 40),                             # manual optimization, accumulation by hand
    (ValidatedClassifier, {"val_check_interval": 10, "limit_val_batches": 2}, 30),  # validation under no_grad
], ids=["automatic", "accumulate4", "bf16-mixed", "manual", "validation"])
def test_clean_runs_have_no_findings(tmp_path, module, kw, steps):
    cb, summary, found, shown = fit(tmp_path, module(), steps=steps, **kw)
    assert found == [] and shown == [] and cb.exit_code == 0
    assert summary["status"] == "clean" and summary["last_step"] > 0 and summary["snapshots"] >= 2
    # max_steps counts optimizer steps (accumulation and manual steps included): the monitor counts the same
    assert summary["last_step"] == steps


def test_gan_two_optimizers_clean_each_watched(tmp_path):
    for idx, name in ((0, "generator"), (1, "discriminator")):
        cb = OptcheckCallback(every=10, optimizer=idx, out=str(tmp_path / name))
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=60, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                            default_root_dir=str(tmp_path), callbacks=[cb])
        gan = GAN()
        trainer.fit(gan, loader())
        assert cb.monitor.model is getattr(gan, name)
        assert cb.findings == [] and cb.exit_code == 0, [f.message for f in cb.findings]
        assert cb.summary["last_step"] >= 25


def test_replaced_head_is_found_at_its_step(tmp_path):
    cb, summary, found, shown = fit(tmp_path, Classifier(), steps=30, callbacks=[ReplaceHead(at=13)])
    got = {(f["code"], f["step"]) for f in found}
    assert {("OC101", 13), ("OC102", 13), ("OC104", 13)} <= got, got
    assert cb.exit_code == 1 and summary["status"] == "findings"
    assert any("OC101" in str(w.message) for w in shown)
    assert all(w.filename == __file__ for w in shown), [(w.filename, w.lineno) for w in shown]  # trainer.fit()


def test_exception_in_fit_is_the_runs_crash(tmp_path):
    class Boom(Classifier):
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == 7:
                raise RuntimeError("data went bad")
            return super().training_step(batch, batch_idx)

    cb = OptcheckCallback(every=5)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=20, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        default_root_dir=str(tmp_path), callbacks=[cb])
    with pytest.raises(RuntimeError, match="data went bad"):
        trainer.fit(Boom(), loader())
    s = json.loads((tmp_path / "optcheck" / "summary.json").read_text())
    assert s["status"] == "crashed" and s["crash"]["step"] == 8 and s["crash"]["exc_type"] == "RuntimeError"
    assert cb.exit_code == 3
