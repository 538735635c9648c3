"""``optcheck.Monitor``'s autograd hazard probes on loops written the way users write
them (not optcheck's GPT): evaluation forwards are not graph cuts, OC301 names the
statement that wrote in place, modules assigned after the Monitor starts are watched,
``torch.compile``d models and both forms of activation checkpointing (issue 11, items
4, 6, 9, 13, 14). Each loop is small, CPU, one thread."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

import optcheck  # noqa: E402
from optcheck.drivers.worker_loop import StepStopped  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(1)


def watch(model, opt, **kw):
    kw.setdefault("every", 5)
    kw.setdefault("on_finding", "ignore")
    return optcheck.Monitor(model, opt, **kw)


def codes(mon):
    return [(f.code, f.step) for f in mon.findings]


# --------------------------------------------------------------------------- item 4: evaluation is no cut
def train_gan(bug=None, steps=30, bug_at=4, sample_every=5):
    """DCGAN order on 2-D points, both ``zero_grad()`` at the top of the iteration, and
    samples drawn from G with a fixed noise under ``no_grad`` every few iterations (as
    the DCGAN tutorial does). The Monitor watches the generator. ``bug="g-no-grad"``:
    from iteration ``bug_at`` on, G's training forward runs under ``no_grad`` too."""
    torch.manual_seed(0)
    netG = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 2))
    netD = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-3, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-3, betas=(0.5, 0.999))
    crit = nn.BCEWithLogitsLoss()
    fixed_noise = torch.randn(16, 4)
    samples = []
    with watch(netG, optG) as mon:
        for it in range(1, steps + 1):
            optD.zero_grad()
            optG.zero_grad()
            real = torch.randn(64, 2) * 0.5 + torch.tensor([2.0, -1.0])
            errD_real = crit(netD(real), torch.ones(64, 1))
            errD_real.backward()
            with torch.no_grad():
                fake = netG(torch.randn(64, 4))  # D's step needs no gradient through G
            errD_fake = crit(netD(fake), torch.zeros(64, 1))
            errD_fake.backward()
            optD.step()
            if bug == "g-no-grad" and it >= bug_at:
                with torch.no_grad():
                    fake = netG(torch.randn(64, 4))
            else:
                fake = netG(torch.randn(64, 4))
            errG = crit(netD(fake), torch.ones(64, 1))
            errG.backward()
            optG.step()
            if it % sample_every == 0:
                with torch.no_grad():
                    samples.append(netG(fixed_noise).detach())  # generation: never backwarded
    return mon


def test_generation_and_a_no_grad_generator_for_the_discriminator_are_not_cuts():
    mon = train_gan()
    assert codes(mon) == [] and mon.exit_code == 0


def test_a_generator_trained_under_no_grad_is_a_cut_at_its_step():
    mon = train_gan(bug="g-no-grad")
    first = mon.findings[0]
    assert (first.code, first.step) == ("OC203", 4), codes(mon)
    assert first.detail["cut"] == "partial" and first.detail["module"] == "0"
    assert "test_monitor_hazards_wild.py:" in first.message and "autograd was not recording" in first.message


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.aux = nn.Linear(32, 3)  # an auxiliary head trained on some steps only

    def forward(self, x, aux=False):
        h = self.body(x)
        return self.aux(h) if aux else self.head(h)


