"""optcheck.units: --memory-budget sizes in, readable sizes out."""

from __future__ import annotations

import pytest

from optcheck.errors import InputError
from optcheck.units import format_bytes, format_steps, parse_bytes, round_sig


@pytest.mark.parametrize("text, expected", [
    ("4GiB", 4 * 2**30), ("4 gib", 4 * 2**30), ("512MiB", 512 * 2**20), ("1.5GiB", 3 * 2**29),
    ("100KiB", 102_400), ("2TiB", 2 * 2**40), ("2GB", 2_000_000_000), ("100KB", 100_000),
    ("3MB", 3_000_000), ("1TB", 10**12), ("4096", 4096), (" 7 B ", 7), ("7b", 7), (123, 123),
])
def test_parse_bytes_accepts_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["4 gigs", "", "GiB", "-1GiB", "1e9", "nan", "4GiB2", "4 G", "0", 0, -5, True, "0.1"])
def test_parse_bytes_rejects_junk_with_one_line(text):
    with pytest.raises(InputError) as e:
        parse_bytes(text, "--memory-budget")
    msg = str(e.value)
    assert msg.startswith("--memory-budget ") and "\n" not in msg


def test_format_helpers():
    assert format_bytes(41.2 * 2**20) == "41.2 MiB"
    assert format_bytes(4 * 2**30) == "4 GiB"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(100) == "100 B"
    assert format_bytes(-3 * 2**20) == "-3 MiB"
    assert format_steps(183_417.4) == "183,417"
    assert round_sig(183_417) == 183_000 and round_sig(0) == 0 and round_sig(0.012345, 2) == 0.012


def test_format_bytes_of_a_non_finite_value_is_readable():
    # a summary whose peak RSS was recorded as "inf" crashed render_summary with OverflowError
    assert format_bytes(float("inf")) == "inf B"
    assert format_bytes(float("-inf")) == "-inf B"
    assert format_bytes(float("nan")) == "nan B"
