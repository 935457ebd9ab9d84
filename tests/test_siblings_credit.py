"""The placement credit (issue 29 item 2): a process with room publishes a credit of ``C`` bytes on top of its
reservation at a full ledger step, and its next small placements draw on it with no ledger system call. Our
process (this pid: its ``statm`` is read) and a sibling (a fake pid, reading the ledger) share one fake 4 GiB
container with 3 GiB free; ``C`` is then 16 MiB (a 256th of 4 GiB), and arrays are 2 MiB."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import apsi_memory as memory
import sim.tree
from apsi_memory import Machine
from apsi_memory.machinery import ledger_file
from apsi_memory.machinery.reservations import Siblings
from apsi_memory.machinery.slots import SLOT_BYTES
from sim.clock import FakeClock

MiB, GiB = 1 << 20, 1 << 30
C = 16 * MiB
ARRAY = 2 * MiB
FAKE = 4_195_000  # a pid above any pid_max: no /proc/<pid> of another process is read for it


@pytest.fixture
def two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Machine, Siblings]]:
    """Our machine, and the sibling's entry in the same ledger folder."""
    monkeypatch.setattr(ledger_file, "CHECK_EVERY", 3600.0)  # no check of the file falls due, however slow the test
    tree = sim.tree.docker_v1(tmp_path / "root", limit=4 * GiB, usage=1 * GiB)
    folder = [str(tmp_path / "ledger")]
    ours = Machine(root=str(tree.root), clock=FakeClock(), siblings=Siblings(folder))
    other = Siblings(folder, pid=FAKE)
    yield ours, other
    assert ours.siblings is not None
    ours.siblings.close()
    other.close()


def steps(m: Machine) -> list[str]:
    """The ledger steps of ``m``'s placements from now on (``on_step``)."""
    seen: list[str] = []
    assert m.siblings is not None
    m.siblings.on_step = seen.append
    return seen


def place(m: Machine, nbytes: int = ARRAY) -> np.ndarray:
    with m.use():
        x = memory.array(nbytes, "uint8")
    assert not memory.on_disk(x)
    return x


def published(ours: Machine, other: Siblings) -> int:
    """What the sibling counts as ours (every intact record in full: the upper bound a placement reads)."""
    assert ours.siblings is not None and ours.siblings.key is not None
    return other.read(ours.siblings.key, exact=False).reserved_bytes


