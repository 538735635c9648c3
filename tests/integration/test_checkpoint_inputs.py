"""Inputs an activation checkpoint keeps for its recompute (issue 46, item 4): a cached mask
handed to ``torch.utils.checkpoint.checkpoint`` as a keyword argument or bound in a
``functools.partial`` (HF ``GradientCheckpointingLayer``'s way) is held by reference, and no
version counter of it is compared by PyTorch: written in place in the user's step between the
forward and backward(), the recompute runs on the new values and PyTorch trains on with wrong
gradients. optcheck names the write (op, line) at its step, with the checkpoint's kind read
from the checkpoint. Also: the kind of a checkpoint whose recompute writes a tensor saved
outside it is read, not guessed. Small CPU loops, one thread."""

from __future__ import annotations

import functools
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import optcheck  # noqa: E402
from optcheck.errors import StepStopped  # noqa: E402

STEPS, BAD = 6, 3


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


class Net(nn.Module):
    """A block run under a checkpoint that multiplies by a cached mask (a buffer of the
    model), handed to the checkpoint as ``how`` says."""

    def __init__(self, how: str):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)
        self.register_buffer("mask", torch.ones(8), persistent=False)
        self.how = how

    def block(self, x, mask=None):
        return torch.tanh(self.b(x) * mask)

    def forward(self, x):
        h, ck = self.a(x), torch.utils.checkpoint.checkpoint
        if self.how == "keyword":
            h = ck(self.block, h, mask=self.mask, use_reentrant=False)
        elif self.how == "partial":
            h = ck(functools.partial(self.block, mask=self.mask), h, use_reentrant=False)
        elif self.how == "partial-reentrant":
            h = ck(functools.partial(self.block, mask=self.mask), h, use_reentrant=True)
        else:  # positional: kept as a saved tensor, its version compared
            h = ck(self.block, h, self.mask, use_reentrant=False)
        return self.head(h).mean()


KIND = {"keyword": "non-reentrant", "partial": "non-reentrant", "partial-reentrant": "reentrant",
        "positional": "non-reentrant"}


def train(how: str, hazards: str, bug: bool, tmp_path):
    torch.manual_seed(0)
    model = Net(how)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=how == "partial-reentrant")
    grads, exc = [], None
    mon = optcheck.Monitor(model, opt, every=5, hazards=hazards, on_finding="ignore", out=tmp_path / "run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with mon:
                for step in range(1, STEPS + 1):
                    loss = model(x)
                    if bug and step == BAD:
                        model.mask.mul_(2.0)  # the cached mask refreshed between forward and backward
                    opt.zero_grad()
                    loss.backward()
                    grads.append(model.b.weight.grad.clone())
                    opt.step()
                    if bug and step == BAD:
                        model.mask.fill_(1.0)
        except StepStopped as e:
            exc = e
    return mon, exc, grads


@pytest.mark.parametrize("hazards", ["auto", "always"])
@pytest.mark.parametrize("how", list(KIND))
def test_a_checkpoint_input_written_before_the_recompute_is_found_at_its_step(how, hazards, tmp_path):
    mon, exc, _ = train(how, hazards, True, tmp_path)
    (f,) = [f for f in mon.findings if f.code == "OC301"]
    assert exc is not None and str(exc) == f"step {f.step}: {f.message}"
    assert f.step == BAD
    d = f.detail
    assert d["written"]["op"] == "mul_" and d["written"]["code"].startswith("model.mask.mul_(2.0)")
    assert d["written"]["where"].startswith("test_checkpoint_inputs.py:")
    assert d["checkpoint"] == KIND[how]  # read from the checkpoint, as its word in the message
    assert f"kept by a {KIND[how]} checkpoint for its recompute" in f.message
    assert "Net.block" in d["saved_by"]["argument"] and "mask" in d["saved_by"]["argument"] or how == "positional"
    if how == "positional":  # a saved tensor: PyTorch itself would raise at the recompute
        assert d["saved_by"]["argument"] == "argument 1 of Net.block"
        assert "modified by an inplace operation" in f.next_failure
    else:
        assert "silently" in f.next_failure and "modified by an inplace operation" not in f.next_failure


@pytest.mark.parametrize("how", ["keyword", "partial", "partial-reentrant"])
def test_without_optcheck_pytorch_trains_on_with_wrong_gradients(how):
    """The hazard is real: the same write, no Monitor, gives a different gradient and no error."""
    def grad(bug):
        torch.manual_seed(0)
        model = Net(how)
        x = torch.randn(4, 8, requires_grad=how == "partial-reentrant")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = model(x)
            if bug:
                model.mask.mul_(2.0)
            loss.backward()
        return model.b.weight.grad

    assert not torch.allclose(grad(True), grad(False))


@pytest.mark.parametrize("hazards", ["auto", "always"])
@pytest.mark.parametrize("how", list(KIND))
def test_clean_checkpointed_loops_are_silent_and_unchanged(how, hazards, tmp_path):
    mon, exc, grads = train(how, hazards, False, tmp_path)
    assert exc is None and mon.findings == [] and mon.exit_code == 0
    torch.manual_seed(0)  # the same loop unwatched: the same gradients
    model = Net(how)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=how == "partial-reentrant")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(STEPS):
            loss = model(x)
            opt.zero_grad()
            loss.backward()
            assert torch.equal(model.b.weight.grad, grads[step])
            opt.step()


