"""The reservation ledgers' files (``reservations``) as ``apsi-memory spill`` lists them and ``clean`` removes them.

A ledger file stays in its folder after its last process has gone (one per memory group ever used, in
``/dev/shm`` by default), so ``spill`` lists each: its path, its group where this process can name it (the host,
its own group or a group above it: the file's name is a hash), how many of its slots a live process holds (a
slot's lock lives as long as its process), and its size. ``clean`` removes those no live process holds that the
library made: a regular file of this user (never a link), mode at most ``0600``, of the ledger's size, each slot
empty or a record of ours. It takes every slot's lock first, so no process can claim one while the file goes; a
process that opened the file before keeps its slot's lock on the removed inode and finds the new file when it
publishes again (``reservations``).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

from ..system import paths, trust
from ..units import fmt_size
from . import slots
from .ledger_folders import candidate_dirs
from .reader import MemoryReading

_NAME = re.compile(r"reservations-(host|[0-9a-f]{24})")
_CLOEXEC, _NOFOLLOW = getattr(os, "O_CLOEXEC", 0), getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True)
class LedgerFile:
    """One ledger file. ``live_slots``: slots a live process holds (None where the file could not be opened);
    ``ours``: the library made it (``problem`` says why not), the only kind ``clean`` removes. (None also where
    ``clean`` found a slot claimed, or the file replaced, as it was about to remove it: it is kept.)"""

    path: str
    group: str
    live_slots: int | None
    size_bytes: int
    ours: bool
    problem: str = ""

    def __str__(self) -> str:
        live = "? live slots" if self.live_slots is None else f"{self.live_slots} live slot" + "s" * (
            self.live_slots != 1)
        kept = "" if self.ours else f" (not ours: {self.problem})"
        return f"{fmt_size(self.size_bytes):>10}  {live}  {self.group}  {paths.display(self.path)}{kept}"


def group_names(reading: MemoryReading | None) -> dict[str, str]:
    """File name -> group, for the groups this process can name: the host, its group and every group above it."""
    names = {"reservations-host": "host"}
    if reading is not None and reading.cgroup is not None:
        directory = reading.cgroup.directory
        while True:
            names[paths.ledger_name(reading.cgroup.version, directory)] = f"v{reading.cgroup.version}:{directory}"
            if directory in ("/", ""):
                return names
            directory = os.path.dirname(directory)
    return names


def ledger_files(reading: MemoryReading | None = None) -> list[LedgerFile]:
    """Every ledger file in the folders the ledger may use (``ledger_folders.candidate_dirs``) that exist."""
    names = group_names(reading)
    return [found for folder in _folders() for found in _in_folder(folder, names, remove=False)]


def clean_ledgers(reading: MemoryReading | None = None, dry_run: bool = False) -> list[LedgerFile]:
    """Remove (or with ``dry_run`` only find) the ledger files no live process holds that the library made."""
    names = group_names(reading)
    return [found for folder in _folders() for found in _in_folder(folder, names, remove=not dry_run)
            if found.ours and found.live_slots == 0]


def _folders() -> list[str]:
    """The candidate folders that are there (a listing makes none)."""
    return [folder for folder in dict.fromkeys(candidate_dirs()) if os.path.isdir(folder)]


def _in_folder(folder: str, names: dict[str, str], remove: bool) -> list[LedgerFile]:
    try:
        dir_fd = trust.open_folder(folder)  # ours and nobody else's: or nothing in it is read
    except OSError:
        return []
    try:
        return [_one(dir_fd, folder, name, names.get(name, "a group this process cannot name"), remove)
                for name in sorted(os.listdir(dir_fd)) if _NAME.fullmatch(name)]
    finally:
        os.close(dir_fd)


def _one(dir_fd: int, folder: str, name: str, group: str, remove: bool) -> LedgerFile:
    path = os.path.join(folder, name)
    try:
        fd = os.open(name, os.O_RDWR | _NOFOLLOW | _CLOEXEC, dir_fd=dir_fd)  # no O_CREAT: never makes one
    except OSError as exc:  # a link (ELOOP), another user's file, gone meanwhile
        return LedgerFile(path, group, None, _size(dir_fd, name), False, exc.strerror or str(exc))
    try:
        st = os.fstat(fd)
        problem = _not_ours(fd, st)
        live = _live_slots(fd) if stat.S_ISREG(st.st_mode) else None
        if remove and not problem and live == 0 and not slots.remove_if_unused(dir_fd, name, fd, (st.st_dev, st.st_ino)):
            live = None  # a process claimed a slot meanwhile, or the name is another file now: kept
        return LedgerFile(path, group, live, st.st_size, not problem, problem)
    finally:
        os.close(fd)


def _not_ours(fd: int, st: os.stat_result) -> str:
    """Why the open file is not a ledger the library made ("" where it is one)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"belongs to uid {st.st_uid}"
    if stat.S_IMODE(st.st_mode) & ~0o600:
        return f"mode {stat.S_IMODE(st.st_mode):o} (the library makes 600)"
    if st.st_size != slots.FILE_BYTES:
        return f"{st.st_size} bytes, not {slots.FILE_BYTES}"
    data = os.pread(fd, slots.FILE_BYTES, 0)
    for at in range(0, slots.FILE_BYTES, slots.SLOT_BYTES):
        piece = data[at:at + slots.SLOT_BYTES]
        if piece != slots.FREE and not piece.startswith(slots.MAGIC):
            return f"slot {at // slots.SLOT_BYTES} is not a record of this library"
    return ""


def _live_slots(fd: int) -> int:
    """How many slots another open file holds the lock of (its process runs: the kernel drops a dead one's)."""
    live = 0
    for slot in range(slots.SLOTS):
        if slots.lock(fd, slot):
            slots.unlock(fd, slot)
        else:
            live += 1
    return live


def _size(dir_fd: int, name: str) -> int:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size
    except OSError:
        return 0
