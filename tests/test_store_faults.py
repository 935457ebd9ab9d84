"""Issue 9's fault-injection suite for the store: SIGKILLs mid-set, several processes and threads with eviction on,
forks while another thread uses the store, and a garbage collection forced inside a held lock.

Each test prints its figures (run with ``-s`` to see them) and asserts the ones that must be 0: acknowledged sets
lost, torn values, spurious exceptions, hung children; and peak disk use within ``disk_gb`` plus the values in
flight. Counts are the issue's minimums, sized to take about 30 s in all on this 2-core machine.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
from apsi_memory.errors import TamperWarning
from apsi_memory.units import GiB
from sim import tree as machines
from tests.damage import flip_byte

pytestmark = [pytest.mark.faults, pytest.mark.skipif(sys.platform != "linux", reason="fork and SIGKILL: Linux")]

FORK = multiprocessing.get_context("fork")
KEYS = 40
SIZES = {2: 100, 3: 5_000, 4: 40_000}  # array lengths: inline, inline .npy, memory-mapped file


@pytest.fixture(autouse=True)
def calm_machine(sim_machine) -> None:
    """A calm sim host (7 of 8 GiB free, no stalls), inherited by forked children: the real host's pressure must
    not change what the store and pool do here (at critical a pool keeps no spare and clears nothing)."""
    sim_machine(machines.host)


def value_for(key: int, version: int):
    """Every kind and size class; the key and version can be read back from each."""
    shape = version % 5
    if shape == 0:
        return {"key": key, "version": version}
    if shape == 1:
        return {"key": key, "version": version, "pad": "p" * 30_000}  # its own .pkl file
    array = np.full(SIZES[shape], float(version))
    array[0] = key
    return array


def version_of(key: int, value) -> int:
    """The version of a whole value; ``-1`` for a torn or foreign one."""
    if isinstance(value, dict):
        whole = value["key"] == key and ("pad" in value) == (value["version"] % 5 == 1)
        return value["version"] if whole and value.get("pad", "p" * 30_000) == "p" * 30_000 else -1
    version = int(value[1])
    whole = value[0] == key and version % 5 in SIZES and value.size == SIZES[version % 5] and (value[1:] == version).all()
    return version if whole else -1


def disk_use(folder: str) -> int:
    """Bytes in the store's files now (a file removed while we look counts as gone)."""
    total = 0
    for sub in (folder, os.path.join(folder, "data")):
        try:
            with os.scandir(sub) as entries:
                for entry in entries:
                    try:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        pass
        except FileNotFoundError:
            pass
    return total


class PeakDisk:
    """Samples ``disk_use`` on a thread until stopped; ``peak`` is the most it saw."""

    def __init__(self, folder: str) -> None:
        self.folder, self.peak, self.samples = folder, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak = max(self.peak, disk_use(self.folder))
            self.samples += 1
            time.sleep(0.0005)

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


# -- SIGKILL mid-set: nothing acknowledged is lost, nothing torn ---------------------------------------------

