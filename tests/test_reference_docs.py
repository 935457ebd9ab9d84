"""Reference docs a user reads with help(): short, about this library, every public reading explained."""

from __future__ import annotations

import inspect
import pydoc

import apsi_memory as memory


def test_help_of_the_package_is_not_buried_under_inherited_str_methods() -> None:
    """Before: 2,525 lines on Python 3.11, ~900 of them the str methods of Level and Place. The bound is per public
    name (36 lines each: 2,088 for the 58 names it was set with; with 64 names, 1,889 lines on 3.11 and 2,149 on
    3.13, whose pydoc shows more of each signature), so a new public name does not trip it and a dump does."""
    text = pydoc.render_doc(memory, renderer=pydoc.plaintext)
    assert "inherited from builtins.str" not in text
    assert len(text.splitlines()) < 36 * len(memory.__all__)
    level = pydoc.render_doc(memory.Level, renderer=pydoc.plaintext)
    assert len(level.splitlines()) < 120 and "rank" in level and "parse" in level


def test_the_str_methods_still_work_on_levels_and_places() -> None:
    assert memory.Level("high").upper() == "HIGH" and memory.Level.HIGH >= "moderate"
    assert memory.Place.SSD.lower() == "ssd" and f"{memory.Place.RAM}" == "RAM"


def test_every_public_function_and_class_has_a_docstring_of_its_own() -> None:
    missing = [name for name in memory.__all__
               if (inspect.isfunction(getattr(memory, name)) or inspect.isclass(getattr(memory, name)))
               and not (inspect.getdoc(getattr(memory, name)) or "").strip()
               or (getattr(memory, name).__doc__ or "").startswith(f"{name}(")]  # a dataclass's made-up one
    assert missing == []


def test_every_field_of_the_readings_is_explained() -> None:
    for reading in (memory.Limits, memory.Pressure):
        doc = inspect.getdoc(reading) or ""
        undocumented = [field for field in reading.__dataclass_fields__ if f"``{field}``" not in doc]
        assert undocumented == [], f"{reading.__name__}: {undocumented}"
