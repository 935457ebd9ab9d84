"""The reservation ledger at its edges (issue 26 items 7, 10-13): every ledger error degrades to "no ledger" with
one WARNING; a replaced file, a flipped byte, a full file, a nonsense claim, a recycled pid, a dead sibling and the
last user leaving. Several ``Siblings`` stand for several processes (see ``test_siblings``); two ``Machine``s over
one fake 4 GiB container, each with its own entry, stand for two processes placing arrays.

Placements: 3 GiB free, arrays of 1.8 GiB. Alone, one fits (70 % of 3 GiB is 2.1 GiB); with a sibling's 1.8 GiB
reserved it does not (70 % of 1.2 GiB), and two in RAM (3.6 GiB) overrun the group: the unprotected control."""

from __future__ import annotations

import errno
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import apsi_memory as memory
import sim.tree
from apsi_memory import Machine
from apsi_memory.machinery import ledger_file, reservations, slots
from apsi_memory.machinery.reservations import FILE_BYTES, SLOT_BYTES, Record, Siblings, pack_record
from apsi_memory.machinery.slots import SLOTS
from apsi_memory.system.once import ForkMark
from sim.clock import FakeClock

GiB, MiB = 1 << 30, 1 << 20
KEY = "reservations-test"
ARRAY = 1843 * MiB  # 1.8 GiB
FAKE = 4_195_000  # pids above any pid_max (2**22): no /proc/<pid> of another process is read for them


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "apsi_memory.siblings" and r.levelno == logging.WARNING]


def machines(tmp_path: Path, ledger: bool = True, first_pid: int | None = FAKE + 1) -> tuple[Machine, Machine]:
    """Two processes of one fake 4 GiB container with 3 GiB free; ``ledger`` False: the unprotected control.
    ``first_pid`` None: the first is this process (its ``statm`` is read, so its placements can take the flat path
    of ``Siblings.reserve_and_read``)."""
    tree = sim.tree.docker_v1(tmp_path / "root", limit=4 * GiB, usage=1 * GiB)
    folder = [str(tmp_path / "ledger")]
    return tuple(Machine(root=str(tree.root), clock=FakeClock(),  # type: ignore[return-value]
                         siblings=Siblings(folder, pid=pid) if ledger else None) for pid in (first_pid, FAKE + 2))


KEPT: list[object] = []  # the arrays placed: held, never written, for the test's length


@pytest.fixture(autouse=True)
def _forget_arrays():  # type: ignore[no-untyped-def]
    yield
    KEPT.clear()


def place(m: Machine) -> str:
    with m.use():
        x = memory.array(ARRAY, "uint8")
        KEPT.append(x)
        return "SSD" if memory.on_disk(x) else "RAM"


# -- item 7: every ledger error degrades to "no ledger", loudly -------------------------------------------------

class Faulty:
    """A stand-in for a module whose function ``name`` fails with ``code``; the rest is the real module's."""

    def __init__(self, real: Any, name: str, code: int) -> None:
        self.real, self.name, self.code = real, name, code

    def __getattr__(self, attr: str) -> Any:
        if attr != self.name:
            return getattr(self.real, attr)

        def fail(*args: object, **kwargs: object) -> Any:
            raise OSError(self.code, os.strerror(self.code))
        return fail


FAULTS = [("ENOSPC", "os", "pwrite"), ("EACCES", "trust", "open_file"), ("EROFS", "trust", "open_file"),
          ("EIO", "os", "pread"), ("EIO", "os", "pwrite"), ("EFBIG", "os", "ftruncate")]


@pytest.mark.parametrize("code,module,call", FAULTS, ids=[f"{c}-{f}" for c, _, f in FAULTS])
def test_a_ledger_error_places_as_with_no_siblings_after_one_warning(tmp_path, monkeypatch, caplog, code, module,
                                                                     call):
    ours, other = machines(tmp_path)
    assert place(other) == "RAM"  # a sibling holds 1.8 GiB it has not written
    assert place(ours) == "SSD"  # the control: with the ledger working, ours sees it and goes to the SSD
    ours.siblings.close()  # type: ignore[union-attr]
    if call == "ftruncate":  # a file too small, that cannot be made whole (EFBIG: past RLIMIT_FSIZE)
        os.truncate(tmp_path / "ledger" / other.siblings.key, 100)  # type: ignore[arg-type,union-attr,operator]
    for part in (reservations, ledger_file):  # the ledger's system calls, in both modules
        if hasattr(part, module):
            monkeypatch.setattr(part, module, Faulty(getattr(part, module), call, getattr(errno, code)))
    caplog.set_level(logging.INFO, "apsi_memory.siblings")
    first = place(ours)  # before: a raw OSError out of memory.array (an INFO line at open)
    with ours.use():
        again = memory.siblings()  # the ledger used once more: no second warning
    said = warnings(caplog)
    print(f"\n{code} at {call}: placed in {first}; then {again}; warnings: {said}")
    assert first == "RAM" and (again.processes, again.ledger) == (0, None)  # as with no siblings
    assert len(said) == 1 and code in said[0] and str(tmp_path / "ledger" / "reservations-") in said[0], said


