"""What keeps one store handle's view true and within its limit, under every user operation of ``core.Store``:
replaying the records other processes appended (``_catch_up``) or the whole journal (``_reload``), batching
this process's reads into the journal, appending so that the index changes only after, evicting the least
recently used entries and rewriting the journal without its dead bytes. ``core`` decides when; this module knows
how (the state it works on is made by ``Store.__init__``)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection

from ..adapters.disk import disk_free
from ..errors import StoreClosedError
from . import checkpoint, datafiles
from .journal import _Journal
from .records import OP_CLEAR, OP_DEL, OP_LOST, OP_RESET, OP_SET, Entry, Record
from .stats import Counts
from .tiers import _Index, _RamTier

# Reads are remembered in memory and written to the journal in batches (with the next write, or at this many).
TOUCH_BATCH = 512


class _Upkeep:
    """The journal, the SSD tier's index and the RAM tier of one handle, kept in step with each other."""

    folder: str
    label: str
    disk_limit: int
    _data_fd: int
    _journal: _Journal
    _lock: threading.RLock
    _closed: bool
    _settled: int  # how many of the journal's pending reads the index has applied (``_settle_reads``)
    _counts: Counts
    _key_counts: weakref.WeakSet[Counts]  # a @cached function's, of its keys only
    _index: _Index
    _ram: _RamTier

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.label} is closed; open it again with memory.store(...)")

    # -- reads, in batches --

    def _settle_reads(self) -> None:
        """Move the keys read since the last settling to the recent end of the index, in the order they were read:
        before anything that depends on that order (iteration, eviction, compaction, a checkpoint, another
        process's records)."""
        reads = self._journal.pending_touches
        if len(reads) > self._settled:
            self._index.touch(reads[self._settled:])
            self._settled = len(reads)

    def _take_reads(self) -> list[Record]:
        """The reads not yet in the journal, as a record to append (settled in the index first)."""
        if not self._journal.pending_touches:
            return []  # a store that is only written: nothing to settle or take
        self._settle_reads()
        self._settled = 0
        return self._journal.take_touches()

    def flush(self) -> None:
        """Write remembered reads to the journal now (otherwise done with the next write or at exit)."""
        self._check_open()
        with self._lock:
            if self._journal.pending_touches:
                with self._journal.locked():
                    self._catch_up()
                    try:
                        self._journal.append(self._take_reads())
                    except OSError:
                        pass  # a full disk: recency is a hint, and a read must not fail for it

    # -- the journal and the index, in step --

    def _append(self, records: list[Record], adds: bool = False) -> int:
        """Append to the journal; the index changes only after (so a refused append leaves both as they were)."""
        try:
            return self._journal.append(records, adds)
        except OSError:
            raise  # the journal cut back what it wrote: it, and so the index, are as they were
        except BaseException:
            self._reload()  # interrupted mid-way: what is in the journal is the truth
            raise

    def _catch_up(self) -> None:
        if not self._journal.changed():
            return
        records = self._journal.read_new()
        if records:
            self._settle_reads()  # this process's reads came before what others wrote since
        reset = False
        for record in records:
            self._index.apply(record)
            if record.op in (OP_CLEAR, OP_LOST):
                self._ram.clear()
                self._settled = 0  # the index was emptied: reads still pending apply again to what comes next
            elif record.op == OP_RESET:
                reset = True
                self._settled = 0  # rebuilt from a journal that has not seen this process's pending reads
            elif record.op in (OP_SET, OP_DEL):
                held = self._ram.values.get(record.key)
                if held is not None and (record.entry is None or record.entry.name != held.name):
                    self._ram.drop(record.key)  # another process replaced or removed it
        if reset:  # compacted: keep the RAM values whose entry survived unchanged
            for key, held in list(self._ram.values.items()):
                entry = self._index.get(key)
                if entry is None or entry.name != held.name:
                    self._ram.drop(key)
        if self._journal.lost_tail:
            self._append([Record(OP_CLEAR)])  # the journal was cut: every process must agree it is empty

    def _reload(self) -> None:
        """Under the journal lock: rebuild both tiers' view from the journal alone."""
        self._journal.reopen()
        self._journal.pending_touches = []
        self._settled = 0
        self._index.clear()
        self._ram.clear()
        self._catch_up()

    # -- within the limit on disk --

    def _evict_over_limit(self, keep: Collection[bytes], room: int = 0) -> list[Entry]:
        """Least recently used entries out until the files, the journal (its dead bytes included) and the index
        checkpoint fit, with ``room`` bytes to spare."""
        index, journal = self._index, self._journal
        records = journal.offset - index.inline_total  # the journal less its live values: records and dead bytes
        if index.total + records + room + checkpoint.room_bound(records) <= self.disk_limit:
            return []  # far enough below the limit that the checkpoint's actual size does not matter
        self._settle_reads()
        victims = index.evict_to(max(0, self.disk_limit - records - journal.checkpoint_room() - room), keep)
        if victims:
            keys = [key for key, _ in victims]
            for counts in (self._counts, *self._key_counts):
                counts.evicted(keys)
            for key in keys:
                self._ram.drop(key)
            try:
                self._append([Record(OP_DEL, key) for key, _ in victims])
            except OSError:
                self._reload()  # the index dropped them already: back to what the journal says
                raise
        return [entry for _, entry in victims]

    def _unlink(self, entries: list[Entry]) -> None:
        datafiles.unlink(entries, self._data_fd)

    def _rewrite_journal(self, keep: Collection[bytes]) -> None:
        """Under the journal lock: the journal rewritten with the live entries only. The new journal is written
        beside the old one, so entries are evicted first to make room for it within the limit."""
        inline = self._index.inline_total
        keys = sum(len(key) for key in self._index.entries)
        if disk_free(self.folder) < inline + keys + 64 * (len(self._index.entries) + 1024):
            return  # no room for the rewrite now; the journal stays valid and a later write tries again
        self._unlink(self._evict_over_limit(keep, room=inline + keys + 64 * len(self._index.entries) + 64))
        self._settle_reads()  # the new journal is written in recency order
        try:
            self._journal.replace(list(self._index.entries.items()))
        except OSError:
            return  # the same, had the disk filled up meanwhile
        self._catch_up()
        datafiles.sweep_orphans({entry.name for entry in self._index.entries.values()}, self._data_fd)
