"""Token data for the soak: the default corpus, text files and nanoGPT ``.bin``
files, a held-out split, and the batch schedule both backends share. Torch-free.

The default corpus is real text every machine has: the Python standard
library's own top-level ``*.py`` sources, read at run time, as byte tokens
(vocabulary 256). Its SHA-256 goes into the run's summary, since it differs
between Python versions.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from optcheck.config import MAX_VOCAB
from optcheck.errors import InputError

DEFAULT_CORPUS_BYTES = 4 * 2**20
VAL_FRACTION = 0.1


@dataclass
class Corpus:
    """Tokens of a corpus, split into training and held-out parts.

    Attributes:
        train: token ids, shape (N_train,), dtype uint16.
        val: token ids, shape (N_val,), dtype uint16.
        vocab_size: number of distinct token ids the model must embed.
        source: where the tokens came from (path or "stdlib:<dir>").
        sha256: hash of all the tokens, for comparing runs.
    """

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    source: str
    sha256: str

    def describe(self) -> dict:
        return {"source": self.source, "sha256": self.sha256, "vocab_size": self.vocab_size,
                "train_tokens": int(self.train.size), "val_tokens": int(self.val.size)}


def stdlib_sources(limit_bytes: int = DEFAULT_CORPUS_BYTES) -> tuple[bytes, str]:
    """The standard library's top-level ``*.py`` files, sorted by name, concatenated.

    Returns (text bytes, up to ``limit_bytes``; the directory read).
    Raises InputError if the directory has no sources (a stripped Python).
    """
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    buf = io.BytesIO()
    for path in sorted(stdlib.glob("*.py")):
        try:
            buf.write(path.read_bytes())
        except OSError:
            continue
        if buf.tell() >= limit_bytes:
            break
    data = buf.getvalue()[:limit_bytes]
    if not data:
        raise InputError(f"no Python sources under {stdlib} for the default corpus; pass --data FILE")
    return data, str(stdlib)


class _MetaUnpickler(pickle.Unpickler):
    """nanoGPT's ``meta.pkl`` holds only dicts, strings and ints: allow nothing else."""

    def find_class(self, module, name):  # pragma: no cover - only hit by hostile files
        raise pickle.UnpicklingError(f"meta.pkl refers to {module}.{name}")


def _vocab_from_meta(path: Path) -> int | None:
    """``vocab_size`` of the ``meta.pkl`` beside ``path`` (None if there is none).

    Raises:
        InputError: unreadable, not a dict with an integer ``vocab_size``, or a
            size outside 1..65,536 (a ``.bin`` holds uint16 ids).
    """
    meta = path.parent / "meta.pkl"
    if not meta.exists():
        return None
    try:
        with open(meta, "rb") as f:
            d = _MetaUnpickler(f).load()
        vocab = d["vocab_size"]
    except Exception as e:
        raise InputError(f"{meta}: cannot read vocab_size ({type(e).__name__}: {e})") from None
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not 1 <= vocab <= MAX_VOCAB:
        raise InputError(f"{meta}: vocab_size {vocab!r} is not a whole number in 1..{MAX_VOCAB} "
                         f"(a .bin holds uint16 token ids)")
    return vocab