def wait_until(condition: Callable[[], bool], failure: str, seconds: float = 60) -> None:
    """Polls ``condition`` every millisecond; ``failure`` is the assertion when it is still false after
    ``seconds`` (far past any start on a loaded host: a child that never gets there is broken)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.001)


def acknowledging_writer(log: str, start: int, seed: int) -> None:
    """Sets forever; appends ``key version`` to the log only after ``set`` returned (acknowledged)."""
    s = memory.store("shared", ram_mb=0, disk_gb=1)
    rng = random.Random(seed)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    version = start
    while True:
        key = rng.randrange(KEYS)
        s.set(key, value_for(key, version))
        # 16 bytes a line, so none straddles a 4 KiB page of the log: the kernel checks for SIGKILL between the
        # pages of one write, and a torn line would glue itself to the next child's (failed 1 CI run in 3).
        os.write(fd, f"{key:3d} {version:11d}\n".encode())
        version += 1


def test_sigkills_mid_set_lose_no_acknowledged_set_and_tear_nothing(tmp_path):
    kills, rng = 100, random.Random(9)
    log = tmp_path / "acknowledged"
    log.touch()
    for kill in range(kills):
        acknowledged_so_far = log.stat().st_size
        child = FORK.Process(target=acknowledging_writer, args=(str(log), (kill + 1) * 1_000_000 // 5 * 5, kill))
        child.start()
        # A handshake, not a guess of how long a start takes on a busy host: the child has acknowledged a set...
        wait_until(lambda: log.stat().st_size > acknowledged_so_far, f"child {kill} acknowledged no set")  # noqa: B023 - called in this iteration
        time.sleep(rng.uniform(0, 0.02))  # ... then the kill lands at a random point of a later set
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=10)
        assert child.exitcode == -signal.SIGKILL
    acknowledged: dict[int, int] = {}
    lines = log.read_text().splitlines()
    for line in lines:
        key, version = map(int, line.split())
        acknowledged[key] = max(version, acknowledged.get(key, -1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = memory.store("shared", ram_mb=0, disk_gb=1)
        read = {key: reader.get(key) for key in range(KEYS)}
    torn = sum(1 for key, value in read.items() if value is not None and version_of(key, value) < 0)
    lost = sum(1 for key, version in acknowledged.items() if read[key] is None or version_of(key, read[key]) < version)
    tampered = [w for w in caught if issubclass(w.category, TamperWarning)]
    print(f"\nSIGKILLs {kills}, acknowledged sets {len(lines)}, acknowledged-then-lost {lost}, torn {torn}, "
          f"tamper warnings {len(tampered)}")
    assert len(lines) >= kills, "every child acknowledged a set before it was killed"
    assert (lost, torn, tampered) == (0, 0, [])


# -- several processes, several threads, eviction on: no spurious exception, disk within its limit ------------

LIMIT = 2 * 1024 * 1024
FILE_VALUE_BYTES = 20_000 + 32 + 100  # a file-backed value below, with its signature and pickle overhead


def evicting_writer(count: int, seed: int, results: multiprocessing.Queue) -> None:
    s = memory.store("evicting", ram_mb=0.2, disk_gb=LIMIT / GiB)
    rng = random.Random(seed)
    failures = []
    for i in range(count):
        key = rng.randrange(300)
        try:
            s.set(key, {"i": i, "pad": "x" * (20_000 if i % 3 == 0 else 200)})
            s.get(rng.randrange(300))
        except Exception as err:  # noqa: BLE001 - every one is spurious: counted, named
            failures.append(repr(err))
    results.put(failures)


def assert_no_failure_within_the_limit(who: str, failures: list[str], peak: PeakDisk, writers: int) -> None:
    """The figure of a many-writers run, printed, then held: no spurious exception, and the disk never past
    ``disk_gb`` plus one file value in flight per writer (+ the lock file)."""
    most = peak.done()
    in_flight = writers * FILE_VALUE_BYTES
    print(f"\n{who}: spurious exceptions {len(failures)}, peak disk {most} B = {most / LIMIT:.2f} x disk_gb "
          f"({peak.samples} samples), allowed {LIMIT} + {in_flight} in flight")
    assert failures == []
    assert most <= LIMIT + in_flight + 4096


# Forked on purpose (several writer processes on one store) from a process with threads; the store resets its
# locks in the child (os.register_at_fork), which is what this test relies on.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_four_processes_of_3000_sets_with_eviction_raise_nothing_and_stay_within_the_limit(home):
    processes, sets = 4, 3000
    folder = os.path.join(home / "stores", "evicting")
    memory.store("evicting", disk_gb=LIMIT / GiB).close()
    results: multiprocessing.Queue = FORK.Queue()
    peak = PeakDisk(folder)
    writers = [FORK.Process(target=evicting_writer, args=(sets, seed, results)) for seed in range(processes)]
    for writer in writers:
        writer.start()
    failures = [failure for _ in writers for failure in results.get(timeout=300)]
    for writer in writers:
        writer.join(timeout=60)
    assert_no_failure_within_the_limit(f"{processes} processes x {sets} sets", failures, peak, processes)
    assert [w.exitcode for w in writers] == [0] * processes


def test_twelve_threads_with_eviction_raise_nothing_and_stay_within_the_limit(home):
    threads, sets = 12, 250
    folder = os.path.join(home / "stores", "evicting")
    memory.store("evicting", disk_gb=LIMIT / GiB).close()
    failures: list[str] = []
    peak = PeakDisk(folder)

    def write(seed: int) -> None:
        s = memory.store("evicting", ram_mb=0.2, disk_gb=LIMIT / GiB)  # a handle each: they contend on the flock
        rng = random.Random(seed)
        for i in range(sets):
            try:
                s.set(rng.randrange(300), {"i": i, "pad": "x" * (20_000 if i % 2 == 0 else 200)})
            except Exception as err:  # noqa: BLE001 - every one is spurious: counted, named
                failures.append(repr(err))

    workers = [threading.Thread(target=write, args=(seed,)) for seed in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert_no_failure_within_the_limit(f"{threads} threads x {sets} sets", failures, peak, threads)


# -- forks while another thread uses the store and the pool --------------------------------------------------

def child_work(s: memory.Store, pool: memory.Pool, i: int) -> int:
    s.set(f"child{i}", i)
    if s.get(f"child{i}") != i:
        return 1
    a = pool.take(1 << 16)
    a[:] = 1
    pool.give(a)
    deadline = time.monotonic() + 5
    while pool.cleared == 0:  # the child's own clearing thread must start and clear the buffer
        if time.monotonic() > deadline:
            return 3
        time.sleep(0.01)
    return 0


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forty_forks_while_another_thread_uses_the_store_never_hang(home):
    """Before the fix 15 of 40 children hung: the store's RLock was copied taken, and the pool's clearer
    ``_thread`` stayed set in the child, which never cleared again."""
    s = memory.store("t", ram_mb=1)
    pool = memory.pool(0.01)
    stop = threading.Event()

    def hammer() -> None:
        i = 0
        while not stop.is_set():
            s.set(i % 50, {"i": i, "pad": "p" * (20_000 if i % 7 == 0 else 10)})
            s.get((i * 7) % 50)
            a = pool.take(1 << 16)
            pool.give(a)  # keeps the clearing thread busy
            i += 1

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    hung, failed = 0, 0
    try:
        for i in range(40):
            time.sleep(random.uniform(0, 0.01))
            pid = os.fork()
            if pid == 0:
                code = 2
                try:
                    code = child_work(s, pool, i)
                finally:
                    os._exit(code)
            deadline = time.monotonic() + 15
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    failed += os.waitstatus_to_exitcode(status) != 0
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    hung += 1
                    break
                time.sleep(0.005)
    finally:
        stop.set()
        thread.join(timeout=30)
    print(f"\n40 forks while another thread used the store and the pool: hung children {hung}, failed {failed}")
    assert (hung, failed) == (0, 0)
    assert all(s.get(f"child{i}") == i for i in range(40))


# -- the garbage collector inside a held lock ----------------------------------------------------------------

def test_a_collection_forced_inside_a_held_lock_does_not_hang(home):
    """Before the fix the finalizer of a handle only the collector could free took a blocking ``flock`` on the
    folder whose lock this thread held through another handle: it never returned."""
    script = textwrap.dedent("""
        import gc
        import apsi_memory as memory
        gc.disable()
        a = memory.store("t")
        a.set("k", 1)
        a.get("k")  # a remembered read: closing it writes to the journal, under the lock
        a.cycle = a  # only the collector frees it
        del a
        b = memory.store("t")
        with b._journal.locked():
            gc.collect()
        print("collected")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent, env=dict(os.environ), check=False)
    assert done.returncode == 0 and "collected" in done.stdout, done.stderr


