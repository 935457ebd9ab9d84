"""The running total of our RAM arrays, as the siblings are told it (machinery/held.py): whatever the order of the
threads that change it, the last total told is the total held. Each telling used to pass on the total of its own
change, so the slower of two threads told an older total last and the siblings planned with one array too few; the
interleavings are forced here, not waited for."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from apsi_memory.machinery.held import Ledger
from tests.load import stretched


def _told_with(during_first: object) -> tuple[Ledger, list[int]]:
    """A ledger whose first telling runs ``during_first(ledger)`` before it records the total it was given."""
    told: list[int] = []
    first = [True]

    def changed(held: int) -> None:
        if first[0]:
            first[0] = False
            during_first(ledger)  # type: ignore[operator]
        told.append(held)

    ledger = Ledger(changed)
    return ledger, told


def test_another_threads_change_during_a_telling_is_told_last() -> None:
    def other_thread_adds(ledger: Ledger) -> None:
        thread = threading.Thread(target=ledger.add, args=(20,))
        thread.start()
        thread.join(stretched(10))
        assert not thread.is_alive(), "the second thread waited for the first one's telling"

    ledger, told = _told_with(other_thread_adds)
    ledger.add(10)
    assert ledger.held() == 30
    assert told[-1] == 30, told  # the old rule: [30, 10], the first thread's 10 told last


def test_a_change_from_inside_the_telling_is_told_after_it() -> None:
    """As when a garbage collection inside the telling frees a dead big array (its finalizer gives bytes back)."""
    ledger, told = _told_with(lambda ledger: ledger.remove(4))
    ledger.add(10)
    assert ledger.held() == 6
    assert told[-1] == 6, told  # the old rule: [6, 10]


def test_a_failing_telling_leaves_the_next_change_told() -> None:
    def fail(ledger: Ledger) -> None:
        raise OSError("the ledger file went away")

    ledger, told = _told_with(fail)
    with pytest.raises(OSError, match="went away"):
        ledger.add(10)
    ledger.add(1)
    assert told == [11]


@pytest.mark.faults
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_a_parent_thread_tells_tells_its_own_changes() -> None:
    """The child has no copy of the telling thread: a ledger that left its changes to that thread told nothing."""
    inside, release = threading.Event(), threading.Event()
    read, write = os.pipe()

    def changed(held: int) -> None:
        if threading.current_thread().name == "teller":
            inside.set()
            release.wait(stretched(30))
        else:
            os.write(write, f"{held}\n".encode())

    ledger = Ledger(changed)
    teller = threading.Thread(target=ledger.add, args=(10,), name="teller")
    teller.start()
    assert inside.wait(stretched(10))
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            ledger.add(5)
        finally:
            os._exit(0)
    release.set()
    teller.join(stretched(10))
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        assert pipe.read() == "15\n"  # without the fork hook: "", the child's change left to a thread it lacks
