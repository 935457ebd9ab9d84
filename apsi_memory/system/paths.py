"""Where the library keeps its files. Read from the environment on every call so a test (or a user) can move them.

The variables (``APSI_HOME``, ``APSI_SPILL_DIR``, ``APSI_STORE_DIR``, and ``APSI_LEDGER_DIR`` through
``env_folder``) follow the XDG base directory rules: an empty
value counts as unset (``APSI_HOME=$UNSET_VAR`` then means the default, not the working folder), ``~`` is
expanded, and a relative path is refused with an ``ArgumentError`` naming the variable (it would put files
wherever the program happens to run). A variable that names a shared sticky folder (``/tmp``, ``/dev/shm``) means
this user's private subfolder there, ``apsi-<uid>``, made 0700 and checked like our own folders: another user
cannot rename or remove it, and if someone else made it first it is refused (``trust``), naming the variable.

Nothing here creates a folder: callers that write use ``private_dir`` (0700, created on first use)."""

from __future__ import annotations

import functools
import os

from ..errors import ArgumentError
from .trust import make_private, shared, within

APSI_HOME = "~/.apsi"


def apsi_home() -> str:
    """``APSI_HOME`` or ``~/.apsi``: the key, and the spill and store folders unless they are set apart."""
    return env_folder("APSI_HOME", os.path.expanduser(APSI_HOME))


def spill_dir() -> str:
    """``APSI_SPILL_DIR`` or ``~/.apsi/spill``: where arrays that do not fit in RAM are memory-mapped."""
    return env_folder("APSI_SPILL_DIR", os.path.join(apsi_home(), "spill"))


def store_dir() -> str:
    """``APSI_STORE_DIR`` or ``~/.apsi/store``: where named stores live."""
    return env_folder("APSI_STORE_DIR", os.path.join(apsi_home(), "store"))


def runtime_dir() -> str | None:
    """``XDG_RUNTIME_DIR`` where it is an absolute path; None where it is unset, empty or relative (the XDG base
    directory spec says to ignore a relative one: it would name a folder wherever the program runs)."""
    value = os.environ.get("XDG_RUNTIME_DIR", "")
    return os.path.normpath(value) if os.path.isabs(value) else None


@functools.lru_cache(maxsize=64)  # every placement in a limited group asks: hashed once
def ledger_name(version: int, directory: str) -> str:
    """The reservation ledger's file name for the memory group at ``directory`` (``CgroupMemory.binding``) of
    cgroup ``version``: a hash, since the folder's path may be long and holds ``/``."""
    import hashlib  # here, with the first ledger: it loads OpenSSL, which a first reading or array need not

    return "reservations-" + hashlib.sha256(f"v{version}:{directory}".encode()).hexdigest()[:24]


def env_folder(variable: str, default: str) -> str:
    """The folder ``variable`` names (see the module docstring), or ``default`` where it is unset or empty."""
    value = os.environ.get(variable, "")
    if not value:
        return default
    folder = os.path.expanduser(value)
    if not os.path.isabs(folder):
        raise ArgumentError(f"{variable}={value!r} is a relative path, which would put files wherever the program "
                            f"runs; set {variable} to an absolute path (e.g. ~/.apsi), or unset it")
    return own_part(os.path.normpath(folder))


def own_part(folder: str) -> str:
    """``folder``, or in a shared sticky folder this user's private subfolder ``apsi-<uid>`` in it."""
    try:
        st = os.stat(folder)
    except OSError:
        return folder  # missing (made 0700 on first use) or unreadable (refused by whoever uses it, by name)
    return os.path.join(folder, f"apsi-{os.geteuid()}") if shared(st) else folder


def key_path() -> str:
    """This user's signing key for pickled store values; outside every store so a copied store brings no key."""
    return os.path.join(apsi_home(), "key")


def private_dir(path: str) -> str:
    """Create ``path`` and every missing parent, each 0700, and check it is ours and writable by nobody else
    (``trust.UnsafePathError`` otherwise, naming the fix); returns it. Below ``apsi_home()`` (the default spill and
    store folders), the home itself is checked as ours first: it holds the key, so a link or a folder of someone
    else's there is refused for spill files too, not only for the key."""
    home = apsi_home()
    if os.path.abspath(path) != home and within(os.path.abspath(path), home):
        make_private(home)
    return make_private(path)


def display(path: str) -> str:
    """``~/.apsi/spill`` rather than ``/home/me/.apsi/spill`` in one-line reports."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path