# -- item 10: the ledger never gives up silently ---------------------------------------------------------------

def test_a_process_whose_ledger_file_was_replaced_publishes_to_the_new_one(tmp_path):
    folder = [str(tmp_path)]
    old, observer = Siblings(folder, pid=FAKE + 11), Siblings(folder)
    old.publish(KEY, GiB, GiB)
    assert observer.read(KEY).reserved_bytes == GiB
    os.unlink(tmp_path / KEY)  # removed (or replaced: the next opener makes a new one) under the running process
    assert observer.read(KEY).reserved_bytes == 0  # the observer, which holds no slot, opened the new file
    time.sleep(ledger_file.CHECK_EVERY + 0.05)  # a process holding a slot asks that often
    old.publish(KEY, 2 * GiB, 2 * GiB)  # before: to the old inode, which nobody reads any more
    after = observer.read(KEY)
    print(f"\nafter the file was replaced: the observer sees {after.processes} process, {after.reserved_bytes} B")
    assert (after.processes, after.reserved_bytes) == (1, 2 * GiB)
    for s in (old, observer):
        s.close()


def test_a_flipped_magic_byte_on_a_live_slot_is_reported_not_dropped(tmp_path, caplog):
    folder = [str(tmp_path)]
    live, observer = Siblings(folder, pid=FAKE + 12), Siblings(folder)
    live.publish(KEY, GiB, GiB)
    slot = live._slot
    with open(tmp_path / KEY, "r+b") as f:
        f.seek(slot * SLOT_BYTES)  # type: ignore[operator]
        f.write(b"X")
    seen = observer.read(KEY)
    print(f"\nflipped magic: {seen.processes} counted, ignored {seen.ignored}, said {warnings(caplog)}")
    assert seen.ignored == (f"slot {slot}: not a record of this version",)  # before: () (silently dropped)
    assert any(f"slot {slot} is held" in line for line in warnings(caplog))
    for s in (live, observer):
        s.close()


def test_the_process_after_every_slot_is_taken_warns_once_and_still_reads(tmp_path, caplog):
    folder = [str(tmp_path)]
    taken = [Siblings(folder, pid=FAKE + 100 + i) for i in range(SLOTS)]
    for s in taken:
        s.publish(KEY, 0, MiB)
    late = Siblings(folder, pid=FAKE + 99)
    late.publish(KEY, GiB, GiB)
    late.publish(KEY, GiB, GiB)
    said = [line for line in warnings(caplog) if "slots are taken" in line]
    assert len(said) == 1 and "does not publish" in said[0], said  # before: INFO, every time
    assert late.read(KEY).processes == SLOTS  # it still sees all of them
    assert Siblings(folder).read(KEY).held_bytes == SLOTS * MiB  # and is not seen
    for s in [*taken, late]:
        s.close()


# -- item 11: a claim is capped by the group's usable memory ----------------------------------------------------

def test_a_claim_above_the_groups_usable_memory_counts_as_that_and_is_said_once(tmp_path, caplog):
    ours, other = machines(tmp_path)
    other.siblings.publish(reservations.group_key(other.memory()), 2**64 - 1, 0)  # type: ignore[union-attr]
    usable = ours.memory().usable
    with ours.use():
        first, second = memory.siblings(), memory.siblings()
    said = [line for line in warnings(caplog) if "nonsense" in line]
    print(f"\nclaim of 2**64-1 B read as {first.reserved_bytes} B (usable {usable}); said {len(said)} time(s)")
    assert first.reserved_bytes == second.reserved_bytes == usable  # before: 2**64-1
    assert len(said) == 1 and f"pid {FAKE + 2}" in said[0]


# -- item 12: a process is (pid, start) everywhere --------------------------------------------------------------

def fake_process(root: Path, pid: int, start: int, rss_pages: int) -> None:
    """``<root>/proc/<pid>/stat`` (start time: field 22) and ``statm`` (resident 2nd, file-backed 3rd)."""
    folder = root / "proc" / str(pid)
    folder.mkdir(parents=True)
    (folder / "stat").write_text(f"{pid} (python) S " + " ".join(["1"] * 18) + f" {start} 0 0\n")
    (folder / "statm").write_text(f"100000 {rss_pages} 0 0 0 0 0\n")


