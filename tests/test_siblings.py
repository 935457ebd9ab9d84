"""The reservation ledger (``apsi_memory.siblings``) and the shared budget rule (``decide.shared_budget``).

Several ``Siblings`` in one test stand for several processes: each opens the ledger file itself, so each holds its
own slot lock, and closing one is what the kernel does when a process dies. Their RSS is the test's to move."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import apsi_memory as memory
import sim
import sim.tree
from apsi_memory import Machine
from apsi_memory.cli import commands as cli
from apsi_memory.decide import ALIKE_MIN_BYTES, ALIKE_WITHIN, alike_holders, default_budget, shared_budget
from apsi_memory.errors import UnsafePathError
from apsi_memory.machinery.reservations import (
    FILE_BYTES,
    SLOT_BYTES,
    Record,
    Siblings,
    group_key,
    pack_record,
    parse_record,
)
from sim.clock import FakeClock

GiB, MiB = 1 << 30, 1 << 20
KEY = "reservations-test"
sizes = st.integers(0, 64 * GiB)


# -- the shared budget -------------------------------------------------------------------------------------------

@given(sizes, sizes, sizes, st.integers(1, 64))
def test_a_shared_budget_is_never_more_than_was_free(free, held, reserved, processes):
    budget = shared_budget(free, held, reserved, processes)
    assert 0 <= budget <= free + held  # what was free before our own arrays took it
    if held == 0:
        assert budget <= free


@given(st.integers(0, 64 * GiB), st.lists(st.tuples(sizes, sizes), min_size=1, max_size=16))
def test_the_siblings_budgets_never_add_up_to_more_than_usable(free, processes):
    """Each process holds ``held`` (already out of free) and reserves ``reserved`` (not yet out of free)."""
    usable = free + sum(held for held, _ in processes)
    budgets = [shared_budget(free, held, sum(r for j, (_, r) in enumerate(processes) if j != i), len(processes))
               for i, (held, _) in enumerate(processes)]
    assert sum(budgets) <= usable


@given(sizes, sizes)
def test_one_process_alone_gets_what_it_got_before(free, held):
    assert shared_budget(free, held, 0, 1) == default_budget(free, held)


# -- records -----------------------------------------------------------------------------------------------------

def test_a_torn_or_foreign_record_is_refused_with_its_reason():
    data = pack_record(Record(123, 456, GiB, 2 * GiB, 10 * MiB))
    assert parse_record(data) == Record(123, 456, GiB, 2 * GiB, 10 * MiB)
    torn = data[:20] + b"\xff" * 8 + data[28:]
    assert parse_record(torn) == "checksum does not match (torn or foreign)"
    assert parse_record(b"XXXX" + data[4:]) == "not a record of this version"


def test_the_ledger_refuses_a_folder_others_may_write(tmp_path, caplog):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    siblings = Siblings([str(shared)])
    siblings.publish(KEY, GiB, GiB)
    assert siblings.read(KEY).ledger is None and "writable by others" in caplog.text
    assert not any(shared.iterdir())  # nothing written there
    siblings.close()
    assert issubclass(UnsafePathError, PermissionError)


def test_a_ledger_file_is_bounded(tmp_path):
    many = [Siblings([str(tmp_path)], pid=1000 + i) for i in range(5)]
    for s in many:
        s.publish(KEY, MiB, MiB)
    assert (tmp_path / KEY).stat().st_size == FILE_BYTES
    observer = Siblings([str(tmp_path)])
    assert observer.read(KEY).processes == 5
    for s in [*many, observer]:
        s.close()


# -- the ledger, stateful ----------------------------------------------------------------------------------------

class LedgerMachine(RuleBasedStateMachine):
    """Processes add reservations, get them charged (their RSS grows), free arrays, die, and have their entry
    corrupted; an observer in another process must always see exactly the live, intact entries' outstanding
    reservations, and a reason for every entry it does not count."""

    @initialize()
    def start(self) -> None:
        self.folder = Path(os.environ["APSI_HOME"]) / f"ledger-{id(self)}"
        self.rss: dict[int, int] = {}
        self.procs: dict[int, Siblings] = {}
        self.model: dict[int, tuple[int, int, int]] = {}  # pid -> (reserved, held, rss when published)
        self.corrupt: set[int] = set()
        self.next_pid = 1000
        self.observer = Siblings([str(self.folder)], anon_rss=self.rss.get)

    def teardown(self) -> None:
        for s in [*self.procs.values(), self.observer]:
            s.close()

    def _publish(self, pid: int, reserved: int, held: int) -> None:
        self.procs[pid].publish(KEY, reserved, held)
        self.model[pid] = (reserved, held, self.rss[pid])
        self.corrupt.discard(pid)

    def _outstanding(self, pid: int) -> int:
        reserved, _, then = self.model[pid]
        return max(0, reserved - max(0, self.rss[pid] - then))

    @rule(n=st.integers(1, 4 * GiB))
    def new_process_adds(self, n: int) -> None:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        self.rss[pid] = 50 * MiB
        self.procs[pid] = Siblings([str(self.folder)], pid=pid, anon_rss=self.rss.get)
        self._publish(pid, n, n)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), n=st.integers(1, 4 * GiB))
    def add(self, data: st.DataObject, n: int) -> None:
        pid = data.draw(st.sampled_from(sorted(self.model)))
        assert self.procs[pid].own_outstanding() == self._outstanding(pid)
        self._publish(pid, self._outstanding(pid) + n, self.model[pid][1] + n)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), n=st.integers(0, 4 * GiB))
    def charge(self, data: st.DataObject, n: int) -> None:
        self.rss[data.draw(st.sampled_from(sorted(self.model)))] += n

    @precondition(lambda self: self.model)
    @rule(data=st.data(), n=st.integers(0, 4 * GiB))
    def free(self, data: st.DataObject, n: int) -> None:
        pid = data.draw(st.sampled_from(sorted(self.model)))
        held = max(0, self.model[pid][1] - n)
        self._publish(pid, min(held, self._outstanding(pid)), held)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from(sorted(self.model)))
        self.procs.pop(pid).close()  # what the kernel does to a killed process's files
        del self.model[pid]
        self.corrupt.discard(pid)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), junk=st.binary(min_size=1, max_size=SLOT_BYTES))
    def corrupt_entry(self, data: st.DataObject, junk: bytes) -> None:
        pid = data.draw(st.sampled_from(sorted(self.model)))
        slot = self.procs[pid]._slot
        assert slot is not None
        skip = 4 + data.draw(st.integers(0, 16))  # past the magic, within the slot
        with open(self.folder / KEY, "r+b") as f:
            f.seek(slot * SLOT_BYTES + skip)
            f.write(junk[:SLOT_BYTES - skip])
        f_data = (self.folder / KEY).read_bytes()[slot * SLOT_BYTES:(slot + 1) * SLOT_BYTES]
        if isinstance(parse_record(f_data), str):
            self.corrupt.add(pid)

    @invariant()
    def check_valid(self) -> None:
        if not hasattr(self, "observer"):
            return
        seen = self.observer.read(KEY)
        intact = [pid for pid in self.model if pid not in self.corrupt]
        assert seen.processes == len(intact)
        assert seen.reserved_bytes == sum(self._outstanding(pid) for pid in intact) >= 0
        assert seen.held_bytes == sum(self.model[pid][1] for pid in intact)
        rough = self.observer.read(KEY, exact=False)  # what a placement reads first: never less
        assert rough.reserved_bytes >= seen.reserved_bytes and rough.active >= seen.active
        for pid in self.corrupt:  # not trusted, and said why
            assert f"slot {self.procs[pid]._slot}: checksum does not match (torn or foreign)" in seen.ignored


TestLedger = LedgerMachine.TestCase
TestLedger.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def test_siblings_and_limits_say_what_siblings_hold_reserved(tmp_path):
    other = Siblings([os.environ["APSI_LEDGER_DIR"]], pid=4242)
    try:
        m = memory.machine()
        assert m.siblings is not None
        other.publish(group_key(m.memory()), 300 * MiB, 300 * MiB)
        assert memory.siblings().processes == 1
        assert memory.limits().siblings_reserved_bytes == memory.status().siblings_reserved_bytes > 0
        assert memory.report().siblings_reserved_bytes > 0
        assert memory.budget().siblings_reserved_bytes > 0 and "shared by 2 processes" in memory.budget().source
    finally:
        other.close()


@given(st.lists(st.integers(0, 4 * GiB), max_size=7))
@example([100 * MiB, 101 * MiB, 2000 * MiB, 2010 * MiB])  # two pairs: the one holding more is named
def test_alike_holders_is_the_largest_set_of_processes_holding_about_the_same(held):
    """Checked against every subset: none larger (or as large, holding more) also qualifies."""
    from itertools import combinations

    def qualifies(indices: tuple[int, ...]) -> bool:
        sizes = [held[i] for i in indices]
        return len(sizes) >= 2 and min(sizes) >= ALIKE_MIN_BYTES and max(sizes) <= min(sizes) * (1 + ALIKE_WITHIN)

    found = alike_holders(held)
    assert found == sorted(found) and (found == [] or qualifies(tuple(found)))
    best = max((c for n in range(2, len(held) + 1) for c in combinations(range(len(held)), n) if qualifies(c)),
               key=lambda c: (len(c), min(held[i] for i in c)), default=())
    assert len(found) == len(best) and (not best or min(held[i] for i in found) == min(held[i] for i in best))


def test_siblings_each_and_those_holding_about_the_same_bytes(capsys):
    """Issue 28 item 5: four DataLoader workers each caching 600 MiB showed as one sum; now each sibling shows,
    and the ones that hold about the same bytes (one dataset loaded once per process) are named."""
    m = memory.machine()
    others = [Siblings([os.environ["APSI_LEDGER_DIR"]], pid=pid) for pid in (4242, 4243, 4244)]
    try:
        for other, held in zip(others, (600 * MiB, 10 * MiB, 610 * MiB)):
            other.publish(group_key(m.memory()), 0, held)
        found = memory.siblings()
        assert sorted((s.pid, s.held_bytes) for s in found.each) == [(4242, 600 * MiB), (4243, 10 * MiB),
                                                                      (4244, 610 * MiB)]
        assert [s.pid for s in found.alike] == [4242, 4244]
        assert cli.main(["siblings"]) == 0
        shown = capsys.readouterr().out.splitlines()
        assert "pid 4244: 610.0 MB of RAM arrays, 0 B reserved, RSS" in "\n".join(shown)
        assert shown[-2].startswith("2 processes (pids 4242, 4244) each hold about 600.0 MB of RAM arrays")
        assert shown[-1].startswith("3 siblings, 1.2 GB of RAM arrays, 0 B reserved; ledger ")
        others[2].publish(group_key(m.memory()), 0, 700 * MiB)  # the control: not the same data
        assert memory.siblings().alike == ()
        assert cli.main(["siblings", "--json"]) == 0
        shown_json = json.loads(capsys.readouterr().out)
        assert shown_json["alike"] == [] and shown_json["processes"] == 3
        assert sorted(s["held_bytes"] for s in shown_json["each"]) == [10 * MiB, 600 * MiB, 700 * MiB]
    finally:
        for other in others:
            other.close()


# -- placement with siblings ---------------------------------------------------------------------------------------

def test_a_placement_leaves_what_a_sibling_reserved_and_sees_it_go_when_the_sibling_dies(tmp_path):
    """A 4 GiB container with 3 GiB free: a sibling placed 2.5 GiB it has not written yet. Counting only the
    kernel's free memory, a 1 GiB array went to RAM and the two together overran the group."""
    tree = sim.tree.docker_v1(tmp_path / "root", limit=4 * GiB, usage=1 * GiB)
    ledger = tmp_path / "ledger"
    m = Machine(root=str(tree.root), clock=FakeClock(), siblings=Siblings([str(ledger)]))
    sibling = Siblings([str(ledger)], pid=4242)
    sibling.publish(group_key(m.memory()), 2560 * MiB, 2560 * MiB)
    with m.use():
        x = memory.array(1 * GiB, "uint8")
        assert memory.on_disk(x)
        assert "reserved by siblings" in str(memory.limits()) and memory.limits().siblings == 1
        sibling.close()  # the sibling dies: its slot's lock goes with it
        y = memory.array(1 * GiB, "uint8")
        assert not memory.on_disk(y) and memory.limits().siblings_reserved_bytes == 0


