"""A training script that knows nothing of optcheck: ``optcheck run -- python examples/run/train.py``
watches it as it is (README "Any training script, unchanged"; ``--bug`` replaces the head after
the optimizer exists: OC101 at step 120, exit 1)."""

import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
bug = "--bug" in sys.argv

for step in range(1, 301):
    if bug and step == 120:
        model[2] = torch.nn.Linear(32, 4)      # the optimizer still holds the old head
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"trained 300 steps, loss {loss.item():.3f}")
