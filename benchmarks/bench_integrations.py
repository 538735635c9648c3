"""Cost of the Lightning and Hugging Face Trainer callbacks, as ratios against the
same run without them.

A tiny LightningModule (MLP, AdamW, automatic optimization) and a tiny GPT-2 built
from a config (2 layers, 32 wide, byte vocabulary, ``Trainer`` with
``optim="adamw_torch"``), CPU, 1 thread, with and without ``OptcheckCallback``
(every=100), interleaved in rounds so load from other processes hits both alike.
Time is the process's CPU time (``time.process_time``) of ``fit()``/``train()``;
the callback's fixed cost (the start snapshot with its tensor census) is printed
apart from the per-step ratio. Needs the pip extra ``integrations``. Usage:
``python benchmarks/bench_integrations.py [--steps 300] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def lightning_run(with_cb: bool, steps: int) -> float:
    import lightning.pytorch as L
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from optcheck.integrations.lightning import OptcheckCallback

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    x = torch.randn(4096, 8)
    dl = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16)
    cbs = [OptcheckCallback(every=100, out=tempfile.mkdtemp())] if with_cb else []
    tr = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                   default_root_dir=tempfile.mkdtemp(), callbacks=cbs)
    t = time.process_time()
    tr.fit(Net(), dl)
    return time.process_time() - t


def trainer_run(with_cb: bool, steps: int) -> float:
    import transformers

    from optcheck.integrations.transformers import OptcheckCallback

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32,
                                                                 n_layer=2, n_head=2))
    ids = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 40))
    ds = [{"input_ids": ids[i:i + 16], "labels": ids[i:i + 16]} for i in range(0, 900, 3)]
    args = transformers.TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=steps,
                                          per_device_train_batch_size=4, use_cpu=True, report_to=[],
                                          save_strategy="no", logging_strategy="no", disable_tqdm=True,
                                          optim="adamw_torch")
    cbs = [OptcheckCallback(every=100)] if with_cb else []
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds, callbacks=cbs)
    t = time.process_time()
    trainer.train()
    return time.process_time() - t


def start_cost() -> float:
    """CPU seconds of ``Monitor()`` (start snapshot, census) with the frameworks imported."""
    import optcheck

    model = torch.nn.Linear(8, 2)
    t = time.process_time()
    optcheck.Monitor(model, torch.optim.SGD(model.parameters(), lr=0.1), out=tempfile.mkdtemp()).close()
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    for name, fn in (("lightning", lightning_run), ("transformers", trainer_run)):
        fn(False, 5)  # imports and warm-up
        res = {False: [], True: []}
        for _ in range(a.rounds):
            for w in (False, True):
                res[w].append(fn(w, a.steps))
        plain, watched = statistics.median(res[False]), statistics.median(res[True])
        print(f"{name}: {a.steps} steps plain {plain:.2f} s, with OptcheckCallback(every=100) {watched:.2f} s, "
              f"ratio {watched / plain:.2f} (median of {a.rounds}, CPU time)")
    print(f"Monitor() start with lightning+transformers imported: {start_cost():.2f} s CPU (start snapshot + census)")


if __name__ == "__main__":
    main()
