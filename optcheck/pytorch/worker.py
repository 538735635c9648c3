"""PyTorch worker process: ``python -m optcheck.pytorch.worker --config FILE --stream-fd N``.

Started by the supervisor (``optcheck/drivers/soak.py``); runs ``optcheck.drivers.worker_loop``
with the PyTorch backend and reports on the pipe ``N``. Exit code 0 finished,
1 the training raised, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from optcheck.config import SoakConfig
# (upward: this module is the worker process's entry point, itself a driver; the probes below it import no driver)
from optcheck.drivers.protocol import Stream
from optcheck.drivers.worker_loop import run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m optcheck.pytorch.worker")
    ap.add_argument("--config", required=True, help="SoakConfig as a JSON file")
    ap.add_argument("--stream-fd", type=int, default=None, help="pipe to the supervisor (default: none)")
    args = ap.parse_args(argv)
    cfg = SoakConfig.from_json(Path(args.config).read_text())
    import torch

    from optcheck.errors import InputError
    from optcheck.torch_version import require_imported

    try:  # the supervisor checked the metadata; a torch without any is checked here
        require_imported(torch.__version__)
    except InputError as e:
        stream = Stream(args.stream_fd)
        stream.send("crash", step=0, exc_type="InputError", message=str(e), stack="", input_error=True)
        stream.close()
        return 2
    from optcheck.pytorch.train import TorchBackend

    return run(TorchBackend(), cfg, Stream(args.stream_fd))


if __name__ == "__main__":
    sys.exit(main())
