"""Issue 28 item 4: ``@cached`` never hit on PyTorch tensor arguments (equal tensors and restarts: 0 hits, the store
filled with duplicates), because a tensor's pickle holds its storage's identity. Tensors are hashed by dtype, shape,
device type and bytes as NumPy arrays are; an argument type whose equal copies hash apart is named by a warning;
``memory.array(shape, torch.float32)`` is accepted."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory

_serial = itertools.count()


class Ticket:
    """Pickles with a serial number: two equal tickets never pickle alike (as a tensor's storage did)."""

    def __init__(self, seat: int) -> None:
        self.seat = seat

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.seat, next(_serial)))


def _rebuild(seat: int, serial: int) -> Ticket:
    return Ticket(seat)


class Seat:
    def __init__(self, row: int) -> None:
        self.row = row


def test_an_argument_that_does_not_hash_by_value_is_named_once(tmp_path: Path) -> None:
    @memory.cached(store="by-value")
    def price(ticket: Ticket) -> int:
        return ticket.seat * 10

    with pytest.warns(memory.CacheKeyWarning, match=r"argument 'ticket' \(tests\.test_cached_by_value\.Ticket\) is not "
                      r"hashed by value: an equal one gives another key, so calls with it never hit") as caught:
        assert price(Ticket(3)) == 30
    assert caught[0].filename == __file__  # at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        price(Ticket(4))  # once per type


def test_an_argument_that_hashes_by_value_warns_nothing_and_hits(tmp_path: Path) -> None:
    @memory.cached(store="by-value")
    def rows(seat: Seat, table: dict[str, Any]) -> int:
        return seat.row + len(table)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rows(Seat(2), {"a": np.arange(3), "b": {1, 2}}) == 4
        assert rows(Seat(2), {"a": np.arange(3), "b": {2, 1}}) == 4
    assert rows.stats().hits == 1


torch_only = pytest.mark.torch


@torch_only
def test_equal_tensors_hit_in_this_process_and_after_a_restart(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    program = textwrap.dedent("""
        import warnings, torch, apsi_memory as memory
        warnings.simplefilter("error")
        @memory.cached(store="tensors")
        def embed(x, w):
            return (x.float() @ w).sum().item()
        w = torch.nn.Parameter(torch.ones(4, 2))
        for _ in range(3):
            embed(torch.arange(8.).reshape(2, 4), w)
        embed(torch.arange(8.).reshape(2, 4).double(), w)   # another dtype: another key
        embed(torch.arange(8.).reshape(4, 2).t(), w)        # same values, not contiguous: the same key as ...
        embed(torch.arange(8.).reshape(4, 2).t().contiguous(), w)
        s = embed.stats()
        print(s.hits, s.misses, len(list(embed.store)))
    """)
    first = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240, check=False)
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == ["3", "3", "3"]  # hits: 2 repeats + the contiguous copy; 3 entries
    again = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240, check=False)
    assert again.stdout.split() == ["6", "0", "3"], again.stderr  # a restart: every call hits, nothing added


@torch_only
def test_a_torch_dtype_makes_the_numpy_array_that_from_numpy_shares() -> None:
    torch = pytest.importorskip("torch")
    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8, torch.bool, torch.complex64):
        x = memory.array((3, 4), dtype)
        t = torch.from_numpy(x)
        t[0, 0] = 1
        assert t.dtype == dtype and bool(x[0, 0]) and x.shape == (3, 4)
    with pytest.raises(memory.ArgumentTypeError, match="torch.bfloat16 has no NumPy equivalent"):
        memory.array(3, torch.bfloat16)
