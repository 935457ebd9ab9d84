"""The store's two tiers in memory, pure: the SSD tier's index (every entry in recency order, with running totals)
and the RAM tier (values, least recently used first out), each a small mapping with running totals (as in zict).
See the package docstring."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable

from ..decide import eviction_target
from .checkpoint import Loaded
from .codec import _Held
from .records import OP_CLEAR, OP_DEL, OP_LOST, OP_RESET, OP_SET, OP_TOUCH, Entry, Record, unpack_keys
from .rows import Rows

# -- the SSD tier's index (pure) -----------------------------------------------------------------------------------

class _Index:
    """Every entry on the SSD in recency order (least recent first), with running totals of their sizes.

    Opened from a checkpoint, it is lazy: the checkpoint's rows (``rows.Rows``, looked up in place) are the base,
    and ``_changes`` holds every entry put or touched since, all more recent than any base row; ``_gone`` names the
    base rows removed or moved into ``_changes``. The whole dict is built only when whole-index order is wanted
    (``entries``: iteration, eviction, compaction, the next checkpoint); from then on ``_changes`` is all of it."""

    def __init__(self) -> None:
        # A plain dict keeps insertion order too, and builds in 3/4 of an OrderedDict's time.
        self._changes: dict[bytes, Entry] = {}
        self._base: Rows | None = None
        self._gone: set[bytes] = set()
        self.total = 0
        self.inline_total = 0  # the part of ``total`` that lives inside the journal

    @property
    def entries(self) -> dict[bytes, Entry]:
        """Every entry in recency order."""
        if self._base is not None:
            whole = {key: entry for key, entry in self._base.items() if key not in self._gone} if self._gone \
                else dict(self._base.items())
            whole.update(self._changes)
            self._changes, self._base, self._gone = whole, None, set()
        return self._changes

    def get(self, key: bytes) -> Entry | None:
        entry = self._changes.get(key)
        if entry is None and self._base is not None and key not in self._gone:
            return self._base.get(key)
        return entry

    def __contains__(self, key: bytes) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self._changes) + (len(self._base) - len(self._gone) if self._base is not None else 0)

    def _count(self, entry: Entry, sign_: int) -> None:
        self.total += sign_ * entry.size
        if entry.offset >= 0:  # ``entry.inline``, without a property call on every put
            self.inline_total += sign_ * entry.size

    def put(self, key: bytes, entry: Entry) -> Entry | None:
        old = self.remove(key)
        self._changes[key] = entry
        self._count(entry, 1)
        return old

    def remove(self, key: bytes) -> Entry | None:
        old = self._take(key)
        if old is not None:
            self._count(old, -1)
        return old

    def touch(self, keys: Iterable[bytes]) -> None:
        """``keys`` to the recent end, in order (a key removed meanwhile is skipped: a touch record may name a key
        deleted since)."""
        changes = self._changes
        built = self._base is None  # then the dict is all of it: a move within it
        for key in keys:
            entry = changes.pop(key, None) if built else self._take(key)
            if entry is not None:
                changes[key] = entry

    def _take(self, key: bytes) -> Entry | None:
        """``key``'s entry taken out of recency order (a base row is marked gone), totals untouched."""
        entry = self._changes.pop(key, None)
        if entry is None and self._base is not None and key not in self._gone:
            entry = self._base.get(key)
            if entry is not None:
                self._gone.add(key)
        return entry

    def clear(self) -> None:
        self._changes, self._base, self._gone = {}, None, set()
        self.total = self.inline_total = 0

    def restore(self, loaded: Loaded | None) -> None:
        """Start from a checkpoint's index (see ``checkpoint.py``), if there is one."""
        if loaded is not None:
            self._changes, self._base, self._gone = {}, loaded.rows, set()
            self.total, self.inline_total = loaded.total, loaded.inline_total

    def snapshot(self) -> tuple[_Index, int, int]:
        """What a checkpoint is written from; builds nothing unless one is written."""
        return self, self.total, self.inline_total

    def apply(self, record: Record) -> None:
        if record.op == OP_SET and record.entry is not None:
            self.put(record.key, record.entry)
        elif record.op == OP_DEL:
            self.remove(record.key)
        elif record.op == OP_TOUCH:
            self.touch(unpack_keys(record.key))
        elif record.op in (OP_CLEAR, OP_RESET, OP_LOST):
            self.clear()

    def evict_to(self, limit: int, keep: bytes | Collection[bytes]) -> list[tuple[bytes, Entry]]:
        """Over ``limit``: remove the least recently used entries (never ``keep``, a key or the keys of a batch)
        down to 90 % of it."""
        if self.total <= limit:
            return []
        kept = (keep,) if isinstance(keep, bytes) else keep
        target = eviction_target(limit)
        victims: list[tuple[bytes, Entry]] = []
        for key, entry in list(self.entries.items()):
            if self.total <= target:
                break
            if key not in kept:
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

    def put(self, key: bytes, held: _Held) -> None:
        self.drop(key)
        if held.nbytes > self.limit:
            return
        self.values[key] = held
        self.total += held.nbytes
        if self.total > self.limit:
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
