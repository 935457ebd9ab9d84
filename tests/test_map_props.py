"""Property: for any shape, dtype, ``rows`` and number of workers, ``map`` with an elementwise function equals
applying it to the whole array — from RAM, a memmap or a file."""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from tests.strategies import SOURCES, arrays_of, as_source


def quiet(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """Integer overflow wraps the same way block by block as whole; the warning is noise here (and NumPy's error
    state is per thread, so it is set inside the function that the workers run)."""
    def run(b: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(b)
    return run


ELEMENTWISE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "square": quiet(np.square),
    "affine": quiet(lambda b: b * 2 + 1),
    "to float32": quiet(lambda b: b.astype(np.float32)),
}


@settings(max_examples=120, deadline=None)
@given(x=arrays_of(st.sampled_from(["int8", "<i4", ">i8", "float32", "<f8"])), rows=st.integers(1, 50),
       kind=SOURCES, fn=st.sampled_from(sorted(ELEMENTWISE)), workers=st.integers(1, 3))
def test_map_of_an_elementwise_fn_equals_applying_it_to_the_whole(x: np.ndarray, rows: int, kind: str, fn: str,
                                                                  workers: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        y = memory.map(ELEMENTWISE[fn], as_source(x, kind, folder), rows=rows, workers=workers)
        expected = ELEMENTWISE[fn](x)
        assert y.shape == expected.shape and y.dtype == expected.dtype
        np.testing.assert_array_equal(y, expected)