def test_a_recycled_pid_is_not_read_as_the_process_that_published(tmp_path):
    """A long-lived reader keeps ``statm`` open: for the new process of a recycled pid it must open that
    process's own, or the new process's writes never shrink its reservation in the reader's eyes."""
    root, folder, page, pid = tmp_path / "root", [str(tmp_path / "ledger")], os.sysconf("SC_PAGE_SIZE"), 4321
    fake_process(root, pid, 111, 100)
    reader = Siblings(folder, root=str(root))
    first = Siblings(folder, pid=pid, start=111, anon_rss=lambda _: 100 * page)
    first.publish(KEY, GiB, GiB)
    assert reader.read(KEY).reserved_bytes == GiB
    first.close()  # it exits; its pid is given to a new process, which reserves 1 GiB and writes it all
    (root / "proc" / str(pid)).rename(root / "proc" / "gone")  # the old process's files stay as its descriptor saw
    fake_process(root, pid, 222, 100)
    second = Siblings(folder, pid=pid, start=222, anon_rss=lambda _: 100 * page)
    second.publish(KEY, GiB, GiB)
    (root / "proc" / str(pid) / "statm").write_text(f"400000 {100 + GiB // page} 0 0 0 0 0\n")
    after = reader.read(KEY)
    print(f"\nrecycled pid, 1 GiB reserved and written: the reader counts {after.reserved_bytes} B")
    assert after.reserved_bytes == 0  # keyed by pid alone: the old process's statm, 1 GiB forever
    for s in (reader, second):
        s.close()


def test_a_dead_siblings_slot_is_cleared_so_no_reading_counts_it(tmp_path):
    """A process killed (no ``close``): its record stays until a reader that asks about locks clears it."""
    observer = Siblings([str(tmp_path)])
    assert observer.read(KEY).processes == 0  # makes the file
    fd = os.open(tmp_path / KEY, os.O_RDWR)
    assert slots.lock(fd, 0)
    os.pwrite(fd, pack_record(Record(4242, 0, GiB, GiB, 0)), 0)
    os.close(fd)  # killed: the kernel drops its lock, its record stays
    rough = observer.read(KEY, exact=False)  # the control: a reading that does not ask about locks counts it
    assert rough.reserved_bytes == GiB
    exact = observer.read(KEY)
    assert (exact.reserved_bytes, exact.ignored) == (0, ("slot 0: pid 4242 is gone",))
    later = Siblings([str(tmp_path)]).read(KEY, exact=False)
    print(f"\ndead sibling: rough {rough.reserved_bytes} B before the exact reading, {later.reserved_bytes} B after")
    assert later.reserved_bytes == 0 and (tmp_path / KEY).read_bytes() == bytes(FILE_BYTES)
    observer.close()


def test_a_process_never_counts_its_own_slot(tmp_path):
    """Counting its own slot, a process finds its own lock free (it is its own), calls itself dead and zeroes its
    record: its sibling then sees nothing and both go to RAM."""
    ours, other = machines(tmp_path)
    assert place(ours) == "RAM"
    with ours.use():
        assert memory.siblings().processes == 0  # not itself
    assert place(other) == "SSD"  # ours's record still stands


def test_control_without_a_ledger_both_go_to_ram(tmp_path):
    ours, other = machines(tmp_path, ledger=False)
    both = (place(ours), place(other))
    print(f"\nno ledger: {both}, 3.6 GiB placed in RAM with 3 GiB free")
    assert both == ("RAM", "RAM")  # the over-commit the ledger exists to prevent


# -- the rule "of two at once, at least one sees the other" -----------------------------------------------------

def test_of_two_placements_at_once_at_least_one_sees_the_other(tmp_path):
    """The other process's whole placement runs between the two ledger steps of ours (a hook after the first):
    published before read, ours has already published when the other reads, so the other goes to the SSD; read
    before published, neither sees the other and both go to RAM."""
    ours, other = machines(tmp_path)
    done: list[str] = []

    def between(step: str) -> None:
        if not done:
            done.append(step)
            done.append(place(other))
    ours.siblings.on_step = between  # type: ignore[union-attr]
    mine = place(ours)
    print(f"\ninterleaved: ours {mine} (first step: {done[0]}), the other {done[1]}")
    assert "SSD" in (mine, done[1])


