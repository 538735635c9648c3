"""Training tests that know nothing of optcheck. Both pass under plain ``pytest``;
``pytest --optcheck`` (README "Your training tests: pytest --optcheck") fails the second
one with OC101 at its ``optimizer.step()`` line: its optimizer still holds the replaced head."""

import torch


def train(steps: int = 20, replace_head_at: int | None = None) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(1, steps + 1):
        if step == replace_head_at:
            model[2] = torch.nn.Linear(32, 4)      # the optimizer still holds the old head
        x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def test_training_runs():
    assert train() < 2.0


def test_training_with_a_new_head():
    assert train(replace_head_at=10) < 2.0
