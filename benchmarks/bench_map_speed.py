"""``memory.map`` at the memory-bandwidth limit (issue 29 item 1): a light and a heavy function over 512 MiB of
float32 in RAM on 2 threads, against its peers, every way once a round and the rounds interleaved, so a noisy
moment of a loaded machine hits every way alike:

    .venv/bin/python -m pytest benchmarks/bench_map_speed.py --benchmark-only -s
    APSI_BENCH_BASELINE=/work/main .venv/bin/python -m pytest benchmarks/bench_map_speed.py --benchmark-only -s

* ``light`` is ``b * 2.0 + 1.0``, ``heavy`` ``np.sqrt(b) * np.log1p(b)``, over 16,777,216 x 8 float32. Peers:
  the NumPy expression on the whole array, a one-thread loop over ``map``'s blocks (8 MiB; ``fn`` on whole
  blocks, whose 8 MiB temporaries ``malloc`` maps and unmaps: 64,000 page faults a call), the same loop in
  ``map``'s pieces (``piece_rows``: 32,768 rows on a 1 MiB level-2 cache), a ``ThreadPoolExecutor`` of 2 threads
  over the same blocks in the same pieces (what ``map`` does, by hand), numexpr on 2 threads, ``dask.array``
  (``from_array``, ``map_blocks``, ``store`` into a new array, 2 threads), ``memory.map(rowwise=False)`` (``fn``
  on whole blocks: ``map`` before pieces) and 2 threads of ``np.copyto`` into a new array: the bandwidth limit,
  reading and writing as much as ``light`` does. Every output is new memory, as ``map``'s is. Targets: ``light``
  at least as fast as the NumPy expression and numexpr; ``heavy`` at least the ``ThreadPoolExecutor`` and 1.6x
  the one-thread loop (the loop in pieces shows how much of that is the second core's).
* ``piece_sizes``: ``map`` of ``light`` and ``heavy`` with pieces of 16 KiB to 4 MiB of input, against the default
  piece (a core's level-2 cache) in the same round.
* ``npy``: ``light`` over the same 512 MiB as a ``.npy`` file (warm in the page cache), each way in a process of
  its own that maps twice (the second is timed) and reports its peak RSS (``VmHWM``): ``map`` as now, with
  ``rowwise=False``, and, where ``APSI_BENCH_BASELINE`` names another checkout (``/work/main``), ``map`` from that
  checkout.

* ``overhead``: ``map``'s own Python, in a process of its own (and one for ``APSI_BENCH_BASELINE``'s checkout):
  CPU microseconds a piece over 16,384 pieces of 16 rows on one thread, the least of 15, against a hand-written
  loop over the same pieces, and the least time of a ``map`` over 64 rows on 2 threads (the fixed cost of a call).

Each table gives the median of a way's rounds and the median over rounds of its speed against a peer measured
in the same round (paired). ``APSI_BENCH_ROUNDS=11`` runs 11 rounds instead of 5 (a loaded machine's noise).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.blocks.rules import piece_rows
from apsi_memory.machinery.machines import machine

ROWS, COLS, WORKERS = 16_777_216, 8, 2
ROUNDS = int(os.environ.get("APSI_BENCH_ROUNDS", "5"))  # more on a loaded machine, where 5 rounds are noise
BLOCK = 262_144  # map's own block without rows on 2 workers: 8 MiB
PIECE = piece_rows(COLS * 4, machine().cache_bytes())  # what map uses here: 32,768 rows on a 1 MiB level-2 cache
BASELINE_ENV = "APSI_BENCH_BASELINE"
Fn = Callable[[np.ndarray], np.ndarray]


def light(b: np.ndarray) -> np.ndarray:
    return b * 2.0 + 1.0


def heavy(b: np.ndarray) -> np.ndarray:
    return np.sqrt(b) * np.log1p(b)


NUMEXPR = {light: "b * two + one", heavy: "sqrt(b) * log1p(b)"}  # float32 constants keep the result float32


@pytest.fixture(scope="module")
def x() -> Iterator[np.ndarray]:
    a = np.empty((ROWS, COLS), np.float32)
    for start in range(0, ROWS, BLOCK):
        a[start:start + BLOCK] = np.random.default_rng(start).random((BLOCK, COLS), dtype=np.float32)
    yield a


def one_thread_loop(fn: Fn, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for start in range(0, len(x), BLOCK):
        out[start:start + BLOCK] = fn(x[start:start + BLOCK])
    return out


def thread_pool(fn: Fn, x: np.ndarray, workers: int = WORKERS) -> np.ndarray:
    out = np.empty_like(x)

    def block(start: int) -> None:
        for piece in range(start, min(start + BLOCK, len(x)), PIECE):
            out[piece:piece + PIECE] = fn(x[piece:piece + PIECE])

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(block, range(0, len(x), BLOCK)))
    return out


def numexpr(fn: Fn, x: np.ndarray) -> np.ndarray:
    import numexpr as ne

    ne.set_num_threads(WORKERS)
    result: np.ndarray = ne.evaluate(NUMEXPR[fn], local_dict={"b": x, "two": np.float32(2), "one": np.float32(1)})
    return result


def dask_array(fn: Fn, x: np.ndarray) -> np.ndarray:
    import dask
    import dask.array as da

    out = np.empty_like(x)
    mapped = da.from_array(x, chunks=(BLOCK, COLS)).map_blocks(fn, dtype=x.dtype)
    with dask.config.set(scheduler="threads", num_workers=WORKERS):
        da.store(mapped, out, lock=False)
    return out


def copy_limit(fn: Fn, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    half = len(x) // 2
    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(lambda span: np.copyto(out[span[0]:span[1]], x[span[0]:span[1]]), [(0, half), (half, len(x))]))
    return out


WAYS: dict[str, Callable[[Fn, np.ndarray], np.ndarray]] = {
    "memory.map": lambda fn, x: memory.map(fn, x, workers=WORKERS),
    "memory.map rowwise=False": lambda fn, x: memory.map(fn, x, workers=WORKERS, rowwise=False),
    "NumPy expression": lambda fn, x: fn(x),
    "1-thread loop": one_thread_loop,
    "1-thread loop in pieces": lambda fn, x: thread_pool(fn, x, 1),
    "ThreadPoolExecutor": thread_pool,
    "numexpr": numexpr,
    "dask.array": dask_array,
    "copyto (limit)": copy_limit,
}
EXACT = {"memory.map", "memory.map rowwise=False", "NumPy expression", "1-thread loop", "1-thread loop in pieces",
         "ThreadPoolExecutor", "dask.array"}  # the same NumPy loops on the same values: the same bits


SAMPLES = [slice(0, 3 * PIECE + 5), slice(5 * BLOCK - 7, 6 * BLOCK + 11), slice(ROWS - BLOCK - 3, ROWS)]


def checked(name: str, fn: Fn, result: np.ndarray, x: np.ndarray) -> None:
    """Rows across pieces and blocks, against the NumPy expression on them (a whole expected array would hold
    another 512 MiB)."""
    for rows in SAMPLES:
        expected = x[rows] if name == "copyto (limit)" else fn(x[rows])
        if name in EXACT or name == "copyto (limit)":
            assert result[rows].tobytes() == expected.tobytes(), name
        else:
            np.testing.assert_allclose(result[rows], expected, rtol=1e-6)


def interleaved(ways: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each way, every way once per round, in a different order each round."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(ways[name]())
    return times


def table(times: dict[str, list[float]], against: list[str], title: str) -> dict[str, dict[str, float]]:
    """Print each way's median and its paired speed against each of ``against``; the speeds, by way."""
    speeds = {name: {peer: statistics.median(p / t for p, t in zip(times[peer], own)) for peer in against}
              for name, own in times.items()}
    print(f"\n{title} (load {os.getloadavg()[0]:.1f})\n{'median':>36}  "
          + "  ".join(f"vs {peer:>18}" for peer in against))
    for name, own in times.items():
        print(f"{name:>26} {statistics.median(own) * 1000:7.0f} ms  "
              + "  ".join(f"{speeds[name][peer]:21.2f}x" for peer in against))
    return speeds


