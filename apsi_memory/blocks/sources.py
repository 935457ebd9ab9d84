"""What ``chunks`` and ``map`` may stream, checked at the call so bad input fails there and not at the first block.

Theory of operation
-------------------
A source is an array given directly (in RAM, an ``np.memmap``, a ``memory.array``) or the path of a ``.npy``
file. A file's header is read and checked against the file's size (format versions 1 and 2 only, never a pickled
object array, never a truncated file) and the file is memory-mapped read-only only when streaming starts. Blocks
are views of consecutive rows, so a file or a file-backed array must store its rows one after another (C order,
or a column slice of it): otherwise a block would be scattered over the whole file. An in-RAM array of any layout
is fine, as its blocks are plain views either way.
"""

from __future__ import annotations

import errno
import math
import os
import sys
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.lib.format as npy_format

from ..errors import ChunkError, CorruptFileError, MissingFileError
from .pages import file_region


@dataclass(frozen=True)
class NpyHeader:
    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    data_offset: int


_HEADER_READERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}


def read_npy_header(path: str) -> NpyHeader:
    """The header of a ``.npy`` file, checked against the file's size. Never unpickles anything."""
    path = os.fspath(path)
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below; only the open's failure is named here
    except FileNotFoundError:
        raise MissingFileError(errno.ENOENT, "No such .npy file", path) from None
    with f:
        try:
            version = npy_format.read_magic(f)
        except ValueError:
            raise CorruptFileError(path, "not a .npy file (it does not start with the \\x93NUMPY magic)") from None
        reader = _HEADER_READERS.get(version)
        if reader is None:
            raise ChunkError(f"{path}: .npy format version {version[0]}.{version[1]} cannot be streamed; "
                             "open it with np.load(path, mmap_mode='r') and pass the array instead")
        try:
            shape, fortran_order, dtype = reader(f)
        except ValueError as exc:
            raise CorruptFileError(path, f"unreadable .npy header ({exc})") from None
        if any(not 0 <= dim <= sys.maxsize for dim in shape):  # one 0 would hide any other in the size check
            raise CorruptFileError(path, f"the header's shape {shape} has a negative or impossibly large dimension")
        header = NpyHeader(path, shape, dtype, fortran_order, f.tell())
        _check_npy_size(header, os.fstat(f.fileno()).st_size)
    return header


def _check_npy_size(header: NpyHeader, file_size: int) -> None:
    if header.dtype.hasobject:
        raise ChunkError(f"{header.path}: holds Python objects (dtype {header.dtype}), which .npy stores pickled; "
                         "apsi never unpickles a file it did not write. If you trust the file, load it with "
                         "np.load(path, allow_pickle=True) and pass the array")
    needed = header.data_offset + math.prod(header.shape) * header.dtype.itemsize  # Python ints: no overflow
    if file_size < needed:
        raise CorruptFileError(header.path, f"truncated: the header promises {header.shape} {header.dtype} "
                                            f"({needed} bytes with the header) but the file has {file_size} bytes")


def open_npy(header: NpyHeader) -> np.ndarray:
    """The file's array, memory-mapped read-only (no copy; an empty array needs no mapping)."""
    order: Literal["C", "F"] = "F" if header.fortran_order else "C"
    if math.prod(header.shape) * header.dtype.itemsize == 0:
        return np.empty(header.shape, dtype=header.dtype, order=order)
    return np.memmap(header.path, dtype=header.dtype, mode="r", offset=header.data_offset,
                     shape=header.shape, order=order)


@dataclass(frozen=True)
class Source:
    """What ``chunks``/``map`` stream: an array given directly, or a ``.npy`` file opened when streaming starts."""

    given: np.ndarray | None
    npy: NpyHeader | None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.given.shape if self.given is not None else self.npy.shape  # type: ignore[union-attr]

    @property
    def dtype(self) -> np.dtype:
        return self.given.dtype if self.given is not None else self.npy.dtype  # type: ignore[union-attr]

    def open(self) -> np.ndarray:
        return self.given if self.given is not None else open_npy(self.npy)  # type: ignore[arg-type]

    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize


def resolve_source(source: object) -> Source:
    """Check a source up front, so bad input fails at the call and not at the first block."""
    if isinstance(source, (str, os.PathLike)):
        header = read_npy_header(os.fspath(source))
        _check_has_rows(header.shape, header.path)
        _check_rows_in_order(header.shape, _file_strides(header), header.dtype.itemsize, header.path)
        return Source(None, header)
    if isinstance(source, np.ndarray):
        _check_has_rows(source.shape, "the array")
        if file_region(source) is not None:  # in RAM any layout is fine: blocks are views either way
            _check_rows_in_order(source.shape, source.strides, source.itemsize, "the memory-mapped array")
        return Source(source, None)
    raise ChunkError(f"cannot split a {type(source).__name__} into row blocks; pass a .npy path, an np.memmap, "
                     "a memory.array or another NumPy array")


def freed_source(when: str) -> ChunkError:
    """The error for a ``memory.array`` source freed (``memory.free``) ``when``: its memory went back and reads
    as zeros since, so no block of it may be used (the caller's ``arrays`` tells it was freed)."""
    return ChunkError(f"the array was freed (memory.free) {when}: a freed array reads as zeros, so its blocks "
                      "would give wrong results; free it only once chunks, map or reduce is done with it")


def _check_has_rows(shape: tuple[int, ...], what: str) -> None:
    if len(shape) == 0:
        raise ChunkError(f"{what} is 0-d (a single value), so it has no rows to split into blocks")


def _check_rows_in_order(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int, what: str) -> None:
    if not rows_follow_each_other(shape, strides, itemsize):
        raise ChunkError(f"{what} does not store its rows one after another (Fortran order, or a transposed or "
                         "reversed view), so a block of rows is scattered over the whole file and cannot be "
                         "streamed; save it in C order (np.save(path, np.ascontiguousarray(a))) or load it into RAM")


def rows_follow_each_other(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Each row lies wholly before the next, as in a C-order file or a column slice of one."""
    if shape[0] <= 1 or int(np.prod(shape[1:])) == 0:
        return True
    if any(stride < 0 for stride in strides):
        return False
    row_span = sum((n - 1) * stride for n, stride in zip(shape[1:], strides[1:])) + itemsize
    return strides[0] >= row_span


def _file_strides(header: NpyHeader) -> tuple[int, ...]:
    """The strides the file's array has: C order unless the header says Fortran order."""
    dims = header.shape[::-1] if not header.fortran_order else header.shape
    strides, step = [], header.dtype.itemsize
    for n in dims:
        strides.append(step)
        step *= max(n, 1)
    return tuple(strides[::-1]) if not header.fortran_order else tuple(strides)

