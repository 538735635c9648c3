"""Sizes in bytes: parsing ``--memory-budget 4GiB`` and printing ``41.2 MiB``. Torch-free.

Units follow IEC 80000-13: ``KiB``/``MiB``/``GiB``/``TiB`` are powers of 1024,
``KB``/``MB``/``GB``/``TB`` powers of 1000, ``B`` is one byte. Unit names are
case-insensitive ("4gib" is 4 GiB); a bare number is bytes.
"""

from __future__ import annotations

import math
import re

from optcheck.errors import InputError

UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_UNIT_NAMES = "B, KB, KiB, MB, MiB, GB, GiB, TB, TiB"


def parse_bytes(text: str | int, what: str = "size") -> int:
    """Parse a size such as ``"4GiB"``, ``"512 MiB"``, ``"1.5GB"``, ``"100KB"`` or ``"4096"``.

    Args:
        text: the size; an int is taken as bytes.
        what: how the error names the input (e.g. ``"--memory-budget"``).

    Returns:
        The size in bytes (int, rounded to the nearest byte; at least 1).

    Raises:
        InputError: not a positive number with one of B, KB, KiB, MB, MiB, GB,
            GiB, TB, TiB (the message names ``what`` and the text).
    """
    if isinstance(text, bool):
        raise InputError(f"{what} {text!r}: expected a size such as 4GiB, 512MiB, 2GB or a number of bytes")
    if isinstance(text, int):
        if text <= 0:
            raise InputError(f"{what} {text}: must be a positive number of bytes")
        return text
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or (unit and unit not in UNITS):
        raise InputError(f"{what} {text!r}: expected a size such as 4GiB, 512MiB, 2GB or a number of bytes "
                         f"(units: {_UNIT_NAMES})")
    value = float(m.group(1)) * UNITS.get(unit, 1)
    if not math.isfinite(value) or value < 0.5:
        raise InputError(f"{what} {text!r}: must be at least one byte")
    return int(round(value))


def format_bytes(n: float, digits: int = 1) -> str:
    """``n`` bytes in the largest IEC unit that keeps the number >= 1: ``"41.2 MiB"``.

    A whole number of units prints without decimals (``"4 GiB"``); negative
    values keep their sign; bytes below 1 KiB print as ``"512 B"``; a value that
    is not finite prints as ``"inf B"``, ``"-inf B"`` or ``"nan B"`` (a summary
    field recorded as "inf" must not crash the report).
    """
    n = float(n)
    if not math.isfinite(n):
        return f"{n} B"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            return f"{sign}{v:.0f} {unit}" if v == int(v) else f"{sign}{v:.{digits}f} {unit}"
    return f"{sign}{n:.0f} B"


def format_steps(step: float) -> str:
    """A step number with thousands separators: ``183000`` -> ``"183,000"``."""
    return f"{int(round(step)):,}"


def round_sig(x: float, sig: int = 3) -> float:
    """``x`` rounded to ``sig`` significant digits (183417 -> 183000). 0 stays 0."""
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, sig - 1 - int(math.floor(math.log10(abs(x)))))
