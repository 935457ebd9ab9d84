"""The checkpoint's index as fixed-width columns, read in place: opening a store looks keys up in the file's bytes
instead of building a dict of every entry first (see ``checkpoint.py`` for the file around them).

The rows are in recency order (least recent first). Columns, in this order, little-endian: the 64-bit hash of
every key sorted, the end of every key in the key blob, sizes, inline offsets (8 bytes each), then the row of every
sorted hash (4 bytes), kinds (1 byte), the 16 hex digits of every name's stem, and the keys one after another. A
lookup bisects the hashes and compares the key bytes of the rows with that hash; a name is rebuilt the way the
journal's reader builds it (``records._record_from``), so an entry read here equals the one a replay would give.
"""

from __future__ import annotations

import gc
import zlib
from bisect import bisect_left
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate, repeat
from operator import itemgetter

import numpy as np

from .keys import EXT, NAME_BYTES
from .records import Entry

_WIDE = 4  # 8-byte columns: hashes, key ends, sizes, offsets
_PER_ROW = 8 * _WIDE + 4 + 1 + NAME_BYTES


# Two 32-bit checksums of the key make its 64-bit hash: stable across processes (``hash`` is not), C-fast for a
# whole column, and a collision only costs comparing one more key.
_HALVES = (zlib.crc32, zlib.adler32)


def _hash(key: bytes) -> int:
    high, low = _HALVES
    return high(key) << 32 | low(key)


def pack(whole: dict[bytes, Entry]) -> tuple[int, bytes]:
    """The number of rows and their columns, ``whole`` in its (recency) order."""
    keys, entries, n = list(whole), list(whole.values()), len(whole)
    high, low = (np.fromiter(map(half, keys), np.uint64, n) for half in _HALVES)
    hashes = high << np.uint64(32) | low
    order = np.argsort(hashes, kind="stable")
    names = "".join(entry.name[:NAME_BYTES] for entry in entries).encode("ascii")
    size, offset, kind = (np.fromiter(map(itemgetter(field), entries), dtype, n)
                          for field, dtype in ((2, "<i8"), (3, "<i8"), (1, "u1")))
    columns = (hashes[order].astype("<u8"), np.fromiter(accumulate(map(len, keys)), "<u8", n), size, offset,
               order.astype("<u4"), kind)
    return n, b"".join(column.tobytes() for column in columns) + names + b"".join(keys)


def fits(n: int, body: memoryview) -> bool:
    """Whether ``body`` holds exactly ``n`` rows: its key blob as long as the last key's end says."""
    if n < 0 or len(body) < n * _PER_ROW:
        return False
    keys = len(body) - n * _PER_ROW
    return keys == 0 if n == 0 else bool(body[(2 * n - 1) * 8:2 * n * 8].cast("Q")[0] == keys)


class Rows:
    """``n`` packed rows (``fits`` checked), looked up in place. Read-only: the index keeps its changes beside it."""

    def __init__(self, n: int, body: memoryview) -> None:
        self.n = n
        at = [n * width for width in (8, 8, 8, 8, 4, 1, NAME_BYTES)]
        starts = list(accumulate(at, initial=0))
        self._hashes, self._ends, self._sizes, self._offsets = (
            body[starts[i]:starts[i + 1]].cast("Q" if i < 2 else "q") for i in range(_WIDE))
        self._order = body[starts[4]:starts[5]].cast("I")
        self._kinds = body[starts[5]:starts[6]]
        self._names = body[starts[6]:starts[7]]
        self._keys = body[starts[7]:]

    def __len__(self) -> int:
        return self.n

    def get(self, key: bytes) -> Entry | None:
        wanted = _hash(key)
        i = bisect_left(self._hashes, wanted)
        while i < self.n and self._hashes[i] == wanted:
            row = self._order[i]
            if self._key(row) == key:
                return self._entry(row)
            i += 1
        return None

    def _key(self, row: int) -> bytes:
        return self._keys[self._ends[row - 1] if row else 0:self._ends[row]].tobytes()

    def _entry(self, row: int) -> Entry:
        stem = self._names[row * NAME_BYTES:(row + 1) * NAME_BYTES].tobytes().decode("ascii")
        kind, offset = self._kinds[row], self._offsets[row]
        return Entry(stem if offset >= 0 else stem + EXT[kind], kind, self._sizes[row], offset)

    def items(self) -> Iterator[tuple[bytes, Entry]]:
        """Every row in recency order, built at once (the whole index is wanted: eviction, iteration, a rewrite)."""
        with _no_gc():
            ends = self._ends.tolist()
            blob = self._keys.tobytes()
            keys = [blob[start:end] for start, end in zip([0] + ends, ends)]
            stems = self._names.tobytes().decode("ascii")
            kinds, offsets = self._kinds.tolist(), self._offsets.tolist()
            names = [stems[i:i + NAME_BYTES] if offset >= 0 else stems[i:i + NAME_BYTES] + EXT[kind]
                     for i, kind, offset in zip(range(0, len(stems), NAME_BYTES), kinds, offsets)]
            # tuple.__new__ builds each Entry in C (Entry's own __new__ is a Python function): a third of the time.
            entries = list(map(tuple.__new__, repeat(Entry), zip(names, kinds, self._sizes.tolist(), offsets)))
        return zip(keys, entries)


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic collector off while the index is built: hundreds of thousands of new tuples would run it
    hundreds of times over objects that hold no cycles (half the build time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
