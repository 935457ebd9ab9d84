"""``Store``: the two tiers, the journal and the value files joined into one ``MutableMapping``: what each
operation does (``upkeep`` keeps the handle's view in step with the journal and within its limit; see the package
docstring for the theory of operation)."""
from __future__ import annotations

import os
import pickle
import threading
import warnings
import weakref
from collections.abc import Callable, Collection, ItemsView, Iterable, Iterator, Mapping, MutableMapping, ValuesView
from typing import Any

from ..decide import Level, ram_tier_limit
from ..errors import (
    ArgumentTypeError,
    DiskFullError,
    MissingKeyError,
    OldEntryWarning,
    TamperWarning,
    UnloadableWarning,
)
from ..machinery.machines import machine
from ..system.trust import open_folder
from ..units import MiB, byte_count, fmt_size
from . import batches, datafiles, forks
from .codec import OldFormat, Unloadable, _Tampered, decode, seal_for
from .folders import allowed_folder, checked_arguments
from .journal import _Journal, close_files
from .keys import KIND_PICKLE, Key, OldKey, decode_key, encode_key, shown_key
from .records import OP_DEL, Entry, Record
from .signing import user_key
from .stats import CacheStats, Counts
from .tiers import _Index, _RamTier
from .upkeep import TOUCH_BATCH, _Upkeep

# The journal is rewritten without its dead bytes once they exceed the live inline values and this much.
COMPACT_MIN_BYTES = 4 * MiB


# -- the store -----------------------------------------------------------------------------------------------------

_MISSING = object()


