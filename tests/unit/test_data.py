"""Corpus loading, .bin token files, the shared batch schedule."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from optcheck.data import BatchSchedule, load_corpus, stdlib_sources
from optcheck.errors import InputError


def test_default_corpus_is_the_stdlib_sources():
    data, where = stdlib_sources(limit_bytes=1 << 16)
    assert b"def " in data and b"import " in data and where
    c = load_corpus()
    assert c.vocab_size == 256 and c.train.size > 1_000_000 and c.val.size > 100_000
    assert c.source.startswith("stdlib:") and len(c.sha256) == 64


def test_text_file_is_bytes(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("hello world " * 500)
    c = load_corpus(p)
    assert c.vocab_size == 256
    assert bytes(np.concatenate([c.train, c.val]).astype(np.uint8)) == p.read_bytes()


def test_bin_with_meta_pkl(tmp_path):
    ids = (np.arange(5000) % 97).astype("<u2")
    ids.tofile(tmp_path / "train.bin")
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 97, "itos": {0: "a"}}, f)
    c = load_corpus(tmp_path / "train.bin")
    assert c.vocab_size == 97 and c.train.dtype == np.uint16


@pytest.mark.parametrize("setup,needle", [
    (lambda d: None, "no such file"),
    (lambda d: (d / "x.txt").write_bytes(b""), "empty"),
    (lambda d: (d / "x.bin").write_bytes(b"abc"), "not a whole number"),
    (lambda d: np.full(4000, 300, "<u2").tofile(d / "x.bin"), "needs --vocab-size"),
])
def test_bad_data_is_one_clear_error(tmp_path, setup, needle):
    setup(tmp_path)
    target = next(iter(tmp_path.iterdir()), tmp_path / "missing.txt")
    with pytest.raises(InputError, match=needle):
        load_corpus(target)


def test_bin_token_beyond_vocab_says_the_vocabulary_is_too_small(tmp_path):
    tokens = np.full(4000, 3, "<u2")
    tokens[100] = 85
    tokens.tofile(tmp_path / "x.bin")
    with pytest.raises(InputError, match="vocabulary is too small.*token id 85.*--vocab-size is 50.*at least "
                                         "--vocab-size 86") as e:
        load_corpus(tmp_path / "x.bin", vocab_size=50)
    assert "corrupt" not in str(e.value)
    assert load_corpus(tmp_path / "x.bin", vocab_size=86).vocab_size == 86  # silent when it fits


@pytest.mark.parametrize("vocab", [10**12, 0, -5, "97", 2.5])
def test_meta_pkl_vocab_size_out_of_range_is_input_error(tmp_path, vocab):
    np.full(4000, 3, "<u2").tofile(tmp_path / "x.bin")
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": vocab}, f)
    with pytest.raises(InputError, match=r"meta.pkl: vocab_size .* is not a whole number in 1\.\.65536"):
        load_corpus(tmp_path / "x.bin")


def test_schedule_is_deterministic_per_seed_and_step():
    tokens = np.arange(10_000, dtype=np.uint16)
    a = BatchSchedule(tokens.size, 16, 4, seed=7)
    b = BatchSchedule(tokens.size, 16, 4, seed=7)
    assert np.array_equal(a.offsets(123), b.offsets(123))
    assert not np.array_equal(a.offsets(123), a.offsets(124))
    assert not np.array_equal(a.offsets(1), BatchSchedule(tokens.size, 16, 4, seed=8).offsets(1))
    x, y = a.batch(tokens, 5)
    assert x.shape == (4, 16) and y.shape == (4, 16) and x.dtype == np.int64
    assert np.array_equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    assert a.offsets(5).max() + 17 <= tokens.size
