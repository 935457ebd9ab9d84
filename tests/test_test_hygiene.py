"""The test suite's own rules: test modules share fixtures through ``conftest.py`` and helpers through modules
that are not tests (``tests/strategies.py``, ``tests/realcg.py``, ``sim/``), never by importing each other — an
imported test module's tests and fixtures would run, or shadow, twice."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent


def imported_test_modules(path: Path) -> set[str]:
    """The ``test_*`` modules that the file at ``path`` imports anywhere (inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base, *(f"{base}.{alias.name}" if base else alias.name for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name and name.split(".")[-1].startswith("test_")}
    return found


def test_no_test_module_imports_another() -> None:
    offenders = {str(path.relative_to(TESTS)): sorted(imported) for path in sorted(TESTS.rglob("test_*.py"))
                 if (imported := imported_test_modules(path))}
    assert offenders == {}, "share fixtures through conftest.py and helpers through a module that is not a test"


def test_the_scan_sees_each_way_of_importing_a_test_module(tmp_path: Path) -> None:
    path = tmp_path / "test_probe.py"
    path.write_text("from tests import test_map\nfrom tests.test_chunks_props import SOURCES\n"
                    "def f():\n    from .test_pool import pool\n    import tests.test_cli\n"
                    "from tests.strategies import arrays_of\nimport pytest\n")
    assert imported_test_modules(path) == {"tests.test_map", "tests.test_chunks_props",
                                              "test_pool", "tests.test_cli"}
