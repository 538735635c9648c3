"""A plain PyTorch loop under optcheck.Monitor; the script's exit code is the Monitor's.

    python examples/monitor/train.py          # exit 0: clean
    python examples/monitor/train.py --bug    # exit 1: the head is replaced after the optimizer exists
"""
import sys

import torch

import optcheck

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
bug = "--bug" in sys.argv                          # plant a bug: a layer replaced after the optimizer exists

with optcheck.Monitor(model, optimizer, every=50, out="runs/bug" if bug else "runs/mine") as mon:
    for step in range(1, 301):
        if bug and step == 120:
            model[2] = torch.nn.Linear(32, 4)      # the optimizer still holds the old head
        x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

sys.exit(mon.exit_code)                            # 0 clean, 1 findings, 3 crashed (the exit-code table)
