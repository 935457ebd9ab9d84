"""Where the library keeps its files. Read from the environment on every call so a test (or a user) can move them.

Nothing here creates a folder: callers that write use ``private_dir`` (0700, created on first use)."""

from __future__ import annotations

import os

from .trust import make_private

APSI_HOME = "~/.apsi"


def apsi_home() -> str:
    return os.path.expanduser(os.environ.get("APSI_HOME", APSI_HOME))


def spill_dir() -> str:
    """``APSI_SPILL_DIR`` or ``~/.apsi/spill``: where arrays that do not fit in RAM are memory-mapped."""
    return os.path.expanduser(os.environ.get("APSI_SPILL_DIR") or os.path.join(apsi_home(), "spill"))


def store_dir() -> str:
    """``APSI_STORE_DIR`` or ``~/.apsi/store``: where named stores live."""
    return os.path.expanduser(os.environ.get("APSI_STORE_DIR") or os.path.join(apsi_home(), "store"))


def key_path() -> str:
    """This user's signing key for pickled store values; outside every store so a copied store brings no key."""
    return os.path.join(apsi_home(), "key")


def private_dir(path: str) -> str:
    """Create ``path`` and every missing parent, each 0700, and check it is ours and writable by nobody else
    (``trust.UnsafePathError`` otherwise, naming the fix); returns it."""
    return make_private(path)


def display(path: str) -> str:
    """``~/.apsi/spill`` rather than ``/home/me/.apsi/spill`` in one-line reports."""
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path
