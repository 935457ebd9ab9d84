"""Issue 20 items 10 and 8 (the store's parts): one named error for a value that cannot be pickled, one behaviour
for a value that cannot be unpickled whichever tier holds it, a clear error for a store sent to another process,
and the same checks for ``Store(...)`` made directly as for ``memory.store(...)``."""

from __future__ import annotations

import multiprocessing
import pickle

import pytest

import apsi_memory as memory
from apsi_memory.errors import ArgumentError, ArgumentTypeError, SizeError, UnloadableWarning, UnsafePathError
from apsi_memory.store import Store


class RefusesPickling:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def __reduce__(self) -> tuple[object, ...]:
        raise self.error


def fails_to_load() -> None:
    raise RuntimeError("this class changed since it was stored")


class Unloadable:
    """Pickles fine; unpickling it fails (as when its class changed since it was stored)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (fails_to_load, ())


@pytest.mark.parametrize("error", [ValueError("no"), RuntimeError("no"), OSError("no"), KeyError("no"),
                                   pickle.PicklingError("no"), TypeError("no")])
def test_a_value_that_cannot_be_pickled_is_one_named_error_and_nothing_is_stored(error):
    s = memory.store("t")
    with pytest.raises(ArgumentTypeError, match="RefusesPickling.*cannot be pickled"):
        s.set("k", RefusesPickling(error))
    assert "k" not in s and len(s) == 0


def test_a_value_nested_too_deeply_to_pickle_is_the_same_named_error():
    nested: list[object] = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(ArgumentTypeError, match="cannot be pickled"):
        memory.store("t").set("k", nested)


@pytest.mark.parametrize("ram_mb", [256, 0], ids=["RAM tier", "SSD tier"])
def test_a_value_that_cannot_be_unpickled_is_a_warned_miss_from_either_tier(ram_mb):
    """Before the fix the RAM tier raised the unpickling error while the SSD tier warned and missed."""
    s = memory.store("t", ram_mb=ram_mb)
    s.set("k", Unloadable())
    for _ in range(2):
        with pytest.warns(UnloadableWarning, match="cannot be loaded here"):
            assert s.get("k", "miss") == "miss"
    assert "k" in s, "left in place for the processes that can load it"
    assert (s.stats().hits, s.stats().misses) == (0, 2), "a warned miss is a miss, never a hit as well"


def test_a_store_sent_to_another_process_says_to_open_it_there_by_name():
    s = memory.store("t")
    with pytest.raises(ArgumentTypeError, match=r"open it there by name.*memory\.store\('t'\)"):
        pickle.dumps(s)
    child = multiprocessing.get_context("spawn").Process(target=print, args=(s,))
    with pytest.raises(ArgumentTypeError, match="open it there by name"):
        child.start()


def test_a_store_made_directly_outside_the_allowed_folders_is_refused_and_nothing_is_made(tmp_path, monkeypatch):
    """Before the fix ``Store(...)`` skipped ``allow_write``: the tester made a store folder under /etc."""
    folder = tmp_path / "not allowed" / "s"
    with pytest.raises(UnsafePathError, match="allow_write"):
        Store(str(folder), "s", 0, 1 << 20)
    assert not folder.parent.exists()
    monkeypatch.setenv("APSI_ALLOW_WRITE", str(tmp_path))
    Store(str(folder), "s", 0, 1 << 20).close()  # allowed now, as for memory.store


@pytest.mark.parametrize(("limit", "error"), [(-1, ArgumentError), (2**63, ArgumentError)] + [
    (wrong, ArgumentTypeError) for wrong in (float("nan"), float("inf"), True, 1.5, "1", None)])
@pytest.mark.parametrize("which", [0, 1], ids=["ram_bytes", "disk_bytes"])
def test_store_limits_made_directly_must_be_whole_bytes_of_at_least_zero(home, limit, error, which):
    """The check ``Pool(max_bytes)`` makes (``units.byte_count``): a type error for what is not a whole number."""
    limits = [0, 1 << 20]
    limits[which] = limit
    with pytest.raises(error, match=f"Store: {['ram_bytes', 'disk_bytes'][which]}"):
        Store(str(home / "stores" / "s"), "s", *limits)


@pytest.mark.parametrize("limit", [-1, -0.5, float("nan"), float("inf"), float("-inf"), True, "1", None])
@pytest.mark.parametrize("which", ["ram_mb", "disk_gb"])
def test_store_limits_must_be_finite_numbers_of_at_least_zero(limit, which):
    with pytest.raises(SizeError, match=which):
        memory.store("t", **{which: limit})