class Store(_Upkeep, MutableMapping[Key, Any]):
    """A two-tier cache in ``folder``, a mapping from keys to values. Use ``memory.store(name_or_path, ram_mb=...,
    disk_gb=...)``. Keys are ``str``, ``int`` or ``bytes`` (``1``, ``"1"`` and ``b"1"`` are three keys); values
    are NumPy arrays (stored as ``.npy``, never pickled) or anything picklable. An array read back is writable and
    the caller's own (``get``). A ``collections.abc.MutableMapping``: ``update``, ``pop``, ``setdefault``,
    ``keys()``, ``items()`` and the rest work as on a dict (``keys()``, ``in`` and ``len`` never read a value), but a
    store equals only itself. ``set_many`` and ``get_many`` take many keys at once, the batch all or nothing."""

    def __init__(self, folder: str | os.PathLike[str], label: str, ram_bytes: int, disk_bytes: int,
                 level: Callable[[], Level] | None = None) -> None:
        folder = checked_arguments(folder, label, level)
        allowed_folder(folder)  # before anything is made there: the check ``memory.store`` makes
        self.folder = folder
        self.label = label
        self.ram_asked = byte_count(ram_bytes, "Store: ram_bytes")
        self.disk_limit = byte_count(disk_bytes, "Store: disk_bytes")
        self._machine = machine()  # the one whose levels this store hears, as it was when opened
        self._level = level or self._machine.current_level
        secret = user_key()
        self._data = os.path.join(folder, "data")
        self._dir_fd = open_folder(folder)  # every file operation is relative to these two (never a path)
        journal: _Journal | None = None
        try:  # the journal first: it refuses a folder that is not a store before anything is made there
            journal = _Journal(folder, self._dir_fd)
            self._data_fd = open_folder("data", self._dir_fd, shown=self._data)
        except BaseException:
            if journal is not None:
                journal.close(wait=False)
            os.close(self._dir_fd)
            raise
        self._journal = journal
        self._seal = seal_for(secret, self._journal.ident)
        self._lock = threading.RLock()
        self._fork_held = False
        self._closed = False
        self._old_seen = False  # an entry signed the old way was met (warned once per handle)
        self._settled = 0  # how many of the journal's pending reads the index has applied (``_settle_reads``)
        self._counts = Counts()
        self._key_counts = weakref.WeakSet()  # a @cached function's, of its keys only
        self._index = _Index()
        self._ram = _RamTier(ram_tier_limit(ram_bytes, self._level()))
        self._closer = weakref.finalize(self, close_files, self._journal, (self._data_fd, self._dir_fd), False)
        forks.track(self)
        with self._lock, self._journal.locked():
            self._index.restore(self._journal.load_checkpoint(self._seal.store_key))  # then only the tail
            self._catch_up()
            self._compact_if_due()
            self._unlink(self._evict_over_limit(keep=()))
            self._journal.checkpoint_if_due(self._seal.store_key, self._index.snapshot)  # also for read-only users
        self._machine.components.register(self)

    def __reduce__(self) -> Any:
        """A store is open files and locks of this process: another process opens it by name instead."""
        raise ArgumentTypeError(f"a store cannot be pickled or sent to another process: open it there by name with "
                                f"memory.store({self.label!r}) (any number of processes may use one store at once)")

    # -- reading --

    def get(self, key: Key, default: Any = None, *, writable: bool = True) -> Any:
        """The value of ``key``, or ``default``. Every call returns a value of its own, as ``np.load`` would: a
        pickled value is unpickled afresh, and an array is writable without the stored one ever changing: a copy
        of a small array, a copy-on-write map of a big one's file (pages are copied only as they are written).
        ``writable=False`` returns the store's own read-only array instead (no copy and no new mapping: the way to
        share one big array between many readers)."""
        if self._closed:
            self._check_open()
        encoded = encode_key(key)
        with self._lock:
            if self._journal.changed():  # a memory read; only another process's write costs more
                self._catch_up()
            value = self._get_now(encoded, default, writable)
            if len(self._journal.pending_touches) >= TOUCH_BATCH:
                self.flush()
            return value

    def get_many(self, keys: Iterable[Key], default: Any = None, *, writable: bool = True) -> list[Any]:
        """The values of ``keys`` as a list in their order, ``default`` for each one missing (a key asked twice
        is read twice): ``[s.get(key, default) for key in keys]`` from one look at the journal. So a batch that
        another process's ``set_many`` writes meanwhile is seen whole or not at all; only a value with a file of
        its own (over 16 KB) that is replaced or removed during the call reads as it is then. A list in the order
        asked, as lmdb's ``getmulti`` (which leaves misses out) and redis's ``MGET`` answer, with ``default`` where
        a key is missing, so it lines up with ``keys``: ``zip(keys, values)``, ``np.stack(values)`` and
        ``dict(zip(keys, values))`` work."""
        if self._closed:
            self._check_open()
        encoded = batches.encoded_keys(keys)
        with self._lock:
            self._catch_up()
            values = [self._get_now(key, default, writable) for key in encoded]
            if len(self._journal.pending_touches) >= TOUCH_BATCH:
                self.flush()
            return values

    def _get_now(self, encoded: bytes, default: Any, writable: bool) -> Any:
        """``get`` once caught up with the journal: the read is remembered, not yet written."""
        values = self._ram.values
        held = values.get(encoded)
        if held is not None and not datafiles.covered(held):
            self._ram.drop(encoded)  # its file was cut short under its mapping: read again, it is damage
            held = None
        if held is None:
            return self._get_from_disk(encoded, default, writable)
        values.move_to_end(encoded)
        self._journal.pending_touches.append(encoded)
        if held.kind != KIND_PICKLE:
            value = datafiles.writable(held, self._data_fd) if writable else held.value
        else:
            try:
                value = pickle.loads(held.value)
            except Exception:  # noqa: BLE001 - cannot be loaded here: the SSD tier's answer (a warned miss)
                self._ram.drop(encoded)
                return self._get_from_disk(encoded, default, writable)
        self._counts.hits += 1  # counted once the value is in hand: a warned miss is only a miss
        return value

    def _get_from_disk(self, key: bytes, default: Any, writable: bool, second_look: bool = False) -> Any:
        entry = self._index.get(key)
        if entry is None:
            self._counts.misses += 1
            return default
        try:
            if entry.offset >= 0:  # inline: in the journal
                value, held = decode(self._seal, key, os.pread(self._journal.fd, entry.size, entry.offset), entry)
            else:
                value, held = datafiles.load(self._seal, key, entry, self._data_fd)
        except (FileNotFoundError, _Tampered, Unloadable) as err:
            self._catch_up()
            now = self._index.get(key)
            if now != entry and not second_look:  # replaced, removed or compacted away meanwhile: not damage
                return self._get_from_disk(key, default, writable, True)
            if now == entry:
                self._unreadable(key, entry, err)
            self._counts.misses += 1
            return default
        self._counts.hits += 1
        self._ram.put(key, held)
        self._journal.pending_touches.append(key)
        return datafiles.writable(held, self._data_fd) if writable and held.kind != KIND_PICKLE else value

    def _where(self, entry: Entry) -> str:
        return self._journal.path if entry.inline else os.path.join(self._data, entry.name)

    def _unreadable(self, key: bytes, entry: Entry, err: BaseException) -> None:
        """A miss, each cause with its own truth: a missing file is silent; a value that verifies but cannot be
        loaded here warns and stays for the processes that can; an old-format one warns once and goes; only a
        failed check is tampering."""
        where, shown = self._where(entry), shown_key(key)
        if isinstance(err, Unloadable):
            warnings.warn(UnloadableWarning(f"{where}: entry {shown!r} is intact but cannot be loaded here ({err}); "
                                            "read as a miss and left in place"), stacklevel=4)
            return
        if isinstance(err, OldFormat):
            if not self._old_seen:
                self._old_seen = True
                warnings.warn(OldEntryWarning(f"store {self.label}: entries written by an older apsi_memory read as "
                                              "misses and are removed as they are met"), stacklevel=4)
        elif isinstance(err, _Tampered):
            warnings.warn(TamperWarning(
                f"{where}: entry {shown!r}: {err} (changed outside apsi_memory, truncated, copied from another "
                "store, or written by another user); removed unread"), stacklevel=4)
        self._forget(key, entry)

    def _forget(self, key: bytes, entry: Entry) -> None:
        """Drop an entry whose file is gone or failed its checks, for every process (a DEL record)."""
        try:
            with self._journal.locked():
                self._catch_up()
                if self._index.get(key) == entry:
                    self._append([Record(OP_DEL, key)])
                    self._index.remove(key)
                    self._unlink([entry])
        except OSError:
            pass  # a full disk: it stays a miss here, and the next read that meets it tries again

    def __getitem__(self, key: Key) -> Any:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise MissingKeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        self._check_open()
        encoded = encode_key(key)  # type: ignore[arg-type]
        with self._lock:
            self._catch_up()
            return encoded in self._index

    def __len__(self) -> int:
        self._check_open()
        with self._lock:
            self._catch_up()
            return len(self._index)

    def __iter__(self) -> Iterator[Key]:
        """Keys, least recently used first (a snapshot: changing the store while iterating is fine)."""
        self._check_open()
        with self._lock:
            self._catch_up()
            self._settle_reads()
            keys, old = [], []
            for encoded in self._index.entries:
                try:
                    keys.append(decode_key(encoded))
                except OldKey:
                    old.append(encoded)
            if old:
                self._forget_old_keys(old)
        return iter(keys)

    def _forget_old_keys(self, old: list[bytes]) -> None:
        """Entries an older version keyed by an int subclass's own ``str()``: no key can name them any more."""
        warnings.warn(OldEntryWarning(f"store {self.label}: {len(old)} entries written by an older apsi_memory under "
                                      "int-subclass keys cannot be named any more; removed"), stacklevel=3)
        for encoded in old:
            entry = self._index.get(encoded)
            if entry is not None:
                self._forget(encoded, entry)

    # -- writing --

    def set(self, key: Key, value: Any) -> None:
        """Store ``value``. Once its record is in the journal the set has happened: nothing after that (evicting,
        compacting, removing replaced files) can make it raise or remove the new value's file."""
        if self._closed:
            self._check_open()
        self._commit({encode_key(key): value})

    def set_many(self, items: Mapping[Key, Any] | Iterable[tuple[Key, Any]]) -> None:
        """Store every pair of ``items`` (a mapping, or (key, value) pairs; a key given twice keeps its last value),
        each as ``set`` would, with one append to the journal (one lock, one write) for them all: a loop of small
        ``set`` calls pays that per value. All or nothing: a value that cannot be stored (not picklable, bigger
        than the SSD tier, a batch that does not fit it whole, a full disk, an interrupt) raises with nothing of
        the batch stored and nothing already stored lost. Another process sees the store as it was before the
        batch or with all of it, never part: its records become readable with the one write that ends them (a
        reader reads only to the end of the last completed append). Separate ``get`` calls there may fall either
        side of the batch; one ``get_many`` sees one side."""
        if self._closed:
            self._check_open()
        self._commit(batches.pairs(items))

    def _commit(self, batch: dict[bytes, Any]) -> None:
        """Sign every value and write the files outside the locks, then append all the records at once; under
        both locks, index them, then make room once. Files no record names any more go before the lock is
        released, so the disk never holds more than the limit and the values in flight."""
        self._level()  # an allocation path: lets a pressure change reach on_level (cheap, rate-limited)
        signed = batches.signed(self._seal, batch, self._ram.limit, self.disk_limit)
        records, kept = batches.written(signed, self._ram.limit, self._data, self._data_fd)
        with self._lock, self._journal:
            try:
                self._catch_up()
                end = self._append(self._take_reads() + records, adds=True)
            except BaseException:
                batches.unlink(records, self._data_fd)
                raise
            for record, entry, held in zip(records, batches.placed(records, end), kept):
                old = self._index.put(record.key, entry)
                if held is not None:
                    self._ram.put(record.key, held)
                else:
                    self._ram.drop(record.key)
                if old is not None:
                    self._unlink([old])
            try:
                self._compact_if_due(keep=batch.keys())
                victims = self._evict_over_limit(keep=batch.keys())
                if victims:
                    self._unlink(victims)
            except OSError:
                pass  # a full disk or a raced unlink: the values are stored; the next write evicts or compacts
            self._journal.checkpoint_if_due(self._seal.store_key, self._index.snapshot)

    def __setitem__(self, key: Key, value: Any) -> None:
        self.set(key, value)

    def delete(self, key: Key) -> bool:
        """Remove ``key`` from both tiers; ``False`` if it was not there. Works on a full disk: a value with its
        own file is unlinked first, which frees the room its record needs."""
        self._check_open()
        encoded = encode_key(key)
        with self._lock, self._journal.locked():
            self._catch_up()
            entry = self._index.get(encoded)
            if entry is None:
                return False
            try:
                self._append(self._take_reads() + [Record(OP_DEL, encoded)])
            except DiskFullError:
                if entry.inline:
                    raise
                self._unlink([entry])  # readers meanwhile see a missing file: a miss, as after the delete
                self._append([Record(OP_DEL, encoded)])
            self._index.remove(encoded)
            self._ram.drop(encoded)
            self._unlink([entry])
        return True

    def __delitem__(self, key: Key) -> None:
        if not self.delete(key):
            raise MissingKeyError(key)

    def clear(self) -> None:
        """Remove every entry, from both tiers and the SSD. Needs no free space: the journal is cut back in place."""
        self._check_open()
        with self._lock, self._journal.locked():
            self._catch_up()
            self._take_reads()
            gone = list(self._index.entries.values())
            self._journal.empty()
            self._catch_up()
            self._ram.clear()
            self._unlink(gone)

    # -- the rest of the mapping (``MutableMapping`` supplies keys, update, setdefault) --

    # Equal only to itself and hashed by identity: Mapping's ``__eq__`` would read (and unpickle) every value of
    # both stores, and its ``__hash__ = None`` would keep stores out of the weak sets that track them.
    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def items(self) -> ItemsView[Key, Any]:
        """Pairs in the store's order, each value read as ``store[key]`` would read it."""
        return _Items(self)

    def values(self) -> ValuesView[Any]:
        """Values in the store's order, each read as ``store[key]`` would read it."""
        return _Values(self)

    def pop(self, key: Key, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its value; ``default`` if it is not there, else ``MissingKeyError``."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise MissingKeyError(key)
            return default
        self.delete(key)  # ``False`` if another process removed it meanwhile: it was there when read
        return value

    def popitem(self) -> tuple[Key, Any]:
        """Remove and return the least recently used entry; ``MissingKeyError`` if the store is empty."""
        for key in self:
            value = self.get(key, _MISSING)
            if value is not _MISSING:  # not removed by another process since the keys were listed
                self.delete(key)
                return key, value
        raise MissingKeyError("popitem(): the store is empty")

    # -- compaction (when; ``upkeep`` rewrites) --

    def _compact_if_due(self, keep: Collection[bytes] = (), force: bool = False) -> None:
        """Under the journal lock. Dead bytes (replaced or deleted inline values, old records) are dropped by
        rewriting the journal once they outweigh the live inline values (so the journal is at most twice what it
        must be, and compaction costs O(1) per byte written), or once the store is over its limit on disk (the
        rewrite: ``upkeep``)."""
        inline = self._index.inline_total
        dead = self._journal.offset - inline
        on_disk = self._index.total - inline + self._journal.offset
        over_limit = on_disk > self.disk_limit and dead > self.disk_limit // 10
        if dead <= max(inline, COMPACT_MIN_BYTES) and not over_limit and not self._journal.damaged and not force:
            return
        self._rewrite_journal(keep)

    # -- closing --

    def close(self) -> None:
        """Write remembered reads and close the files; any later use raises ``StoreClosedError``. Twice is fine."""
        self._machine.components.unregister(self)
        with self._lock:
            self._closed = True
            self._settle_reads()
            if self._closer.detach() is not None:
                close_files(self._journal, (self._data_fd, self._dir_fd), True,
                            (self._seal.store_key, self._index.snapshot))

    def __enter__(self) -> Store:  # noqa: PYI034 - typing.Self needs Python 3.11
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- pressure --

    def on_level(self, level: Level) -> None:
        """``high`` halves the RAM tier, ``critical`` empties it, back at ``ok`` it may grow to what was asked."""
        with self._lock:
            self._ram.limit = ram_tier_limit(self.ram_asked, level)
            self._ram.shrink_to(self._ram.limit)

    def relieve(self) -> None:
        """Give the RAM tier back now; every value stays on the SSD."""
        with self._lock:
            self._ram.clear()

    # -- reports --

    def stats(self) -> CacheStats:
        """Hits, misses and evictions of this handle, in this process (``CacheStats``)."""
        return self._counts.snapshot()

    def count_keys(self, counts: Counts) -> None:
        """Count evictions of the keys starting with ``counts.prefix`` in ``counts`` too (as long as it lives)."""
        self._key_counts.add(counts)

    @property
    def ram_bytes(self) -> int:
        return self._ram.total

    @property
    def disk_bytes(self) -> int:
        self._check_open()
        with self._lock:
            self._catch_up()
            return self._index.total

    def __str__(self) -> str:
        if self._closed:
            return f"<store {self.label}: closed>"
        with self._lock:
            self._catch_up()
            return (f"<store {self.label}: {len(self._ram.values)} in RAM ({fmt_size(self._ram.total)}), "
                    f"{len(self._index)} on SSD ({fmt_size(self._index.total)})>")

    __repr__ = __str__


# -- its views: the keys listed once, a key removed (by another process, say) before its value is read skipped --

class _Items(ItemsView[Key, Any]):
    __slots__ = ()
    _mapping: Store  # set by MappingView's __init__

    def __iter__(self) -> Iterator[tuple[Key, Any]]:
        for key in self._mapping:
            value = self._mapping.get(key, _MISSING)
            if value is not _MISSING:
                yield key, value


class _Values(ValuesView[Any]):
    __slots__ = ()
    _mapping: Store  # set by MappingView's __init__

    def __iter__(self) -> Iterator[Any]:
        for key in self._mapping:
            value = self._mapping.get(key, _MISSING)
            if value is not _MISSING:
                yield value
