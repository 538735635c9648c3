"""OC301 names the writer (issue 33): the op and the ``file:line`` that wrote a saved tensor in
place, wherever the write is — a module's forward, a helper any depth down, the user's loop
between the forward and ``backward()``, a module hook, a custom ``autograd.Function``, an
``out=`` op, a write through a view, a checkpoint's recompute — and, on a step the probes did
not watch (``hazards="auto"``), from the armed re-run of the step's forward. A write it cannot
see says so and names its window. Each fault is planted in the user's own code; each case is
also run without optcheck to show what PyTorch does there. CPU, tiny models, one thread."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import optcheck  # noqa: E402
import writer_loops  # noqa: E402
from optcheck.errors import StepStopped  # noqa: E402
from writer_loops import stopped, train  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def line_of(text: str) -> str:
    return writer_loops.line_of(__file__, text)


# ----------------------------------------------------------------------------- a litgpt-shaped decoder
def batched_index_copy_(t, dim, idx, val):
    """A module-level helper of the model's file, as litgpt's (the KV-cache write)."""
    return t.index_copy_(dim, idx, val)  # WRITE: index_copy_ in a helper


class KVCache(nn.Module):
    def __init__(self, B, H, T, D):
        super().__init__()
        self.register_buffer("k", torch.zeros(B, H, T, D), persistent=False)
        self.register_buffer("v", torch.zeros(B, H, T, D), persistent=False)

    def forward(self, input_pos, k, v):
        k = batched_index_copy_(self.k, -2, input_pos, k)  # CALL: the helper
        v = batched_index_copy_(self.v, -2, input_pos, v)
        return k, v


class Attention(nn.Module):
    def __init__(self, C=32, H=4, T=8, B=2):
        super().__init__()
        self.qkv, self.proj, self.H = nn.Linear(C, 3 * C), nn.Linear(C, C), H
        self.kv_cache = KVCache(B, H, T, C // H)

    def forward(self, x, input_pos=None):
        B, T, C = x.shape
        q, k, v = (z.view(B, T, self.H, C // self.H).transpose(1, 2) for z in self.qkv(x).split(C, -1))
        if input_pos is not None:  # the cache switched on during a training forward (seed 000)
            k, v = self.kv_cache(input_pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=input_pos is None)  # SAVE: sdpa saves k, v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Decoder(nn.Module):
    def __init__(self, V=40, C=32):
        super().__init__()
        self.wte, self.attn, self.lm_head = nn.Embedding(V, C), Attention(C), nn.Linear(C, V)

    def forward(self, idx, input_pos=None):
        return self.lm_head(self.attn(self.wte(idx), input_pos))


def decoder_loop(bug, monitor=True):
    """Returns (monitor or None, exception)."""
    torch.manual_seed(0)
    model = Decoder()
    idx, pos = torch.randint(0, 40, (2, 8)), torch.arange(8)

    def step_loss(model, step):
        if bug == "two-forwards":  # two forwards share the model's KV cache before one backward
            return model(idx, pos).logsumexp(-1).mean() + model(idx, pos).logsumexp(-1).mean()
        loss = model(idx, pos).logsumexp(-1).mean()
        pos.add_(8)  # WRITE: the loop advances input_pos in place
        pos.sub_(8)
        return loss

    return train(model, torch.optim.AdamW(model.parameters(), lr=1e-3), step_loss, monitor, steps=3)


@pytest.mark.parametrize("bug", ["two-forwards", "pos-advanced"])
def test_the_issues_first_two_rows_name_the_op_and_the_writers_line(bug):
    _, plain = decoder_loop(bug, monitor=False)
    assert "modified by an inplace operation" in str(plain)  # what PyTorch says, without op or line
    mon, exc = decoder_loop(bug)
    f, d = stopped(mon, exc)
    w = d["written"]
    assert f.step == 1 and w["seen"] is True
    if bug == "two-forwards":
        assert d["tensor"]["shape"] == [2, 4, 8, 8] and d["saved_by"]["module"] == "attn"
        assert d["saved_by"]["op"].startswith("ScaledDotProduct") and d["saved_by"]["where"] == line_of("SAVE: sdpa")
        assert (w["op"], w["where"]) == ("index_copy_", line_of("WRITE: index_copy_ in a helper"))
        assert w["module"] == "attn.kv_cache" and w["phase"] == "forward"
        assert w["stack"][1].startswith(line_of("CALL: the helper")) and "in forward" in w["stack"][1]
    else:  # seed 000's exact error: the saved index is the loop's position tensor
        assert "LongTensor [8]] is at version 2; expected version 0" in str(plain)  # add_ then sub_
        assert d["tensor"]["shape"] == [8] and d["saved_by"]["op"] == "IndexCopyBackward0"
        assert d["saved_by"]["module"] == "attn.kv_cache"
        assert (w["op"], w["where"], w["module"]) == ("add_", line_of("WRITE: the loop advances"), None)
        assert w["phase"].startswith("after the forward") and "the training loop" in f.message
    assert f"by {w['op']} at {w['where']}" in f.message
    assert w["where"] != d["saved_by"]["where"]  # never the saving line offered as the writer's


# ----------------------------------------------------------------------------- every other place
class Scale2(torch.autograd.Function):
    """A custom Function that doubles its input in place (and says so with mark_dirty)."""

    @staticmethod
    def forward(ctx, x):
        x.mul_(2.0)  # WRITE: custom Function
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2.0


def deep_helper(y):
    return deeper_helper(y)


def deeper_helper(y):
    y.clamp_(max=0.9)  # WRITE: two helpers down
    return y


class Gate(nn.Module):
    """sigmoid saves its output; ``how`` writes it in place one way or another."""

    def __init__(self, how):
        super().__init__()
        self.fc, self.how = nn.Linear(8, 8), how
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        y = torch.sigmoid(self.fc(x))  # SAVE: sigmoid
        if self.how == "out=":  # out= refuses a tensor that requires grad: a buffer the op saved
            y = y * self.scale  # SAVE: the scale buffer
            torch.add(self.scale, 0.5, out=self.scale)  # WRITE: out=
        elif self.how == "view":
            y.view(-1)[:4] = 0.0  # WRITE: through a view
        elif self.how == "function":
            y = Scale2.apply(y)
        elif self.how == "helper":
            y = deep_helper(y)
        elif self.how == "augmented":
            y += 1.0  # WRITE: augmented
        elif self.how == "aten":
            torch.ops.aten.mul_.Tensor(y, torch.tensor(2.0))  # WRITE: torch.ops, not through torch's Python API
        return y


def hook_writes(module, args, out):
    out.mul_(0.5)  # WRITE: a forward hook
    return None


class Net(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.gate, self.head = Gate(how), nn.Linear(8, 1)
        if how == "hook":
            self.gate.register_forward_hook(hook_writes)

    def forward(self, x):
        return self.head(self.gate(x))


def net_loop(how, monitor=True):
    torch.manual_seed(0)
    model = Net(how)
    x = torch.randn(4, 8)
    return train(model, torch.optim.SGD(model.parameters(), lr=0.01), lambda m, step: m(x).pow(2).mean(), monitor)


WRITERS = {"out=": ("add(out=...)", "WRITE: out="), "view": ("x[...] = ... (__setitem__)", "WRITE: through a view"),
           "function": ("mul_", "WRITE: custom Function"), "helper": ("clamp_", "WRITE: two helpers down"),
           "augmented": ("add_", "WRITE: augmented"), "hook": ("mul_", "WRITE: a forward hook")}


@pytest.mark.parametrize("how", sorted(WRITERS))
def test_the_writer_is_named_wherever_it_writes(how):
    _, plain = net_loop(how, monitor=False)
    assert "modified by an inplace operation" in str(plain)
    mon, exc = net_loop(how)
    f, d = stopped(mon, exc)
    op, mark = WRITERS[how]
    w = d["written"]
    assert f.step == 1 and (w["op"], w["where"]) == (op, line_of(mark)) and w["seen"]
    saver = ("MulBackward0", "SAVE: the scale buffer") if how == "out=" else ("SigmoidBackward0", "SAVE: sigmoid")
    assert (d["saved_by"]["op"], d["saved_by"]["where"]) == (saver[0], line_of(saver[1]))
    assert w["module"] == "gate" and f"at {w['where']}" in f.message
    if how == "helper":  # the chain of calls, innermost first
        assert [s.split(" in ")[1] for s in w["stack"][:3]] == ["deeper_helper", "deep_helper", "forward"]


def test_a_write_the_probes_cannot_see_says_so_and_names_its_window():
    _, plain = net_loop("aten", monitor=False)
    assert "modified by an inplace operation" in str(plain)
    mon, exc = net_loop("aten")
    f, d = stopped(mon, exc)
    w = d["written"]
    # the window: the last module boundary before the write and the first after it
    assert w["seen"] is False and w["where"] is None and w["between"] == "the return of gate.fc and the return of gate"
    assert "was not seen" in f.message and "torch.ops" in f.message
    assert line_of("WRITE: torch.ops") not in f.message and d["saved_by"]["where"] in f.message


def test_the_third_row_a_lightning_forward_on_an_unarmed_step_is_named_at_its_step(tmp_path):
    L = pytest.importorskip("lightning.pytorch")
    from optcheck.integrations.lightning import OptcheckCallback

    class LM(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 1)

        def forward(self, x):
            h = torch.sigmoid(self.fc1(x))
            if self.global_step >= 12:
                h.mul_(2)  # WRITE: Lightning forward, unarmed step
            return self.fc2(h)

        def training_step(self, batch, i):
            return F.mse_loss(self(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    ds = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
    cb = OptcheckCallback(out=str(tmp_path / "run"), every=50, on_finding="ignore")  # hazards: the default, auto
    trainer = L.Trainer(max_steps=20, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(StepStopped) as exc:
            trainer.fit(LM(), torch.utils.data.DataLoader(ds, batch_size=4))
    (f,) = [f for f in cb.findings if f.code == "OC301"]
    d = exc.value.event["detail"]
    assert f.step == 13 and d["found_by"] == "pytorch" and d["armed"] is False and d["rerun"] == "forward"
    assert (d["written"]["op"], d["written"]["where"]) == ("mul_", line_of("WRITE: Lightning forward"))
    assert cb.monitor.summary()["hazards"]["armed_steps"] == 1  # step 1 only: step 13 ran unarmed


@pytest.mark.parametrize("hazards", ["auto", "always"])
def test_a_write_in_the_loop_on_a_step_4_is_named_when_armed_and_its_window_given_when_not(hazards):
    """The re-run of an unarmed step covers the model's forward only: a write in the loop is named
    with ``hazards="always"``; at ``auto`` the finding says it is outside the forward."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Sigmoid(), nn.Linear(8, 1))
    x = torch.randn(4, 8)

    def step_loss(model, step):
        h = model[1](model[0](x))
        if step == 3:
            h.mul_(2)  # WRITE: the loop, step 4
        return model[2](h).pow(2).mean()

    mon, exc = train(model, torch.optim.SGD(model.parameters(), lr=0.01), step_loss, steps=5, hazards=hazards)
    f, d = stopped(mon, exc)
    assert f.step == 4
    if hazards == "always":
        assert (d["written"]["op"], d["written"]["where"]) == ("mul_", line_of("WRITE: the loop, step 4"))
    else:
        assert d["rerun"] == "forward: no write seen" and "outside it" in f.message and 'hazards="always"' in f.message