def test_a_machine_over_a_fake_tree_has_no_siblings(tmp_path):
    tree = sim.tree.docker_v1(tmp_path / "root")
    assert sim.machine(tree).siblings is None  # a fake machine's processes are not this host's


FORK_AND_HOLD = r"""
import os, sys, time
import apsi_memory as memory
x = memory.array(512 << 20, "uint8")  # a 512 MiB reservation, never written
if os.fork() == 0:  # a child that outlives its parent, never using the library itself
    time.sleep(60)
    os._exit(0)
print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_a_forked_child_does_not_keep_its_dead_parents_reservation_alive(tmp_path):
    import signal
    import subprocess
    import sys

    ledger = os.environ["APSI_LEDGER_DIR"]
    env = {**os.environ, "APSI_SPILL_DIR": str(tmp_path / "spill"), "APSI_RAM_BUDGET": "1GB"}
    parent = subprocess.Popen([sys.executable, "-c", FORK_AND_HOLD], stdout=subprocess.PIPE, text=True, env=env,
                              start_new_session=True)
    try:
        assert parent.stdout is not None and int(parent.stdout.readline()) == parent.pid
        key = group_key(memory.machine().memory())
        observer = Siblings([ledger])
        assert observer.read(key).reserved_bytes > 500 * MiB
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        after = observer.read(key)  # the child still runs, with copies of the parent's descriptors
        assert (after.processes, after.reserved_bytes) == (0, 0), after
        observer.close()
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