def load_corpus(path: str | os.PathLike | None = None, vocab_size: int | None = None,
                min_tokens: int = 1024) -> Corpus:
    """Load tokens from ``path`` (or the default corpus) and split off the last 10 %.

    ``*.bin`` is a nanoGPT token file: little-endian uint16 ids, vocabulary from
    ``vocab_size`` or a ``meta.pkl`` beside it. Anything else is read as bytes
    (vocabulary 256).

    Raises:
        InputError: missing, unreadable, empty, too short or corrupt data.
    """
    if path is None:
        raw, where = stdlib_sources()
        tokens = np.frombuffer(raw, dtype=np.uint8).astype(np.uint16)
        vocab, source = 256, f"stdlib:{where}"
    else:
        p = Path(path)
        if not p.exists():
            raise InputError(f"--data {path}: no such file")
        if p.is_dir():
            raise InputError(f"--data {path}: is a directory, expected a text file or a .bin token file")
        try:
            size = p.stat().st_size
        except OSError as e:
            raise InputError(f"--data {path}: {e.strerror}") from None
        if size == 0:
            raise InputError(f"--data {path}: the file is empty")
        source = str(p)
        if p.suffix == ".bin":
            if size % 2:
                raise InputError(f"--data {path}: corrupt .bin: {size} bytes is not a whole number of uint16 tokens")
            vocab = vocab_size or _vocab_from_meta(p)
            if vocab is None:
                raise InputError(f"--data {path}: a .bin token file needs --vocab-size N or a meta.pkl beside it")
            tokens = np.fromfile(p, dtype="<u2")
            if not 1 <= vocab <= MAX_VOCAB:
                raise InputError(f"--vocab-size {vocab}: must be in 1..{MAX_VOCAB} (a .bin holds uint16 token ids)")
            top = int(tokens.max())
            if top >= vocab:
                given = "--vocab-size" if vocab_size else f"vocab_size in {p.parent / 'meta.pkl'}"
                raise InputError(f"--data {path}: the vocabulary is too small: the file holds token id {top}, "
                                 f"{given} is {vocab}; give at least --vocab-size {top + 1}")
        else:
            try:
                raw = p.read_bytes()
            except OSError as e:
                raise InputError(f"--data {path}: {e.strerror}") from None
            tokens = np.frombuffer(raw, dtype=np.uint8).astype(np.uint16)
            vocab = 256
    if tokens.size < min_tokens:
        raise InputError(f"--data {source}: {tokens.size} tokens, need at least {min_tokens}")
    n_val = max(int(tokens.size * VAL_FRACTION), min_tokens // 4)
    digest = hashlib.sha256(tokens.tobytes()).hexdigest()
    return Corpus(tokens[:-n_val], tokens[-n_val:], vocab, source, digest)


class BatchSchedule:
    """Deterministic batch offsets: the same ``(seed, step)`` gives the same batch on
    every backend, in every process, after a resume.

    Args:
        n_tokens: length of the token array batches are cut from.
        block_size: tokens per sequence (T).
        batch_size: sequences per batch (B).
        seed: run seed; ``split`` keeps training and held-out draws apart.

    Raises:
        InputError: the tokens are shorter than one sequence.
    """

    def __init__(self, n_tokens: int, block_size: int, batch_size: int, seed: int, split: int = 0):
        if n_tokens <= block_size + 1:
            raise InputError(f"the data has {n_tokens} tokens, fewer than one sequence of {block_size + 1}")
        self.high = n_tokens - block_size - 1
        self.block_size, self.batch_size, self.seed, self.split = block_size, batch_size, seed, split

    def offsets(self, step: int) -> np.ndarray:
        """Start offsets of the batch for ``step``: shape (B,), int64."""
        rng = np.random.default_rng([self.seed, self.split, step])
        return rng.integers(0, self.high + 1, size=self.batch_size, dtype=np.int64)

    def batch(self, tokens: np.ndarray, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets for ``step``: two int64 arrays of shape (B, T)."""
        idx = self.offsets(step)[:, None] + np.arange(self.block_size + 1)[None, :]
        chunk = tokens[idx].astype(np.int64)
        return np.ascontiguousarray(chunk[:, :-1]), np.ascontiguousarray(chunk[:, 1:])

    def fill(self, tokens: np.ndarray, first: int, xs: np.ndarray, ys: np.ndarray) -> None:
        """The batches of steps ``first``, ``first + 1``, ... written into ``xs`` and ``ys`` ((count, B, T)
        int64): ``xs[i], ys[i]`` are :meth:`batch` of step ``first + i``, cut from the tokens in one go."""
        offs = np.stack([self.offsets(first + i) for i in range(xs.shape[0])])
        chunk = tokens[offs[:, :, None] + np.arange(self.block_size + 1)]
        xs[...] = chunk[:, :, :-1]
        ys[...] = chunk[:, :, 1:]


def val_batches(corpus: Corpus, block_size: int, batch_size: int, seed: int, n: int) -> list:
    """The ``n`` held-out batches every validation pass uses: [(x, y)], each (B, T) int64."""
    sched = BatchSchedule(corpus.val.size, block_size, batch_size, seed, split=1)
    return [sched.batch(corpus.val, i) for i in range(n)]
