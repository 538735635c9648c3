"""``python -m optcheck.distributed.launch ARGS``: ``python -m torch.distributed.run ARGS``
that dies with the process that started it (``optcheck soak --nproc``), so its ranks
die with it (``optcheck/distributed/lifetime.py``)."""

from __future__ import annotations

import runpy
import sys

from optcheck.distributed.lifetime import die_with_parent


def main() -> None:
    die_with_parent()
    sys.argv = ["torch.distributed.run", *sys.argv[1:]]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
