"""Hypothesis strategies and sources that the property tests of ``chunks`` and ``map`` share (not a test module:
test modules import from here, never from each other)."""

from __future__ import annotations

import os

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

DTYPES = st.sampled_from(["int8", "uint16", "<i4", ">i8", "float32", "<f8", "complex64", "bool", "S3", "<U2"])
SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=40)
SOURCES = st.sampled_from(["ram", "file", "memmap"])


def arrays_of(dtypes: st.SearchStrategy[str] = DTYPES) -> st.SearchStrategy[np.ndarray]:
    return dtypes.flatmap(lambda dtype: hnp.arrays(np.dtype(dtype), SHAPES))


def as_source(x: np.ndarray, kind: str, folder: str) -> np.ndarray | str:
    """``x`` as a source of that kind: the array itself, a ``.npy`` path in ``folder``, or a memmap of it."""
    if kind == "ram":
        return x
    path = os.path.join(folder, "x.npy")
    np.save(path, x)
    return path if kind == "file" else np.load(path, mmap_mode="r")
