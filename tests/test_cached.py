"""@memory.cached: results survive restarts; the key covers the code and the arguments (arrays by content)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.store.hashing import array_digest, value_digest
from tests.bodies import RUNS, ran


@pytest.fixture(autouse=True)
def no_runs_yet() -> None:
    RUNS.clear()


def test_a_second_call_with_equal_arguments_does_not_run_the_body():
    @memory.cached
    def square(x, power=2):
        ran(x)
        return {"x": x ** power}

    assert square(3) == {"x": 9}
    assert square(3) == {"x": 9} and square(x=3) == {"x": 9} and square(3, power=2) == {"x": 9}
    assert square(3, 3) == {"x": 27} and square(4) == {"x": 16}
    assert RUNS == [3, 3, 4]


def test_none_results_are_cached_too():
    @memory.cached
    def nothing(x):
        ran(x)

    assert nothing(1) is None and nothing(1) is None
    assert RUNS == [1]


def test_arrays_are_keyed_by_content():
    @memory.cached
    def double(a):
        ran(1)
        return a * 2

    a = np.arange(100_000, dtype=np.float32)
    np.testing.assert_array_equal(double(a), a * 2)
    np.testing.assert_array_equal(double(a.copy()), a * 2)  # equal content, another object: a hit
    assert len(RUNS) == 1
    b = a.copy()
    b[-1] = -1
    double(b)  # one element differs: a miss
    double(a.astype(np.float64))  # same values, another dtype: a miss
    double(a.reshape(1000, 100))  # same bytes, another shape: a miss
    assert len(RUNS) == 4


@pytest.mark.parametrize("n", [10, 1_000_000], ids=["small", "big"])
def test_a_hit_is_writable_like_the_miss_and_writing_it_never_changes_the_cache(n):
    """``x = load(n); x += 1`` works on every run, as on any NumPy array, from the RAM tier and from the SSD (test
    first failed: a hit was read-only, "output array is read-only")."""

    @memory.cached
    def load(n):
        ran(n)
        return np.arange(n, dtype=np.float64)

    for where in ("miss", "RAM hit", "RAM hit", "SSD hit"):
        if where == "SSD hit":
            load.store.relieve()  # the RAM tier given back: read from the SSD
        x = load(n)
        x += 1
        assert x[0] == 1 and x[-1] == n, where
    assert RUNS == [n]


def test_results_survive_a_restart_and_big_arrays_come_back_memory_mapped(home, tmp_path):
    module = tmp_path / "work.py"
    module.write_text(textwrap.dedent("""
        import numpy as np
        import apsi_memory as memory

        @memory.cached
        def features(n):
            print("computed", flush=True)
            return np.arange(n, dtype=np.float64)
    """))
    script = textwrap.dedent("""
        import mmap, sys
        sys.path.insert(0, sys.argv[1])
        from work import features
        x = features(1_000_000)
        x += 1  # the caller's own: the cache keeps what the function returned
        print(x[-1], isinstance(x.base, mmap.mmap))
    """)
    env = {"APSI_HOME": str(home / "home"), "APSI_STORE_DIR": str(home / "stores"), "PATH": "/usr/bin:/bin"}
    runs = [subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                           timeout=60, check=False) for _ in range(3)]
    assert [r.returncode for r in runs] == [0, 0, 0], "".join(r.stderr for r in runs)
    assert runs[0].stdout.split() == ["computed", "1000000.0", "False"]  # computed: the function's own array
    for run in runs[1:]:  # after a restart: from the SSD, mapped copy-on-write, as stored
        assert run.stdout.split() == ["1000000.0", "True"]


def define(source: str) -> object:
    namespace = {"__name__": "work", "ran": ran}
    exec(compile(source, "work.py", "exec"), namespace)  # noqa: S102 (the test's own source: a module body)
    return namespace["f"]


def test_a_changed_body_misses_a_moved_one_does_not():
    body = "def f(x):\n    ran(x)\n    return x + {n}\n"
    assert memory.cached(define(body.format(n=1)))(1) == 2
    assert memory.cached(define("\n\n\n" + body.format(n=1)))(1) == 2  # moved down three lines
    assert RUNS == [1]
    assert memory.cached(define(body.format(n=100)))(1) == 101, "a changed body returned the old result"
    assert RUNS == [1, 1]


def test_the_key_covers_the_qualified_name():
    @memory.cached
    def one(x):
        ran(x)
        return "one"

    def make_other():
        @memory.cached
        def one(x):  # same name, same body, another qualified name
            ran(x)
            return "one"
        return one

    assert one(1) == "one" and make_other()(1) == "one"
    assert RUNS == [1, 1]


def test_keyword_arguments_in_any_order_are_one_call():
    @memory.cached
    def f(**options):
        ran(options)
        return sorted(options)

    assert f(a=1, b=2) == ["a", "b"] and f(b=2, a=1) == ["a", "b"]
    assert len(RUNS) == 1


def test_an_argument_that_cannot_be_hashed_is_named():
    @memory.cached
    def f(callback):
        return 1

    with pytest.raises(TypeError, match="argument 'callback'"):
        f(lambda: 1)


def test_exceptions_are_not_cached():
    @memory.cached
    def flaky(x):
        if ran(x) == 1:
            raise RuntimeError("first time")
        return x

    with pytest.raises(RuntimeError):
        flaky(1)
    assert flaky(1) == 1 and flaky(1) == 1 and len(RUNS) == 2


def test_a_named_store_and_a_store_object(home):
    @memory.cached(store="features", ram_mb=1, disk_gb=0.01)
    def f(x):
        return x + 1

    assert f.store is None  # opens on the first call, not at import
    assert f(1) == 2
    assert f.store.folder == str(home / "stores" / "features") and len(f.store) == 1
    s = memory.store("mine")

    @memory.cached(store=s)
    def g(x):
        return x * 10

    assert g(2) == 20 and g.store is s and len(s) == 1


def test_sets_hash_the_same_in_every_process(home):
    code = "from apsi_memory.store.hashing import value_digest; print(value_digest({'a', 'b', 'c', 'd'}).hex())"
    digests = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                              env={"PYTHONHASHSEED": str(seed), "PATH": "/usr/bin:/bin"}).stdout
               for seed in (1, 2, 3)}
    assert len(digests) == 1 and digests != {""}


def test_arrays_hash_by_every_byte_dtype_and_shape():
    a = np.arange(10_000, dtype=np.int64)
    b = a.copy()
    b[9_999] = 0  # the last byte counts as much as the first
    assert array_digest(a) == array_digest(a.copy()) != array_digest(b)
    assert array_digest(a[::2]) == array_digest(np.ascontiguousarray(a[::2]))
    assert array_digest(a) != array_digest(a.reshape(100, 100)) != array_digest(a.view(np.float64))
    assert array_digest(a.reshape(100, 100).T) != array_digest(a.reshape(100, 100))  # C-order bytes differ


def test_arrays_inside_containers_are_hashed_by_content():
    a = np.arange(1000)
    assert value_digest({"x": a, "y": [a]}) == value_digest({"x": a.copy(), "y": [a.copy()]})
    assert value_digest({"x": a}) != value_digest({"x": a + 1})
    assert value_digest(np.arange(3)) != value_digest([0, 1, 2])
