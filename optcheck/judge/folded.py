"""``compare`` and ``--baseline`` of a run folded from several streams. Torch-free.

A folded run (``optcheck soak --nproc``, a distributed Monitor, ``optcheck run`` of a GAN,
of torchrun or of several processes) has no ``metrics.jsonl`` at its top: each stream is
a ``rank-K`` folder (:func:`optcheck.report.reader.rank_dirs`, the reader ``optcheck
check`` uses) with its own losses, findings and summary. Two such runs are judged stream by
stream: ``rank-K`` of one against ``rank-K`` of the other, with the one-run judges
(``optcheck.judge.compare.compare_runs`` here; ``optcheck.judge.baseline.compare_with_baseline``
over :func:`paired_streams` there),
and the worst exit code counts. Streams are only comparable by position: a GAN's
discriminator and generator, or rank 0 and rank 1, train different things; so a folded run
is never compared with a one-stream run, nor with a run of another number of streams.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from optcheck.errors import InputError
from optcheck.report.reader import rank_dirs


def _streams_text(n: int) -> str:
    return f"folded from {n} streams (rank-0 .. rank-{n - 1})" if n else "one stream"


def paired_streams(a: str | os.PathLike, b: str | os.PathLike, who_a: str = "run A",
                   who_b: str = "run B") -> list[tuple[int, Path, Path]]:
    """``(K, a/rank-K, b/rank-K)`` for each stream of two folded runs; [] when neither is folded.

    Raises:
        InputError: one run is folded and the other not, or their streams differ in number or
            rank ("run A gan1: folded from 2 streams (rank-0 .. rank-1), run B x: one stream:
            streams are compared rank by rank, so both need the same ones").
    """
    ra, rb = rank_dirs(a), rank_dirs(b)
    if not ra and not rb:
        return []
    if [k for k, _ in ra] != [k for k, _ in rb]:
        raise InputError(f"{who_a} {a}: {_streams_text(len(ra))}, {who_b} {b}: {_streams_text(len(rb))}: a folded "
                         f"run is compared rank by rank (rank-K with rank-K), so both need the same streams")
    return [(k, da, db) for (k, da), (_, db) in zip(ra, rb)]


def compare_folded(pairs: list[tuple[int, Path, Path]], *, as_json: bool = False, **options) -> tuple[str, int]:
    """``optcheck compare`` of two folded runs (``pairs`` from :func:`paired_streams`): each
    stream's comparison (``compare_runs(**options)``) under a ``== rank K ==`` heading (JSON: a
    list of ``{"rank": K, ...}``), and the worst exit code (0 agree, 1 OC601 or new findings).

    Raises:
        InputError: as ``compare_runs`` for a stream, its message prefixed with ``rank-K``.
    """
    from optcheck.judge.compare import compare_runs

    texts, dicts, code = [], [], 0
    for k, da, db in pairs:
        try:
            res = compare_runs(da, db, **options)
        except InputError as e:
            raise InputError(f"rank-{k}: {e}") from None
        code = max(code, res.exit_code)
        texts.append(f"== rank {k} ==\n{res.render()}")
        dicts.append({"rank": k, **json.loads(res.to_json())})
    return (json.dumps(dicts, indent=2) if as_json else "\n\n".join(texts)), code
