"""Several processes on one store: writers SIGKILLed mid-set leave every entry whole or missing; concurrent
writers lose no completed set; a reader never sees a half-written value. Bounded: well under 30 s in all."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
import warnings

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import TamperWarning
from apsi_memory.units import GiB, MiB

FORK = multiprocessing.get_context("fork")
KILLS = 40
KEYS = 40


def value_for(key: int, version: int):
    """Every kind and size class: inline pickles and arrays, pickle and array files, memory-mapped arrays."""
    shape = version % 5
    if shape == 0:
        return {"key": key, "version": version}
    if shape == 1:
        return {"key": key, "version": version, "pad": "p" * 30_000}
    sizes = {2: 100, 3: 5_000, 4: 40_000}
    return np.full(sizes[shape], key * 1_000_000 + version, dtype=np.float64)


def check_whole(key: int, value) -> None:
    """A value read back must be one some writer wrote, entire."""
    if isinstance(value, dict):
        assert value["key"] == key
        assert ("pad" in value) == (value["version"] % 5 == 1)
        if "pad" in value:
            assert value["pad"] == "p" * 30_000
        return
    assert isinstance(value, np.ndarray)
    version = int(value[0]) - key * 1_000_000
    assert 0 <= version and value.size == {2: 100, 3: 5_000, 4: 40_000}[version % 5]
    assert (value == value[0]).all()


SETS_BEFORE_KILLS = KEYS // 4  # each writer completes these before it may be killed: the test means something at any load


def write_forever(start: int, disk_bytes: int, ready) -> None:
    s = memory.store("shared", ram_mb=1, disk_gb=disk_bytes / GiB)
    version = start
    while True:
        s.set(version % KEYS, value_for(version % KEYS, version))
        version += 1
        if version - start == SETS_BEFORE_KILLS:
            ready.set()


# Forked on purpose (several writer processes on one store) from a process with threads; the store resets its
# locks in the child (os.register_at_fork), which is what this test relies on.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_writers_killed_mid_set_leave_entries_whole_or_missing():
    """SIGKILL a writer at a random moment, many times; after each kill every entry reads back whole or is
    missing, nothing warns of tampering, and the store takes new sets."""
    rng = random.Random(5)
    disk = 4 * MiB  # small, so kills also land in eviction and compaction
    seen = 0
    for kill in range(KILLS):
        ready = FORK.Event()
        child = FORK.Process(target=write_forever, args=(kill * 100_000, disk, ready))
        child.start()
        assert ready.wait(120), "a writer completed no set in 120 s"
        time.sleep(rng.uniform(0.0, 0.1))  # then a random moment: mid-set, mid-eviction, between sets
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        with warnings.catch_warnings():
            warnings.simplefilter("error", TamperWarning)
            reader = memory.store("shared", ram_mb=0, disk_gb=disk / GiB)
            for key in range(KEYS):
                value = reader.get(key)
                if value is not None:
                    check_whole(key, value)
                    seen += 1
            reader.set("after kill", kill)
            assert memory.store("shared", disk_gb=disk / GiB).get("after kill") == kill
            reader.close()
    assert seen > KILLS * KEYS // 4, "the writers wrote too little for the test to mean anything"


def write_range(prefix: str, count: int) -> None:
    s = memory.store("shared", ram_mb=1, disk_gb=1)
    for i in range(count):
        s.set(f"{prefix}-{i}", value_for(i, i))
        s.set(f"both-{i % 10}", {"key": -1, "version": i * 5, "by": prefix})


def test_two_writers_lose_no_completed_set():
    count = 400
    writers = [FORK.Process(target=write_range, args=(name, count)) for name in ("a", "b")]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=60)
        assert w.exitcode == 0
    s = memory.store("shared", ram_mb=0, disk_gb=1)
    for name in ("a", "b"):
        for i in range(count):
            value = s.get(f"{name}-{i}")
            assert value is not None, f"{name}-{i} was lost"
            check_whole(i, value)
    assert {s.get(f"both-{i}")["by"] for i in range(10)} <= {"a", "b"}
    assert len(s) == 2 * count + 10


def read_and_check(seconds: float, results) -> None:
    s = memory.store("shared", ram_mb=0.05, disk_gb=1)
    reads = hits = 0
    deadline = time.monotonic() + seconds
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        while time.monotonic() < deadline:
            key = reads % KEYS
            value = s.get(key)
            if value is not None:
                check_whole(key, value)
                hits += 1
            reads += 1
    results.put((reads, hits))


def write_for(seconds: float) -> None:
    s = memory.store("shared", ram_mb=1, disk_gb=8 * MiB / GiB)
    version = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        s.set(version % KEYS, value_for(version % KEYS, version))
        version += 1


def test_a_reader_never_sees_a_half_written_value():
    results = FORK.Queue()
    procs = [FORK.Process(target=write_for, args=(1.5,)),
             FORK.Process(target=read_and_check, args=(1.5, results)),
             FORK.Process(target=read_and_check, args=(1.5, results))]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0, 0], "a reader failed its checks (see its traceback above)"
    counts = [results.get(timeout=5) for _ in range(2)]
    assert all(hits > 100 for _, hits in counts), counts


def write_with(s: memory.Store, prefix: str, count: int) -> None:
    for i in range(count):
        s.set(f"{prefix}-{i}", value_for(i, i))


def test_a_handle_opened_before_fork_still_excludes_the_parent():
    """A child that inherits an open store and writes alongside its parent and a sibling loses nothing."""
    s = memory.store("shared", ram_mb=1, disk_gb=1)
    s.set("opened", True)
    children = [FORK.Process(target=write_with, args=(s, name, 300)) for name in ("a", "b")]
    for child in children:
        child.start()
    write_with(s, "parent", 300)
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    reader = memory.store("shared", ram_mb=0, disk_gb=1)
    lost = [f"{name}-{i}" for name in ("a", "b", "parent") for i in range(300) if reader.get(f"{name}-{i}") is None]
    assert lost == [] and len(reader) == 901


def clear_and_die_mid_compaction(s: memory.Store) -> None:
    """Delete, then compact (which rewrites the journal), but die right after the new journal took the old one's
    place."""
    real_replace = os.replace

    def replace_then_die(src: str, dst: str, **kwargs: int) -> None:
        real_replace(src, dst, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace_then_die  # type: ignore[assignment]
    s.delete("old")
    with s._lock, s._journal.locked():
        s._compact_if_due(force=True)


def test_a_writer_killed_in_the_middle_of_a_compaction():
    s = memory.store("shared")
    s.set("old", 1)
    other = memory.store("shared")  # holds the journal that is about to be replaced
    assert other.get("old") == 1
    child = FORK.Process(target=clear_and_die_mid_compaction, args=(s,))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == -signal.SIGKILL
    other.set("after", 2)  # must land in the journal everyone reads now, not the replaced one
    fresh = memory.store("shared")
    assert fresh.get("after") == 2 and "old" not in fresh
    assert other.get("old") is None and len(other) == 1
    assert not [name for name in os.listdir(s.folder) if name.endswith(".tmp")]