def flat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Machine, Machine]:
    """Two processes, ours (this process's pid) having placed and freed once: its slot is held and its file known,
    it saw no sibling, it reserves nothing any more, and its next placement takes the flat path of
    ``reserve_and_read`` (made sure of: the step-by-step path fails)."""
    monkeypatch.setattr(ledger_file, "CHECK_EVERY", 3600.0)  # no check of the file falls due, however slow the test
    ours, other = machines(tmp_path, first_pid=None)
    with ours.use():
        memory.free(memory.array(ARRAY, "uint8"))
    assert ours.siblings is not None and ours.siblings.own().reserved == 0

    def step_by_step(*_: object) -> None:
        raise AssertionError("the placement took the step-by-step path, not the flat one")
    monkeypatch.setattr(ours.siblings, "reserve", step_by_step)
    return ours, other


def test_a_sibling_that_came_after_our_last_reading_is_seen_by_our_next_placement(tmp_path, monkeypatch):
    """Issue 29 item 2: a placement is cheap because its steps are flat (one pwrite, one pread), not because a
    process that saw no sibling last time skips reading. The other process arrives (and places) between our last
    reading, which saw nobody, and our next placement: that placement still reads, sees it, and goes to the SSD."""
    ours, other = flat(tmp_path, monkeypatch)
    assert place(other) == "RAM"  # alone when it placed: ours had nothing reserved
    assert place(ours) == "SSD"  # with the other's 1.8 GiB reserved, 70 % of 1.2 GiB is too little


@pytest.mark.parametrize("step", ["published", "read"])
def test_of_two_placements_at_once_at_least_one_sees_the_other_on_the_flat_path(tmp_path, monkeypatch, step):
    """The rule of ``test_of_two_placements_at_once_at_least_one_sees_the_other`` on the flat path: the other
    process's whole placement runs right after ours's ``step``."""
    ours, other = flat(tmp_path, monkeypatch)
    done: list[str] = []

    def between(at: str) -> None:
        if at == step and not done:
            done.append(place(other))
    ours.siblings.on_step = between  # type: ignore[union-attr]
    mine = place(ours)
    print(f"\nafter {step}: ours {mine}, the other {done}")
    assert done and "SSD" in (mine, done[0])


@pytest.mark.parametrize("call", ["pread", "preadv", "pwrite"])
def test_a_ledger_error_on_the_flat_path_places_as_with_no_siblings_after_one_warning(tmp_path, monkeypatch, caplog,
                                                                                      call):
    """The rule of ``test_a_ledger_error_places_as_with_no_siblings_after_one_warning`` where the placement takes
    the flat path of ``reserve_and_read``: its ledger read (``preadv`` into its buffer; ``pread`` elsewhere) or
    ``pwrite`` fails with EIO. Before: a NameError out of ``memory.array`` on that path's ``except OSError``."""
    ours, other = flat(tmp_path, monkeypatch)
    assert place(other) == "RAM"  # a sibling holds 1.8 GiB it has not written: working, ours would go to the SSD
    monkeypatch.setattr(reservations, "os", Faulty(os, call, errno.EIO))  # the ledger's calls (statm's are slots')
    caplog.set_level(logging.INFO, "apsi_memory.siblings")
    mine = place(ours)
    with ours.use():
        again = memory.siblings()
    said = warnings(caplog)
    print(f"\nEIO at the flat path's {call}: placed in {mine}; then {again}; warnings: {said}")
    assert mine == "RAM" and (again.processes, again.ledger) == (0, None)  # as with no siblings
    assert len(said) == 1 and "EIO" in said[0] and str(tmp_path / "ledger" / "reservations-") in said[0], said


# -- item 13: the last user removes the file ---------------------------------------------------------------------

def test_the_last_user_of_a_ledger_file_removes_it_and_only_it(tmp_path):
    folder = [str(tmp_path)]
    first, second, reader = Siblings(folder, pid=FAKE + 21), Siblings(folder, pid=FAKE + 22), Siblings(folder)
    for s in (first, second):
        s.publish(KEY, MiB, MiB)
    assert reader.read(KEY).processes == 2
    first.close()
    assert (tmp_path / KEY).exists()  # a live slot remains
    second.close()
    assert not (tmp_path / KEY).exists()  # no live slot remains; before: there for good
    assert reader.read(KEY).processes == 0 and (tmp_path / KEY).exists()  # a reader opens it anew
    reader.close()
    assert not (tmp_path / KEY).exists()
    third = Siblings(folder, pid=FAKE + 23)
    third.publish(KEY, MiB, MiB)
    os.chmod(tmp_path / KEY, 0o640)  # not as the library made it: left alone
    third.close()
    assert (tmp_path / KEY).exists()


