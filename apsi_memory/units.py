"""Sizes: parsing what users type and printing what they read. Pure: no I/O.

The one rule, everywhere (the CLI, ``status()``, ``report()``, ``dask-limit``, errors, the README): units are
binary and written KB, MB, GB, TB, as the SPEC's report line does (6.4e9 bytes prints as ``5.960 GB``): "KB" is
2**10 bytes, "MB" 2**20, "GB" 2**30, "TB" 2**40. Sizes a user passes (``budget(16)``, ``APSI_RAM_BUDGET=12GB``,
``ram_mb=``, ``disk_gb=``) mean the same units ("GiB" is read as "GB"), so a number read back from ``budget()``
can be passed to it again unchanged. Text shows each size in the largest unit it reaches (``fmt_size``): ``512 B``,
``1.5 KB``, ``40.0 MB``, never ``0.0 MB``; sizes shown side by side share one unit (``in_one_unit``).
"""

from __future__ import annotations

import math
import numbers
import re
from threading import TIMEOUT_MAX

import numpy as np

from .errors import ArgumentError, ArgumentTypeError, SizeError

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

# "GB" and "GiB" are the same unit on purpose: see the module docstring.
_UNITS = {
    "": GiB,  # a bare number is GB, as in budget(16)
    "b": 1,
    "k": KiB, "kb": KiB, "kib": KiB,
    "m": MiB, "mb": MiB, "mib": MiB,
    "g": GiB, "gb": GiB, "gib": GiB,
    "t": TiB, "tb": TiB, "tib": TiB,
}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str | float) -> int:
    """Bytes from ``"12GB"``, ``"512 MB"``, ``"1.5GiB"``, ``"0.5"`` (GB) or a number of GB.

    Raises ``SizeError`` naming the input for anything else (negative, NaN, unknown unit, empty).
    """
    if isinstance(text, bool):
        raise SizeError(f"size {text!r} is a bool, not a size")
    if isinstance(text, (int, float)):
        return _checked(float(text), GiB, repr(text))
    if not isinstance(text, str):
        raise SizeError(f"size must be a string or a number of GB, not {type(text).__name__}")
    match = _SIZE.fullmatch(text)
    if match is None:
        raise SizeError(f"cannot read {text!r} as a size; write e.g. '12GB', '512 MB', '1.5GiB' or '0.5' (GB)")
    number, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise SizeError(f"unknown unit {unit!r} in size {text!r}; use B, KB, MB, GB or TB (binary)")
    return _checked(float(number), factor, repr(text))


def _checked(value: float, factor: int, shown: str) -> int:
    if not math.isfinite(value) or value < 0:
        raise SizeError(f"size {shown} must be a finite number of at least 0")
    size = value * factor
    if size >= 2**63:
        raise SizeError(f"size {shown} is larger than any machine's memory")
    return int(size)


def byte_count(value: object, name: str) -> int:
    """``value`` as a whole number of bytes, at least 0: ``ArgumentTypeError`` for anything but an integer (a
    float, a bool, a string), ``ArgumentError`` for a negative or impossibly large one; both name ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentTypeError(f"{name} must be a whole number of bytes, not {type(value).__name__} ({value!r})")
    number = int(value)
    if number < 0:
        raise ArgumentError(f"{name} must be at least 0, not {number}")
    if number >= 2**63:
        raise ArgumentError(f"{name} of {number} bytes is larger than any machine's memory")
    return number


def flag(value: object, name: str) -> bool:
    """``value`` as True or False: a string such as ``"no"`` (or a number) would read as its truth value."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be True or False, not {type(value).__name__} ({value!r})")
    return bool(value)


MAX_SECONDS = TIMEOUT_MAX  # the longest wait the platform can do: a longer one overflows (292 years on Linux)


def seconds(value: object, name: str) -> float:
    """``value`` as a number of seconds to wait: a real number above 0 and at most ``MAX_SECONDS``.

    ``ArgumentTypeError`` for a string or bool, ``ArgumentError`` for 0, negative, NaN, inf or too large; both
    name ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be a number of seconds, not {type(value).__name__} ({value!r})")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        number = math.inf
    if not 0 < number <= MAX_SECONDS:  # NaN fails every comparison
        raise ArgumentError(f"{name} must be a number of seconds above 0 and at most {MAX_SECONDS:.0f}, "
                            f"not {value!r}")
    return number


_STEPS = ((TiB, "TB"), (GiB, "GB"), (MiB, "MB"), (KiB, "KB"))


def _unit(n_bytes: float, digits: int) -> tuple[int, str]:
    """The largest unit ``n_bytes`` reaches once shown with ``digits`` decimals (1023.99 KB shows as 1.0 MB)."""
    for unit, name in _STEPS:
        if float(f"{abs(n_bytes) / unit:.{digits}f}") >= 1:  # as it will be shown, rounding included
            return unit, name
    return 1, "B"


MAX_DIGITS = 6


def fmt_size(n_bytes: float, digits: int = 1) -> str:
    """``n_bytes`` in the largest unit it reaches, with ``digits`` decimals (bytes have none): ``512 B``,
    ``1.5 KB``, ``5.8 GB``; ``fmt_size(6.4e9, 3)`` is the SPEC's ``5.960 GB``; a negative size (a change) keeps its
    sign. The units are ``parse_size``'s, so what it shows reads back as about the same bytes.

    ``ArgumentTypeError`` for a size that is not a real number (a string, a bool) or ``digits`` that are not a whole
    number, ``ArgumentError`` for NaN or infinity or ``digits`` outside 0-6."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, numbers.Real):
        raise ArgumentTypeError(f"fmt_size: the size must be a number of bytes, not {type(n_bytes).__name__} "
                                f"({n_bytes!r})")
    if not math.isfinite(n_bytes):
        raise ArgumentError(f"fmt_size: the size must be a finite number of bytes, not {n_bytes!r}")
    if isinstance(digits, bool) or not isinstance(digits, numbers.Integral):
        raise ArgumentTypeError(f"fmt_size: digits must be a whole number, not {type(digits).__name__} ({digits!r})")
    if not 0 <= digits <= MAX_DIGITS:
        raise ArgumentError(f"fmt_size: digits must be 0 to {MAX_DIGITS}, not {digits}")
    return " ".join(in_one_unit(n_bytes, digits=int(digits)))


def in_one_unit(*sizes: float, digits: int = 1) -> tuple[str, ...]:
    """The sizes as numbers in the unit of the largest, and that unit: ``in_one_unit(3 * GiB, 4 * GiB)`` is
    ``("3.0", "4.0", "GB")``, for ``3.0/4.0 GB``."""
    unit, name = _unit(max((abs(size) for size in sizes), default=0), digits)
    places = 0 if unit == 1 else digits
    return (*(f"{size / unit:.{places}f}" for size in sizes), name)
