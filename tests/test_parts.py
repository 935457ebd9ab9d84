"""Issue 25: the package in parts. Every part imports as a module with its names; ``store``, ``status`` and
``devices`` are modules called as their functions; the old module paths still import, warned, for one release;
one warning base for all; ``Machine.use()`` is per thread (or task)."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest

import apsi_memory as memory
import sim
from apsi_memory import errors
from sim import tree as trees

# Each part with public names, and one that ``import apsi_memory.<part> as p; p.<name>`` must give (``adapters``,
# ``blocks`` and ``system`` are internal: their modules are imported by name).
PARTS = {"arrays": "array", "cli": "main", "decide": "place", "devices": "fit_batch", "machinery": "Machine",
         "outofcore": "chunks", "store": "Store"}
PACKAGE = Path(memory.__file__).parent


def run(code: str) -> list[str]:
    """``code`` in a fresh interpreter (imports, warnings): its printed lines."""
    done = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.splitlines() + [line for line in done.stderr.splitlines() if "DeprecationWarning" in line]


@pytest.mark.parametrize(("part", "name"), sorted(PARTS.items()))
def test_import_of_a_part_gives_the_module_with_its_names(part: str, name: str) -> None:
    lines = run(f"""
        import types
        import apsi_memory.{part} as p
        print(isinstance(p, types.ModuleType), p.__name__, hasattr(p, {name!r}))
    """)
    assert lines == [f"True apsi_memory.{part} True"]


def test_import_as_gives_every_module_of_the_package() -> None:
    """No name a package exports hides a module of the same name (``import apsi_memory.store as s`` was the
    function ``store`` until issue 25)."""
    names = sorted(".".join(("apsi_memory", *path.relative_to(PACKAGE).with_suffix("").parts))
                   for path in PACKAGE.rglob("*.py")
                   if path.name not in ("__init__.py", "__main__.py") and "dask" not in path.parts)
    lines = run("import sys\n" + "".join(f"import {name} as m; print(m.__name__)\n" for name in names))
    assert lines == names


def test_store_status_and_devices_are_modules_called_as_their_functions(tmp_path: Path) -> None:
    import apsi_memory.store as s

    assert s is memory.store and s.Store is memory.Store
    memory.allow_write(tmp_path)
    with memory.store(tmp_path / "cache") as opened:
        opened["k"] = 1
        assert isinstance(opened, s.Store) and opened["k"] == 1
    assert isinstance(memory.status(), memory.Status)
    assert isinstance(memory.devices(), memory.Devices)
    assert list(inspect.signature(memory.store).parameters) == ["name_or_path", "ram_mb", "disk_gb"]
    assert pickle.loads(pickle.dumps(memory.status)) is memory.status  # as a function pickles: by reference


def test_a_module_named_like_a_function_stays_callable_whichever_loads_first() -> None:
    lines = run("""
        import apsi_memory as memory
        memory.Store, memory.Gpu, memory.Status  # their modules load first, through another name
        print(callable(memory.store), callable(memory.devices), callable(memory.status))
        import apsi_memory.store as s
        print(s is memory.store, s.Store is memory.Store)
    """)
    assert lines == ["True True True", "True True"]


def test_an_old_module_path_imports_the_new_module_with_a_warning() -> None:
    lines = run("""
        import apsi_memory as memory
        import apsi_memory.spill
        from apsi_memory.readings import Pressure
        from apsi_memory.chunks import chunks
        print(apsi_memory.spill is memory.arrays.spill, Pressure is memory.Pressure, chunks is memory.chunks)
        print(memory.chunks.__name__, memory.pool.__name__)  # an old path does not hide the function of its name
        import apsi_memory.pool
        print(callable(memory.pool) and memory.pool.__name__)
    """)
    assert lines[:3] == ["True True True", "chunks pool", "pool"]
    moved = sorted(line.split("DeprecationWarning: ")[1] for line in lines[3:])
    assert moved == [f"apsi_memory.{old} moved to apsi_memory.{new}; the old path goes in the next release"
                     for old, new in [("chunks", "outofcore.chunking"), ("pool", "arrays.pools"),
                                      ("readings", "machinery.reading"), ("spill", "arrays.spill")]]


def test_the_old_name_of_the_stores_size_check_warns_and_works() -> None:
    import apsi_memory.store as s

    with pytest.warns(DeprecationWarning, match="byte_limits"):
        old = s.limits
    assert old is s.byte_limits and old(1, 1) == (2**20, 2**30)


def test_every_warning_of_ours_derives_from_one_base() -> None:
    ours = [cls for cls in vars(errors).values() if isinstance(cls, type) and issubclass(cls, Warning)]
    assert len(ours) == 8 and all(issubclass(cls, memory.ApsiMemoryWarning) for cls in ours)


def test_one_filter_on_the_base_turns_a_warning_into_an_error(tmp_path: Path) -> None:
    machine = sim.machine(trees.docker_v1(tmp_path, limit=2**30))
    with machine.use(), warnings.catch_warnings():
        warnings.simplefilter("error", memory.ApsiMemoryWarning)
        with pytest.raises(memory.BudgetWarning, match="more than the 1.0 GB usable"):
            memory.budget(4)


def test_two_threads_each_use_their_own_machine(tmp_path: Path) -> None:
    small = sim.machine(trees.docker_v1(tmp_path / "a", limit=2**30))
    big = sim.machine(trees.docker_v1(tmp_path / "b", limit=3 * 2**30))
    inside, seen = threading.Barrier(2), {}

    def use(name: str, m: memory.Machine) -> None:
        with m.use():
            inside.wait(timeout=10)  # both blocks are open at once
            seen[name] = memory.limits().usable_bytes
            inside.wait(timeout=10)

    threads = [threading.Thread(target=use, args=args) for args in (("small", small), ("big", big))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert seen == {"small": 2**30, "big": 3 * 2**30}
    assert memory.machine() not in (small, big)  # this thread chose none


def test_map_and_a_watcher_run_with_the_machine_of_the_caller(tmp_path: Path) -> None:
    import numpy as np

    chosen = sim.machine(trees.docker_v1(tmp_path, limit=2**30))
    machines: set[int] = set()

    def block(x: np.ndarray) -> np.ndarray:
        machines.add(id(memory.machine()))
        return x

    called = threading.Event()
    with chosen.use():
        memory.map(block, np.zeros((64, 4)), rows=8, workers=2)
        watcher = memory.on_pressure(lambda reading: (machines.add(id(memory.machine())), called.set()),
                                     level="ok", every=0.01)
        try:
            assert called.wait(10)
        finally:
            watcher.stop()
    assert machines == {id(chosen)}
