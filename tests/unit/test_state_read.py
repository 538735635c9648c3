"""Reading optimizer state never raises (``optcheck/pytorch/state_read.py``, issue 25):
nested dicts and lists, non-tensor keys and values, tensor subclasses that implement
only some ops. A property test over random state shapes, plus the real cases:
a quantized stand-in subclass under the Monitor, duck-typed optimizers and
wrappers (``optcheck/pytorch/unwrap.py``), ``nn.LazyLinear`` before its first forward."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import optcheck  # noqa: E402
from optcheck.pytorch import probe, state_read  # noqa: E402
from optcheck.drivers.monitor import FindingError  # noqa: E402
from optcheck.record.snapshot import validate  # noqa: E402


class Quantized(torch.Tensor):
    """A stand-in for torchao's OptimState8bit: a wrapper subclass holding uint8 codes
    and a scale, implementing only ``detach``/``clone``/``copy_`` and raising
    NotImplementedError on every other op (``_foreach_norm``, ``isfinite``...)."""

    @staticmethod
    def __new__(cls, codes, scale, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32, device=codes.device)

    def __init__(self, codes, scale, shape):
        self.codes, self.scale = codes, scale

    def __tensor_flatten__(self):
        return ["codes", "scale"], list(self.shape)

    def dequantize(self):
        return (self.codes.float() * self.scale).reshape(self.shape)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.detach.default:
            return args[0]
        raise NotImplementedError(f"Quantized dispatch: attempting to run unimplemented operator/function: {func}")


class Opaque(Quantized):
    """The same without ``dequantize()``: only shape, dtype and identity can be read."""

    dequantize = torch.Tensor.dequantize


def quantized(shape, cls=Quantized):
    n = 1
    for d in shape:
        n *= d
    return cls(torch.randint(0, 255, (n,), dtype=torch.uint8), torch.tensor(0.01), torch.Size(shape))


SHAPES = st.sampled_from([(), (1,), (4,), (4, 1), (1, 4), (4, 4), (2, 3, 4)])


def leaves():
    return st.one_of(
        SHAPES.map(lambda s: torch.randn(s)),  # scalar, vector, factored, matrix
        SHAPES.map(lambda s: torch.zeros(s, dtype=torch.uint8)),  # an 8-bit state
        SHAPES.filter(lambda s: s != ()).map(quantized),
        SHAPES.filter(lambda s: s != ()).map(lambda s: quantized(s, Opaque)),
        st.integers(), st.floats(allow_nan=True), st.none(), st.text(max_size=3), st.just({1, 2}),
        st.just(object()), st.just(lambda: 0),
    )


def trees():
    return st.recursive(leaves(), lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers(0, 3)), inner, max_size=4)), max_leaves=12)


class Bag(torch.optim.Optimizer):
    """An optimizer whose state is whatever the test puts there."""

    def __init__(self, params, state):
        super().__init__(params, {"lr": 0.1})
        self.state.update(state)

    def step(self, closure=None):
        return None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(per_param=st.lists(trees(), min_size=1, max_size=3), extra_keys=st.dictionaries(
    st.one_of(st.text(max_size=5), st.integers()), leaves(), max_size=2))
def test_a_snapshot_never_raises_whatever_the_state_holds(per_param, extra_keys):
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in per_param])
    params = [m.weight for m in model]
    state = dict(zip(params, per_param))
    state.update(extra_keys)  # SPAM/MADGRAD-style counters under keys that are not parameters
    opt = Bag(model.parameters(), state)
    body = probe.snapshot_body(model, opt, census=False, norms=probe.Norms())
    snap = validate({"schema": "optcheck.snapshot/1", "backend": "pytorch", "run": "r", "step": 1,
                     "phase": "post-step", "trigger": "cadence", **body, "events": []})
    refs = {id(p) for p in params}
    assert {s["ref"] for s in snap["state"]} <= refs  # keys that are not parameters are no state records
    read = state_read.read(opt)
    for ps in read.params:
        for t in ps.tensors:
            assert t.values is None or state_read.plain(t.values)  # only plain tensors are ever read
    # a second snapshot repeats no note
    assert probe.snapshot_body(model, opt, census=False)["notes"] == []


def test_nested_and_quantized_state_is_read_and_unreadable_values_noted_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False))
    w = model[0].weight
    opt = Bag(model.parameters(), {
        w: {0: {"exp_avg": torch.zeros(4, 4), "step": torch.tensor(3.0)}, "Q": [torch.eye(4), torch.eye(4)],
            "q8": quantized((4, 4)), "opaque": quantized((4, 4), Opaque), "flags": {"a", "b"}},
        "total_step": 7})
    body = probe.snapshot_body(model, opt, census=False, norms=probe.Norms())
    (rec,) = body["state"]
    assert rec["step"] == 3 and set(rec["tensors"]) == {"0.exp_avg", "0.step", "Q.0", "Q.1", "q8", "opaque"}
    assert rec["tensors"]["q8"] == {"shape": [4, 4], "dtype": "float32"}
    notes = body["notes"]
    assert len(notes) == 2 and any("'opaque'" in n and "dequantize" in n for n in notes) \
        and any("total_step" in n and "not a parameter" in n for n in notes), notes
    assert all(n.startswith("Bag state ") and "not read" in n for n in notes)
    # the 8-bit state's bytes are those it holds (16 uint8 codes + a float32 scale), not 16 float32
    assert body["memory"]["state_bytes"] == 4 * 16 + 4 + 2 * 4 * 16 + 2 * (16 + 4)
    # the dequantized values are what the NaN/Inf check reads
    paths = {k for _, k, _ in probe.state_tensors(opt, [w])}
    assert paths == {"0.exp_avg", "0.step", "Q.0", "Q.1", "q8"}


class NaNState(torch.optim.Optimizer):
    """SGD keeping a quantized momentum whose codes the test can poison."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.05})

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "m" not in st:
                    st["m"] = quantized(tuple(p.shape))
                    st["nested"] = {"count": 0, "hist": [torch.zeros(1)]}
                st["nested"]["count"] += 1
                p.add_(p.grad, alpha=-g["lr"])


