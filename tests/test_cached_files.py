"""@memory.cached with file arguments: a path is keyed by the identity of the file behind it, so an edited file
misses instead of returning the stale result (issue 13, item 5)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import apsi_memory as memory
from tests.bodies import RUNS, ran


@pytest.fixture(autouse=True)
def no_runs_yet() -> None:
    RUNS.clear()


def test_an_edited_file_behind_a_path_argument_misses(tmp_path: Path) -> None:
    @memory.cached
    def tokenize(path: Path) -> list[str]:
        ran(str(path))
        return path.read_text().split()

    doc = tmp_path / "doc.txt"
    doc.write_text("one two")
    assert tokenize(doc) == ["one", "two"] and tokenize(doc) == ["one", "two"] and len(RUNS) == 1
    doc.write_text("one two three")  # edited: another size and mtime
    assert tokenize(doc) == ["one", "two", "three"] and len(RUNS) == 2
    os.utime(doc, ns=(1, 1))  # the same content, touched: a miss too (identity, not content)
    tokenize(doc)
    assert len(RUNS) == 3


def test_str_parameters_named_in_files_are_keyed_by_the_file(tmp_path: Path) -> None:
    @memory.cached(files=("path",))
    def size(path: str, label: str = "x") -> int:
        ran(path)
        with open(path, "rb") as f:
            return len(f.read())

    doc = tmp_path / "doc.bin"
    doc.write_bytes(b"abc")
    assert size(str(doc)) == 3 and size(str(doc)) == 3 and len(RUNS) == 1
    replacement = tmp_path / "new.bin"
    replacement.write_bytes(b"xyz")
    replacement.replace(doc)  # another inode at the same path (what editors and atomic writers do)
    size(str(doc))
    assert len(RUNS) == 2


def test_a_missing_file_is_keyed_as_missing(tmp_path: Path) -> None:
    @memory.cached
    def exists(path: Path) -> bool:
        ran(True)
        return path.exists()

    doc = tmp_path / "later.txt"
    assert exists(doc) is False and exists(doc) is False and len(RUNS) == 1
    doc.write_text("now here")
    assert exists(doc) is True and len(RUNS) == 2


def test_files_naming_no_parameter_is_an_error_at_decoration() -> None:
    with pytest.raises(ValueError, match="has no parameter 'pth'; its parameters are path"):
        @memory.cached(files=("pth",))
        def read(path: str) -> str:
            return path


def test_a_files_parameter_that_is_not_a_path_is_named() -> None:
    @memory.cached(files="path")
    def read(path: object) -> object:
        return path

    with pytest.raises(TypeError, match="argument 'path' cannot be part of a cache key"):
        read(3.5)
