"""Where the reservation ledger (``reservations``) keeps its files: ``APSI_LEDGER_DIR`` alone where set, else the
first of ``/dev/shm/apsi-<uid>``, ``$XDG_RUNTIME_DIR/apsi`` and ``~/.apsi/run`` that is, or can be made, a folder
of this user that nobody else may write (``trust.open_folder``); a folder that cannot be used is a WARNING and the
next is tried. ``ledgers`` lists and cleans the files in the same folders."""

from __future__ import annotations

import os

from ..errors import UnsafePathError
from ..logs import logger
from ..system import paths, trust

LEDGER_DIR_ENV = "APSI_LEDGER_DIR"
LOG = "apsi_memory.siblings"  # the documented logger name (docs: "What it logs"), made where it logs


def candidate_dirs() -> list[str]:
    """``APSI_LEDGER_DIR`` alone where set; else ``/dev/shm/apsi-<uid>``, ``paths.runtime_dir()/apsi``, ``~/.apsi/run``."""
    chosen = paths.env_folder(LEDGER_DIR_ENV, "")  # the rules of the other folders: empty unset, relative refused
    if chosen:
        return [chosen]
    uid = os.geteuid()
    found = [f"/dev/shm/apsi-{uid}"] if os.path.isdir("/dev/shm") else []
    runtime = paths.runtime_dir()  # a relative XDG_RUNTIME_DIR is ignored, as the XDG spec says
    if runtime:
        found.append(os.path.join(runtime, "apsi"))
    return [*found, os.path.join(paths.apsi_home(), "run")]


def open_folder(candidates: list[str]) -> tuple[int, str] | None:
    """The first candidate that is (or can be made) a folder of ours nobody else may write; None if none is."""
    for folder in candidates:
        try:
            return trust.open_folder(folder), folder
        except (UnsafePathError, OSError) as exc:
            logger(LOG).warning("reservation ledger: not in %s (%s): %s", folder,
                                LEDGER_DIR_ENV if os.environ.get(LEDGER_DIR_ENV) else "default", exc)
    return None
