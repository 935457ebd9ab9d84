"""What a ``set`` or a ``set_many`` writes before its records go into the journal, one append for all of them:
the batch's pairs checked and in order, each value signed, the ones with a file of their own written (nobody
reads such a file before a record names it), and where the inline values lie once appended. ``core.Store``
appends; nothing here touches the journal."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ArgumentTypeError, DiskFullError, SizeError
from ..system.fileio import write_new
from ..units import fmt_size
from . import datafiles
from .codec import Seal, _Blob, _Held, to_blob
from .journal import disk_full
from .keys import EXT, KIND_NPY_MAP, Key, encode_key, new_stem, shown_key
from .records import OP_SET, Entry, Record, packed_size

# Values up to this size live inside the journal itself: one append instead of a new file per entry (creating a
# file costs far more than appending to one). Bigger ones get a file of their own.
INLINE_MAX_BYTES = 16 * 1024


# One value signed, not yet written: its encoded key, its version (the stem of its name) and its bytes. Plain
# tuples: a ``set`` makes one of these per call, and a NamedTuple costs a Python-level ``__new__``.
Signed = tuple[bytes, str, _Blob]


def pairs(items: Mapping[Key, Any] | Iterable[tuple[Key, Any]]) -> dict[bytes, Any]:
    """``set_many``'s argument as encoded keys and values, in the order a loop of ``set`` would leave them: a key
    given twice keeps its last value, in its last place. ``ArgumentTypeError`` names what is wrong, and where."""
    if isinstance(items, Mapping):
        source: Iterable[Any] = items.items()
    elif isinstance(items, str | bytes | bytearray) or not isinstance(items, Iterable):
        raise ArgumentTypeError(f"set_many takes a mapping or an iterable of (key, value) pairs, not a "
                                f"{type(items).__name__}")
    else:
        source = items
    batch: dict[bytes, Any] = {}
    for position, pair in enumerate(source):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise ArgumentTypeError(f"set_many: item {position} is a {type(pair).__name__}"
                                    f"{f' of length {len(pair)}' if isinstance(pair, tuple | list) else ''}, "
                                    "not a (key, value) pair; nothing was stored")
        encoded = _encoded(pair[0], position, "set_many")
        batch.pop(encoded, None)
        batch[encoded] = pair[1]
    return batch


def encoded_keys(keys: Iterable[Key]) -> list[bytes]:
    """``get_many``'s keys, encoded; one ``str`` or ``bytes`` is refused (it would be read as keys of one
    character or byte each)."""
    if isinstance(keys, str | bytes | bytearray) or not isinstance(keys, Iterable):
        raise ArgumentTypeError(f"get_many takes an iterable of keys (a list, say), not a {type(keys).__name__}; "
                                "for one key use get(key)")
    return [_encoded(key, position, "get_many") for position, key in enumerate(keys)]


def _encoded(key: Key, position: int, call: str) -> bytes:
    try:
        return encode_key(key)
    except ArgumentTypeError as err:
        raise ArgumentTypeError(f"{call}: key {position}: {err}") from None


def signed(seal: Seal, batch: dict[bytes, Any], ram_limit: int, disk_limit: int) -> list[Signed]:
    """Every value of ``batch`` as the bytes to write, before anything is written: a value that cannot be pickled,
    or a batch that cannot fit the SSD tier whole, is refused with nothing on disk."""
    done: list[Signed] = []
    total = 0
    for encoded, value in batch.items():
        stem = new_stem()
        try:
            blob = to_blob(seal, encoded, stem, value, ram_limit)
        except ArgumentTypeError as err:
            raise ArgumentTypeError(f"{err} (key {shown_key(encoded)!r}); nothing was stored") from err
        if blob.size > disk_limit:
            raise SizeError(f"a {fmt_size(blob.size)} value does not fit this store's SSD tier "
                            f"({fmt_size(disk_limit)}); nothing was stored")
        total += blob.size
        done.append((encoded, stem, blob))
    if total > disk_limit:
        raise SizeError(f"the {len(done)} values take {fmt_size(total)}, more than this store's SSD tier "
                        f"({fmt_size(disk_limit)}) holds at once; nothing was stored (store them in smaller batches)")
    return done


def written(values: list[Signed], ram_limit: int, data: str, data_fd: int) -> tuple[list[Record], list[_Held | None]]:
    """The SET records of ``values`` and what the RAM tier keeps of each, the values that get a file of their own
    written first, outside the store's locks: nobody reads a file before a record names it. On any failure (a
    full disk, an interrupt) the files already written are removed."""
    records: list[Record] = []
    kept: list[_Held | None] = []
    try:
        for key, stem, blob in values:
            if blob.kind != KIND_NPY_MAP and blob.size <= INLINE_MAX_BYTES:
                records.append(Record(OP_SET, key, Entry(stem, blob.kind, blob.size), b"".join(blob.parts)))
                kept.append(None if blob.ram_value is None else _Held(blob.ram_value, blob.kind, blob.ram_nbytes, stem))
            else:
                entry = Entry(stem + EXT[blob.kind], blob.kind, blob.size)
                kept.append(_write_file(entry, blob, ram_limit, data, data_fd))
                records.append(Record(OP_SET, key, entry))
    except BaseException:
        unlink(records, data_fd)
        raise
    return records, kept


def _write_file(entry: Entry, blob: _Blob, ram_limit: int, data: str, data_fd: int) -> _Held | None:
    """A value's own file, and what the RAM tier keeps of it: a big array mapped from that file, if it fits."""
    def full() -> DiskFullError:
        return disk_full(data, blob.size)
    if entry.kind == KIND_NPY_MAP and blob.ram_nbytes <= ram_limit:
        return datafiles.write_mapped(entry.name, data_fd, blob.parts, blob.size, full)
    write_new(entry.name, data_fd, blob.parts, full)
    return None if blob.ram_value is None else _Held(blob.ram_value, entry.kind, blob.ram_nbytes, entry.name)


def unlink(records: list[Record], data_fd: int) -> None:
    """The files of records that never went in (an inline value has none)."""
    datafiles.unlink([record.entry for record in records if record.entry is not None], data_fd)


def placed(appended: list[Record], end: int) -> list[Entry]:
    """The entries of the SET records that ended ``appended``, in order, an inline value's with the offset where
    it lies: each inline value ends where its record does, and the last record ends at ``end``."""
    entries = []
    for record in reversed(appended):
        entry = record.entry
        assert entry is not None
        entries.append(Entry(entry.name, entry.kind, entry.size, end - len(record.value)) if record.value else entry)
        end -= packed_size(record)
    entries.reverse()
    return entries
