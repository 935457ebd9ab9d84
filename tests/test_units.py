from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apsi_memory import SizeError, parse_size
from apsi_memory.units import GiB, MiB, fmt_gb


@pytest.mark.parametrize(("text", "expected"), [
    ("12GB", 12 * GiB), ("512 MB", 512 * MiB), ("1.5GiB", int(1.5 * GiB)), ("0.5", GiB // 2),
    ("  2 gb ", 2 * GiB), ("100b", 100), ("1e1 KB", 10 * 1024), (16, 16 * GiB), (0.25, GiB // 4), ("0", 0),
])
def test_sizes_users_write(text: str | float, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GB", "12 parsecs", "-1GB", "nan", "inf", "1.2.3GB", "12 G B", "0x10"])
def test_anything_else_is_a_clear_error_that_quotes_it(text: str) -> None:
    with pytest.raises(SizeError, match="size|unit"):
        parse_size(text)


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, None, [1]])
def test_bad_numbers_are_size_errors_and_value_errors(value: object) -> None:
    with pytest.raises(ValueError):
        parse_size(value)  # type: ignore[arg-type]


def test_gb_in_text_is_binary_as_the_spec_report_line() -> None:
    assert fmt_gb(200_000_000 * 8 * 4, 3) == "5.960 GB"


@given(st.text())
def test_any_text_is_bytes_or_a_size_error(text: str) -> None:
    try:
        size = parse_size(text)
    except SizeError:
        return
    assert isinstance(size, int) and size >= 0


@given(st.floats(min_value=0, max_value=1e6))
def test_gb_numbers_round_trip(gb: float) -> None:
    assert abs(parse_size(gb) - gb * GiB) <= 1
