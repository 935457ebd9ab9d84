"""``apsi_memory.blocks.sources``: which layouts can be streamed as blocks of rows (the bad-input errors at the call are
tested through ``memory.chunks`` in test_chunks)."""

from __future__ import annotations

import numpy as np

from apsi_memory.blocks.sources import rows_follow_each_other


def test_rows_follow_each_other_in_c_order_and_column_slices_only() -> None:
    c = np.zeros((5, 4), np.float32)
    f = np.zeros((5, 4), np.float32, order="F")
    assert rows_follow_each_other(c.shape, c.strides, 4)
    assert rows_follow_each_other(c[:, :2].shape, c[:, :2].strides, 4)
    assert not rows_follow_each_other(f.shape, f.strides, 4)
    assert not rows_follow_each_other(c[::-1].shape, c[::-1].strides, 4)
    assert rows_follow_each_other(f[:, :1].shape, f[:, :1].strides, 4)  # one column: still one row after another
    assert rows_follow_each_other((1, 4), f[:1].strides, 4)  # a single row