def test_cached_makes_no_reference_cycle(home):
    def square(x: int) -> int:
        return x * x

    wrapper = memory.cached(square)
    assert wrapper(3) == 9
    inner = weakref.ref(wrapper.__closure__[0].cell_contents)  # the _Cached object behind the wrapper
    gc.disable()
    try:
        del wrapper
        assert inner() is None, "freed by reference counting alone: no cycle for the collector to run into"
    finally:
        gc.enable()


# -- issue 20: a damaged last record, a copied checkpoint, forks during close, killed checkpoint writes ----------

def test_a_damaged_last_record_never_brings_back_the_older_value():
    """Issue 20 item 2: the lock file's recorded end shows the last write completed, so a last record that does
    not parse is damage (a miss and a warning), not a crash's torn tail. Before the fix 39 of 96 positions read
    the older value silently."""
    s = memory.store("t", ram_mb=0)
    s.set("k", "older")
    s.set("other", 1)
    before = os.path.getsize(os.path.join(s.folder, "index"))
    s.set("k", "newer")
    s.close()
    saved = {name: Path(s.folder, name).read_bytes() for name in ("index", "lock")}
    older, missed = 0, 0
    for at in range(before, len(saved["index"])):
        for name, content in saved.items():
            Path(s.folder, name).write_bytes(content)  # in place: the lock file keeps its inode
        flip_byte(os.path.join(s.folder, "index"), at, mask=0xFF)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reader = memory.store("t", ram_mb=0)
            value = reader.get("k")
            reader.close()
        warned = any(issubclass(w.category, TamperWarning) for w in caught)
        older += value == "older"
        missed += value is None and warned
        assert value == "newer" or (value is None and warned), f"byte {at}: {value!r}, warned {warned}"
    positions = len(saved["index"]) - before
    print(f"\nlast record of {positions} bytes damaged at each: older value read {older}, misses with a "
          f"warning {missed}, newer value read {positions - older - missed}")
    assert older == 0


