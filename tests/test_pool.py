"""memory.pool: reuse, zeroing, bounds, drop order, pressure, and the errors of give."""

from __future__ import annotations

import gc
import threading

import numpy as np
import psutil
import pytest

import apsi_memory as memory
from apsi_memory.arrays.pools import PAGE, Pool, _clearer, capacity_for, choose_spare, oldest_to_drop
from apsi_memory.decide import Level
from sim.tree import MiB


def address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def wait_until_cleared(p: Pool, count: int) -> None:
    """The background thread has cleared everything given back so far (it says so: no sleeping)."""
    assert _clearer.wait_idle(timeout=10), f"the background clearing did not finish: {p!r}"
    assert p.cleared >= count


# -- pure rules ---------------------------------------------------------------------------------------------------

def test_choose_spare_takes_the_smallest_fitting_idle_one_and_only_cleared_ones_for_zero():
    mb = MiB
    spares = [(4 * mb, False, False), (2 * mb, True, False), (2 * mb, False, False), (2 * mb, True, True)]
    assert choose_spare(spares, 2 * mb, zero=False) == 2  # dirty before clean; the busy one never
    assert choose_spare(spares, 2 * mb, zero=True) == 1
    assert choose_spare(spares, 3 * mb, zero=False) == 0  # 4 MiB serves 3 MiB (wastes under half)
    assert choose_spare(spares, 3 * mb, zero=True) is None  # the only fitting one is dirty
    assert choose_spare(spares, 1 * mb, zero=False) == 2  # 2 MiB serves 1 MiB, 4 MiB would waste too much
    assert choose_spare(spares, 5 * mb, zero=False) is None
    assert choose_spare([(mb, True, False), (mb, True, False)], mb, zero=True) == 0  # the oldest of equals


def test_oldest_spares_are_dropped_first_down_to_the_bound():
    assert oldest_to_drop([3, 2, 2], 4) == 1
    assert oldest_to_drop([3, 2, 2], 7) == 0
    assert oldest_to_drop([1, 1, 9], 4) == 3  # the newest alone is over the bound
    assert oldest_to_drop([], 0) == 0


def test_buffers_are_whole_pages():
    assert capacity_for(0) == PAGE and capacity_for(PAGE + 1) == 2 * PAGE


# -- take and give ------------------------------------------------------------------------------------------------

def test_a_given_back_buffer_is_handed_out_again_already_mapped(pressure_machine):
    p = Pool(64 * MiB)
    a = p.take((512, 1024), zero=False)
    where = address(a)
    a[:] = 7.0
    p.give(a)
    b = p.take((1024, 512), "float64", zero=False)  # the same bytes, another shape
    assert address(b) == where and b.shape == (1024, 512) and b[0, 0] == 7.0


def test_take_with_zero_always_gives_zeros_and_reuses_cleared_buffers(pressure_machine):
    p = Pool(64 * MiB)
    a = p.take((256, 1024))
    assert not a.any()
    a[:] = 1.0
    p.give(a)
    b = p.take((256, 1024))
    assert not b.any()  # right after a give: cleared in time, or fresh memory; zeros either way
    b[:] = 2.0
    p.give(b)
    wait_until_cleared(p, p.spares)
    c = p.take((256, 1024))
    assert not c.any() and address(c) in {address(a), address(b)}  # a cleared spare, already mapped


def test_a_shape_no_spare_fits_is_a_fresh_allocation(pressure_machine):
    p = Pool(64 * MiB)
    p.give(p.take(1000, zero=False))
    big = p.take((2048, 1024), zero=False)
    assert big.shape == (2048, 1024) and p.spares == 1


