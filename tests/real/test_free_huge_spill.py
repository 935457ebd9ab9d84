"""Issue 20 item 1: ``free()`` of a spilled array bigger than RAM + swap. Replacing its mapping with anonymous memory
asked the kernel for that much memory, which it refuses (``SystemCallError``, ENOMEM): the file then stayed until
exit, and inside ``memory.map``'s error path that error hid the real one and the output file leaked.

The kernel's refusal is real; only the disk is spared: the spill file is made sparse (no ``posix_fallocate``), so
an array twice the size of RAM + swap costs no disk space and no memory here."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.arrays import spill

pytestmark = pytest.mark.real
psutil = pytest.importorskip("psutil")

ROW_BYTES = 32 * 1024  # the width of each output row of the map below


def bigger_than_memory() -> int:
    """Bytes no anonymous mapping may have here unless the kernel overcommits without limit."""
    return 2 * (psutil.virtual_memory().total + psutil.swap_memory().total)


@pytest.fixture
def sparse_spill(spill_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Spill files without reserved blocks, on a disk that need not hold them."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("the kernel's memory accounting is Linux's")
    monkeypatch.setattr(spill, "_reserve", lambda fd, total: os.ftruncate(fd, total))
    monkeypatch.setattr(spill, "fits", lambda needed, free: True)
    yield spill_dir
    gc.collect()


def test_freeing_a_spilled_array_bigger_than_ram_and_swap_gives_its_file_back(sparse_spill):
    x = memory.array(bigger_than_memory(), "uint8")
    assert memory.on_disk(x)
    view = x[-10:]
    view[:] = 7
    memory.free(x)  # raised SystemCallError (ENOMEM) before the fix
    assert f"{x.filename} (deleted)" in Path("/proc/self/maps").read_text(), \
        "no anonymous memory was mapped over it: the deleted file stays mapped for the view"
    assert os.listdir(sparse_spill) == [], "the file is gone now, not at exit"
    assert all(r.path != x.filename for r in memory.report())
    assert int(view.sum()) == 0, "a view made before free reads zeros, no crash"


def test_a_failing_map_into_an_output_bigger_than_ram_and_swap_raises_its_own_error(sparse_spill):
    rows = bigger_than_memory() // ROW_BYTES
    marks = np.zeros(rows, np.uint8)
    marks[1000:] = 1  # the blocks after the first ones fail

    def widen(block: np.ndarray) -> np.ndarray:
        if block.any():
            raise ValueError("this block is bad")
        return np.zeros((len(block), ROW_BYTES), np.uint8)

    with pytest.raises(memory.BlockError) as caught:  # was SystemCallError (ENOMEM) from freeing the output
        memory.map(widen, marks, rows=1000, workers=2)
    assert isinstance(caught.value.__cause__, ValueError)
    assert os.listdir(sparse_spill) == [], "the output's spill file does not leak"
