"""A Ctrl-C swallowed by a finalizer is kept for the next check (``system.interrupts``). ``memory.map``'s block
loop checks it: its dask engine drops a future per block on the main thread (``tests/test_dask.py``)."""

from __future__ import annotations

import os
import signal
import time
import weakref

import pytest

from apsi_memory.system.interrupts import interrupts_kept

pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
              pytest.mark.usefixtures("ctrl_c_raises")]


class _Held:
    """An object whose finalizer is where the Ctrl-C arrives."""


def _swallow_a_ctrl_c() -> None:
    """Python's own behaviour: a KeyboardInterrupt raised in a finalizer is printed and dropped."""
    def interrupt() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)

    held = _Held()
    weakref.finalize(held, interrupt)
    del held


def test_python_drops_a_ctrl_c_raised_in_a_finalizer() -> None:
    """The control: without ``interrupts_kept`` the program goes on as if Ctrl-C had not been pressed."""
    _swallow_a_ctrl_c()


def test_the_swallowed_ctrl_c_is_raised_at_the_next_check_and_on_leaving() -> None:
    with interrupts_kept() as interrupted:
        _swallow_a_ctrl_c()
        with pytest.raises(KeyboardInterrupt):
            interrupted()
    with pytest.raises(KeyboardInterrupt), interrupts_kept():
        _swallow_a_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_program_that_chose_its_own_handler_keeps_it() -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        with interrupts_kept() as interrupted:
            assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            interrupted()
        assert got == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)

