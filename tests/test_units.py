from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import apsi_memory
from apsi_memory import SizeError, parse_size
from apsi_memory.units import GiB, KiB, MiB, TiB, fmt_size, in_one_unit


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
    assert fmt_size(200_000_000 * 8 * 4, 3) == "5.960 GB"


@pytest.mark.parametrize(("n_bytes", "shown"), [
    (0, "0 B"), (315, "315 B"), (1536, "1.5 KB"), (40 * MiB, "40.0 MB"), (int(5.8 * GiB), "5.8 GB"),
    (3 * TiB, "3.0 TB"), (1024 * KiB - 1, "1.0 MB"),  # 1023.999 KB rounds up to the next unit
])
def test_a_size_shows_in_the_largest_unit_it_reaches(n_bytes: int, shown: str) -> None:
    """Small sizes in B or KB, never "0.0 MB" (test first failed: fmt_mb(315) was "0.0 MB")."""
    assert fmt_size(n_bytes) == shown


def test_sizes_side_by_side_share_the_unit_of_the_largest() -> None:
    assert in_one_unit(300 * MiB, 4 * GiB) == ("0.3", "4.0", "GB")
    assert in_one_unit(300 * MiB, 400 * MiB) == ("300.0", "400.0", "MB")
    assert in_one_unit(64 * MiB, digits=0) == ("64", "MB")


@given(st.integers(min_value=1, max_value=2**60), st.integers(min_value=0, max_value=3))
def test_a_shown_size_reads_back_as_nearly_the_same_bytes_and_is_never_zero(n_bytes: int, digits: int) -> None:
    shown = fmt_size(n_bytes, digits)
    number = float(shown.split()[0])
    assert number >= 1, shown  # never "0.0 MB" for something there
    assert abs(parse_size(shown) - n_bytes) <= 0.5 * 10.0 ** -digits * parse_size(f"1 {shown.split()[1]}") + 1


SIZE_BY_HAND = re.compile(r"/ ?(GiB|MiB|KiB|2 ?\*\* ?\d+|1 ?<< ?\d+)\b[^}]*:\.\d+f\}|>> ?[123]0\}|\} ?([KMGT]i?B)\b")


def test_sizes_are_shown_by_the_units_module_only() -> None:
    """One rule everywhere: no module prints a size with its own f-string arithmetic (test first failed on
    status.py's ``{self.ram_free_bytes / GiB:.1f}``, cli.py's ``{self.chunk_bytes >> 20} MiB`` and others)."""
    package = Path(apsi_memory.__file__).parent
    by_hand = [f"{path.relative_to(package)}:{number}: {line.strip()}"
               for path in sorted(package.rglob("*.py")) if path.name != "units.py"
               for number, line in enumerate(path.read_text().splitlines(), 1) if SIZE_BY_HAND.search(line)]
    assert by_hand == []


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