def test_a_checkpoint_copied_from_another_copy_of_the_store_is_not_accepted(home):
    """Issue 20 item 3: two copies of one store diverge with journals of the same length ending in the same
    bytes; before the fix the first copy's checkpoint, copied into the second, was taken for its own and every
    entry the second copy had written vanished."""
    from apsi_memory.store import checkpoint

    base = memory.store("a")
    for name in ("z0", "z1", "z2"):
        base.set(name, 0)
    base.close()
    shutil.copytree(home / "stores" / "a", home / "stores" / "b")
    sets = checkpoint.MIN_RECORDS - 5  # so the checkpoint is written at close, after the three deletes
    for name in "ab":
        s = memory.store(name)
        for i in range(sets):
            s.set(f"{name}{i:05d}", i)  # same sizes in both copies, other keys and random entry names
        for key in ("z0", "z1", "z2"):
            s.delete(key)  # the same bytes at the end of both journals
        s.close()
    ours = home / "stores" / "b" / "checkpoint"
    assert ours.exists()
    shutil.copyfile(home / "stores" / "a" / "checkpoint", ours)
    b = memory.store("b")
    vanished = sum(1 for i in range(sets) if b.get(f"b{i:05d}") != i)
    foreign = sum(1 for i in range(sets) if f"a{i:05d}" in b)
    print(f"\ncheckpoint copied from a diverged copy: entries {sets}, vanished {vanished}, foreign keys {foreign}")
    assert (vanished, foreign) == (0, 0)


def killed_inside_a_write(log: str, run: int, target: str, fraction: float) -> None:
    """Sets (each acknowledged in ``log`` once it returned), then is SIGKILLed inside a checkpoint or compaction
    write, after ``fraction`` of its bytes reached the temp file."""
    from apsi_memory.store import checkpoint, journal

    def dying(fd: int, data: bytes) -> int:
        os.write(fd, data[:int(len(data) * fraction)])
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    if target == "checkpoint":
        checkpoint.write_all = dying  # type: ignore[assignment]
    else:
        journal._write_batch = lambda fd, batch: dying(fd, b"".join(batch))  # type: ignore[assignment]
    s = memory.store("killed", ram_mb=0)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    for i in range(checkpoint.MIN_RECORDS if target == "checkpoint" else 300):
        s.set(i % 300, (run, i))
        os.write(fd, f"{i % 300} {run} {i}\n".encode())
    with s._lock, s._journal.locked():
        s._compact_if_due(force=True)
    os._exit(3)  # not reached: killed inside the write


def temps(folder: Path) -> int:
    return sum(1 for name in os.listdir(folder) if name.startswith("index.") and name.endswith(".tmp"))


