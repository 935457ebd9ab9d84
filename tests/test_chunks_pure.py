"""The pure rules under chunks/map (block spans, what may be released when, which pages were ours, how much written
data may wait for the disk, reading /proc/self/maps) and the background thread that makes the slow calls."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from apsi_memory.errors import ChunkError
from apsi_memory.outofcore import (
    DEFAULT_BLOCK_BYTES,
    FOLIO_PAGES,
    PAGE,
    Background,
    ReleaseFront,
    Residency,
    WriteBehind,
    block_spans,
    check_rows,
    default_rows,
    false_runs,
    parse_maps_line,
    region_in_maps,
    rows_follow_each_other,
)


def test_block_spans_cover_the_rows_in_order_with_a_shorter_last_block() -> None:
    assert block_spans(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert block_spans(8, 4) == [(0, 4), (4, 8)]
    assert block_spans(3, 10) == [(0, 3)]
    assert block_spans(0, 5) == []


def test_default_rows_make_blocks_of_about_32_mb_and_at_least_one_row() -> None:
    assert default_rows(32) == DEFAULT_BLOCK_BYTES // 32
    assert default_rows(DEFAULT_BLOCK_BYTES * 4) == 1
    assert default_rows(0) == DEFAULT_BLOCK_BYTES  # zero-byte rows (an empty inner dimension)


def test_default_rows_share_the_32_mb_among_the_blocks_in_flight() -> None:
    assert default_rows(32, blocks_in_flight=4) == DEFAULT_BLOCK_BYTES // 4 // 32
    assert default_rows(DEFAULT_BLOCK_BYTES, blocks_in_flight=32) == 1


@pytest.mark.parametrize("rows", [0, -1, 2.5, 1e6, True, "10", None])
def test_check_rows_names_what_was_passed(rows: object) -> None:
    with pytest.raises(ChunkError, match="rows must be") as info:
        check_rows(rows)
    assert repr(rows) in str(info.value) or str(rows) in str(info.value)


def test_check_rows_accepts_numpy_integers() -> None:
    assert check_rows(np.int64(7)) == 7


def test_release_front_releases_whole_pages_behind_finished_blocks() -> None:
    spans = block_spans(10, 4)
    front = ReleaseFront(spans, first_row=PAGE * 100 + 128, stride=PAGE // 2)  # two rows per page
    assert front.finish(0) == (PAGE * 100, PAGE * 102)  # rows 0..3 end 128 bytes into page 102: keep that one
    assert front.finish(1) == (PAGE * 102, PAGE * 104)
    assert front.rest() == (PAGE * 104, PAGE * 106)  # the last rows, up to the end of the page holding them


def test_release_front_waits_for_every_earlier_block_when_blocks_finish_out_of_order() -> None:
    front = ReleaseFront(block_spans(12, 4), first_row=0, stride=PAGE)
    assert front.finish(2) is None  # block 0 still running: nothing before it is free
    assert front.finish(1) is None
    assert front.finish(0) == (0, 12 * PAGE)  # all three at once
    assert front.rest() is None


def test_release_front_never_hands_out_a_byte_twice_with_rows_smaller_than_a_page() -> None:
    front = ReleaseFront(block_spans(1000, 10), first_row=0, stride=8)
    released = [front.finish(i) for i in range(100)] + [front.rest()]
    spans = [r for r in released if r is not None]
    assert spans[0][0] == 0 and spans[-1][1] == 2 * PAGE  # 8000 bytes: two pages
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_false_runs() -> None:
    flags = np.array([True, False, False, True, False], dtype=bool)
    assert false_runs(flags, 10) == [(11, 2), (14, 1)]
    assert false_runs(np.zeros(0, dtype=bool), 0) == []


def test_residency_drops_only_pages_that_were_not_cached_before() -> None:
    residency = Residency(first_page=100)
    residency.record(np.array([True, False, False, True, False, False]))
    assert residency.known_to == 106
    assert residency.take_uncached(104) == [(101, 2)]
    assert residency.take_uncached(106) == [(101, 2), (104, 2)]  # recent pages are handed out once more


def test_residency_hands_out_the_last_folio_of_pages_again_then_forgets_them() -> None:
    residency = Residency(first_page=0)
    residency.record(np.zeros(3 * FOLIO_PAGES, dtype=bool))
    assert residency.take_uncached(2 * FOLIO_PAGES) == [(0, 2 * FOLIO_PAGES)]
    assert residency.take_uncached(3 * FOLIO_PAGES) == [(FOLIO_PAGES, 2 * FOLIO_PAGES)]
    assert residency.take_uncached(3 * FOLIO_PAGES) == [(2 * FOLIO_PAGES, FOLIO_PAGES)]


def test_residency_treats_pages_never_recorded_as_someone_elses() -> None:
    residency = Residency(first_page=0)
    residency.record(np.zeros(4, dtype=bool))
    assert residency.take_uncached(100) == [(0, 4)]


def test_write_behind_keeps_at_most_the_slack_waiting_for_the_disk() -> None:
    queue = WriteBehind(slack_bytes=100)
    assert queue.add(0, 60) == []
    assert queue.add(60, 30) == []
    assert queue.add(90, 30) == [(0, 60)]  # 120 queued > 100: the oldest goes out first
    assert queue.drain() == [(60, 30), (90, 30)]
    assert queue.drain() == []


MAPS = """\
55d0c8a00000-55d0c8a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000400000 r--s 00000000 fd:01 1234                       /data/my features.npy
7f0000400000-7f0000800000 r--s 00400000 fd:01 1234                       /data/my features.npy
7f0000800000-7f0000900000 rw-s 00000000 00:01 77                         /dev/zero (deleted)
7f0000900000-7f0000a00000 rw-s 00000000 fd:01 99                         /spill/apsi-1.npy (deleted)
7f0000a00000-7f0000b00000 rw-p 00000000 00:00 0
7f0000b00000-7f0000c00000 r--p 00001000 fd:01 55                         /data/private.npy
"""


def test_parse_maps_line_reads_sharing_offset_and_paths_with_spaces() -> None:
    regions = [parse_maps_line(line) for line in MAPS.splitlines()]
    heap, features, features_2, zero, spill, anonymous, private = [r for r in regions if r is not None]
    assert (features.start, features.end, features.shared, features.writable) == (0x7F0000000000, 0x7F0000400000,
                                                                                    True, False)
    assert features.path == "/data/my features.npy" and features.is_file
    assert features_2.file_offset == 0x400000
    assert anonymous.path == "" and not anonymous.is_file and not heap.is_file
    assert not zero.is_file  # shared anonymous memory is RAM, not a file on a disk
    assert spill.is_file and spill.writable
    assert not private.shared
    assert parse_maps_line("") is None


def test_region_in_maps_joins_a_mapping_the_kernel_split() -> None:
    region = region_in_maps(MAPS, 0x7F0000100000, 0x7F0000700000)
    assert region is not None
    assert (region.start, region.end, region.file_offset) == (0x7F0000000000, 0x7F0000800000, 0)
    assert region_in_maps(MAPS, 0x7F0000100000, 0x7F0000200000) == parse_maps_line(MAPS.splitlines()[1])


def test_region_in_maps_finds_the_last_mapping() -> None:
    region = region_in_maps(MAPS, 0x7F0000B00000, 0x7F0000C00000)
    assert region is not None and region.path == "/data/private.npy"


@pytest.mark.parametrize("start,end", [
    (0x55D0C8A00010, 0x55D0C8A00020),  # the heap: RAM
    (0x7F0000800000, 0x7F0000800100),  # shared anonymous memory: RAM
    (0x7F0000300000, 0x7F0000880000),  # runs past the file into other memory
    (0x1000, 0x2000),  # before every mapping
    (0x7F0000C00000, 0x7F0000C00100),  # after every mapping
])
def test_region_in_maps_is_none_for_anything_but_one_file(start: int, end: int) -> None:
    assert region_in_maps(MAPS, start, end) is None


def test_rows_follow_each_other_in_c_order_and_column_slices_only() -> None:
    c = np.zeros((5, 4), np.float32)
    f = np.zeros((5, 4), np.float32, order="F")
    assert rows_follow_each_other(c.shape, c.strides, 4)
    assert rows_follow_each_other(c[:, :2].shape, c[:, :2].strides, 4)
    assert not rows_follow_each_other(f.shape, f.strides, 4)
    assert not rows_follow_each_other(c[::-1].shape, c[::-1].strides, 4)
    assert rows_follow_each_other(f[:, :1].shape, f[:, :1].strides, 4)  # one column: still one row after another
    assert rows_follow_each_other((1, 4), f[:1].strides, 4)  # a single row


def test_background_runs_calls_in_order_and_raises_a_failed_one_at_close() -> None:
    done: list[int] = []
    kernel = Background(depth=1)

    def fail() -> None:
        raise RuntimeError("bug in a background call")

    kernel.submit(done.append, 1)
    kernel.submit(fail)
    kernel.submit(done.append, 2)  # the thread keeps serving after a failure, so the caller never blocks
    with pytest.raises(RuntimeError, match="bug in a background call"):
        kernel.close()
    assert done == [1, 2]


def test_background_without_calls_starts_no_thread() -> None:
    before = threading.active_count()
    kernel = Background()
    assert threading.active_count() == before
    kernel.close()
