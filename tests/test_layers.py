"""The import direction of the package (docs/internals.md, "Layout"): decisions ← adapters ← machine ← features ← api.

An AST scan of every module under ``apsi_memory/``, imports inside functions and ``TYPE_CHECKING`` blocks
included: a module may import its own layer and the layers below, never one above, and the import graph has no
cycle. The layer table is data: a new module fails ``test_every_module_has_a_layer`` until it is placed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import apsi_memory

PACKAGE = Path(apsi_memory.__file__).parent

# Lowest first. A name covers the module and, for a package, everything in it.
LAYERS: dict[str, tuple[str, ...]] = {
    # pure rules: no I/O, import nothing of ours but each other
    "decisions": ("decide", "units", "errors", "hashing", "blocks", "_version"),
    # the OS: kernel files, time, folders, files, libc
    "adapters": ("adapters", "_libc", "_uffd", "_once", "fileio", "paths", "trust", "signing", "spill", "pages", "sources"),
    # the Machine and what it keeps: root, clock, budget, ledger, level tracker, components, readings
    "machine": ("ledger", "levels", "measure", "readings", "siblings", "machinery"),
    # what users call, built on machine()
    "features": ("moving", "arrays", "pool", "watch", "store", "cached", "chunks",
                 "rowblocks", "mapping", "progress", "devices", "batch", "dask", "inventory"),
    # the public face: module-level readings, status(), the command line, the package itself
    "api": ("api", "status", "cli", "cli_files", "__init__", "__main__"),
}



def modules() -> dict[str, Path]:
    """Dotted names relative to the package (``adapters.psi``; the package itself is ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        found[".".join(parts)] = path
    return found


def layer_of(module: str) -> int:
    for rank, names in enumerate(LAYERS.values()):
        if any(module == name or module.startswith(name + ".") for name in names):
            return rank
    raise LookupError(module)


def _package_of(module: str, path: Path) -> list[str]:
    parts = [] if module == "__init__" else module.split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _target(parts: list[str]) -> str:
    return ".".join(parts) or "__init__"


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that ``module`` imports anywhere in its file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {_ours(alias.name.split(".")) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(module, path)
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            else:
                base = (node.module or "").split(".")
                if base[0] != "apsi_memory":
                    continue
                base = base[1:]
            for alias in node.names:
                named = ".".join([*base, alias.name])
                found.add(named if named in known else _target(base))
    found.discard("")
    found.discard(module)
    return found


def _ours(parts: list[str]) -> str:
    return _target(parts[1:]) if parts[0] == "apsi_memory" else ""


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imports_of(module, path, known) for module, path in known.items()}


def test_every_module_has_a_layer() -> None:
    unplaced = [module for module in modules() if not any(
        module == name or module.startswith(name + ".") for names in LAYERS.values() for name in names)]
    assert unplaced == [], f"add these modules to LAYERS in {__file__}"


def test_no_module_imports_a_higher_layer() -> None:
    upward = {(module, target) for module, targets in graph().items() for target in targets
              if layer_of(target) > layer_of(module)}
    assert upward == set(), "a lower layer imports a higher one"


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Each cycle of the graph found by a depth-first walk, as the sorted tuple of its modules."""
    found: set[tuple[str, ...]] = set()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.add(tuple(sorted(path[path.index(module):])))
            return
        if module in done:
            return
        for target in sorted(edges.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    return found


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(graph()) == set(), "import cycle"


def test_a_cycle_through_a_lazy_import_is_found() -> None:
    """The walk itself, on the graph of today's main before status() moved: api imported devices in a function."""
    before = {"api": {"devices", "machinery"}, "devices": {"api"}, "machinery": set()}
    assert cycles(before) == {("api", "devices")}


def test_the_scan_sees_imports_inside_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    """The scan itself: a lazy import and a type-only import count as imports."""
    path = tmp_path / "probe.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .api import Pressure\n"
                    "def f():\n    from . import devices\n    from .adapters import psi\n")
    known = modules()
    assert imports_of("probe", path, known) == {"api", "devices", "adapters.psi"}
