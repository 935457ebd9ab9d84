"""What ``memory.array`` and ``pool.take`` accept: a shape (an int or a sequence of ints), a dtype (NumPy's, or a
PyTorch dtype by its name) and the bytes the two take, each refused with an error that names it."""

from __future__ import annotations

import contextlib
import math
import operator
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError


def normalize_shape(shape: int | Sequence[int]) -> tuple[int, ...]:
    """``(200_000_000, 8)`` from an int or a sequence of ints; ``ValueError``/``TypeError`` naming the shape."""
    try:
        items = (shape,) if isinstance(shape, (int, np.integer, np.bool_)) else tuple(shape)
        dims = tuple(operator.index(dim) for dim in items if not isinstance(dim, (bool, np.bool_)))
    except TypeError:
        raise ArgumentTypeError(f"shape {shape!r} must be an int or a sequence of ints") from None
    if len(dims) < len(items):  # [True, 2] would read as (1, 2)
        raise ArgumentTypeError(f"shape {shape!r} holds a bool, which is not a size")
    if dims and min(dims) < 0:
        raise ArgumentError(f"shape {shape!r} has a negative dimension")
    return dims


_dtypes: dict[Any, np.dtype[Any]] = {}  # np.dtype("float64") parses the string on every call; arrays are made often


def normalize_dtype(dtype: Any) -> np.dtype[Any]:
    """The ``numpy.dtype`` for ``dtype``; ``TypeError`` naming it when it is not one or holds Python objects."""
    try:
        return _dtypes[dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable spec, e.g. a list of fields
        pass
    try:
        result: np.dtype[Any] = np.dtype(_numpy_name(dtype) or dtype)
    except TypeError as exc:
        raise ArgumentTypeError(f"dtype {dtype!r} is not a NumPy dtype: {exc}") from None
    if result.hasobject:
        raise ArgumentTypeError(f"dtype {result} holds Python objects, which cannot live in a memory-mapped "
                                "file; use a numeric dtype")
    if result.itemsize == 0:  # "S0"/"U0": NumPy makes S1/U1 arrays, so count the bytes they really take
        result = np.empty(0, result).dtype
    with contextlib.suppress(TypeError):
        _dtypes[dtype] = result
    return result


def _numpy_name(dtype: Any) -> str | None:
    """The NumPy name of a PyTorch dtype (``torch.float32`` -> ``"float32"``; ``torch.from_numpy`` then shares the
    array's memory), None for anything else. Read by name: torch is not imported for it."""
    if type(dtype).__module__ != "torch" or type(dtype).__name__ != "dtype":
        return None
    name = str(dtype).removeprefix("torch.")
    if name in _TORCH_ONLY:
        raise ArgumentTypeError(f"dtype {dtype} has no NumPy equivalent, so it cannot back a memory.array; use "
                                "torch.float32 (or float16) and convert the tensor after torch.from_numpy")
    return name


_TORCH_ONLY = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "qint8",
                         "quint8", "qint32", "quint4x2", "complex32", "chalf"})


def nbytes_of(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes an array of ``shape`` and ``dtype`` takes; ``ArgumentError`` naming both when no array can be that
    big (more than an address can count)."""
    nbytes = math.prod(shape) * dtype.itemsize  # Python ints: no overflow for absurd shapes
    if nbytes > sys.maxsize:
        raise ArgumentError(f"shape {shape} of {dtype} would take {nbytes} bytes, more than any array can hold "
                            f"({sys.maxsize} at most)")
    return nbytes
