"""The parameter pass of the PyTorch probe: value checksum and gradient norms in one read."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from optcheck.pytorch import probe  # noqa: E402


def _records(model):
    return {r["name"]: r for r in probe.params(model)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_checksum_moves_with_one_ulp_and_only_then(dtype):
    torch.manual_seed(0)
    model = torch.nn.Linear(7, 3).to(dtype)  # 21 weights: an odd count of 16-bit values
    before = _records(model)
    assert _records(model)["weight"]["checksum"] == before["weight"]["checksum"]  # deterministic
    w = model.weight.data.view(-1)  # .data: its own version counter, the weight's does not move
    w[5] = torch.nextafter(w[5], torch.tensor(float("inf"), dtype=dtype))  # one element, one ulp
    after = _records(model)
    assert after["weight"]["version"] == before["weight"]["version"]
    assert None is not after["weight"]["checksum"] != before["weight"]["checksum"] is not None
    assert after["bias"]["checksum"] == before["bias"]["checksum"] is not None


def test_checksum_left_to_the_version_counter_where_it_moved():
    """One read of the values, not two: where the version counter moved since the
    tensor's last snapshot, it already says the tensor was written."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = _records(model)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()  # for-loop SGD: add_ in place, the version counter moves
    stepped = _records(model)
    assert first["weight"]["checksum"] is not None and stepped["weight"]["checksum"] is None
    assert stepped["weight"]["version"] > first["weight"]["version"]
    still = _records(model)  # nothing ran since: the values are read again
    assert still["weight"]["checksum"] is not None and still["weight"]["version"] == stepped["weight"]["version"]