@pytest.mark.parametrize("fn", [light, heavy], ids=["light", "heavy"])
def test_map_in_ram(benchmark: Any, x: np.ndarray, fn: Fn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APSI_SPILL_DIR", str(tmp_path))

    def timed(name: str) -> Callable[[], float]:
        def run() -> float:
            start = time.perf_counter()
            result = WAYS[name](fn, x)
            seconds = time.perf_counter() - start
            checked(name, fn, result, x)
            if name.startswith("memory.map"):
                memory.free(result)
            return seconds
        return run

    times: dict[str, list[float]] = {}
    benchmark.group = f"map {fn.__name__} in RAM"
    benchmark.pedantic(lambda: times.update(interleaved({name: timed(name) for name in WAYS}, ROUNDS)),
                       rounds=1, iterations=1)
    speeds = table(times, ["1-thread loop", "1-thread loop in pieces", "NumPy expression", "numexpr",
                           "ThreadPoolExecutor"],
                   f"{fn.__name__} over {x.nbytes >> 20} MiB float32 in RAM, {WORKERS} threads, {ROUNDS} rounds")
    benchmark.extra_info.update({name: {peer: round(s, 2) for peer, s in row.items()} for name, row in speeds.items()})


PIECE_BYTES = [16 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20]


@pytest.mark.parametrize("fn", [light, heavy], ids=["light", "heavy"])
def test_map_piece_sizes(benchmark: Any, x: np.ndarray, fn: Fn, monkeypatch: pytest.MonkeyPatch) -> None:
    """The curve behind ``rules.PIECES_PER_CACHE``: ``map`` with pieces of each of ``PIECE_BYTES``."""
    from apsi_memory.outofcore import mapping

    default = mapping._piece

    def timed(rows: int | None) -> Callable[[], float]:
        def run() -> float:
            monkeypatch.setattr(mapping, "_piece", default if rows is None else lambda array: rows)
            start = time.perf_counter()
            result = memory.map(fn, x, workers=WORKERS)
            seconds = time.perf_counter() - start
            checked("memory.map", fn, result, x)
            memory.free(result)
            return seconds
        return run

    ways = {f"{size >> 10:,} KiB pieces": timed(size // x[0].nbytes) for size in PIECE_BYTES}
    ways[f"default ({PIECE * x[0].nbytes >> 10:,} KiB)"] = timed(None)
    times: dict[str, list[float]] = {}
    benchmark.group = f"map {fn.__name__} piece sizes"
    benchmark.pedantic(lambda: times.update(interleaved(ways, ROUNDS)), rounds=1, iterations=1)
    speeds = table(times, [list(ways)[-1]], f"{fn.__name__} over {x.nbytes >> 20} MiB float32 in RAM by piece size, "
                   f"{WORKERS} threads, {ROUNDS} rounds")
    benchmark.extra_info.update({name: round(next(iter(row.values())), 2) for name, row in speeds.items()})


CHILD = """
import json, sys, time
import apsi_memory as memory
path, kwargs = sys.argv[1], json.loads(sys.argv[2])
for _ in range(2):  # the second map is timed: the first also pays for what a process does once (imports, threads)
    start = time.perf_counter()
    y = memory.map(lambda b: b * 2.0 + 1.0, path, workers=2, **kwargs)
    seconds = time.perf_counter() - start
    assert float(y[-1, -1]) == float(y[-1, -1])
    memory.free(y)
with open("/proc/self/status") as f:  # VmHWM: this process's own peak (ru_maxrss would include the parent's)
    peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "peak_rss": peak}))
"""


def in_child(tree: str, path: str, kwargs: dict[str, object], rss: dict[str, list[int]], name: str) -> float:
    """One ``map`` over ``path`` in a new process importing ``apsi_memory`` from ``tree``: its seconds."""
    with open(path, "rb") as f:  # warm: the rounds measure map, not the disk
        while f.read(64 << 20):
            pass
    env = dict(os.environ, PYTHONPATH=tree)
    done = subprocess.run([sys.executable, "-c", CHILD, path, json.dumps(kwargs)], env=env, check=True,
                          capture_output=True, text=True, cwd=tree)
    report = json.loads(done.stdout)
    rss[name].append(report["peak_rss"])
    seconds: float = report["seconds"]
    return seconds


def test_map_npy(benchmark: Any, x: np.ndarray, tmp_path: Path) -> None:
    path = str(tmp_path / "x.npy")
    np.save(path, x)
    here = str(Path(__file__).resolve().parents[1])
    children: dict[str, tuple[str, dict[str, object]]] = {
        "memory.map": (here, {}), "memory.map rowwise=False": (here, {"rowwise": False})}
    if os.environ.get(BASELINE_ENV):
        children[f"memory.map from {os.environ[BASELINE_ENV]}"] = (os.environ[BASELINE_ENV], {})
    rss: dict[str, list[int]] = {name: [] for name in children}
    times: dict[str, list[float]] = {}
    ways = {name: (lambda name=name, c=child: in_child(c[0], path, c[1], rss, name))
            for name, child in children.items()}
    benchmark.group = "map light over a .npy"
    benchmark.pedantic(lambda: times.update(interleaved(ways, ROUNDS)), rounds=1, iterations=1)
    table(times, list(children)[1:], f"light over a {os.path.getsize(path) >> 20} MiB .npy (warm), 2 threads, "
          f"each way in a process of its own, {ROUNDS} rounds")
    for name, peaks in rss.items():
        print(f"{name:>26} peak RSS {max(peaks) / 2**20:7.0f} MiB (most over the rounds)")
        benchmark.extra_info[f"{name} peak_rss"] = max(peaks)


OVERHEAD_CHILD = """
import json, time
import numpy as np
import apsi_memory as memory
from apsi_memory.outofcore import mapping
from concurrent.futures import ThreadPoolExecutor
mapping._piece = lambda array: 16  # 16,384 pieces of 16 rows: map's own Python a piece, not NumPy's loops
x = np.ones((1 << 18, 8), np.float32)
fn = lambda b: b + 1

def loop():
    out = np.empty_like(x)
    def block(start):
        for p in range(start, min(start + 8192, len(x)), 16):
            out[p:p + 16] = fn(x[p:p + 16])
    with ThreadPoolExecutor(1) as pool:
        list(pool.map(block, range(0, len(x), 8192)))

pieces, loops, calls = [], [], []
small = np.ones((64, 8), np.float32)
memory.map(fn, small, workers=2)
for _ in range(15):
    start = time.process_time()
    memory.free(memory.map(fn, x, workers=1))
    middle = time.process_time()
    loop()
    pieces.append((middle - start) / 16384)
    loops.append((time.process_time() - middle) / 16384)
    start = time.perf_counter()
    memory.map(fn, small, workers=2)
    calls.append(time.perf_counter() - start)
print(json.dumps({"piece": min(pieces), "loop": min(loops), "call": min(calls)}))
"""


def test_map_overhead(benchmark: Any) -> None:
    """``map``'s own cost: CPU seconds a piece (16-row pieces on one thread, the least of 15) against a hand-written
    loop over the same pieces, and the least time of a ``map`` over 64 rows on 2 threads; with
    ``APSI_BENCH_BASELINE`` also that checkout's, in a process of its own."""
    trees = {"here": str(Path(__file__).resolve().parents[1])}
    if os.environ.get(BASELINE_ENV):
        trees[os.environ[BASELINE_ENV]] = os.environ[BASELINE_ENV]
    found: dict[str, dict[str, float]] = {}

    def measure() -> None:
        for name, tree in trees.items():
            done = subprocess.run([sys.executable, "-c", OVERHEAD_CHILD], env=dict(os.environ, PYTHONPATH=tree),
                                  check=True, capture_output=True, text=True, cwd=tree)
            found[name] = json.loads(done.stdout)

    benchmark.group = "map overhead"
    benchmark.pedantic(measure, rounds=1, iterations=1)
    print(f"\nmap's own cost (load {os.getloadavg()[0]:.1f}): us a piece (map / hand loop), ms a 64-row call")
    for name, row in found.items():
        print(f"{name:>26} {row['piece'] * 1e6:5.2f} / {row['loop'] * 1e6:5.2f} us  {row['call'] * 1e3:6.2f} ms")
        benchmark.extra_info[name] = row
