"""The watcher wakes on a PSI trigger (adapters/psi.py ``open_trigger``) instead of waiting out ``every``."""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest

import apsi_memory as memory
from apsi_memory.adapters.psi import trigger_line
from apsi_memory.machinery import watcher as watch


def test_the_trigger_line_is_a_share_of_the_window_and_ends_with_nul() -> None:
    assert trigger_line(1_000_000) == b"some 150000 1000000\0"
    assert trigger_line(2_000_000, 0.5) == b"some 1000000 2000000\0"


def _wait_for(condition: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.01)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="out-of-band data on a Unix socket is Linux's")
def test_a_stall_event_wakes_the_watcher_long_before_every(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_side, ours = socket.socketpair()  # out-of-band data makes POLLPRI, as a PSI trigger's event does
    monkeypatch.setattr(watch, "open_trigger", lambda path: os.dup(ours.fileno()))
    watcher = memory.on_pressure(lambda reading: None, level="critical", every=60)
    try:
        assert _wait_for(lambda: watcher.checks == 1)
        kernel_side.send(b"!", socket.MSG_OOB)
        assert _wait_for(lambda: watcher.triggered >= 1), "the event did not wake the watcher"
        ours.recv(1, socket.MSG_OOB)  # read, as a kernel trigger's event is by the poll that reports it
        assert watcher.checks >= 2
    finally:
        started = time.monotonic()
        watcher.stop()
        assert not watcher.running and time.monotonic() - started < 5  # the pipe ends the 60 s poll too
        kernel_side.close()
        ours.close()