def test_fused_step_count_spares_the_checksum_and_only_it():
    """A fused AdamW step leaves the version counter alone but advances state["step"]:
    that signal already says the parameter was stepped, so the values are read once."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)

    def body():
        b = probe.snapshot_body(model, opt, census=False)
        steps = {s["ref"]: s["step"] for s in b["state"]}
        return {p["name"]: (p["version"], steps.get(p["ref"]), p["checksum"]) for p in b["params"]}

    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    before = body()
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    after = body()
    (v0, s0, c0), (v1, s1, c1) = before["weight"], after["weight"]
    assert v1 == v0 and s1 == s0 + 1 and c1 is None  # the step count tells
    v2, s2, c2 = body()["weight"]  # nothing ran since: no signal moved, the values are read
    assert (v2, s2) == (v1, s1) and c2 is not None


def test_fingerprint_changes_on_every_kind_of_rebinding():
    lin = torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(lin, torch.nn.ReLU(), torch.nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fp = probe.fingerprint(model, opt)
    assert probe.fingerprint(model, opt) == fp
    model(torch.randn(2, 4)).sum().backward()
    opt.step()  # an in-place update is no rebinding
    assert probe.fingerprint(model, opt) == fp

    def changed(change) -> bool:
        nonlocal fp
        change()
        new = probe.fingerprint(model, opt)
        moved, fp = new != fp, new
        return moved

    assert changed(lambda: setattr(lin, "weight", torch.nn.Parameter(lin.weight.detach().clone())))  # replaced
    assert changed(lambda: setattr(lin.weight, "data", lin.weight.detach().clone()))  # new data, same object
    assert changed(lambda: setattr(model[2], "weight", lin.weight))  # tied
    assert changed(lambda: lin._parameters.__setitem__("bias", torch.nn.Parameter(torch.zeros(4))))  # no hook
    assert changed(lambda: model.append(torch.nn.Linear(4, 4)))  # added
    assert changed(lambda: model.__delitem__(3))  # removed again
    assert changed(lambda: opt.param_groups[0]["params"].append(torch.nn.Parameter(torch.ones(2))))  # outside
    outside = opt.param_groups[0]["params"][-1]
    assert changed(lambda: setattr(outside, "data", torch.zeros(2)))  # the outside member's data
    assert not changed(lambda: None)


def test_fingerprint_walks_the_model_again_only_for_a_registration_into_it():
    """A registration into a module outside every watched model (a slice of the model's
    ModuleList each forward, as HF Llama-family models make; a module being built) leaves the
    cached layout as it is; one into the model (a new parameter, a new child) does not."""
    model = torch.nn.Sequential(torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fp = probe.fingerprint(model, opt)
    layout = probe._LAYOUTS[id(model)]
    gen = probe._Layout.generation
    model[0][:2]  # a new ModuleList holding two of the model's layers
    torch.nn.Sequential(torch.nn.Linear(4, 4), *model[0])  # a temporary container and a module being built
    assert probe._Layout.generation == gen and probe.fingerprint(model, opt) == fp
    assert probe._LAYOUTS[id(model)] is layout
    model[0][1].register_parameter("extra", torch.nn.Parameter(torch.zeros(1)))  # into the model
    assert probe._Layout.generation > gen and probe.fingerprint(model, opt) != fp
    fp = probe.fingerprint(model, opt)
    model[0].append(torch.nn.Linear(4, 4))
    assert probe.fingerprint(model, opt) != fp


def test_checksum_sees_what_the_version_counter_misses():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    before = _records(model)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    after = _records(model)
    assert after["weight"]["version"] == before["weight"]["version"]  # fused: no bump (docs/parameter-identity.md)
    assert after["weight"]["checksum"] != before["weight"]["checksum"]


def test_grad_norms_dense_sparse_mixed_dtypes_and_tied():
    emb = torch.nn.Embedding(10, 4, sparse=True).double()
    lin = torch.nn.Linear(4, 4).to(torch.bfloat16)
    model = torch.nn.ModuleDict({"emb": emb, "lin": lin})
    model.tied = emb  # the same module under a second name
    emb.weight.grad = torch.sparse_coo_tensor([[1, 3]], torch.full((2, 4), 0.5, dtype=torch.float64), (10, 4))
    lin.weight.grad = torch.full((4, 4), 0.25, dtype=torch.bfloat16)
    recs = probe.params(model)
    by = {r["name"]: r for r in recs}
    assert by["emb.weight"]["grad_norm"] == pytest.approx(2 ** 0.5) and by["emb.weight"]["grad"] == "set"
    assert by["lin.weight"]["value_norm"] == pytest.approx(float(lin.weight.float().norm()), rel=1e-6)
    assert by["tied.weight"]["value_norm"] == by["emb.weight"]["value_norm"]  # one tensor, read once
    assert by["lin.weight"]["grad_norm"] == pytest.approx(1.0)
    assert by["lin.bias"]["grad_norm"] is None and by["lin.bias"]["grad"] == "none"
    assert by["tied.weight"]["ref"] == by["emb.weight"]["ref"]
    assert by["tied.weight"]["checksum"] == by["emb.weight"]["checksum"] is not None


def test_snapshot_body_says_identity_is_by_ref():
    model = torch.nn.Linear(2, 2)
    body = probe.snapshot_body(model, torch.optim.SGD(model.parameters(), lr=0.1), census=False)
    assert body["optimizer"]["identity"] == "ref"


def test_a_new_module_at_a_gone_models_address_walks_nothing_again():
    """A module made where a watched model's module was freed (CPython reuses addresses) is
    outside every layout: a registration into it leaves the cached layouts as they are (the
    CI run at dfc4c6b failed the test above on such a reused address)."""
    gone = torch.nn.Sequential(torch.nn.Linear(4, 4), *(torch.nn.Identity() for _ in range(200)))
    probe.fingerprint(gone, torch.optim.SGD(gone.parameters(), lr=0.1))
    ids = {id(m) for m in gone.modules()}
    del gone
    gc.collect()
    made, reused = [], None
    for _ in range(10_000):  # (kept alive, so each takes a new address until a freed one comes up)
        made.append(torch.nn.Identity())
        if id(made[-1]) in ids:
            reused = made[-1]
            break
    assert reused is not None, "no module was made at a freed module's address"
    gen = probe._Layout.generation
    reused.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))
    reused.add_module("child", torch.nn.Identity())
    assert probe._Layout.generation == gen
