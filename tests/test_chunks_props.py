"""Property: for any shape, dtype and ``rows``, the blocks of ``chunks`` put back together are the source — from
RAM, a memmap or a file."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from tests.strategies import SOURCES, arrays_of, as_source


def joined(blocks: Iterator[np.ndarray], like: np.ndarray) -> np.ndarray:
    parts = list(blocks)
    return np.concatenate(parts) if parts else like[:0]


@settings(max_examples=120, deadline=None)
@given(x=arrays_of(), rows=st.integers(1, 50), kind=SOURCES)
def test_chunks_put_back_together_are_the_source(x: np.ndarray, rows: int, kind: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        blocks = list(memory.chunks(as_source(x, kind, folder), rows=rows))
        assert all(len(b) == rows for b in blocks[:-1])
        assert all(0 < len(b) <= rows and b.shape[1:] == x.shape[1:] and b.dtype == x.dtype for b in blocks)
        np.testing.assert_array_equal(joined(iter(blocks), x), x)
        assert len(blocks) == -(-len(x) // rows)
