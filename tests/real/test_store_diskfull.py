"""A store on a really full disk (a 4 MiB tmpfs): a clear DiskFullError naming the folder, nothing stored is lost,
no partial file is left, and the store takes sets again once there is room."""

from __future__ import annotations

import os

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import DiskFullError

pytestmark = pytest.mark.real


def fill_until_full(s: memory.Store, make) -> tuple[int, DiskFullError]:
    for i in range(100_000):
        try:
            s.set(i, make(i))
        except DiskFullError as err:
            return i, err
    raise AssertionError("the 4 MiB disk never filled up")


def test_big_values_on_a_full_disk(small_disk):
    s = memory.store(str(small_disk / "c"), disk_gb=1)
    stored, err = fill_until_full(s, lambda i: np.full(100_000, i, dtype=np.float64))  # 800 KB files
    assert "no space left" in str(err) and str(small_disk) in str(err) and "free" in str(err)
    assert err.errno == 28 and isinstance(err, OSError)
    assert stored >= 3 and len(s) == stored
    assert len(os.listdir(small_disk / "c" / "data")) == stored  # no partial file left behind
    for i in range(stored):
        assert memory.store(str(small_disk / "c"), disk_gb=1).get(i)[0] == i
    s.delete(0)
    s.set("after", np.zeros(100_000))  # room again: the store works
    assert s.get("after").sum() == 0


def test_small_values_on_a_full_disk(small_disk):
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (1 << 20))
    s = memory.store(str(small_disk / "c"), disk_gb=1)
    stored, err = fill_until_full(s, lambda i: {"i": i, "pad": "x" * 2000})  # inline in the journal
    assert "no space left" in str(err)
    again = memory.store(str(small_disk / "c"), ram_mb=0, disk_gb=1)
    assert len(again) == stored and all(again.get(i)["i"] == i for i in range(stored))
    filler.unlink()  # room again
    s.set("after", 1)
    assert memory.store(str(small_disk / "c"), disk_gb=1).get("after") == 1
    s.clear()  # rewrites the journal: the space comes back
    assert os.path.getsize(small_disk / "c" / "index") < 100
