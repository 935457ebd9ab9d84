"""What users of joblib.Memory and diskcache expect of a cache (issue 21, item 6): ``with memory.store(...)``,
hit/miss/eviction counts for a store and for a ``@cached`` function, ``f.clear()`` of one function's entries, a
warning naming the inputs a ``@cached`` function reads that are not part of its key, and store names that never
depend on the working folder."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory import CacheKeyWarning, CacheStats
from apsi_memory.errors import ArgumentError, StoreClosedError
from tests.bodies import RUNS, ran


@pytest.fixture(autouse=True)
def no_runs_yet() -> None:
    RUNS.clear()


def test_a_store_is_a_context_manager_that_closes_it():
    with memory.store("ctx") as s:
        s.set("a", 1)
        assert s["a"] == 1
    with pytest.raises(StoreClosedError, match="ctx"):
        s.get("a")
    with memory.store("ctx") as again:
        assert again["a"] == 1  # closed, not cleared


KIB_200 = 200 * 1024 // 8  # float64 elements in 200 KiB: a file of its own each


def test_a_store_counts_its_hits_misses_and_evictions():
    s = memory.store("counted", disk_gb=1 / 1024)  # 1 MiB on the SSD
    assert s.stats() == CacheStats(hits=0, misses=0, evictions=0)
    for i in range(8):  # 1.6 MiB in all: the oldest go
        s.set(i, np.full(KIB_200, i, dtype=np.float64))
    kept = [i for i in range(8) if i in s]
    assert kept and len(kept) < 8
    for i in range(8):
        s.get(i)
    s.relieve()
    s.get(kept[-1])  # a hit from the SSD counts the same
    assert s.stats() == CacheStats(hits=len(kept) + 1, misses=8 - len(kept), evictions=8 - len(kept))


def test_a_cached_function_counts_its_own_hits_misses_and_evictions():
    s = memory.store("shared", disk_gb=1 / 1024)

    @memory.cached(store=s)
    def f(i):
        return np.full(KIB_200, i, dtype=np.float64)

    @memory.cached(store=s)
    def g(i):
        return np.full(KIB_200, -i, dtype=np.float64)

    for i in range(4):
        f(i)
    f(3)
    assert f.stats() == CacheStats(hits=1, misses=4, evictions=0)
    for i in range(4):  # g's 800 KiB push f's (least recently used) out of the 1 MiB
        g(i)
    assert f.stats().evictions == 4 and g.stats() == CacheStats(hits=0, misses=4, evictions=0)
    assert s.stats().evictions == 4


def test_clear_removes_one_functions_entries_only():
    @memory.cached(store="two")
    def f(x):
        ran("f")
        return x

    @memory.cached(store="two")
    def g(x):
        ran("g")
        return -x

    for x in range(3):
        f(x), g(x)
    assert f.clear() == 3 and len(f.store) == 3
    for x in range(3):
        f(x), g(x)
    assert RUNS == ["f", "g"] * 3 + ["f"] * 3  # f ran again, g's entries stayed
    assert f.clear() == 3 and g.clear() == 3 and len(g.store) == 0


def test_clear_before_the_first_call_opens_the_store():
    @memory.cached(store="fresh")
    def f(x):
        return x

    assert f.clear() == 0 and f.store is not None


def make_scaler(scale):
    @memory.cached
    def scaled(x):
        return x * scale
    return scaled


def test_a_closure_is_warned_about_by_its_variables_names():
    """``make_scaler(2)`` and ``make_scaler(3)`` share one key: the warning says why (test first failed: silent)."""
    with pytest.warns(CacheKeyWarning, match=r"make_scaler.<locals>.scaled reads closure variable 'scale', which is "
                                              r"not part of its key"):
        two = make_scaler(2)
    with pytest.warns(CacheKeyWarning):
        three = make_scaler(3)
    assert two(5) == 10 and three(5) == 10  # the trap the warning names


MODULE = """
import numpy as np
import os

SCALE = 2.0
NAMES = ("a", "b")
CONFIG = {"power": 2}
WEIGHTS = np.ones(3)

def helper(x):
    return x

class Model:
    pass

def f(x):
    return helper(np.sum([SCALE * v for v in x])) ** CONFIG["power"] + len(NAMES) + WEIGHTS[0] + len(os.sep)

def g(x):
    return Model, helper(x) * SCALE, NAMES
"""


def module_function(name: str) -> object:
    namespace: dict[str, object] = {"__name__": "work"}
    exec(compile(MODULE, "work.py", "exec"), namespace)  # noqa: S102 (the test's own source: a module body)
    return namespace[name]


def test_mutable_globals_are_warned_about_by_name_and_type_and_nothing_else_is():
    with pytest.warns(CacheKeyWarning) as caught:
        memory.cached(module_function("f"))
    (warning,) = caught
    assert "reads global 'CONFIG' (dict), global 'WEIGHTS' (ndarray), which are not part of its key" in \
        str(warning.message)  # modules, functions, classes and constants (SCALE, NAMES) are read silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory.cached(module_function("g"))


def test_the_warning_points_at_the_decorating_line():
    with pytest.warns(CacheKeyWarning) as caught:
        make_scaler(1)
    assert caught[0].filename == __file__


def test_a_store_name_with_a_separator_is_refused_never_made_in_the_working_folder(tmp_path, monkeypatch):
    """"a/b" was a store in the working folder, wherever the program was started (test first failed: made)."""
    memory.allow_write(tmp_path)
    monkeypatch.chdir(tmp_path)
    for name in ("sub/cache", "./cache", ".cache", Path("sub") / "cache"):
        with pytest.raises(ArgumentError, match=r"relative path.*os\.path\.abspath"):
            memory.store(name)
    assert os.listdir(tmp_path) == []
    with memory.store(tmp_path / "cache") as s:  # an absolute path under an allowed root: as before
        s.set("k", 1)
    assert os.listdir(tmp_path) == ["cache"]
