"""Seeds 000 and 001 on real third-party model code (issue 33, item 4): a Hugging Face
``transformers`` Llama decoder (built from a tiny config, no weights), trained by a plain
loop under ``optcheck.Monitor``. Each bug sits where users' bugs live — the library's own
``StaticCache`` written in place by a training forward with ``use_cache=True``, a 4-D mask
advanced in place in the user's loop, a user's attention function (registered with
``AttentionInterface``) refreshing a cached mask in place under the library's gradient
checkpointing — and OC301 names the exact op and line. Each loop is also run without
optcheck: what PyTorch says there (or that it says nothing) is asserted too."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers", reason="transformers not installed (pip extra 'integrations')")

import writer_loops  # noqa: E402
from writer_loops import stopped, train  # noqa: E402

V, T = 64, 8


@pytest.fixture(autouse=True)
def _quiet():
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def line_of(text: str) -> str:
    return writer_loops.line_of(__file__, text)


def library_line(fn, text: str) -> str:
    """``file:line`` of the line of library function ``fn`` holding ``text`` (read from the installed source)."""
    src, first = inspect.getsourcelines(fn)
    (n,) = [first + i for i, s in enumerate(src) if text in s]
    return f"{os.path.basename(inspect.getsourcefile(fn))}:{n}"


def llama(attn="sdpa", kv_heads=2):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                                   attn_implementation=attn)
    model = transformers.LlamaForCausalLM(cfg)
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


IDS = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- seed 000: the library's KV cache
def static_cache_two_forwards(model, step):
    """A prefix forward and a continuation forward share one StaticCache before one backward
    (a ``use_cache=True`` training forward: the library writes its cache with index_copy_)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=4 * T)
    first = model(IDS, past_key_values=cache, use_cache=True)
    second = model(IDS, past_key_values=cache, use_cache=True)
    return first.logits.logsumexp(-1).mean() + second.logits.logsumexp(-1).mean()


def test_a_static_cache_written_by_the_next_training_forward_is_named_in_the_library():
    _, plain = train(*llama(), static_cache_two_forwards, monitor=False)
    assert "modified by an inplace operation" in str(plain) and "expected version 1" in str(plain)
    mon, exc = train(*llama(), static_cache_two_forwards)
    f, d = stopped(mon, exc)
    w = d["written"]
    assert f.step == 1 and w["op"] == "index_copy_" and w["module"] == "model.layers.0.self_attn"
    assert w["where"] == library_line(transformers.cache_utils.StaticLayer.update,
                                      "self.keys.index_copy_(2, cache_position, key_states)")
    assert w["code"] == "self.keys.index_copy_(2, cache_position, key_states)" and w["phase"] == "forward"
    assert d["saved_by"]["op"].startswith("ScaledDotProduct") and d["saved_by"]["module"] == "model.layers.0.self_attn"
    assert d["saved_by"]["where"].startswith("sdpa_attention.py:") and w["where"] != d["saved_by"]["where"]
    assert any(s.startswith("modeling_llama.py:") for s in w["stack"])  # the library's call chain


# ----------------------------------------------------------------------------- seed 000/001: the user's loop
def mask_advanced_in_place(model, step):
    """A 4-D float mask (sequence packing) passed to the model, then advanced in place for the
    next batch before backward(): sdpa saved it."""
    mask = torch.zeros(2, 1, T, T).masked_fill_(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = model(IDS, labels=IDS, attention_mask=mask)
    mask[:, :, :, 0] = 0.0  # WRITE: the loop advances the mask in place
    return out.loss


def test_a_mask_advanced_in_place_in_the_loop_is_named_at_the_loops_line():
    _, plain = train(*llama(), mask_advanced_in_place, monitor=False)
    assert "[torch.FloatTensor [2, 1, 8, 8]] is at version 2; expected version 1" in str(plain)
    mon, exc = train(*llama(), mask_advanced_in_place)
    f, d = stopped(mon, exc)
    w = d["written"]
    assert f.step == 1 and d["tensor"]["shape"] == [2, 1, T, T] and (d["saved_version"], d["version"]) == (1, 2)
    assert (w["op"], w["where"]) == ("x[...] = ... (__setitem__)", line_of("WRITE: the loop advances the mask"))
    assert w["module"] is None and "the training loop" in f.message
    assert d["saved_by"]["op"].startswith("ScaledDotProduct") and d["saved_by"]["module"] == "model.layers.0.self_attn"


# ----------------------------------------------------------------------------- seed 001: gradient checkpointing
def cached_mask_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A user's attention function: scores times a keep-mask cached on the module, which it
    refreshes in place after use (seed 001's cached mask)."""
    n = query.shape[-2]
    keep = module.__dict__.setdefault("keep_cache", torch.ones(64, 64))[:n, :n]
    w = torch.softmax(query @ key.transpose(2, 3) * scaling, dim=-1) * keep  # SAVE: the cached keep-mask
    keep.copy_(torch.ones(n, n).tril())  # WRITE: the attention refreshes its mask cache
    return (w @ value).transpose(1, 2).contiguous(), w


def cached_mask_llama(checkpointing):
    transformers.AttentionInterface.register("cached_mask", cached_mask_attention)
    model, opt = llama(attn="cached_mask", kv_heads=4)
    if checkpointing:  # the library's activation checkpointing of each decoder layer
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, opt


def plain_loss(model, step):
    return model(IDS, labels=IDS).loss


def test_a_cached_mask_written_in_the_checkpoint_recompute_is_named_as_such():
    _, plain = train(*cached_mask_llama(False), plain_loss, monitor=False)
    assert "modified by an inplace operation" in str(plain)  # without checkpointing PyTorch raises ...
    _, plain = train(*cached_mask_llama(True), plain_loss, monitor=False)
    assert plain is None  # ... with it, the recompute checks no version: training goes on, silently
    mon, exc = train(*cached_mask_llama(True), plain_loss)
    f, d = stopped(mon, exc)
    w = d["written"]
    assert f.step == 1 and (w["op"], w["where"]) == ("copy_", line_of("WRITE: the attention refreshes"))
    assert w["phase"] == "backward (recompute)" and d["checkpoint"] == "non-reentrant"
    assert d["saved_by"]["where"] == line_of("SAVE: the cached keep-mask")
    assert w["module"].startswith("model.layers.") and w["module"].endswith(".self_attn")
    assert "non-reentrant checkpoint's recompute" in f.message and "silently" in f.next_failure
