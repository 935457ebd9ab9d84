"""Importing the library does no work: no file is deleted or created, no fork hook, at-exit function or C
library is registered or loaded (issue 11, item 6). Each happens on first use instead."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from apsi_memory.arrays import spill

SPY = textwrap.dedent("""
    import atexit, ctypes, os, sys

    callers = set()

    def spy(real):
        def called(*args, **kwargs):
            callers.add(sys._getframe(1).f_globals.get("__name__", "?"))
            return real(*args, **kwargs)
        return called

    os.register_at_fork = spy(os.register_at_fork)
    atexit.register = spy(atexit.register)
    ctypes.CDLL = spy(ctypes.CDLL)
    import apsi_memory
    print(" ".join(sorted(name for name in callers if name.startswith("apsi_memory"))))
""")
AFTER_IMPORT = 'print(" ".join(sorted(name for name in callers if name.startswith("apsi_memory"))))'



def dead_pid() -> int:
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
    return int(finished.stdout)


def test_importing_deletes_creates_and_registers_nothing(tmp_path):
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir(mode=0o700)
    dead_owners = spill_dir / spill.file_name(dead_pid(), "1", "aa")  # what a first spill would reclaim
    dead_owners.write_bytes(b"\x93NUMPY")
    home = tmp_path / "home"  # the key, stores and spill files would go here by default
    env = {**os.environ, "APSI_SPILL_DIR": str(spill_dir), "APSI_HOME": str(home)}
    env.pop("APSI_STORE_DIR", None)
    done = subprocess.run([sys.executable, "-c", SPY], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []
    assert dead_owners.exists(), "importing must not reclaim spill files"
    assert not home.exists(), "importing must not create the library's folders or key"
    assert [p.name for p in spill_dir.iterdir()] == [dead_owners.name]


def test_relieve_loads_libc_on_first_use():
    """watch.py used to load libc at import for ``malloc_trim``; now the first ``relieve()`` does, in ``libc``. Its
    machine's first use also registers the fork hook that gives a child fresh component locks (issue 26 item 5)."""
    code = SPY.replace(AFTER_IMPORT, "callers.clear(); apsi_memory.relieve(); " + AFTER_IMPORT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["apsi_memory.system.libc", "apsi_memory.system.once"]


def test_importing_loads_no_submodule_and_the_functions_keep_their_names_after_their_modules_load():
    """Issue 21, item 10: every public name is imported on first use (benchmarks/bench_import.py has the time).
    Loading the modules first (``cached`` imports ``store``) leaves every public function callable where it was;
    ``store``, ``status`` and ``devices`` are their modules, called as their functions (issue 25)."""
    code = textwrap.dedent("""
        import sys
        import apsi_memory as memory
        print(sorted(name for name in sys.modules if name.startswith("apsi_memory.")))
        import apsi_memory.store.cached, apsi_memory.outofcore.chunking, apsi_memory.devices.hardware
        import apsi_memory.arrays.pools, apsi_memory.status, apsi_memory.machinery.reservations
        from apsi_memory.store import Store
        functions = ("cached", "chunks", "pool", "siblings")
        print(all(callable(getattr(memory, name)) and getattr(memory, name).__name__ == name for name in functions))
        modules = ("devices", "status", "store")
        print(all(callable(getattr(memory, name)) and getattr(memory, name).__name__ == "apsi_memory." + name
                  for name in modules))
        print(memory.arrays.spill.__name__, memory.Store is Store, memory.__version__ != "")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == ["[]", "True", "True", "apsi_memory.arrays.spill True True"]


FIRST_CALL = textwrap.dedent("""
    import sys
    import numpy
    before = set(sys.modules)
    import apsi_memory as memory
    {call}
    print(" ".join(sorted(set(sys.modules) - before)))
    import dataclasses  # only now: it is one of the modules a first store must not import
    print(" ".join(sorted(name for module_name, module in list(sys.modules.items())
                          if module_name.startswith("apsi_memory") for name, value in vars(module).items()
                          if dataclasses.is_dataclass(value) and value.__module__ == module_name)))
""")
# Modules a first call of each feature must not import (issue 29 item 4), none of them imported by NumPy: a program
# that already has NumPy pays for each one. hashlib loads OpenSSL: only a store (its MACs) and a group's siblings'
# ledger (its name) need it.
NEVER = {"multiprocessing", "secrets", "subprocess", "socket", "psutil", "shutil", "concurrent.futures"}
# logging (with traceback and string: ~3 ms) comes with the first logger made (``apsi_memory.logs``); a first store or
# reading that has nothing to log makes none.
QUIET = NEVER | {"logging"}
FIRST_CALLS = {
    "import alone": ("pass", QUIET | {"threading", "hashlib"}),
    "store": ("memory.store('first')['a'] = 1", QUIET | {"apsi_memory.decide.workers", "dataclasses",
                                                           "apsi_memory.machinery.reading",
                                                           "apsi_memory.machinery.watcher"}),
    "array": ("memory.array((1000,), 'f4')", NEVER),  # small, so in RAM: a first spill file takes multiprocessing
    "pressure": ("memory.pressure()", QUIET | {"hashlib", "apsi_memory.decide.workers"}),
    "limits": ("memory.limits()", QUIET),
    "status": ("memory.status()", NEVER),
    "map": ("list(memory.map(lambda block: block * 2, numpy.ones((1000, 4))))", NEVER - {"concurrent.futures"}),
    "cached": ("memory.cached(lambda x: x)(1)", NEVER),
}


@pytest.mark.parametrize("feature", sorted(FIRST_CALLS))
def test_the_first_call_of_each_feature_imports_only_what_it_needs(feature, tmp_path):
    """Each first call, after NumPy and ``import apsi_memory``, leaves out the modules only a rare path needs
    (psutil where ``/proc`` is missing, multiprocessing's pickler until the first spill file, the Dask workers'
    rules, the watcher). A store defines no dataclass, a reading none but the public readings: a frozen dataclass
    takes ~7x as long to define as the named tuples the readings' parts are (``benchmarks/bench_import.py`` has the
    time)."""
    call, never = FIRST_CALLS[feature]
    env = {**os.environ, "APSI_HOME": str(tmp_path / "home"), "APSI_STORE_DIR": str(tmp_path / "stores"),
           "APSI_SPILL_DIR": str(tmp_path / "spill")}
    done = subprocess.run([sys.executable, "-c", FIRST_CALL.format(call=call)], env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    loaded, dataclasses = (line.split() for line in done.stdout.splitlines())
    assert sorted(never & set(loaded)) == []
    if feature in ("pressure", "limits"):
        assert set(dataclasses) <= {"Budget", "Limits", "Pressure", "SiblingReading"}
