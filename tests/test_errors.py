"""The public names and the exception tree (modelled on httpx's tests/test_exported_members.py).

Every name in ``apsi_memory.__all__`` exists and is public; every error class in ``errors.py`` is exported and
derives from ``ApsiMemoryError`` and a builtin a caller would catch; the tree drawn in ``errors.py`` and in the
docs/reference/errors.md is the real class hierarchy; and no deliberate ``raise`` in the library uses a bare builtin.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import re
import types
from pathlib import Path

import pytest

import apsi_memory
from apsi_memory import errors
from apsi_memory.errors import ApsiMemoryError

PACKAGE = Path(apsi_memory.__file__).parent
ERRORS_PAGE = PACKAGE.parent / "docs" / "reference" / "errors.md"

NOT_SCANNED_YET: set[str] = set()  # every module is scanned (the store side was converted on branch i9store)

BUILTIN_EXCEPTIONS = {name for name, value in vars(builtins).items()
                      if isinstance(value, type) and issubclass(value, BaseException)}


def error_module_classes() -> dict[str, type[BaseException]]:
    return {name: value for name, value in vars(errors).items()
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == errors.__name__}


# -- __all__ ----------------------------------------------------------------------------------------------------

def test_every_exported_name_exists_is_public_and_listed_once():
    assert len(apsi_memory.__all__) == len(set(apsi_memory.__all__))
    for name in apsi_memory.__all__:
        assert not name.startswith("_"), name
        assert hasattr(apsi_memory, name), f"__all__ names {name}, which apsi_memory does not have"


def test_every_public_attribute_is_exported():
    """dir(), not vars(): the public names are imported on first use, so vars() holds only those used so far. A
    module is public when it is callable (``store``, ``status``, ``devices``: each is its namesake function)."""
    public = {name for name in dir(apsi_memory) if not name.startswith("_") and name != "annotations"
              and (callable(value := getattr(apsi_memory, name)) or not isinstance(value, types.ModuleType))}
    assert public == set(apsi_memory.__all__)


@pytest.mark.parametrize("name", sorted(error_module_classes()))
def test_every_error_class_is_exported_and_also_a_builtin_kind(name):
    cls = error_module_classes()[name]
    assert name in apsi_memory.__all__ and getattr(apsi_memory, name) is cls
    if issubclass(cls, Warning):
        assert any(issubclass(base, Warning) and base not in (cls, Warning) and base.__module__ == "builtins"
                   for base in cls.__mro__), f"{name} derives from no builtin warning category"
        return
    assert issubclass(cls, ApsiMemoryError)
    caught = {base for base in cls.__mro__ if base.__module__ == "builtins"} - {Exception, BaseException, object}
    assert cls is ApsiMemoryError or caught, f"{name} derives from no builtin a caller would catch"


# -- the drawn tree ---------------------------------------------------------------------------------------------

NODE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>\w+)(?:\((?P<bases>[\w, ]+)\))?$")


def drawn_tree(text: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(depth, class name, builtins drawn in parentheses) for each line of the drawing that starts at the line
    ``ApsiMemoryError(Exception)`` and ends at the first blank line or fence."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "ApsiMemoryError(Exception)")
    margin = len(lines[start]) - len(lines[start].lstrip())
    nodes = []
    for line in lines[start:]:
        match = NODE.match(line[margin:].rstrip())
        if not line.strip() or match is None:
            break
        bases = tuple(b.strip() for b in (match["bases"] or "").split(",") if b.strip())
        nodes.append((len(match["indent"]) // 4, match["name"], bases))
    return nodes


def resolve(name: str) -> type[BaseException]:
    cls = getattr(errors, name, None) or getattr(builtins, name)
    assert isinstance(cls, type) and issubclass(cls, BaseException), name
    return cls


def test_the_tree_drawn_in_errors_py_is_the_real_hierarchy():
    nodes = drawn_tree(errors.__doc__ or "")
    parents: list[str] = []
    for depth, name, bases in nodes:
        parents[depth:] = [name]
        cls = resolve(name)
        if cls.__module__ == "builtins":  # a root such as UserWarning, drawn to hang our warnings from
            assert depth == 0 and not bases
            continue
        drawn = ((resolve(parents[depth - 1]),) if depth else ()) + tuple(resolve(b) for b in bases)
        assert cls.__bases__ == drawn, f"{name} is drawn as {drawn}, but derives from {cls.__bases__}"
    drawn_names = [name for _, name, _ in nodes if name not in BUILTIN_EXCEPTIONS]
    assert sorted(drawn_names) == sorted(error_module_classes()), "every class in errors.py is drawn once"


def test_the_docs_draw_the_same_tree():
    assert drawn_tree(ERRORS_PAGE.read_text(encoding="utf-8")) == drawn_tree(errors.__doc__ or "")


# -- the tree stays real ----------------------------------------------------------------------------------------

def builtin_raises(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``raise ValueError(...)`` (or a bare ``raise KeyError``) in ``path``: ``file:line builtin`` each."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # a module's __getattr__ must raise AttributeError itself: that is the language's protocol, not a library error
    protocol = {id(node) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
                for node in ast.walk(f)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None or id(node) in protocol:
            continue
        raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(raised, ast.Name) and raised.id in BUILTIN_EXCEPTIONS:
            found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno} {raised.id}"))
    return [hit for _, hit in sorted(found)]


def test_no_deliberate_raise_is_a_bare_builtin():
    """A library error is an ``errors.py`` class, which is also the builtin (``ArgumentError`` is a ValueError)."""
    sources = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name not in NOT_SCANNED_YET]
    assert len(sources) > 10
    found = [hit for path in sources for hit in builtin_raises(path)]
    assert found == []


def test_the_scan_sees_a_bare_builtin(tmp_path):
    """The scan itself finds what it looks for (so the test above can fail)."""
    sample = PACKAGE / "decide" / "levels.py"
    planted = tmp_path / "apsi_memory" / "planted.py"
    planted.parent.mkdir()
    planted.write_text("def f(x):\n    if x:\n        raise ValueError('x')\n    raise KeyError\n")
    assert builtin_raises(sample) == []
    assert builtin_raises(planted, tmp_path) == ["apsi_memory/planted.py:3 ValueError",
                                                 "apsi_memory/planted.py:4 KeyError"]

