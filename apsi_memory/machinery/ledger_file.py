"""One process's entry in its group's ledger file (``reservations``' theory comment says why and how): which
file, opened safely and checked now and then for removal or replacement, the slot held in it, writing our record
there, and giving the file up after one WARNING on any error. ``reservations.Siblings`` builds the publishing and
reading on it."""

from __future__ import annotations

import contextlib
import errno
import os
import time

from ..logs import logger
from ..system import trust
from ..system.once import ForkMark
from .ledger_folders import LOG, candidate_dirs, open_folder
from .ledger_life import close_in_children, leave_at_exit
from .slots import FILE_BYTES, FREE, SLOT_BYTES, SLOTS, Record, lock, names, pack_record, remove_if_unused, unlock

CHECK_EVERY = 1.0  # seconds: how often a process holding a slot asks whether its file was removed or replaced


class LedgerFile:
    """The file side of a ledger entry. ``directories``: where to look for a safe folder (default
    ``candidate_dirs()``); ``_mine`` is the record this entry publishes and ``_mark`` the mark of the process that
    opened its files (``Siblings`` keeps both)."""

    _mine: Record
    _mark: ForkMark

    def __init__(self, directories: list[str] | None) -> None:
        self._directories = directories

    def _reset_file(self) -> None:
        self._folder: tuple[int, str] | None | bool = False  # False: not looked for yet; None: no safe folder
        self._files: dict[str, tuple[int, tuple[int, int]]] = {}  # key -> descriptor, (device, inode) opened
        self._off: set[str] = set()  # files given up on, each after one WARNING: as with no ledger
        self._said: set[object] = set()  # what was warned about already: once each
        self._slot: int | None = None
        self._key: str | None = None
        self._check_at = 0.0  # when to ask again whether our slot's file is still the one named

    def _give_up(self, key: str, exc: OSError) -> None:
        """Any ledger problem (a full disk, EACCES, EROFS, EIO, a file that cannot be made whole): one WARNING
        naming the file and the errno, then this process goes on without that file, as with no siblings."""
        if key == self._key:
            with contextlib.suppress(OSError):
                self._leave()  # so that no reader counts a record this process can no longer keep right
        if key not in self._off:
            code = errno.errorcode.get(exc.errno or 0, "no errno")
            logger(LOG).warning("reservation ledger %s: %s (%s); this process goes on without it, as with no siblings",
                                self.path(key) or key, code, exc.strerror or exc)
        self._off.add(key)
        self._drop(key)

    def _say(self, what: object, message: str, *args: object) -> None:
        if what not in self._said:
            self._said = self._said if len(self._said) < 4 * SLOTS else set()
            self._said.add(what)
            logger(LOG).warning(message, *args)

    def _file(self, key: str) -> int | None:
        held = self._held_slot(key)
        if held is not None:
            return held[0]  # our slot's file, not due for a check: every placement comes here
        known = self._files.get(key)
        if key in self._off:
            return None
        if self._folder is False:
            close_in_children()  # registered on first use, never at import
            leave_at_exit()
            self._folder = open_folder(self._directories or candidate_dirs())
        if not isinstance(self._folder, tuple):
            return None
        if known is not None and self._still(key, known[1]):
            return known[0]
        if known is not None:  # removed by its last user, or replaced: this process's record goes to the new one
            logger(LOG).info("reservation ledger %s was removed or replaced: reopened", self.path(key))
            self._drop(key)
        fd = self._open(key, self._folder)
        if known is not None and key == self._key and (self._mine.reserved or self._mine.held):
            self._write(key, fd)
        return fd

    def _open(self, key: str, folder: tuple[int, str]) -> int:
        fd = trust.open_file(key, os.O_RDWR | os.O_CREAT, dir_fd=folder[0], shown=os.path.join(folder[1], key))
        try:
            found = os.fstat(fd)
            if found.st_size < FILE_BYTES:
                os.ftruncate(fd, FILE_BYTES)  # racing creators truncate to the same size: nothing is lost
        except OSError:
            os.close(fd)
            raise
        self._files[key] = (fd, (found.st_dev, found.st_ino))
        self._check_at = time.monotonic() + CHECK_EVERY
        return fd

    def _still(self, key: str, opened: tuple[int, int]) -> bool:
        """Whether ``key`` still names the file opened: asked at once where this process holds no slot in it, else
        at most every ``CHECK_EVERY`` seconds (``_file``; only someone else removes a file in which a live slot
        remains)."""
        self._check_at = time.monotonic() + CHECK_EVERY
        return self._current(key, opened)

    def _current(self, key: str, opened: tuple[int, int]) -> bool:
        """Whether ``key`` still names the file opened (one ``fstatat``)."""
        assert isinstance(self._folder, tuple)
        return names(self._folder[0], key, opened)

    def _drop(self, key: str, remove: bool = False) -> None:
        """Close ``key``'s file (its slot's lock goes with it); ``remove``: first remove it if it is the last."""
        known = self._files.pop(key, None)
        if key == self._key:
            self._slot = None
        if known is None:
            return
        if remove and isinstance(self._folder, tuple):
            with contextlib.suppress(OSError):
                remove_if_unused(self._folder[0], key, *known)
        with contextlib.suppress(OSError):
            os.close(known[0])

    @property
    def key(self) -> str | None:
        """The group this process last published to (None before it did)."""
        return self._key

    def path(self, key: str) -> str | None:
        folder = self._folder
        return os.path.join(folder[1], key) if isinstance(folder, tuple) else None

    def _write(self, key: str, fd: int | None) -> None:
        """Write our record in our slot, claiming one first; a file removed between opening and claiming (its
        last user left) is opened anew, once."""
        if fd is not None and self._slot is not None:  # our slot, claimed: every publish but the first
            os.pwrite(fd, pack_record(self._mine), self._slot * SLOT_BYTES)
            return
        for _ in range(2):
            claiming = self._slot is None
            if fd is None or not self._claimed(key, fd):
                return
            assert self._slot is not None
            if not claiming or self._current(key, self._files[key][1]):
                os.pwrite(fd, pack_record(self._mine), self._slot * SLOT_BYTES)
                return
            self._drop(key)
            fd = self._open(key, self._folder) if isinstance(self._folder, tuple) else None

    def _held_slot(self, key: str) -> tuple[int, int] | None:
        """The file and slot this process holds in ``key``'s ledger while the file is not due for its check, where
        a publish may go straight to it; None in a forked child (``ForkMark``: no system call), whose copies of
        them are its parent's."""
        known, slot = self._files.get(key), self._slot
        if known is None or slot is None or key != self._key or time.monotonic() >= self._check_at:
            return None
        return (known[0], slot) if self._mark.same() else None

    def _claimed(self, key: str, fd: int) -> bool:
        """Hold a slot: a free one, or one whose owner died (the kernel dropped its lock)."""
        if self._slot is not None:
            return True
        self._slot = next((slot for slot in range(SLOTS) if lock(fd, slot)), None)
        if self._slot is not None:
            return True
        self._say(("full", key), "reservation ledger %s: all %d slots are taken; this process reads its siblings "
                  "but does not publish, so they do not see its arrays", self.path(key), SLOTS)
        return False

    def _leave(self) -> None:
        """Give up the slot in the previous group's ledger (the process moved, or its limit came or went)."""
        if self._key is None or self._slot is None:
            return
        known = self._files.get(self._key)
        slot, self._slot = self._slot, None
        if known is not None:
            os.pwrite(known[0], FREE, slot * SLOT_BYTES)
            unlock(known[0], slot)
