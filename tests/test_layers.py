"""The parts of the package and the direction of their imports (docs/internals.md, "The parts").

A part is a folder of ``apsi_memory/``; its ``__init__.py`` docstring ends with ``May import: a, b, c.``, the
other parts (or top-level modules) its modules may import. An AST scan of every module, imports inside functions
and ``TYPE_CHECKING`` blocks included, checks each import against that line; the declarations themselves must
form no cycle (so the parts stand on levels), and the modules' own import graph has no cycle either. Every module
is in a part folder, or is one of the few at the top (``TOP``); no two modules share a file stem.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import apsi_memory

PACKAGE = Path(apsi_memory.__file__).parent

# Below every part, importable from anywhere: the exception tree, size units, the version, the loggers.
BASE = {"errors", "units", "_version", "logs"}
# The package itself and its entry point, above everything.
FACE = {"__init__", "__main__"}
# Top-level modules besides those: each declares its imports in its docstring, as a part does.
TOP = BASE | FACE | {"status"}
MAX_LINES = 500


def modules() -> dict[str, Path]:
    """Dotted names relative to the package (``adapters.psi``; the package itself is ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts.pop()
        found[".".join(parts)] = path
    return found


def parts() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def owner(module: str) -> str:
    """The part (or top-level module) ``module`` belongs to."""
    return module.split(".")[0]


def declared(unit: str) -> set[str]:
    """What the docstring of part or top-level module ``unit`` says it may import."""
    path = PACKAGE / unit / "__init__.py" if (PACKAGE / unit).is_dir() else PACKAGE / f"{unit}.py"
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    match = re.search(r"^May import: (.*?)\.$", doc, re.MULTILINE | re.DOTALL)
    if match is None:
        raise LookupError(f"{path} declares no 'May import: ...' line")
    text = match.group(1)
    return set() if text.startswith("nothing of ours") else {name.strip() for name in text.split(",")}


def _package_of(module: str, path: Path) -> list[str]:
    parts_ = [] if module == "__init__" else module.split(".")
    return parts_ if path.name == "__init__.py" else parts_[:-1]


def _target(parts_: list[str]) -> str:
    return ".".join(parts_) or "__init__"


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


def _ours(parts_: list[str]) -> str:
    return _target(parts_[1:]) if parts_[0] == "apsi_memory" else ""


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imports_of(module, path, known) for module, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Each cycle of the graph found by a depth-first walk, as the sorted tuple of its nodes."""
    found: set[tuple[str, ...]] = set()
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.add(tuple(sorted(path[path.index(node):])))
            return
        if node in done:
            return
        for target in sorted(edges.get(node, ())):
            visit(target, [*path, node])
        done.add(node)

    for node in sorted(edges):
        visit(node, [])
    return found


def test_every_module_is_in_a_part_or_one_of_the_few_at_the_top() -> None:
    loose = [module for module in modules() if "." not in module and module not in TOP and module not in parts()]
    assert loose == [], "a module at the top of apsi_memory/: move it into the folder of its part"


def test_every_part_and_top_level_module_declares_what_it_may_import() -> None:
    units = parts() + sorted(TOP - BASE - FACE)
    unknown = {(unit, name) for unit in units for name in declared(unit) if name not in set(parts()) | TOP}
    assert unknown == set(), "a 'May import' line names something that is not a part"


def test_every_import_is_one_its_part_declares() -> None:
    allowed = {unit: declared(unit) for unit in parts() + sorted(TOP - BASE - FACE)}
    undeclared = {(module, target) for module, targets in graph().items() for target in targets
                  if owner(module) not in FACE and owner(target) != owner(module) and owner(target) not in BASE
                  and owner(target) not in allowed.get(owner(module), set())}
    assert undeclared == set(), "an import its part's 'May import' line does not allow"


def test_the_base_modules_import_only_each_other() -> None:
    reaching = {(module, target) for module, targets in graph().items() if owner(module) in BASE
                for target in targets if owner(target) not in BASE}
    assert reaching == set()


def test_the_parts_stand_on_levels() -> None:
    """The declared imports have no cycle, so each part has a level: 1 + the highest level of what it imports."""
    declarations = {unit: declared(unit) for unit in parts() + sorted(TOP - BASE - FACE)}
    assert cycles(declarations) == set(), "the parts' 'May import' lines form a cycle"


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles(graph()) == set(), "import cycle"


def test_no_two_modules_share_a_stem() -> None:
    stems: dict[str, list[str]] = {}
    for module in modules():
        if module not in FACE:
            stems.setdefault(module.rpartition(".")[2], []).append(module)
    assert {stem: found for stem, found in stems.items() if len(found) > 1} == {}


def test_no_module_is_over_500_lines() -> None:
    long = {module: n for module, path in modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert long == {}


def test_no_module_is_named_like_a_name_its_package_exports() -> None:
    """``import apsi_memory.arrays.placement`` must give that module: a function of the same name exported by the
    package would be what the import statement binds (``store``, ``status`` and ``devices`` are callable modules,
    so their name is theirs twice over)."""
    known = modules()
    clashes = {module for module in known if "." in module
               and module.rpartition(".")[2] in exported(known[module.rpartition(".")[0]])}
    assert clashes == set()


def exported(path: Path) -> set[str]:
    """The names in the ``__all__`` list of the module at ``path``, read without importing it (``dask`` is an
    extra)."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_a_cycle_through_a_lazy_import_is_found() -> None:
    """The walk itself, on the graph of an old main before status() moved: api imported devices in a function."""
    before = {"api": {"devices", "machinery"}, "devices": {"api"}, "machinery": set()}
    assert cycles(before) == {("api", "devices")}


def test_the_scan_sees_imports_inside_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    """The scan itself: a lazy import and a type-only import count as imports."""
    path = tmp_path / "probe.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .machinery import Pressure\n"
                    "def f():\n    from . import devices\n    from .adapters import psi\n")
    known = modules()
    assert imports_of("probe", path, known) == {"machinery", "devices", "adapters.psi"}


def test_an_undeclared_import_is_caught(tmp_path: Path) -> None:
    """The check itself: a module of ``system`` importing ``machinery`` (above it) is an undeclared import."""
    path = tmp_path / "probe.py"
    path.write_text("from ..machinery import machine\n")
    targets = imports_of("system.probe", path, modules())
    assert targets == {"machinery"} and "machinery" not in declared("system")