def test_a_tensor_saved_and_written_in_the_loop_says_outside_every_module_not_a_question_mark():
    """The saving op ran in the loop (a softmax of the model's output): the finding says so in words."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(4, 8), torch.nn.functional.one_hot(torch.arange(4) % 3, 3)

    def step_loss(model, step):
        probs = model(x).softmax(-1)  # SAVE: the loop's softmax
        loss = -(probs * y).sum()
        if step == 2:
            probs.clamp_(min=1e-6)  # WRITE: the loop clamps the saved softmax
        return loss

    mon, exc = train(model, torch.optim.SGD(model.parameters(), lr=0.01), step_loss, steps=4, hazards="always")
    f, d = stopped(mon, exc)
    assert f.step == 3
    assert (d["written"]["op"], d["written"]["where"]) == ("clamp_", line_of("WRITE: the loop clamps"))
    assert f"outside every module ({line_of('SAVE: the loop')})" in f.message and " ? " not in f.message


# ----------------------------------------------------------------------------- clean runs, the mode stack
class Doubler(torch.overrides.TorchFunctionMode):
    """A user's own torch-function mode: counts the calls it sees."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def test_a_clean_loop_stays_silent_equal_and_leaves_no_mode_behind():
    """In-place writes that touch no saved tensor (relu_, an optimizer step, a running mean)
    stay silent; the losses are those of the same loop without optcheck; a user's own mode
    around the forward keeps working and the mode stack is empty again at every step's end."""
    def run(monitor, hazards="always"):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(inplace=True), nn.Linear(16, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        mon = optcheck.Monitor(model, opt, every=3, on_finding="ignore", hazards=hazards) if monitor else None
        losses, mine = [], Doubler()
        for _ in range(6):
            with mine:
                out = model(x)
            assert all(torch._C._get_function_stack_at(i) is not mine for i in range(torch._C._len_torch_function_stack()))
            loss = F.mse_loss(out, y)
            loss.add_(0.0)  # an in-place op on a tensor nothing saved
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            assert torch._C._len_torch_function_stack() == 0
        if mon is not None:
            mon.close()
        return mon, losses

    _, plain = run(False)
    for hazards in ("always", "auto"):
        mon, watched = run(True, hazards)
        assert watched == plain and mon.findings == [] and mon.exit_code == 0
        assert mon.summary()["not_checked"] == []


def test_a_warning_raised_inside_the_mode_keeps_the_users_line():
    """PyTorch warns from inside the torch call the mode ran: the warning is the caller's line."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    with optcheck.Monitor(model, opt, on_finding="ignore", hazards="always") as mon:
        out = model(x)
        out.grad  # WARN: non-leaf .grad read
        out.sum().backward()
        opt.step()
    (f,) = [f for f in mon.findings if f.code == "OC201"]
    assert line_of("WARN: non-leaf .grad read") in f.message, f.message


# ----------------------------------------------------------------------------- checkpoint recompute
class CachedMaskBlock(nn.Module):
    """Attention-ish block reading a cached float mask it refreshes in place after use
    (seed 001's shape), under activation checkpointing."""

    def __init__(self, d, cache):
        super().__init__()
        self.qk, self.proj, self.cache = nn.Linear(d, 2 * d), nn.Linear(d, d), cache

    def forward(self, x):
        T = x.size(1)
        q, k = self.qk(x).chunk(2, -1)
        keep = self.cache[:T, :T]
        att = F.softmax(q @ k.transpose(-2, -1), dim=-1) * keep  # SAVE: the cached mask
        keep.masked_fill_(~torch.tril(torch.ones(T, T, dtype=torch.bool)), 0.0)  # WRITE: the mask cache refreshed
        return x + self.proj(att @ x)


def ckpt_loop(reentrant, monitor=True):
    torch.manual_seed(0)
    cache = torch.tril(torch.ones(8, 8))
    block, head = CachedMaskBlock(16, cache), nn.Linear(16, 1)
    model = nn.ModuleDict({"block": block, "head": head})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(2, 8, 16, requires_grad=reentrant)

    def step_loss(model, step):
        return head(torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant)).pow(2).mean()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train(model, opt, step_loss, monitor)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_write_in_the_checkpoint_recompute_is_named_as_such(reentrant):
    _, plain = ckpt_loop(reentrant, monitor=False)
    if reentrant:
        assert "modified by an inplace operation" in str(plain)
    else:  # the non-reentrant recompute checks no version counter: PyTorch trains on
        assert plain is None
    mon, exc = ckpt_loop(reentrant)
    f, d = stopped(mon, exc)
    w = d["written"]
    assert (w["op"], w["where"]) == ("masked_fill_", line_of("WRITE: the mask cache refreshed"))
    assert d["saved_by"]["where"] == line_of("SAVE: the cached mask")
    assert w["phase"] == "backward (recompute)" and d["checkpoint"] == ("reentrant" if reentrant else "non-reentrant")
    kind = "a reentrant" if reentrant else "a non-reentrant"
    assert f"in {kind} checkpoint's recompute of block's forward during backward()" in f.message


def test_a_step_that_raises_inside_a_checkpoint_recompute_leaves_no_mode_behind():
    """A recompute forward that raises inside ``backward()`` (the user's module fails on its second
    call) ends the step before the write log's mode pushed for it is taken out; closing the Monitor
    takes it out (``ModeSlot.release``): the user's thread is left with no mode of optcheck's, which
    every later ``torch.compile`` would otherwise trace. Before, it stayed."""
    from torch.utils.checkpoint import checkpoint

    class FailsOnRecompute(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.calls = nn.Linear(8, 8), 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("the user's module fails when it is recomputed")
            return torch.tanh(self.lin(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.head = FailsOnRecompute(), nn.Linear(8, 1)

        def forward(self, x):
            return self.head(checkpoint(self.inner, x, use_reentrant=False))

    def stack() -> list:
        return [type(torch._C._get_function_stack_at(i)).__name__ for i in range(torch._C._len_torch_function_stack())]

    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="fails when it is recomputed"):
        with optcheck.Monitor(model, opt, every=2, on_finding="ignore", hazards="always"):
            model(torch.randn(4, 8)).sum().backward()
    assert stack() == []


def test_a_backward_bound_before_the_monitor_leaves_no_mode_behind():
    """A loop whose ``torch.autograd.backward`` was bound before the Monitor wrapped it (a library's
    ``from torch.autograd import backward``) runs its backward through the write log's own mode, which
    torch takes off the stack for that call: the probes' pop at backward's start found nothing and the
    mode came back for good, on the user's thread after ``close()`` (found by the conftest check on
    ``bench_twins``' plain twin). The pop is kept for later, and the stack is empty at the end."""
    bound = torch.autograd.backward
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with optcheck.Monitor(model, opt, every=2, on_finding="ignore", hazards="always") as mon:
        for _ in range(3):
            opt.zero_grad()
            bound(F.mse_loss(model(x), y))
            opt.step()
    assert mon.findings == [] and mon.step_count == 3
    assert torch._C._len_torch_function_stack() == 0
