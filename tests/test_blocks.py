"""The pure rules under chunks/map (``apsi_memory.blocks``): block spans, what may be released when, which pages
were ours, how much written data may wait for the disk. Examples first, then properties over made-up integers
(addresses, page sizes, finishing orders), which is what a module without system calls allows."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from apsi_memory.blocks.rules import (
    DEFAULT_BLOCK_BYTES,
    FOLIO_BYTES,
    ReleaseFront,
    Residency,
    WriteBehind,
    block_spans,
    check_rows,
    default_rows,
    false_runs,
    page_ceil,
    page_floor,
)
from apsi_memory.errors import ChunkError

PAGE = 4096
FOLIO_PAGES = FOLIO_BYTES // PAGE


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
    front = ReleaseFront(spans, first_row=PAGE * 100 + 128, stride=PAGE // 2, page=PAGE)  # two rows per page
    assert front.finish(0) == (PAGE * 100, PAGE * 102)  # rows 0..3 end 128 bytes into page 102: keep that one
    assert front.finish(1) == (PAGE * 102, PAGE * 104)
    assert front.rest() == (PAGE * 104, PAGE * 106)  # the last rows, up to the end of the page holding them


def test_release_front_waits_for_every_earlier_block_when_blocks_finish_out_of_order() -> None:
    front = ReleaseFront(block_spans(12, 4), first_row=0, stride=PAGE, page=PAGE)
    assert front.finish(2) is None  # block 0 still running: nothing before it is free
    assert front.finish(1) is None
    assert front.finish(0) == (0, 12 * PAGE)  # all three at once
    assert front.rest() is None


def test_release_front_never_hands_out_a_byte_twice_with_rows_smaller_than_a_page() -> None:
    front = ReleaseFront(block_spans(1000, 10), first_row=0, stride=8, page=PAGE)
    released = [front.finish(i) for i in range(100)] + [front.rest()]
    spans = [r for r in released if r is not None]
    assert spans[0][0] == 0 and spans[-1][1] == 2 * PAGE  # 8000 bytes: two pages
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_false_runs() -> None:
    flags = np.array([True, False, False, True, False], dtype=bool)
    assert false_runs(flags, 10) == [(11, 2), (14, 1)]
    assert false_runs(np.zeros(0, dtype=bool), 0) == []


def test_residency_drops_only_pages_that_were_not_cached_before() -> None:
    residency = Residency(first_page=100, folio_pages=FOLIO_PAGES)
    residency.record(np.array([True, False, False, True, False, False]))
    assert residency.known_to == 106
    assert residency.take_uncached(104) == [(101, 2)]
    assert residency.take_uncached(106) == [(101, 2), (104, 2)]  # recent pages are handed out once more


def test_residency_hands_out_the_last_folio_of_pages_again_then_forgets_them() -> None:
    residency = Residency(first_page=0, folio_pages=FOLIO_PAGES)
    residency.record(np.zeros(3 * FOLIO_PAGES, dtype=bool))
    assert residency.take_uncached(2 * FOLIO_PAGES) == [(0, 2 * FOLIO_PAGES)]
    assert residency.take_uncached(3 * FOLIO_PAGES) == [(FOLIO_PAGES, 2 * FOLIO_PAGES)]
    assert residency.take_uncached(3 * FOLIO_PAGES) == [(2 * FOLIO_PAGES, FOLIO_PAGES)]


def test_residency_treats_pages_never_recorded_as_someone_elses() -> None:
    residency = Residency(first_page=0, folio_pages=FOLIO_PAGES)
    residency.record(np.zeros(4, dtype=bool))
    assert residency.take_uncached(100) == [(0, 4)]


def test_write_behind_keeps_at_most_the_slack_waiting_for_the_disk() -> None:
    queue = WriteBehind(slack_bytes=100)
    assert queue.add(0, 60) == []
    assert queue.add(60, 30) == []
    assert queue.add(90, 30) == [(0, 60)]  # 120 queued > 100: the oldest goes out first
    assert queue.drain() == [(60, 30), (90, 30)]
    assert queue.drain() == []


# -- properties ----------------------------------------------------------------------------------------------------

PAGES = st.sampled_from([512, 4096, 16384, 65536])  # 4 KiB (x86-64), 16 and 64 KiB (arm64, ppc64le)


@given(n_rows=st.integers(0, 300), rows=st.integers(1, 50))
def test_block_spans_tile_the_rows_in_blocks_of_rows(n_rows: int, rows: int) -> None:
    spans = block_spans(n_rows, rows)
    assert [start for start, _ in spans] == list(range(0, n_rows, rows))
    assert all(stop - start == rows for start, stop in spans[:-1])
    assert (spans[-1][1] if spans else 0) == n_rows and all(stop > start for start, stop in spans)


@given(address=st.integers(0, 2**48), page=PAGES)
def test_page_floor_and_ceil_are_the_pages_around_an_address(address: int, page: int) -> None:
    low, high = page_floor(address, page), page_ceil(address, page)
    assert low % page == 0 and high % page == 0
    assert low <= address <= high and high - low in (0 if address % page == 0 else page,)


@st.composite
def streams(draw: st.DrawFn) -> tuple[ReleaseFront, list[int], int]:
    """A release front over random rows, the order its blocks finish in, and how many finish before an early exit
    (all of them when the stream runs to its end)."""
    spans = block_spans(draw(st.integers(1, 200)), draw(st.integers(1, 40)))
    page = draw(PAGES)
    front = ReleaseFront(spans, draw(st.integers(0, 2**40)), draw(st.integers(1, 3 * page)), page)
    order = draw(st.permutations(range(len(spans))))
    return front, order, draw(st.integers(0, len(spans)))


@given(streams())
def test_release_front_hands_out_each_whole_page_once_and_never_one_a_running_block_uses(
        stream: tuple[ReleaseFront, list[int], int]) -> None:
    front, order, n_finished = stream
    released, finished = [], set()
    for index in order[:n_finished]:
        finished.add(index)
        span = front.finish(index)
        if span is not None:
            released.append(span)
        running = [front.spans[i][0] for i in range(len(front.spans)) if i not in finished]
        if running and released:  # nothing at or after the first row of the first block still running
            assert released[-1][1] <= front.row_address(min(running))
    rest = front.rest()
    released += [rest] if rest is not None else []
    assert released[0][0] == page_floor(front.first_row, front.page)
    assert released[-1][1] == page_ceil(front.row_address(front.spans[-1][1]), front.page)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(released))  # contiguous: each byte once
    assert all(start < end and start % front.page == end % front.page == 0 for start, end in released)


@given(st.lists(st.booleans(), max_size=200), st.integers(0, 10**9))
def test_false_runs_are_exactly_the_false_flags_in_maximal_runs(flags: list[bool], offset: int) -> None:
    runs = false_runs(np.array(flags, dtype=bool), offset)
    covered = [page for start, count in runs for page in range(start, start + count)]
    assert covered == [offset + i for i, flag in enumerate(flags) if not flag]
    assert all(a[0] + a[1] < b[0] for a, b in itertools.pairwise(runs))  # separate runs: never two touching


@given(cached=st.lists(st.booleans(), min_size=1, max_size=300), first_page=st.integers(0, 10**6),
       folio_pages=st.integers(1, 64), data=st.data())
def test_residency_hands_out_every_uncached_page_released_never_a_cached_one_and_repeats_only_the_last_folio(
        cached: list[bool], first_page: int, folio_pages: int, data: st.DataObject) -> None:
    residency = Residency(first_page, folio_pages)
    recorded = 0
    for size in data.draw(st.lists(st.integers(1, 50), max_size=10)):  # recorded in pieces, as read-ahead goes
        piece = cached[recorded:recorded + size]
        residency.record(np.array(piece, dtype=bool))
        recorded += len(piece)
    uncached = {first_page + i for i, flag in enumerate(cached[:recorded]) if not flag}
    handed: set[int] = set()
    released_to = first_page
    for end in sorted(data.draw(st.lists(st.integers(first_page, first_page + 400), max_size=8))):
        pages = {page for start, count in residency.take_uncached(end) for page in range(start, start + count)}
        assert pages <= uncached and all(page < end for page in pages)
        assert all(page >= released_to - folio_pages for page in pages & handed)  # the last folio, once more
        handed |= pages
        released_to = min(end, first_page + recorded)
    assert {page for page in uncached if page < released_to} <= handed


@given(slack=st.integers(0, 1000), lengths=st.lists(st.integers(1, 500), max_size=30))
def test_write_behind_keeps_at_most_the_slack_queued_and_writes_each_range_once_in_order(
        slack: int, lengths: list[int]) -> None:
    queue = WriteBehind(slack)
    added = list(zip(itertools.accumulate([0] + lengths), lengths))
    written: list[tuple[int, int]] = []
    for i, (offset, length) in enumerate(added):
        written += queue.add(offset, length)
        assert sum(queued for _, queued in added[len(written):i + 1]) <= slack  # what still waits for the disk
    assert written + queue.drain() == added