LIBC_FORK = r"""
import ctypes, os, sys, time
import apsi_memory as memory
x = memory.array(64 << 20, "uint8")  # a 64 MiB reservation, never written
fork = ctypes.CDLL(None, use_errno=True).fork  # no Python fork hook runs
for uses_the_library in (True, False):
    if fork() == 0:
        if uses_the_library:  # it must not take its parent's slot for its own
            print("child sees", memory.siblings().processes, flush=True)
        time.sleep(60)
        os._exit(0)
print("parent", os.getpid(), flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_WIPEONFORK is Linux's (elsewhere: getpid)")
def test_the_fork_mark_sees_a_libc_fork_without_asking_getpid(monkeypatch):
    """``ForkMark``, which every placement asks (``Siblings._held_slot``): a child of a C library's fork (no Python
    hook runs) is told apart from its parent by a page the kernel zeroed, with ``getpid`` not called (it fails
    here); the parent is still the process that made the mark."""
    import ctypes

    mark = ForkMark()
    reader, writer = os.pipe()

    def no_getpid() -> int:
        raise AssertionError("getpid asked")
    monkeypatch.setattr(os, "getpid", no_getpid)
    child = ctypes.CDLL(None, use_errno=True).fork()
    if child == 0:
        os.write(writer, b"child %d" % mark.same())
        os._exit(0)
    os.close(writer)
    told = os.read(reader, 100)
    os.waitpid(child, 0)
    os.close(reader)
    assert (told, mark.same()) == (b"child 0", True)


def test_children_of_a_libc_fork_neither_take_nor_keep_their_dead_parents_slot(tmp_path):
    import signal
    import subprocess
    import sys

    env = {**os.environ, "APSI_SPILL_DIR": str(tmp_path / "spill"), "APSI_RAM_BUDGET": "1GB"}
    parent = subprocess.Popen([sys.executable, "-c", LIBC_FORK], stdout=subprocess.PIPE, text=True, env=env,
                              start_new_session=True)
    try:
        assert parent.stdout is not None
        lines = sorted(parent.stdout.readline().strip() for _ in range(2))
        assert lines == ["child sees 1", f"parent {parent.pid}"], lines
        key = reservations.group_key(memory.machine().memory())
        observer = Siblings([os.environ["APSI_LEDGER_DIR"]])
        before = observer.read(key)
        assert before.processes == 2 and before.reserved_bytes > 60 * MiB, before  # the parent and one child (the
        # parent's RSS growth since it published comes off its reservation)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        after = observer.read(key)  # a child still holds the parent's descriptors, and so its slot's lock
        print(f"\nlibc fork: {before.processes} processes, {before.reserved_bytes} B before the parent died; "
              f"{after.processes}, {after.reserved_bytes} B after ({after.ignored})")
        assert (after.processes, after.reserved_bytes) == (1, 0), after  # before: (2, 64 MiB)
        assert observer.read(key, exact=False).reserved_bytes == 0  # its slot was cleared
        observer.close()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_a_process_that_exits_removes_the_ledger_file_it_was_the_last_user_of(tmp_path):
    import subprocess
    import sys

    ledger = tmp_path / "ledger"
    env = {**os.environ, "APSI_LEDGER_DIR": str(ledger)}
    code = "import apsi_memory as memory, os; print(memory.siblings().ledger, os.path.exists(memory.siblings().ledger))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=True)
    assert done.stdout.split()[1] == "True"  # it was there while the process ran
    assert list(ledger.iterdir()) == []  # before: one file per group ever used, there for good


def test_settling_keeps_a_written_reservation_written(tmp_path):
    """An array reserved and then written: its reservation is spent. Freeing another array republishes
    (``settle``); read against the RSS of that moment, the spent reservation counted in full again."""
    rss = {FAKE + 31: 100 * MiB}
    owner, observer = Siblings([str(tmp_path)], pid=FAKE + 31, anon_rss=rss.get), Siblings([str(tmp_path)],
                                                                                            anon_rss=rss.get)
    owner.reserve(KEY, GiB, GiB + 64 * MiB)
    rss[FAKE + 31] += GiB  # the owner writes it all
    assert observer.read(KEY).reserved_bytes == 0
    owner.settle(KEY, GiB)  # a 64 MiB array freed
    after = observer.read(KEY).reserved_bytes
    print(f"\nwritten reservation after a settle: {after} B outstanding")
    assert after == 0  # before: 1 GiB, back from the dead
    for s in (owner, observer):
        s.close()