class Bump(nn.Module):
    """Holds a frozen scale; its forward writes the scale in place when backward re-runs it
    (a recompute): a write the forward itself never made."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8), requires_grad=False)

    def forward(self, h):
        if torch._C._current_graph_task_id() != -1:  # in backward: the checkpoint's recompute
            self.scale.add_(0.5)
        return h


class RecomputeWriter(nn.Module):
    """The scale is saved outside the checkpoint (``a(x) * scale``); the checkpointed block
    runs ``Bump`` first, so its recompute writes the scale before backward reaches the mul."""

    def __init__(self, reentrant: bool):
        super().__init__()
        self.a, self.b, self.head, self.bump = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1), Bump()
        self.reentrant = reentrant

    def block(self, h):
        return torch.tanh(self.b(self.bump(h)))

    def forward(self, x):
        h = torch.sigmoid(self.a(x) * self.bump.scale)
        h = torch.utils.checkpoint.checkpoint(self.block, h, use_reentrant=self.reentrant)
        return self.head(h).mean()


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_write_in_a_recompute_is_named_with_the_kind_read(reentrant, tmp_path):
    torch.manual_seed(0)
    model = RecomputeWriter(reentrant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=reentrant)
    with pytest.raises(StepStopped) as exc:
        with optcheck.Monitor(model, opt, every=5, hazards="always", on_finding="ignore",
                              out=tmp_path / "run") as mon:
            for _ in range(3):
                loss = model(x)
                opt.zero_grad()
                loss.backward()
                opt.step()
    (f,) = [f for f in mon.findings if f.code == "OC301"]
    kind = "reentrant" if reentrant else "non-reentrant"
    assert f.step == 1 and f.detail["checkpoint"] == kind and str(exc.value).endswith(f.message)
    assert f.detail["written"]["code"] == "self.scale.add_(0.5)"
    assert f"a {kind} checkpoint's recompute" in f.message
    other = "non-reentrant" if reentrant else " reentrant"
    assert f"{other} checkpoint" not in f.message


def tiny_llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    model.train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def causal(T: int = 16) -> torch.Tensor:
    return torch.full((2, 1, T, T), float("-inf")).triu(1)  # a 4-D float mask: 0 keep, -inf drop


def test_hf_llama_a_cached_4d_mask_rewritten_before_backward_is_found(tmp_path):
    """transformers' own gradient checkpointing binds ``attention_mask`` in a
    ``functools.partial`` (``GradientCheckpointingLayer``): a cached 4-D mask the loop rewrites
    after the forward changes the recompute, silently without optcheck."""
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))

    def grads(write: bool) -> torch.Tensor:
        model, mask = tiny_llama(), causal()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
            if write:
                mask[:, :, :, 1:4] = float("-inf")
            loss.backward()
        return model.model.layers[0].self_attn.q_proj.weight.grad

    assert not torch.allclose(grads(True), grads(False))  # PyTorch: no error, other gradients
    model, mask = tiny_llama(), causal()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(StepStopped):
            with optcheck.Monitor(model, opt, every=3, on_finding="ignore", out=tmp_path / "run") as mon:
                for step in range(1, 5):
                    loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
                    if step == BAD:
                        mask[:, :, :, 1:4] = float("-inf")  # the cache rewritten for the next batch, too early
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
    (f,) = [f for f in mon.findings if f.code == "OC301"]
    assert f.step == BAD and f.detail["checkpoint"] == "non-reentrant"
    assert f.detail["written"]["code"] == 'mask[:, :, :, 1:4] = float("-inf")  # the cache rewritten for the next batch, too early'
    assert "keyword 'attention_mask' bound in functools.partial(LlamaDecoderLayer.forward)" in f.message
    assert "model.layers.0" in f.message and "silently" in f.next_failure


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_hf_llama_checkpointed_clean_is_silent(reentrant, tmp_path):
    model = tiny_llama()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:
        model.enable_input_require_grads()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with optcheck.Monitor(model, opt, every=3, hazards="always", on_finding="ignore", out=tmp_path / "run") as mon:
            for _ in range(4):
                loss = model(input_ids=ids, attention_mask=torch.ones(2, 16, dtype=torch.long), labels=ids).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
    assert mon.findings == [] and mon.exit_code == 0