def test_validation_and_teacher_forwards_between_steps_are_not_cuts():
    """Lightning-style: validation under ``no_grad`` (``validation_step``), a mean-teacher
    forward under ``no_grad`` before each training forward, and an auxiliary head
    trained on every 4th step only (so some parameters legitimately have no gradient at a
    step): no finding."""
    torch.manual_seed(0)
    model = Classifier()
    teacher = Classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(128, 10), torch.randint(0, 3, (128,))
    with watch(model, opt, every=4) as mon:
        for step in range(1, 25):
            with torch.no_grad():
                soft = F.softmax(teacher(x), -1)
                model.eval()
                model(x)  # the student itself as its own teacher, eval mode
                model.train()
            logits = model(x)
            loss = F.cross_entropy(logits, y) + 0.1 * F.kl_div(F.log_softmax(logits, -1), soft, reduction="batchmean")
            if step % 4 == 0:  # the auxiliary head: some steps only
                loss = loss + 0.5 * F.cross_entropy(model(x, aux=True), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 3 == 0:
                model.eval()
                with torch.no_grad():  # validation_step
                    F.cross_entropy(model(x), y)
                model.train()
    assert codes(mon) == [] and mon.exit_code == 0


# --------------------------------------------------------------------------- item 6 + 9: the write site
class Gate(nn.Module):
    """A sigmoid gate that rescales its output in place."""

    def forward(self, x):
        y = torch.sigmoid(x)
        y.mul_(2.0)
        return y


def gated(x):
    y = torch.sigmoid(x)
    y.mul_(2.0)
    return y


class FuncGate(nn.Module):
    def forward(self, x):
        return gated(x)


class Block(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(8, 16), act, nn.Linear(16, 8))

    def forward(self, x):
        return x + self.ff(x)


class Net(nn.Module):
    def __init__(self, act=nn.GELU):
        super().__init__()
        self.blocks = nn.Sequential(Block(act()), Block(act()))
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


def run_net(model, steps=3, before=None, at_step=None, **kw):
    """``at_step(model, step)`` runs before each step's forward (1-based), inside the loop."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(1)
    x = torch.randn(4, 8)
    mon = watch(model, opt, **kw)
    if before is not None:
        before(model)
    exc = None
    try:
        for step in range(1, steps + 1):
            if at_step is not None:
                at_step(model, step)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    except StepStopped as e:
        exc = e
    mon.close()
    return mon, exc


def one_finding_same_as_exception(mon, exc):
    (f,) = [f for f in mon.findings if f.code == "OC301"]
    assert str(exc) == f"step {f.step}: {f.message}"  # one formatter for both
    return f


@pytest.mark.parametrize("act", [Gate, FuncGate], ids=["module", "function"])
def test_inplace_names_the_statement_that_wrote(act):
    mon, exc = run_net(Net(act))
    f = one_finding_same_as_exception(mon, exc)
    assert f.step == 1 and "y.mul_(2.0)" in f.message
    line = f.detail["written"]["where"]
    assert f"at {line}" in f.message and line != f.detail["saved_by"]["where"]
    assert f.detail["saved_by"]["code"] == "y = torch.sigmoid(x)"


class SigmoidThenInplaceReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 1)

    def forward(self, x):
        h = torch.sigmoid(self.fc1(x))
        h = self.act(h)  # relu_ on sigmoid's saved output
        h += 1
        return self.fc2(h)


def test_a_torch_module_writing_in_place_is_named_by_the_statement_calling_it():
    mon, exc = run_net(SigmoidThenInplaceReLU())
    f = one_finding_same_as_exception(mon, exc)
    assert f.detail["written"]["module"] == "act" and f.detail["written"]["code"] == "h = self.act(h)  # relu_ on " \
        "sigmoid's saved output"
    assert f.detail["saved_by"]["code"] == "h = torch.sigmoid(self.fc1(x))"


def test_a_module_swapped_in_after_the_monitor_started_is_watched():
    def swap(model):
        model.blocks[0].ff[1] = Gate()  # ff[1] = MyGate()

    mon, exc = run_net(Net(), before=swap)
    f = one_finding_same_as_exception(mon, exc)
    assert f.step == 1 and f.detail["written"]["module"] == "blocks.0.ff.1"
    assert f.detail["saved_by"]["module"] == "blocks.0.ff.1" and "y.mul_(2.0)" in f.message


class Wrapper(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


class NoGradNorm(nn.LayerNorm):
    """LayerNorm run in float32 "for stability" under no_grad (seed 002's shape)."""

    def forward(self, x):
        with torch.no_grad():
            return super().forward(x.float()).to(x.dtype)


def test_a_wrapped_container_is_named_by_its_new_paths():
    def wrap(model):
        model.blocks = Wrapper(model.blocks)  # m.blocks = Wrapper(m.blocks)
        model.blocks.inner.insert(1, NoGradNorm(8, elementwise_affine=False))  # and a cut planted in it

    mon, exc = run_net(Net(), before=wrap, steps=6, every=2)
    assert exc is None
    cut = next(f for f in mon.findings if f.code == "OC203")
    assert cut.step == 1 and cut.detail["module"] == "blocks.inner.1"
    assert cut.subjects and all(n.startswith("blocks.inner.0.") for n in cut.subjects), cut.subjects
    starved = next((f for f in mon.findings if f.code == "OC202"), None)
    if starved is not None:  # OC202 and OC203 name the same parameters
        assert set(cut.subjects) <= set(starved.subjects)
    assert mon.hazards.rescans <= 3  # re-scanned on the assignments only, not per step


# --------------------------------------------------------------------------- item 14: checkpointing
class CkptBlock(nn.Module):
    """Attention-ish block whose probabilities are multiplied by a cached float mask
    shared by every block; ``refresh`` re-applies the causal pattern to the cache in
    place after use (seed 001's shape)."""

    def __init__(self, d, cache, refresh):
        super().__init__()
        self.qk = nn.Linear(d, 2 * d)
        self.proj = nn.Linear(d, d)
        self.cache, self.refresh = cache, refresh

    def forward(self, x):
        T = x.size(1)
        q, k = self.qk(x).chunk(2, -1)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = (q @ k.transpose(-2, -1)).masked_fill(~causal, float("-inf"))
        keep = self.cache[:T, :T]
        att = F.softmax(att, dim=-1) * keep
        if self.refresh:
            keep.masked_fill_(~causal, 0.0)  # refresh the cached mask in place for the next block
        return x + self.proj(att @ x)


class CkptNet(nn.Module):
    def __init__(self, reentrant, refresh, d=16, T=8, n=2):
        super().__init__()
        self.register_buffer("mask_cache", torch.tril(torch.ones(T, T)), persistent=False)
        self.blocks = nn.ModuleList([CkptBlock(d, self.mask_cache, refresh) for _ in range(n)])
        self.head = nn.Linear(d, 1)
        self.reentrant = reentrant

    def forward(self, x):
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=self.reentrant)
        return self.head(x).mean()


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize("refresh", [False, True], ids=["clean", "mask-inplace"])
def test_checkpointing_both_forms(reentrant, refresh):
    torch.manual_seed(0)
    model = CkptNet(reentrant, refresh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8, 16, requires_grad=reentrant)  # reentrant needs an input that requires grad
    exc = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with watch(model, opt) as mon:
                for _ in range(6):
                    loss = model(x).pow(2)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
        except StepStopped as e:
            exc = e
    if not refresh:
        assert exc is None and codes(mon) == [] and mon.exit_code == 0
        return
    f = one_finding_same_as_exception(mon, exc)
    assert f.step == 1 and f.detail["phase"] == "backward (recompute)"
    assert f.detail["written"]["code"].startswith("keep.masked_fill_(~causal, 0.0)")
    assert f.detail["saved_by"]["code"] == "att = F.softmax(att, dim=-1) * keep"
    if reentrant:
        assert "modified by an inplace operation" in f.next_failure
    else:  # PyTorch itself says nothing here: the recompute checks no version counter
        assert "silently" in f.next_failure
    # the hooks are gone: PyTorch's own check works again
    a = torch.ones(3, requires_grad=True)
    b = a.exp()
    b.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()


# --------------------------------------------------------------------------- item 13: torch.compile
class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.ln = nn.LayerNorm(64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.gelu(self.ln(self.fc1(x))))


def train_compiled(bug=None, steps=12, monitor=True, out=None):
    """``model = torch.compile(model, backend="aot_eager")`` (the inductor backend needs
    a C++ build per graph: minutes on this 2-core machine; aot_eager runs the same
    Dynamo capture and AOTAutograd joint graph)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Small()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cmodel = torch.compile(model, backend="aot_eager")
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))
    mon = watch(cmodel, opt, every=4, out=out) if monitor else None
    losses, exc = [], None
    try:
        for step in range(1, steps + 1):
            if bug == "no-grad-forward" and step >= 5:
                with torch.no_grad():
                    out = cmodel(x)
            else:
                out = cmodel(x)
            loss = F.cross_entropy(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if bug == "head-replaced" and step == 6:
                model.fc2 = nn.Linear(64, 4)  # replaced after the optimizer was built
            losses.append(loss.item())
    except StepStopped as e:
        exc = e
    if mon is not None:
        mon.close()
    return mon, losses, exc, {k: dict(v) for k, v in counters.items()}


def test_a_compiled_model_clean_no_graph_break_no_recompile(tmp_path):
    from optcheck.record.snapshot import read_jsonl

    plain_mon, plain, _, plain_counters = train_compiled(monitor=False)
    mon, losses, exc, counters = train_compiled(out=str(tmp_path / "run"))
    assert exc is None and codes(mon) == [] and mon.exit_code == 0 and losses == pytest.approx(plain)
    assert counters.get("graph_break", {}) == {} and "recompiles" not in counters
    assert counters["stats"]["unique_graphs"] == plain_counters["stats"]["unique_graphs"] == 1
    snaps = list(read_jsonl(tmp_path / "run" / "snapshots.jsonl"))
    assert [p["name"] for p in snaps[-1]["params"]] == ["fc1.weight", "fc1.bias", "ln.weight", "ln.bias",
                                                       "fc2.weight", "fc2.bias"]
    summary = mon.summary()
    assert summary["not_checked"] and any("OC203" in s for s in summary["not_checked"])


def test_a_compiled_model_keeps_the_parameter_checks_and_the_full_cut():
    mon, _, exc, _ = train_compiled(bug="head-replaced")
    by = {f.code: f for f in mon.findings}
    assert by["OC102"].step == 7 and set(by["OC102"].subjects) == {"fc2.weight", "fc2.bias"}
    mon, _, exc, _ = train_compiled(bug="no-grad-forward")
    (f,) = mon.findings
    assert (f.code, f.step) == ("OC203", 5) and exc is not None
    assert "compiled forward" in f.message and "torch.compile" in f.message and "fc1.weight" in f.message
    assert str(exc).startswith("step 5: the loss has no grad_fn")


def test_an_eager_model_reports_nothing_unchecked():
    mon, exc = run_net(Net())
    assert exc is None and mon.summary()["not_checked"] == []


# --------------------------------------------------------------------------- issue 16: found at its step
@pytest.mark.parametrize("bug,code,stops", [("inplace-saved", "OC301", True), ("loss-no-grad", "OC203", True),
                                            ("detach-middle", "OC203", False)])
def test_a_hazard_between_two_snapshots_is_found_at_its_step(tmp_path, bug, code, stops):
    """Every probe runs on every step: a hazard planted on step 11 under ``every=100``
    (snapshots at 0 and 100 only) is found at step 11, not at the next snapshot."""
    from plain_loop import train

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _, mon = train(bug, steps=30, monitor_kwargs={"every": 100, "out": str(tmp_path / bug),
                                                          "on_finding": "ignore"})
            exc = None
        except StepStopped as e:
            exc = e
    assert (exc is not None) == stops
    from optcheck.record.snapshot import read_jsonl

    found = [(f["code"], f["step"]) for f in read_jsonl(tmp_path / bug / "findings.jsonl")]
    assert (code, 11) in found and all(step == 11 for c, step in found if c == code), found
