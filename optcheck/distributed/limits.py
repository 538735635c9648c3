"""What a ``--nproc`` job may ask of this machine, checked before any rank starts, and the
cross-rank exchange's timeout from the environment. Torch-free."""

from __future__ import annotations

import math
import os

from optcheck.config import SoakConfig
from optcheck.errors import InputError

#: Ranks a core may carry: each rank is a training process with ``--threads`` threads; more
#: than two per core and the collectives of a starved rank time out (and a few hundred ranks
#: exhaust the launcher before they start).
RANKS_PER_CORE = 2
#: Memory of one rank of the built-in GPT before its model: the interpreter, torch, gloo,
#: the Monitor (peak RSS 390 MiB measured, torch 2.13 CPU, 1-layer GPT).
RANK_BASE_BYTES = 400 * 2**20
#: Bytes per model parameter on a rank: weights, gradients, AdamW's two moments, DDP's bucket.
RANK_BYTES_PER_PARAM = 5 * 4
ENV_TIMEOUT = "OPTCHECK_DIST_TIMEOUT"


def env_timeout_s() -> float | None:
    """``OPTCHECK_DIST_TIMEOUT``: the cross-rank exchange's timeout in seconds, or None when unset.

    Raises:
        InputError: set to anything but a finite positive number of seconds.
    """
    raw = os.environ.get(ENV_TIMEOUT)
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{ENV_TIMEOUT}={raw!r}: give the cross-rank exchange's timeout in seconds "
                         f"(a positive number), or unset it")
    return value


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; ``os.cpu_count()`` elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def rank_bytes(cfg: SoakConfig) -> int:
    """Memory one rank of the built-in GPT of ``cfg`` needs, roughly (bytes):
    :data:`RANK_BASE_BYTES` + :data:`RANK_BYTES_PER_PARAM` per parameter (GPT-2 count:
    12·n_layer·n_embd² + (vocab + block)·n_embd; vocabulary 50,304 when not given)."""
    m = cfg.model
    params = 12 * m.n_layer * m.n_embd ** 2 + ((m.vocab_size or 50_304) + m.block_size) * m.n_embd
    return RANK_BASE_BYTES + RANK_BYTES_PER_PARAM * params


def check_capacity(cfg: SoakConfig, nproc: int) -> None:
    """Refuse ``--nproc`` beyond this machine before anything starts: more than
    :data:`RANKS_PER_CORE` ranks (of ``--threads`` threads) per usable core, or more
    memory than is available (``psutil.virtual_memory().available``, :func:`rank_bytes` each).

    Raises:
        InputError: one line naming the limit and the largest ``--nproc`` that fits.
    """
    from optcheck.units import format_bytes

    cores = usable_cores()
    fits = max(1, RANKS_PER_CORE * cores // cfg.run.threads)
    if nproc > fits:
        raise InputError(f"--nproc {nproc}: this machine has {cores} usable core(s), which take at most {fits} "
                         f"ranks of --threads {cfg.run.threads} ({RANKS_PER_CORE} threads per core); give --nproc {fits} "
                         f"or fewer")
    import psutil

    per, free = rank_bytes(cfg), psutil.virtual_memory().available
    if nproc * per > free:
        raise InputError(f"--nproc {nproc}: the ranks need about {format_bytes(nproc * per)} ({format_bytes(per)} "
                         f"each), {format_bytes(free)} is available; give --nproc {max(1, free // per)} or fewer")
