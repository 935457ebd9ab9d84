"""The files the library keeps, made visible: ``apsi-memory spill``, ``apsi-memory stores``, ``apsi-memory clean``.

Everything here reads folders someone else may have written to, so: entries are looked at with ``lstat`` (a
symlink is listed as what it is and never followed), spill files count only under the names ``spill.owner_of``
recognises, a store is only a real folder (not a link) holding a store ``index``, and ``clean`` deletes only this
user's spill files whose owner process is dead (the rule ``spill.reclaim`` applies) or clears one named store
through the store's own API, under its lock.

Note that a process's first spill reclaims this user's dead spill files in its folder, so ``spill`` mostly shows
live owners' files, files of processes killed since, and other users' files, which are never touched.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..adapters import processes
from ..arrays import spill
from ..errors import ArgumentError, CorruptFileError
from ..store import Store, resolve_folder
from ..system import paths
from ..system.trust import untrusted
from ..units import fmt_size

STORE_INDEX = "index"  # the journal every store folder has (the theory of operation in ``store/__init__.py``)
UNLIMITED = 1 << 62  # a disk limit no store reaches: opening a store to count it must never evict


@dataclass(frozen=True)
class SpillFile:
    """One spill file: who made it (pid and start time from its name), whether that process still runs, size,
    age in seconds, and whether it is this user's (only those are ever deleted)."""

    path: str
    pid: int
    alive: bool
    size_bytes: int
    age_s: float
    mine: bool

    def __str__(self) -> str:
        state = "alive" if self.alive else "dead"
        owner = "" if self.mine else " (another user's)"
        return (f"{fmt_size(self.size_bytes):>10}  {_age(self.age_s):>6}  pid {self.pid} {state}{owner}  "
                f"{paths.display(self.path)}")


@dataclass(frozen=True)
class StoreFolder:
    """One store under the store folder. ``entries`` is ``None`` when it was not opened: another user's store,
    or one that cannot be read (``problem`` says why). ``limit_bytes`` is ``None`` because the SSD limit is not
    kept on disk: each process passes its own ``disk_gb`` when it opens the store (``store.DEFAULT_DISK_GB``)."""

    name: str
    path: str
    entries: int | None
    bytes_on_ssd: int
    limit_bytes: int | None
    problem: str | None = None

    def __str__(self) -> str:
        entries = f"? entries ({self.problem})" if self.entries is None else \
            f"{self.entries} {'entry' if self.entries == 1 else 'entries'}"
        limit = "limit set when opened" if self.limit_bytes is None else f"limit {fmt_size(self.limit_bytes)}"
        return f"{self.name}: {entries}, {fmt_size(self.bytes_on_ssd)} on the SSD, {limit}  {paths.display(self.path)}"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _names(folder: str) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:  # no folder yet (nothing kept), or not ours to read
        return []


# -- spill files ---------------------------------------------------------------------------------------------------

def _listable(folder: str) -> str:
    """``folder``, made absolute, if it is a folder or is not there yet (nothing kept); anything else there (a file,
    a symbolic link) is an ``UnsafePathError`` naming the variable that pointed there, not an empty listing."""
    folder = os.path.abspath(folder)
    info = _lstat(folder)
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise untrusted(folder, "is not a folder (a file or a symbolic link)")
    return folder


def spill_files(folder: str | None = None) -> list[SpillFile]:
    """The spill files in ``folder`` (default: the configured spill folder), oldest first."""
    folder = _listable(folder or paths.spill_dir())
    now = time.time()
    found: list[SpillFile] = []
    for name in _names(folder):
        owner = spill.owner_of(name)
        path = os.path.join(folder, name)
        info = _lstat(path)
        if owner is None or info is None or not stat.S_ISREG(info.st_mode):
            continue  # not a name we give, or a link/folder wearing one: not a spill file
        found.append(SpillFile(path, owner[0], processes.owner_alive(*owner), info.st_size, max(0.0, now - info.st_mtime),
                               info.st_uid == os.getuid()))
    return sorted(found, key=lambda f: -f.age_s)


def clean_spill(folder: str | None = None, dry_run: bool = False) -> list[SpillFile]:
    """Delete (or with ``dry_run`` only list) this user's spill files whose owner is dead; returns them."""
    dead = [f for f in spill_files(folder) if f.mine and not f.alive]
    if dry_run:
        return dead
    removed = set(spill.reclaim(os.path.abspath(folder or paths.spill_dir())))
    return [f for f in dead if f.path in removed]


# -- stores --------------------------------------------------------------------------------------------------------

def _bytes_under(folder: str) -> int:
    """Bytes of the regular files in ``folder`` and its ``data`` folder (links not followed, not counted)."""
    total = 0
    for sub in (folder, os.path.join(folder, "data")):
        for name in _names(sub):
            info = _lstat(os.path.join(sub, name))
            if info is not None and stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def _store_folder(path: str) -> os.stat_result | None:
    """The folder's stat if ``path`` is a real folder (not a link) holding a store index that is a regular file."""
    info = _lstat(path)
    index = _lstat(os.path.join(path, STORE_INDEX))
    if info is None or index is None or not stat.S_ISDIR(info.st_mode) or not stat.S_ISREG(index.st_mode):
        return None
    return info


def _open(name: str, path: str) -> Store:
    return Store(path, name, ram_bytes=0, disk_bytes=UNLIMITED)


def stores(folder: str | None = None) -> list[StoreFolder]:
    """Every store under ``folder`` (default: the configured store folder), by name."""
    folder = _listable(folder or paths.store_dir())
    found: list[StoreFolder] = []
    for name in _names(folder):
        path = os.path.join(folder, name)
        info = _store_folder(path)
        if info is None:
            continue
        entries, problem = _count(name, path) if info.st_uid == os.getuid() else (None, "another user's")
        found.append(StoreFolder(name, path, entries, _bytes_under(path), None, problem))
    return found


def _count(name: str, path: str) -> tuple[int | None, str | None]:
    """The number of entries, or ``None`` and why the store could not be opened (a damaged index, no access)."""
    try:
        opened = _open(name, path)
    except (CorruptFileError, OSError) as exc:
        return None, str(exc)
    try:
        return len(opened), None
    finally:
        opened.close()


def clear_store(name: str, dry_run: bool = False) -> StoreFolder:
    """Remove every entry of the store ``name`` (a plain name under the store folder); returns what it held.

    ``ArgumentError`` (``UnsafePathError`` for another user's store) naming the problem for a name that is not a store of this user's here."""
    if not name or os.sep in name or name.startswith((".", "~")):
        raise ArgumentError(f"--store takes the plain name of a store under {paths.display(paths.store_dir())}, "
                         f"not {name!r}")
    path = resolve_folder(name)
    info = _store_folder(path)
    if info is None:
        raise ArgumentError(f"there is no store {name!r} in {paths.display(paths.store_dir())}")
    if info.st_uid != os.getuid():
        raise untrusted(path, f"(store {name!r}) belongs to uid {info.st_uid}, not to this user")
    entries, problem = _count(name, path)
    if problem is not None:
        raise ArgumentError(f"store {name!r} cannot be opened: {problem}")
    before = StoreFolder(name, path, entries, _bytes_under(path), None)
    if not dry_run:
        opened = _open(name, path)
        try:
            opened.clear()
        finally:
            opened.close()
    return before


def as_dict(item: SpillFile | StoreFolder) -> dict[str, Any]:
    return asdict(item)
