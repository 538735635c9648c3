"""A real gloo process group of one rank for tests that need ``torch.distributed``
initialised in this process (FSDP2 and DTensor run on it on the CPU)."""

from __future__ import annotations

import contextlib
import os
import tempfile


@contextlib.contextmanager
def one_process_group():
    """Initialise a one-rank gloo process group (a file store in a temporary folder) and
    destroy it on exit."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as d:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(d, 'store')}", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()