def test_monitor_on_a_quantized_state_optimizer_runs_and_stays_silent():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = NaNState(model.parameters())
    x, y = torch.randn(32, 8), torch.randn(32, 2)
    with optcheck.Monitor(model, opt, every=5, on_finding="ignore") as mon:
        for _ in range(20):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    assert [f.code for f in mon.findings] == [] and mon.exit_code == 0
    assert not [n for n in mon.notes if "internal error" in n], list(mon.notes)
    # the quantized state's NaN is still found through dequantize()
    for st_ in opt.state.values():
        st_["m"].scale = torch.tensor(float("nan"))
    with optcheck.Monitor(model, opt, every=5, on_finding="ignore") as mon:
        for _ in range(5):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    assert "OC501" in {f.code for f in mon.findings}


def test_an_internal_error_is_a_note_not_an_exception(monkeypatch):
    monkeypatch.delenv("OPTCHECK_RAISE_INTERNAL", raising=False)  # as users run it (tests/conftest.py sets it)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with optcheck.Monitor(model, opt, every=2, on_finding="ignore") as mon:
        def boom(*a, **k):
            raise ZeroDivisionError("planted")

        monkeypatch.setattr(probe, "snapshot_body", boom)
        for _ in range(6):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()  # would raise ZeroDivisionError out of the user's step without the guard
        monkeypatch.undo()
    assert mon.step_count == 6
    notes = [n for n in mon.summary()["not_checked"] if "internal error" in n]
    assert len(notes) == 1 and "ZeroDivisionError: planted" in notes[0]


def test_on_finding_raise_still_raises():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = optcheck.Monitor(model, opt, every=1, on_finding="raise")
    try:
        with pytest.raises(FindingError):
            for i in range(4):
                if i == 2:
                    model[1] = torch.nn.Linear(4, 2)
                opt.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                opt.step()
    finally:
        mon.close()


# -- what the Monitor accepts as an optimizer ---------------------------------------------------


class Duck:
    """An optimizer that is no torch.optim.Optimizer: param_groups, state, step."""

    def __init__(self, params, lr=0.05):
        self.param_groups = [{"params": list(params), "lr": lr}]
        self.state = {}

    def zero_grad(self):
        for p in self.param_groups[0]["params"]:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p in self.param_groups[0]["params"]:
            if p.grad is not None:
                buf = self.state.setdefault(p, {"momentum": torch.zeros_like(p)})["momentum"]
                buf.mul_(0.9).add_(p.grad)
                p.add_(buf, alpha=-self.param_groups[0]["lr"])


class Holder:
    """A wrapper keeping its optimizer under ``attr`` and forwarding step()."""

    def __init__(self, attr, inner):
        setattr(self, attr, inner)
        self._inner = inner

    def zero_grad(self):
        self._inner.zero_grad()

    def step(self):
        self._inner.step()


def _train(model, opt, steps=12, swap_at=None):
    x, y = torch.randn(32, 8), torch.randn(32, 2)
    with optcheck.Monitor(model, opt, every=3, on_finding="ignore") as mon:
        for i in range(steps):
            if swap_at is not None and i + 1 == swap_at:
                model[2] = torch.nn.Linear(16, 2)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    return mon


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


