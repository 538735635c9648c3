"""``optcheck soak --trainer-option KEY=VALUE``: a user's own settings for their TorchSharp trainer.

Each option reaches the trainer's ``Setup`` as ``extra.KEY`` in ``TrainerOptions``
(dotnet/Probe/TrainerOptions.cs: ``o.Long("extra.width", 64)``, ``o.String("extra.data", "")``,
``o.Bool("extra.flag", false)``), through ``SoakConfig.trainer_options`` (written into the wire's
``extra`` beside optcheck's own keys; every value is text, the trainer parses it). Torch-free.
"""

from __future__ import annotations

import re

from optcheck.config import EXTRA
from optcheck.errors import InputError

#: Keys under the wire's ``extra`` that optcheck itself sets (``optcheck.config.EXTRA``: fields of its own
#: config sections) or once set: not a trainer option.
RESERVED = frozenset(EXTRA) | {"same_init_dir", "memory_device_budget_bytes", "corpus_vocab_size"}
#: Reserved keys with no command-line option of their own (set in code, e.g. by the GPU check): no hint.
_NO_OPTION = frozenset({"fused", "autocast", "grad_check_every"}) | (RESERVED - frozenset(EXTRA))
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def parse_trainer_options(values: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``["width=128", "data=/x/y.txt"]`` -> ``{"width": "128", "data": "/x/y.txt"}`` (the first ``=``
    splits; the value may be empty or hold ``=``; a repeated key keeps its last value).

    Raises:
        InputError: one line naming the option: no ``=``, a key that is not a name
            (``[A-Za-z_][A-Za-z0-9_.-]*``), or a key optcheck sets itself (:data:`RESERVED`).
    """
    out: dict[str, str] = {}
    for raw in values:
        key, eq, value = raw.partition("=")
        key = key.strip()
        if not eq:
            raise InputError(f"--trainer-option {raw!r}: expected KEY=VALUE (the trainer reads it as extra.KEY)")
        if not _KEY.match(key):
            raise InputError(f"--trainer-option {raw!r}: KEY must be a name (letters, digits, _ . -; not starting "
                             f"with a digit)")
        if key in RESERVED:
            hint = ("pick another name" if key in _NO_OPTION
                    else f"use its own option, --{key.replace('_', '-')}, or pick another name")
            raise InputError(f"--trainer-option {raw!r}: {key} is set by optcheck itself ({hint})")
        out[key] = value
    return out
