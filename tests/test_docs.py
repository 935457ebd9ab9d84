"""The documentation site covers what it must: every public name, every subcommand, every APSI_* variable, the
store's defaults. (The blocks of its pages run in tests/test_readme.py; ``tox -e docs`` builds it with warnings as
errors.)"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import pytest

import apsi_memory
from apsi_memory.store import DEFAULT_DISK_GB, DEFAULT_RAM_MB
from apsi_memory.store.cached import DEFAULT_STORE

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"


def test_every_public_name_is_in_the_api_reference() -> None:
    """Each name of ``__all__`` once, as ``name``; or, for a callable module (``memory.store`` is the module
    ``apsi_memory.store``, called as its function), as ``apsi_memory.store.store``: the function it calls, so the page
    shows that function's signature and docstring, not the module's."""
    found = re.findall(r"^\.\. auto(?:function|class|exception):: (?:apsi_memory\.(\w+)\.)?(\w+)$",
                       (DOCS / "reference" / "api.rst").read_text(encoding="utf-8"), re.MULTILINE)
    assert sorted(name for _, name in found) == sorted(apsi_memory.__all__)
    by_module = [(module, name) for module, name in found if module]
    assert sorted(by_module) == [(name, name) for name in sorted(apsi_memory._CALLABLE)]
    for _, name in by_module:
        function = getattr(importlib.import_module(f"apsi_memory.{name}"), name)
        assert inspect.isfunction(function), name
        assert inspect.signature(function) == inspect.signature(getattr(apsi_memory, name)), name


def test_the_dask_reference_documents_the_module_with_its_members() -> None:
    text = (DOCS / "reference" / "dask.rst").read_text(encoding="utf-8")
    assert ".. automodule:: apsi_memory.dask\n   :members:" in text


def package_variables() -> set[str]:
    return {name for path in (REPO / "apsi_memory").rglob("*.py")
            for name in re.findall(r"\bAPSI_[A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8"))}


def test_every_environment_variable_is_in_the_reference_with_its_default_and_named_in_the_readme() -> None:
    assert {"APSI_HOME", "APSI_SPILL_DIR", "APSI_RAM_BUDGET"} <= package_variables()  # the scan finds them
    reference = (DOCS / "reference" / "environment.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(APSI_\w+)` \| ([^|]+) \|", reference, re.MULTILINE))
    assert set(rows) == package_variables()
    assert all(default.strip() for default in rows.values())
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert set(re.findall(r"`(APSI_\w+)`", readme)) >= package_variables()
    assert "(docs/reference/environment.md)" in readme


def test_the_store_defaults_the_guide_states_are_the_code_s() -> None:
    text = (DOCS / "guides" / "store-and-cached.md").read_text(encoding="utf-8")
    assert f"`ram_mb={DEFAULT_RAM_MB:g}`" in text and f"`disk_gb={DEFAULT_DISK_GB:g}`" in text
    assert f'the store named `"{DEFAULT_STORE}"`' in text


def test_the_cli_reference_has_every_subcommand_with_its_help() -> None:
    pytest.importorskip("sphinx", reason="the docs extra is not installed: pip install '.[docs]'")
    sys.path.insert(0, str(DOCS / "_ext"))
    try:
        import apsi_cli
    finally:
        sys.path.remove(str(DOCS / "_ext"))
    from apsi_memory.cli import commands as cli

    parser = cli._parser()
    lines = apsi_cli.reference(parser)
    names = apsi_cli.subcommands(parser)
    assert {"status", "limits", "pressure", "dask-limit", "spill", "stores", "clean"} <= set(names)
    for name, sub in names.items():
        assert f"apsi-memory {name}" in lines
        assert all("   " + line in lines for line in sub.format_help().rstrip().splitlines() if line), name
    assert ".. apsi-cli::" in (DOCS / "reference" / "cli.rst").read_text(encoding="utf-8")
