"""Importing the package does no work (issue 11, item 6): libc is loaded, ``atexit`` and fork hooks registered on
first use, never at import. Watched in a fresh interpreter: which of our modules call ``ctypes.CDLL``,
``atexit.register`` or ``os.register_at_fork`` while ``import apsi_memory`` runs."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import atexit, ctypes, json, os, sys
calls = set()
def watch(module, name):
    real = getattr(module, name)
    def spy(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("apsi_memory"):
            calls.add((caller, name))
        return real(*args, **kwargs)
    setattr(module, name, spy)
watch(ctypes, "CDLL"); watch(atexit, "register"); watch(os, "register_at_fork")
import apsi_memory
print(json.dumps(sorted(calls)))
"""

# Work at import that remains in modules this step did not change (other helpers are splitting them); each
# should move to first use, then leave this list. (spill.py also reclaims dead processes' spill files at import.)
PENDING = {
    ("apsi_memory.journal", "register_at_fork"),  # journals re-open after fork
    ("apsi_memory.signing", "register_at_fork"),  # the key cache's lock
    ("apsi_memory.spill", "CDLL"),  # _libc_mmap, _libc_mincore
    ("apsi_memory.spill", "register"),  # @atexit.register _delete_all_at_exit
    ("apsi_memory.spill", "register_at_fork"),  # the spill locks
    ("apsi_memory.store", "register_at_fork"),  # stores' locks around a fork
}


def import_work() -> set[tuple[str, str]]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    return {tuple(call) for call in json.loads(out.stdout)}  # type: ignore[misc]


def test_importing_the_package_does_no_work_outside_the_pending_modules() -> None:
    work = import_work()
    assert work - PENDING == set(), "work at import: do it on first use"
    assert PENDING - work == set(), "no longer done at import: remove it from PENDING"


def test_relieve_loads_libc_on_first_use() -> None:
    """watch.py used to load libc at import for ``malloc_trim``; now the first ``relieve()`` does, in ``_libc``."""
    code = PROBE.replace("print(json.dumps(sorted(calls)))",
                         "before = set(calls); apsi_memory.relieve(); print(json.dumps(sorted(calls - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert json.loads(out.stdout) == [["apsi_memory._libc", "CDLL"]]
