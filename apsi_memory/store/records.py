"""The store journal's records, pure: how they are packed, and how a journal's bytes parse back into them.

No I/O here: bytes in, records out. A record is a frame (its meta length, its inline value's length, the CRC of
its meta), the meta (an op, and for a SET the value's kind, size and name, then the key) and the inline value.
Every name read back is checked against the exact form the writer uses (``keys.is_stem`` and a known kind) before
anything can use it as a path; damaged records are reported, never guessed at, and a torn tail (a writer killed
mid-append) is left for the next writer to cut off.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple
from zlib import crc32

from ..units import MiB
from .keys import EXT, NAME_BYTES, is_stem

_FRAME = struct.Struct("<III")  # meta length, inline value length, crc32(meta)
_SET = struct.Struct("<BQ")  # kind, size
OP_SET, OP_DEL, OP_TOUCH, OP_CLEAR = b"S", b"D", b"T", b"C"
OP_RESET = b"R"  # never written: what a reader sees when the journal it held was compacted away
# Never written: where damaged records were skipped. Whatever they held is unknown, so every entry recorded before
# them reads as a miss (an older value would be a lie); entries recorded after them are intact.
OP_LOST = b"L"
_OPS = (OP_SET, OP_DEL, OP_TOUCH, OP_CLEAR)


class Entry(NamedTuple):
    name: str  # identity of this value; for a file entry also its name under data/
    kind: int
    size: int  # bytes on disk: the file, or the value inside the journal
    offset: int = -1  # where an inline value starts in the journal; -1: it has its own file

    @property
    def inline(self) -> bool:
        return self.offset >= 0


class Record(NamedTuple):
    op: bytes
    key: bytes = b""
    entry: Entry | None = None
    value: bytes = b""  # an inline value being appended (signed bytes, signature last)


def pack_record(record: Record) -> bytes:
    if record.op == OP_SET:
        entry = record.entry
        assert entry is not None
        meta = OP_SET + _SET.pack(entry.kind, entry.size) + entry.name[:NAME_BYTES].encode("ascii") + record.key
    else:
        meta = record.op + record.key
    return _FRAME.pack(len(meta), len(record.value), crc32(meta)) + meta + record.value


def packed_size(record: Record) -> int:
    """``len(pack_record(record))`` without packing it: where a batch's inline values will lie once appended."""
    meta = 1 + (_SET.size + NAME_BYTES if record.op == OP_SET else 0) + len(record.key)
    return _FRAME.size + meta + len(record.value)


_KEY_LENGTH = struct.Struct("<I")


def pack_keys(keys: list[bytes]) -> bytes:
    pack = _KEY_LENGTH.pack
    return b"".join([pack(len(key)) + key for key in keys])


def unpack_keys(packed: bytes) -> Iterator[bytes]:
    pos = 0
    while pos + _KEY_LENGTH.size <= len(packed):
        (length,) = _KEY_LENGTH.unpack_from(packed, pos)
        pos += _KEY_LENGTH.size
        yield packed[pos:pos + length]
        pos += length


def record_length(buf: bytes, pos: int = 0) -> int | None:
    """Bytes the record at ``pos`` claims to take, or ``None`` if not even its frame is there."""
    if pos + _FRAME.size > len(buf):
        return None
    meta_len, value_len, _ = _FRAME.unpack_from(buf, pos)
    return int(_FRAME.size + meta_len + value_len)


def _record_at(buf: bytes, pos: int, base: int) -> Record | None:
    """The intact record at ``pos``, or ``None`` (incomplete or damaged)."""
    length = record_length(buf, pos)
    if length is None or pos + length > len(buf):
        return None
    meta_len, value_len, crc = _FRAME.unpack_from(buf, pos)
    meta = buf[pos + _FRAME.size:pos + _FRAME.size + meta_len]
    if meta_len == 0 or crc32(meta) != crc:
        return None
    return _record_from(meta, value_len, base + pos + _FRAME.size + meta_len)


