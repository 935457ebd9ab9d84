"""Pressure stall information: the share of recent time tasks waited for memory.

The container's own ``memory.pressure`` (cgroup v2, also on hybrid hosts) is preferred to the machine-wide
``/proc/pressure/memory``: a pod can thrash while the host is calm. Absent (kernel before 4.20, v1-only) or
disabled (``psi=0``: the file exists, reads fail with EOPNOTSUPP) is "not available" — never 0 %.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from ..errors import CorruptFileError
from .cgroup import Layout
from .files import KernelFiles

SYSTEM_PSI = "/proc/pressure/memory"


class Psi(NamedTuple):
    some: float  # avg10, percent
    full: float | None  # avg10, percent; None where the kernel has no "full" line
    source: str
    host_wide: bool = False  # every group's stalls: /proc/pressure/memory, or the v2 root group's file


def parse_psi(text: str, path: str = SYSTEM_PSI, host_wide: bool = False) -> Psi:
    """``some avg10=0.12 avg60=... total=...`` and ``full ...`` lines; other lines (a later kernel may add some) are
    skipped. A ``some``/``full`` line without a numeric avg10, or no ``some`` line, is a ``CorruptFileError``."""
    some, full = _as_the_kernel_writes(text) or _by_lines(text, path)
    return Psi(some, full, path, host_wide)


def _by_lines(text: str, path: str) -> tuple[float, float | None]:
    """``parse_psi``'s ``some`` and ``full``, every line split into words."""
    shares: dict[str, float] = {}
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] not in ("some", "full"):
            continue
        fields = dict(word.partition("=")[::2] for word in words[1:])
        try:
            shares[words[0]] = float(fields["avg10"])
        except (KeyError, ValueError):
            raise CorruptFileError(path, f"line {line!r} has no numeric avg10") from None
    if "some" not in shares:
        raise CorruptFileError(path, "no 'some' line")
    return shares["some"], shares.get("full")


def _as_the_kernel_writes(text: str) -> tuple[float, float | None] | None:
    """``some`` and ``full`` avg10 where ``text`` is the kernel's ``some avg10=...`` line and maybe a ``full``
    one, each with one avg10, read without splitting every word (every placement reads PSI); None for any other
    text, which ``_by_lines`` reads."""
    lines = text.splitlines()
    if not 1 <= len(lines) <= 2 or not lines[0].startswith("some avg10=") or (
            len(lines) == 2 and not lines[1].startswith("full avg10=")):
        return None
    values = []
    for line in lines:
        value = line[11:].partition(" ")[0]
        if line.count("avg10=") != 1 or value.split() != [value]:
            return None
        try:
            values.append(float(value))
        except ValueError:
            return None
    return values[0], values[1] if len(values) == 2 else None


def read_psi(source: KernelFiles, layout: Layout) -> Psi | None:
    """The group's PSI, else the machine's; None where neither can be read. A file that reads but does not parse
    raises ``CorruptFileError`` (``read_memory`` keeps it as the reason stalls are not available)."""
    group = layout.v2_directory
    for path in ([os.path.join(group, "memory.pressure")] if group else []) + [SYSTEM_PSI]:
        text = source.read(path)
        if text is not None:
            # (host_wide passed in, not set after with a copy: every placement reads this)
            return parse_psi(text, path, path == SYSTEM_PSI or _root_on_hybrid(layout))
    return None


def _root_on_hybrid(layout: Layout) -> bool:
    """A hybrid host (memory on v1) whose process sits in the v2 root group (``0::/``, systemd's default for
    services): that group's ``memory.pressure`` is the whole host's."""
    v2 = layout.locate(2)
    return layout.locate(1) is not None and v2 is not None and v2.entry.path == "/"


# -- triggers: the kernel wakes a poller when stalls pass a threshold (Linux 5.2) ------------------------------------

TRIGGER_WINDOWS_US = (1_000_000, 2_000_000)  # 1 s; 2 s where only multiples of 2 s are allowed (unprivileged)
TRIGGER_SHARE = 0.15  # of the window stalled: high's PSI "some" threshold (decide.LEVEL_TABLE)


def trigger_line(window_us: int, share: float = TRIGGER_SHARE) -> bytes:
    """``some 150000 1000000`` with its terminating NUL (the kernel replaces the last byte written by one)."""
    return f"some {int(window_us * share)} {window_us}".encode() + b"\0"


def open_trigger(path: str) -> int | None:
    """A descriptor of ``path`` (a PSI file, already under the root) with a trigger on it, to ``poll`` for
    ``POLLPRI``; ``None`` where the kernel or the file refuses (before 5.2, read-only, PSI disabled)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    for window in TRIGGER_WINDOWS_US:
        try:
            os.write(fd, trigger_line(window))
            return fd
        except OSError:
            continue
    os.close(fd)
    return None
