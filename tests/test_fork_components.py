"""A fork while another thread holds a machine's component lock (issue 26, item 5): the child's first big
``memory.array`` must not wait forever on the copy of a lock whose holder does not exist in the child. The control
forks with a plain ``threading.Lock`` held the same way: its child hangs, so the harness can see a hang."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

import apsi_memory as memory
from apsi_memory.machinery.machines import machine

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.fork"), pytest.mark.faults,
              # the point of these tests: a fork while another thread holds a lock
              pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")]


def _fork_while_held(lock: AbstractContextManager[object], child: Callable[[], None], timeout: float) -> str:
    """Fork while another thread holds ``lock``; how the child ended: ``exited 0``, ``exited N`` or ``hung`` (still
    running after ``timeout`` seconds, then killed)."""
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            done.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child()
            code = 0
        finally:
            os._exit(code)
    done.set()
    thread.join(10)
    return _outcome(pid, timeout)


def _outcome(pid: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            return f"exited {os.waitstatus_to_exitcode(status)}"
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def _big_array_and_relieve() -> None:
    x = memory.array(4 << 20, "uint8")  # the machine's first big array: the mover registers with the components
    x[:] = 1
    memory.relieve()  # tells every component: takes the lock again
    assert int(x[-1]) == 1


@pytest.mark.parametrize("holder", ["components", "tracker"])
def test_a_child_forked_while_a_thread_holds_the_component_lock_makes_a_big_array(holder: str) -> None:
    lock = getattr(machine(), holder)._lock  # the components' registry, or the level's (published on allocations)
    started = time.monotonic()
    outcome = _fork_while_held(lock, _big_array_and_relieve, timeout=10)
    print(f"child forked with the {holder} lock held: {outcome} after {time.monotonic() - started:.2f} s")
    assert outcome == "exited 0"


def test_control_a_plain_lock_held_at_the_fork_hangs_the_child() -> None:
    lock = threading.Lock()

    def take() -> None:
        with lock:
            pass

    assert _fork_while_held(lock, take, timeout=1) == "hung"