def parse_records(buf: bytes, base: int = 0, final: bool = False, whole_to: int = 0) -> tuple[list[Record], int,
                                                                                             list[tuple[int, int]]]:
    """The intact records in ``buf`` (which starts at journal offset ``base``), the bytes they use, and damaged
    spans that were skipped. A bad record followed by good ones is damage (skipped, reported, an ``OP_LOST`` in its
    place); one with nothing intact after it is the tail: being appended right now, or cut short by a crash, so
    parsing stops there.

    A record that runs past the end of ``buf`` is an incomplete tail too, unless ``final`` (the caller holds the
    lock and ``buf`` reaches the end of the file, so nobody is appending): then intact records after it mean its
    length field was damaged, and parsing resumes at them (a writer never appends after a torn record).

    ``whole_to`` (a position in ``buf``, 0 if unknown) is where the last completed append ended, as the lock file
    recorded it: every record before it was written whole, so one there that does not parse is damage, never a
    torn tail, and parsing resumes at ``whole_to`` (a record boundary) if nothing intact comes earlier."""
    records: list[Record] = []
    damaged: list[tuple[int, int]] = []
    pos, size, frame = 0, len(buf), _FRAME.size
    while pos + frame <= size:
        meta_len, value_len, crc = _FRAME.unpack_from(buf, pos)  # the common case inline: replay is this loop
        meta_at = pos + frame
        length = frame + meta_len + value_len
        record = None
        if pos + length <= size:
            meta = buf[meta_at:meta_at + meta_len]
            if meta_len and crc32(meta) == crc:
                record = _record_from(meta, value_len, base + meta_at + meta_len)
        if record is not None:
            records.append(record)
            pos += length
            continue
        resync = _resync(buf, pos, length, base, final)
        if resync is None and pos < whole_to <= size:
            resync = whole_to  # written whole, so damaged: the bytes up to there are skipped
        if resync is None:
            break  # incomplete: the tail
        damaged.append((base + pos, base + resync))
        records.append(Record(OP_LOST))
        pos = resync
    return records, pos, damaged


def _resync(buf: bytes, pos: int, length: int, base: int, final: bool) -> int | None:
    """Where parsing resumes after the record at ``pos`` that did not parse, or ``None`` if it is the tail."""
    if pos + length > len(buf):
        return _next_intact(buf, pos, None, base) if final else None
    return _next_intact(buf, pos, length, base)


RESYNC_WINDOW = 1 * MiB  # past this much garbage, the rest is treated as a torn tail


def _next_intact(buf: bytes, bad: int, length: int | None, base: int) -> int | None:
    """Where intact records resume after the damaged one at ``bad``: where its own length says (damage in its
    content), else the first intact record within ``RESYNC_WINDOW`` (damage in its length field)."""
    if length is not None and bad + length < len(buf) and _record_at(buf, bad + length, base) is not None:
        return bad + length
    for pos in range(bad + 1, min(len(buf), bad + RESYNC_WINDOW) - _FRAME.size + 1):
        if _record_at(buf, pos, base) is not None:
            return pos
    return None


def _record_from(meta: bytes, value_len: int, value_at: int) -> Record | None:
    """The record in ``meta``, or ``None`` when it is not one a writer makes (a name that is not 16 hex digits, an
    unknown kind): a name read from disk is never used as a path before this check."""
    op = meta[:1]
    if op != OP_SET:
        return Record(op, meta[1:]) if op in _OPS else None
    name_at = 1 + _SET.size
    if len(meta) < name_at + NAME_BYTES:
        return None
    kind, size = _SET.unpack_from(meta, 1)
    stem = meta[name_at:name_at + NAME_BYTES]
    if kind not in EXT or not is_stem(stem):
        return None
    key = meta[name_at + NAME_BYTES:]
    if value_len:
        return Record(op, key, Entry(stem.decode("ascii"), kind, value_len, value_at))
    return Record(op, key, Entry(stem.decode("ascii") + EXT[kind], kind, size))