def test_spares_are_bounded_and_the_oldest_go_first(pressure_machine):
    p = Pool(3 * MiB)
    arrays = [p.take(MiB // 8, zero=False) for _ in range(4)]
    where = [address(a) for a in arrays]
    for a in arrays:
        p.give(a)
    assert p.spares == 3 and p.spare_bytes == 3 * MiB
    again = {address(p.take(MiB // 8, zero=False)) for _ in range(3)}
    assert again == set(where[1:])  # the first given back was dropped


def test_a_buffer_larger_than_the_bound_is_not_kept(pressure_machine):
    p = Pool(MiB)
    p.give(p.take(MiB // 4, zero=False))
    assert p.spares == 0


def test_a_given_back_array_becomes_read_only(pressure_machine):
    p = Pool(MiB)
    a = p.take(100)
    p.give(a)
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1.0


@pytest.mark.parametrize("make_view", [lambda a: a[10:], lambda a: a.reshape(10, 10), lambda a: a.T[::2],
                                       lambda a: a[:50][5:]], ids=["slice", "reshape", "strided", "view of a view"])
def test_a_view_kept_past_give_never_writes_into_the_next_take(pressure_machine, make_view):
    """NumPy cannot make a view read-only after the fact (only mprotect could, and then a stale write would crash
    the process): a buffer with a view still alive at give is not reused, so the view writes into memory no
    later take is handed, and keeps its values."""
    p = Pool(MiB)
    a = p.take(100, zero=False)
    a[:] = 1.0
    view = make_view(a)
    p.give(a)
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 3.0
    b = p.take(100, zero=False)
    b[:] = 2.0
    view[...] = 9.0  # a stale write, as a bug would make it
    assert (b == 2.0).all() and (view == 9.0).all()
    assert address(b) != address(a) and p.spares == 0


def test_a_buffer_is_reused_once_the_view_that_kept_it_is_gone_whatever_names_the_array_has(pressure_machine):
    p = Pool(MiB)
    a = p.take(100, zero=False)
    view, alias, held = a[1:], a, [a, a]
    del view
    p.give(alias)
    assert address(p.take(100, zero=False)) == address(a) and held[0] is a


@pytest.mark.parametrize("wrong,message", [
    ("twice", "already given back"),
    ("view", "not handed out by this pool"),
    ("copy", "not handed out by this pool"),
    ("other pool", "not handed out by this pool"),
    ("numpy", "not handed out by this pool"),
])
def test_giving_back_what_the_pool_did_not_hand_out_is_a_clear_error(pressure_machine, wrong, message):
    p, other = Pool(MiB), Pool(MiB)
    a = p.take(100)
    candidates = {"view": lambda: a[1:], "copy": lambda: a.copy(), "other pool": lambda: other.take(100),
                  "numpy": lambda: np.zeros(100)}
    if wrong == "twice":
        p.give(a)
        given = a
    else:
        given = candidates[wrong]()
    with pytest.raises(memory.PoolError, match=message):
        p.give(given)
    assert isinstance(memory.PoolError("x"), ValueError)


def test_give_refuses_what_is_not_an_array(pressure_machine):
    with pytest.raises(memory.PoolError, match="list"):
        Pool(MiB).give([1.0])  # type: ignore[arg-type]


def test_an_array_never_given_back_is_freed_when_no_longer_used(pressure_machine):
    p = Pool(64 * MiB)
    a = p.take(1000)
    assert p.out == 1
    del a
    gc.collect()
    assert p.out == 0 and p.spares == 0


# -- sizes and pressure ---------------------------------------------------------------------------------------------

def test_the_default_bound_is_a_tenth_of_the_budget_and_sizes_are_read_like_everywhere(pressure_machine):
    memory.budget("100MB")
    assert memory.pool().max_bytes == 10 * MiB
    assert memory.pool("512MB").max_bytes == 512 * MiB and memory.pool(0.5).max_bytes == 512 * MiB
    with pytest.raises(memory.SizeError, match="lots"):
        memory.pool("lots")


def test_high_pressure_drops_every_spare_and_keeps_none_until_memory_is_back(pressure_machine):
    p = Pool(64 * MiB)
    held = [p.take(MiB // 8, zero=False) for _ in range(3)]
    for a in held[:2]:
        p.give(a)
    assert p.spares == 2
    pressure_machine.at(Level.HIGH)
    pressure_machine.next_measurement()
    p.take(10, zero=False)  # the allocation path measures the level and tells every component
    assert p.spares == 0
    p.give(held[2])
    assert p.spares == 0
    pressure_machine.at(Level.OK)
    pressure_machine.next_measurement()
    p.give(p.take(MiB // 8, zero=False))
    assert p.spares == 1


def test_relieve_drops_the_spares_and_their_ram_now(pressure_machine):
    p = Pool(256 * MiB)
    a = p.take(64 * MiB, "uint8", zero=False)
    a[:] = 1
    p.give(a)  # ``a`` (a stale reference) still points at the buffer
    before = psutil.Process().memory_info().rss
    memory.relieve()
    assert p.spares == 0
    assert before - psutil.Process().memory_info().rss > 60 * MiB
    assert int(a[::4096].sum()) == 0  # the stale reference reads zeros, no crash


def test_threads_sharing_a_pool_never_get_the_same_buffer(pressure_machine):
    p = Pool(16 * MiB)
    clashes = []

    def work(mark: float) -> None:
        for _ in range(200):
            a = p.take(MiB // 8, zero=mark > 1)  # one thread asks for cleared buffers, the other does not
            a[:] = mark
            if not (a == mark).all():
                clashes.append(mark)
            p.give(a)

    threads = [threading.Thread(target=work, args=(mark,)) for mark in (1.0, 2.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clashes == [] and p.out == 0


def _clearer_thread() -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == "apsi-pool-clearer"), None)


def test_the_clearing_thread_ends_when_idle_and_comes_back(pressure_machine, monkeypatch: pytest.MonkeyPatch):
    # A program that used a pool once and then forks should not fork with our thread running.
    from apsi_memory.arrays.pools import _Clearer

    monkeypatch.setattr(_Clearer, "IDLE_SECONDS", 0.05)
    p = Pool(64 * MiB)
    a = p.take((256, 1024))
    for round_ in range(2):
        a[:] = 7
        p.give(a)
        thread = _clearer_thread()
        assert thread is not None, f"round {round_}: no thread cleared the buffer given back"
        thread.join(5)  # it ends by itself after IDLE_SECONDS without work
        assert _clearer_thread() is None, f"round {round_}: the idle thread did not end"
        b = p.take((256, 1024), zero=True)  # the spare, cleared before the thread ended
        assert address(b) == address(a) and not b.any()
        a = b