@pytest.mark.parametrize("target", ["checkpoint", "compaction"])
def test_kills_inside_checkpoint_and_compaction_writes_lose_nothing_and_leave_no_temp_file(home, target):
    """Issue 20 item 9 (and the tester's kills inside those writes): a temp file left by a writer killed mid-way
    is removed by the next open; before the fix it stayed until the next compaction, outside ``disk_gb``."""
    log, folder, kills, left = home / "acknowledged", home / "stores" / "killed", 8, 0
    log.touch()
    rng = random.Random(20)
    for run in range(kills):
        child = FORK.Process(target=killed_inside_a_write, args=(str(log), run, target, rng.random()))
        child.start()
        child.join(timeout=60)
        assert child.exitcode == -signal.SIGKILL
        left += temps(folder)
    acknowledged: dict[int, tuple[int, int]] = {}
    for line in log.read_text().splitlines():
        key, run, i = map(int, line.split())
        acknowledged[key] = max((run, i), acknowledged.get(key, (-1, -1)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reader = memory.store("killed", ram_mb=0)
        lost = sum(1 for key, version in acknowledged.items() if (reader.get(key) or (-1, -1)) < version)
    after = temps(folder)
    tampered = [w for w in caught if issubclass(w.category, TamperWarning)]
    print(f"\nSIGKILLs inside {target} writes {kills}, acknowledged sets {len(log.read_text().splitlines())}, lost "
          f"{lost}, temp files seen after a kill {left}, left after the next open {after}, tamper warnings "
          f"{len(tampered)}")
    assert left >= kills, "each child must have been killed inside the write, leaving its temp file"
    assert (lost, after, tampered) == (0, 0, [])


def shared_with_parent(stores: list[memory.Store]) -> int:
    """In a child forked while the parent held every store's ``flock``: how many locks the child can take too
    (it shares the parent's open file, so the parent's lock does not exclude it)."""
    import fcntl

    shared = 0
    for s in stores:
        try:
            fcntl.flock(s._journal.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shared += 1
        except BlockingIOError:
            pass
    return shared


def fork_holding_locks(stores: list[memory.Store]) -> tuple[int, int]:
    """Fork while holding every store's lock; the child's count of shared locks and of fork-hook errors."""
    import contextlib

    with contextlib.ExitStack() as held:
        for s in stores:
            held.enter_context(s._journal.locked())
        errors: list[object] = []
        hook, sys.unraisablehook = sys.unraisablehook, errors.append
        try:
            pid = os.fork()
            if pid == 0:
                os._exit(min(shared_with_parent(stores), 15) * 16 + min(len(errors), 15))
        finally:
            sys.unraisablehook = hook
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])  # still holding the locks
    return code // 16, code % 16


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_journal_closing_at_the_fork_does_not_stop_the_other_stores_fork_hooks(home):
    """Issue 20 item 4: a journal whose files another thread was closing at the fork made its hook fail (EBADF)
    and the journals after it kept the parent's lock in the child."""
    stores = [memory.store(f"s{i}") for i in range(12)]
    closing = stores[::3]
    for s in closing:  # as ``_Journal.close`` on another thread leaves it mid-way: its files closed, fd not -1 yet
        s._journal.closing = True
        os.close(s._journal.fd)
        os.close(s._journal.lock_fd)
    others = [s for s in stores if s not in closing]
    try:
        shared, errors = fork_holding_locks(others)
    finally:
        for s in closing:  # what the interrupted close had left to do
            s._closer.detach()
            s._journal.fd = -1
            os.close(s._data_fd)
            os.close(s._dir_fd)
    assert (shared, errors) == (0, 0)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forks_while_another_thread_closes_stores_keep_every_lock_the_childs_own(home):
    """The tester's shape: forks while another thread opens and drops stores (their finalizers close them)."""
    kept = memory.store("kept")
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            s = memory.store("churn")
            s.get("x")  # a remembered read: closing it locks and appends, a longer window
            del s

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    forks, shared, errors = 200, 0, 0
    try:
        for _ in range(forks):
            one_shared, one_errors = fork_holding_locks([kept])
            shared += one_shared > 0
            errors += one_errors > 0
    finally:
        stop.set()
        thread.join(timeout=30)
    print(f"\n{forks} forks while another thread closed stores: children sharing the parent's lock {shared}, "
          f"with a fork-hook error {errors}")
    assert (shared, errors) == (0, 0)


def test_each_runs_every_item_and_raises_the_first_failure_after():
    from apsi_memory.system.once import each

    seen: list[int] = []

    def action(item: int) -> None:
        seen.append(item)
        if item % 2:
            raise OSError(9, f"bad {item}")

    with pytest.raises(OSError, match="bad 1"):
        each(range(5), action)
    assert seen == [0, 1, 2, 3, 4]


# -- issue 26 item 9: a data file truncated under a mapped array -----------------------------------------------------

TRUNCATED_SCRIPT = textwrap.dedent("""
    import os, sys, warnings
    import numpy as np
    from apsi_memory.decide import Level
    from apsi_memory.errors import TamperWarning
    from apsi_memory.store import Store, encode_key, resolve_folder
    from apsi_memory.units import GiB, MiB

    # A fixed level: the RAM tier keeps its mapped arrays whatever the host's pressure.
    s = Store(resolve_folder("t"), "t", 64 * MiB, GiB, level=lambda: Level.OK)
    big = np.arange(100_000.0)  # 800 KB: a memory-mapped file, kept mapped by the RAM tier
    for key in ("empty", "half", "readonly", "kept"):
        s.set(key, big + len(key))
    s.set("small", {"a": 1})
    assert all(encode_key(k) in s._ram.values for k in ("empty", "half", "readonly")), "not mapped in RAM"
    paths = {k: os.path.join(s.folder, "data", s._index.entries[encode_key(k)].name) for k in ("empty", "half",
                                                                                                 "readonly")}
    cut = {"empty": 0, "half": os.path.getsize(paths["half"]) // 2, "readonly": 4096}
    for key, size in cut.items():
        os.truncate(paths[key], size)  # the same inode, as another process of this user could
    warned = 0
    for key in cut:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            value = s.get(key, "miss", writable=key != "readonly")
            if not isinstance(value, str):
                value.sum()  # every page read: a mapping past the file's end would raise SIGBUS here
        assert isinstance(value, str), f"{key}: a value from a truncated file"
        assert any(issubclass(w.category, TamperWarning) and "bytes, expected" in str(w.message)
                   for w in seen), [str(w.message) for w in seen]
        warned += 1
        assert key not in s and not os.path.exists(paths[key]), f"{key}: not removed"
    assert (s.get("kept") == big + 4).all() and s.get("small") == {"a": 1}
    fresh = Store(resolve_folder("t"), "t", 0, GiB, level=lambda: Level.OK)
    assert sorted(fresh) == ["kept", "small"], sorted(fresh)
    print(f"truncated files {len(cut)}, misses with a warning {warned}, kept intact 2")
""")


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent, env=dict(os.environ), check=False)


def test_a_data_file_truncated_under_a_mapped_array_is_a_warned_miss_not_a_sigbus():
    """Before the fix the next ``get`` of a RAM-tier array whose file was cut short read the mapping past the file's
    end: SIGBUS killed the process. Run in a child, so a SIGBUS kills only it."""
    done = run_script(TRUNCATED_SCRIPT)
    print("\n" + done.stdout.strip())
    assert done.returncode == 0, f"exit {done.returncode} (-7 is SIGBUS): {done.stderr[-2000:]}"
    assert "misses with a warning 3" in done.stdout


def test_control_a_plain_memmap_of_a_truncated_file_dies_of_sigbus(tmp_path):
    """The harness sees a SIGBUS: the same truncation under an unprotected ``np.memmap`` kills the child."""
    script = textwrap.dedent(f"""
        import os
        import numpy as np
        path = {str(tmp_path / "a.npy")!r}
        np.save(path, np.arange(100_000.0))
        a = np.load(path, mmap_mode="r")
        os.truncate(path, 0)
        print(a.sum())
    """)
    done = run_script(script)
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr[-2000:])
