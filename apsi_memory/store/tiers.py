"""The store's two tiers in memory, pure: the SSD tier's index (every entry in recency order, with running totals)
and the RAM tier (values, least recently used first out), each a small mapping with running totals (as in zict).
See the package docstring."""

from __future__ import annotations

from collections import OrderedDict

from ..decide import eviction_target
from .checkpoint import Loaded
from .codec import _Held
from .records import OP_CLEAR, OP_DEL, OP_LOST, OP_RESET, OP_SET, OP_TOUCH, Entry, Record, unpack_keys

# -- the SSD tier's index (pure) -----------------------------------------------------------------------------------

class _Index:
    """Every entry on the SSD in recency order (least recent first), with running totals of their sizes."""

    def __init__(self) -> None:
        # A plain dict keeps insertion order too, and builds from a checkpoint in 3/4 of an OrderedDict's time.
        self.entries: dict[bytes, Entry] = {}
        self.total = 0
        self.inline_total = 0  # the part of ``total`` that lives inside the journal

    def _count(self, entry: Entry, sign_: int) -> None:
        self.total += sign_ * entry.size
        if entry.inline:
            self.inline_total += sign_ * entry.size

    def put(self, key: bytes, entry: Entry) -> Entry | None:
        old = self.remove(key)
        self.entries[key] = entry
        self._count(entry, 1)
        return old

    def remove(self, key: bytes) -> Entry | None:
        old = self.entries.pop(key, None)
        if old is not None:
            self._count(old, -1)
        return old

    def touch(self, key: bytes) -> None:
        try:
            self.entries[key] = self.entries.pop(key)  # to the end: most recently used
        except KeyError:
            pass  # removed meanwhile (a touch record may name a key deleted since)

    def clear(self) -> None:
        self.entries.clear()
        self.total = self.inline_total = 0

    def restore(self, loaded: Loaded | None) -> None:
        """Start from a checkpoint's index (see ``checkpoint.py``), if there is one."""
        if loaded is not None:
            self.entries, self.total, self.inline_total = loaded.entries, loaded.total, loaded.inline_total

    def snapshot(self) -> tuple[dict[bytes, Entry], int, int]:
        return self.entries, self.total, self.inline_total

    def apply(self, record: Record) -> None:
        if record.op == OP_SET and record.entry is not None:
            self.put(record.key, record.entry)
        elif record.op == OP_DEL:
            self.remove(record.key)
        elif record.op == OP_TOUCH:
            for key in unpack_keys(record.key):
                self.touch(key)
        elif record.op in (OP_CLEAR, OP_RESET, OP_LOST):
            self.clear()

    def evict_to(self, limit: int, keep: bytes) -> list[tuple[bytes, Entry]]:
        """Over ``limit``: remove the least recently used entries (never ``keep``) down to 90 % of it."""
        if self.total <= limit:
            return []
        target = eviction_target(limit)
        victims: list[tuple[bytes, Entry]] = []
        for key, entry in list(self.entries.items()):
            if self.total <= target:
                break
            if key != keep:
                self.remove(key)
                victims.append((key, entry))
        return victims


# -- the RAM tier (pure) -------------------------------------------------------------------------------------------

class _RamTier:
    """Least recently used values first out, bounded by ``limit`` bytes of measured size, with a running total."""

    def __init__(self, limit: int) -> None:
        self.values: OrderedDict[bytes, _Held] = OrderedDict()
        self.total = 0
        self.limit = limit

    def get(self, key: bytes) -> _Held | None:
        held = self.values.get(key)
        if held is not None:
            self.values.move_to_end(key)
        return held

    def put(self, key: bytes, held: _Held) -> None:
        self.drop(key)
        if held.nbytes > self.limit:
            return
        self.values[key] = held
        self.total += held.nbytes
        self.shrink_to(self.limit)

    def drop(self, key: bytes) -> None:
        held = self.values.pop(key, None)
        if held is not None:
            self.total -= held.nbytes

    def shrink_to(self, limit: int) -> None:
        while self.total > limit:
            _, held = self.values.popitem(last=False)
            self.total -= held.nbytes

    def clear(self) -> None:
        self.values.clear()
        self.total = 0