class Calls:
    """Counts the ledger's system calls: ``os.pread``, ``os.preadv`` and ``os.pwrite`` on its file or on a ``statm``
    (the memory reading's own, of the cgroup's files, are not the ledger's)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
        self.count = 0
        self.folder = str(folder)
        for name in ("pread", "preadv", "pwrite"):
            monkeypatch.setattr(os, name, self._counting(getattr(os, name)))

    def _counting(self, real):  # type: ignore[no-untyped-def]
        def call(fd, *args):  # type: ignore[no-untyped-def]
            target = os.readlink(f"/proc/self/fd/{fd}")
            self.count += target.startswith(self.folder) or target.endswith("/statm")
            return real(fd, *args)
        return call


def test_a_placement_inside_the_credit_makes_no_ledger_system_call(two, monkeypatch, tmp_path):
    ours, _ = two
    first = steps(ours)
    calls = Calls(monkeypatch, tmp_path / "ledger")
    kept = [place(ours)]
    assert (first, calls.count) == (["published", "read"], 3)  # the full step that takes the credit: statm, write, read
    calls.count = 0
    later = steps(ours)
    kept += [place(ours) for _ in range(C // ARRAY)]  # 16 MiB more: the whole credit
    memory.free(kept.pop())  # a free within the credit: nothing published
    print(f"\n{C // ARRAY} placements and a free in the credit: {calls.count} pread/pwrite, steps {later}")
    assert (later, calls.count) == ([], 0)
    kept.append(place(ours))  # the freed bytes do not come back to the credit: spent, so a full step
    assert later == ["published", "read"]


def test_a_sibling_that_reads_after_our_first_placement_counts_our_credit_as_reserved(two):
    ours, other = two
    kept = [place(ours)]
    assert published(ours, other) == ARRAY + C
    kept += [place(ours) for _ in range(3)]  # drawn from the credit: what the sibling counts does not change
    assert published(ours, other) == ARRAY + C


def test_with_tight_memory_no_credit_is_taken_and_every_placement_publishes_and_reads(two):
    ours, other = two
    ours.budget("40MB")  # room after a 2 MiB placement: under 4 credits
    seen = steps(ours)
    kept = [place(ours) for _ in range(3)]
    assert seen == ["published", "read"] * 3
    assert published(ours, other) == 3 * ARRAY  # what was placed, no credit
    del kept


@pytest.mark.parametrize("how", ["os.fork", "libc fork"])
def test_a_forked_child_starts_without_its_parents_credit(two, how):
    """A child forked by Python (its fork hooks run) or by the C library (none runs: ``ForkMark`` tells)."""
    import ctypes

    ours, _ = two
    kept = [place(ours)]  # the parent holds a credit
    read, write = os.pipe()
    pid = os.fork() if how == "os.fork" else ctypes.CDLL(None, use_errno=True).fork()
    if pid == 0:  # the child: its first placement takes the full step, in a slot of its own
        try:
            seen = steps(ours)
            place(ours)
            os.write(write, ",".join(seen).encode())
        finally:
            os._exit(0)
    os.close(write)
    said = os.read(read, 100).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert said == "published,read"
    del kept


def test_the_credit_is_retaken_once_spent_and_never_piles_up(two, monkeypatch):
    """A 2 MiB array placed and freed 45 times: the credit (16 MiB: 8 arrays) is re-taken at a full step each time
    it is spent, about once in 9; frees within it publish nothing; what the sibling counts stays within the bytes
    placed plus two credits (the credit and frees not yet published), not growing by a credit a cycle."""
    ours, other = two
    seen = steps(ours)
    most = 0
    for _ in range(45):
        x = place(ours)
        most = max(most, published(ours, other))
        memory.free(x)
    full = seen.count("published")
    print(f"\n45 placements: {full} full steps, the sibling counted at most {most / MiB:.0f} MiB")
    assert 45 // (C // ARRAY + 1) <= full <= 45 // (C // ARRAY) + 1
    assert most <= ARRAY + 2 * C


def test_a_full_step_before_the_credit_is_spent_takes_a_fresh_one_instead_of_adding_one(two, monkeypatch):
    """With a check of the file due at every placement, each takes the full step with the credit unspent: the
    sibling counts the arrays held and one credit, not one credit per step."""
    ours, other = two
    monkeypatch.setattr(ledger_file, "CHECK_EVERY", 0.0)
    seen = steps(ours)
    kept = [place(ours) for _ in range(5)]
    assert seen.count("published") == 5
    assert published(ours, other) == 5 * ARRAY + C
    del kept


def test_a_full_step_counts_what_the_file_holds_now_not_what_an_earlier_read_held(two, tmp_path):
    """A full step reads the file into a buffer it keeps (a fresh 6 KiB bytes object costs more than the read):
    a sibling's record cut off the file since the last read is not counted from the buffer's old bytes."""
    ours, other = two
    kept = [place(ours)]  # our slot (the first), and the key
    assert ours.siblings is not None and ours.siblings.key is not None
    other.publish(ours.siblings.key, 64 * MiB, 64 * MiB)  # the sibling's record, in the next slot
    big = 2 * C  # bigger than the credit: every placement takes the full step
    kept.append(place(ours, big))
    assert ours.siblings.last is not None and ours.siblings.last.reserved_bytes == 64 * MiB
    os.truncate(tmp_path / "ledger" / ours.siblings.key, SLOT_BYTES)  # the file now holds our slot only
    kept.append(place(ours, big))
    assert ours.siblings.last.reserved_bytes == 0


def test_a_process_entered_in_another_group_while_it_holds_a_credit_is_published_there(two):
    """A free within the credit publishes nothing (``settle``), but only in the credit's own group: a process that
    moved to another memory group is entered in that group's ledger at once (``siblings()`` calls ``settle``)."""
    ours, other = two
    kept = [place(ours)]  # a credit in our group's ledger
    assert ours.siblings is not None
    ours.siblings.settle("reservations-elsewhere", 4 * MiB)
    assert other.read("reservations-elsewhere").held_bytes == 4 * MiB
    del kept


def test_a_credit_is_given_up_once_memory_turns_tight(two):
    """A credit taken with room to spare is given up by the first placement after which the room holds under 4
    credits: the placements after it take the full step again."""
    ours, _ = two
    kept = [place(ours)]  # the credit, taken with room
    ours.budget("40MB")  # now the room after a 2 MiB placement is under 4 credits
    seen = steps(ours)
    kept.append(place(ours))  # drawn on the credit, which it then gives up
    assert seen == []
    kept.append(place(ours))
    assert seen == ["published", "read"]