@pytest.mark.parametrize("attr", ["optimizer", "base_optimizer", "base", "wrapped_optimizer", "optim", None])
def test_wrappers_and_duck_typed_optimizers_are_watched(attr):
    model = _mlp()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2) if attr else Duck(model.parameters())
    opt = Holder(attr, inner) if attr else inner
    mon = _train(model, opt)
    assert mon.step_count == 12 and mon.findings == [] and mon.snapshots >= 4
    assert "step" not in vars(inner) or attr  # a duck-typed optimizer's step is its own again after close()
    model = _mlp()
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2) if attr else Duck(model.parameters())
    mon = _train(model, Holder(attr, inner) if attr else inner, swap_at=6)
    assert {"OC101", "OC102", "OC104"} <= {f.code for f in mon.findings if f.step == 6}


@pytest.mark.parametrize("bad", [object(), 3, torch.nn.Linear(2, 2), type("NoStep", (), {"param_groups": [],
                                                                                         "state": {}})()])
def test_anything_else_is_refused_in_one_line(bad):
    with pytest.raises(TypeError) as e:
        optcheck.Monitor(torch.nn.Linear(2, 2), bad)
    msg = str(e.value)
    assert "\n" not in msg and ".base_optimizer" in msg and "param_groups, state, step" in msg


def test_lazy_linear_before_its_first_forward():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.LazyLinear(16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before the first forward: valid PyTorch
    mon = _train(model, opt, steps=15)
    assert mon.findings == [] and mon.exit_code == 0 and not list(mon.notes)
    assert len(mon.grad_clear._params) == 4  # the lazy weight and bias were adopted once materialised
    model = torch.nn.Sequential(torch.nn.LazyLinear(16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    mon = _train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), steps=10, swap_at=7)
    assert {"OC101", "OC102", "OC104"} <= {f.code for f in mon.findings if f.step == 7}


def test_a_step_calling_super_step_counts_once():
    # MuonClip.step calls Muon.step: torch runs the step hooks in both (nested)
    class Inner(torch.optim.SGD):
        pass

    class Outer(Inner):
        def step(self, closure=None):
            return super().step(closure)

    model = _mlp()
    Inner(model.parameters(), lr=0.1)  # torch patches Inner.step (with its hooks) at its first instance
    mon = _train(model, Outer(model.parameters(), lr=0.05, momentum=0.9))
    assert mon.step_count == 12 and mon.findings == []


def test_a_state_tensor_on_another_device_is_recorded_and_not_read():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False))
    w = model[0].weight
    opt = Bag(model.parameters(), {w: {"exp_avg": torch.empty(4, 4, device="meta"), "v": torch.zeros(4, 4)}})
    body = probe.snapshot_body(model, opt, census=False, norms=probe.Norms())
    assert body["state"][0]["tensors"]["exp_avg"] == {"shape": [4, 4], "dtype": "float32", "device": "meta"}
    assert "device" not in body["state"][0]["tensors"]["v"]
    assert any("meta device" in n for n in body["notes"])


def test_lbfgs_history_past_the_cap_is_one_note_and_the_run_stays_clean(tmp_path):
    """LBFGS keeps its history in lists (``old_dirs``, ``old_stps``, ``ro``, ``al``: up to
    ``history_size`` tensors each): past :data:`state_read.MAX_TENSORS` the rest is not
    read, said in one note, not one per list index (there were hundreds)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    x, y = torch.randn(16, 8), torch.randn(16, 1)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    with optcheck.Monitor(model, opt, every=5, out=str(tmp_path / "run"), on_finding="raise") as mon:
        for _ in range(30):
            opt.step(closure)
    view = state_read.read(opt)
    assert sum(len(ps.tensors) for ps in view.params) == state_read.MAX_TENSORS  # the cap was reached
    s = mon.summary()
    capped = [n for n in s["not_checked"] if f"past the first {state_read.MAX_TENSORS} tensors" in n]
    assert s["status"] == "clean" and len(capped) == 1 and len(s["not_checked"]) <= 3, s["not_checked"]


def test_optcheck_raise_internal_makes_an_internal_error_fail_the_test(monkeypatch):
    """What tests/conftest.py sets for the whole suite: optcheck's own bug raises."""
    monkeypatch.setenv("OPTCHECK_RAISE_INTERNAL", "1")
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = optcheck.Monitor(model, opt, every=1, on_finding="ignore")
    try:
        monkeypatch.setattr(probe, "snapshot_body", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            for _ in range(2):
                opt.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                opt.step()
    finally:
        monkeypatch.undo()
        mon.close()
