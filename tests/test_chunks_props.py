"""Property: for any shape, dtype and ``rows``, the blocks of ``chunks`` put back together are the source — from
RAM, a memmap or a file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import apsi_memory as memory

DTYPES = st.sampled_from(["int8", "uint16", "<i4", ">i8", "float32", "<f8", "complex64", "bool", "S3", "<U2"])
SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=40)
SOURCES = st.sampled_from(["ram", "file", "memmap"])


def arrays_of(dtypes: st.SearchStrategy[str] = DTYPES) -> st.SearchStrategy[np.ndarray]:
    return dtypes.flatmap(lambda dtype: hnp.arrays(np.dtype(dtype), SHAPES))


def as_source(x: np.ndarray, kind: str, folder: str) -> np.ndarray | str:
    if kind == "ram":
        return x
    path = os.path.join(folder, "x.npy")
    np.save(path, x)
    return path if kind == "file" else np.load(path, mmap_mode="r")


@pytest.fixture(autouse=True)
def _spill_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_SPILL_DIR", str(tmp_path_factory.mktemp("spill")))


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
