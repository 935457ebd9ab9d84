"""Files only cgroup v2 has, read for the rules of ``decide.v2``: ``memory.events`` (its ``high`` count, how often the
kernel throttled a level over ``memory.high``) and ``memory.oom.group``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from ..decide import oom_group_at
from ..errors import CorruptFileError
from .files import KernelFiles


def parse_flat_keyed(text: str, path: str, value: Callable[[str, str], int | None], what: str) -> dict[str, int]:
    """A "flat keyed" file (the kernel's cgroup-v2.rst): ``name value`` lines, as ``memory.stat`` (both versions)
    and ``memory.events``; the last of a repeated name wins. ``value(word, path)``: the number, or None where the
    word is not a ``what``."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        number = value(words[1], path) if len(words) == 2 else None
        if number is None:
            raise CorruptFileError(path, f"line {line!r} is not 'name {what}'")
        found[words[0]] = number
    return found


def parse_events(text: str, path: str) -> dict[str, int]:
    """``memory.events``: ``name count`` lines."""
    return parse_flat_keyed(text, path, lambda word, _: int(word) if word.isdigit() else None, "count")


def high_events(source: KernelFiles, directories: Sequence[str]) -> int | None:
    """The ``high`` counts of ``directories`` (the group and the levels above it its charges reach) added up: it
    rises whenever the kernel throttles any of them. None where no level has a ``memory.events``."""
    total = None
    for directory in directories:
        path = os.path.join(directory, "memory.events")
        text = source.read(path)
        if text is not None:
            total = (total or 0) + parse_events(text, path).get("high", 0)
    return total


def oom_group(source: KernelFiles, directories: Sequence[str], binding: int | None) -> str | None:
    """The directory one OOM kill takes whole (``decide.oom_group_at``; ``binding``: the index in ``directories``
    of the level whose limit binds), or None."""
    flags = [(source.read(os.path.join(directory, "memory.oom.group")) or "").strip() == "1"
             for directory in directories]
    at = oom_group_at(flags, binding)
    return None if at is None else directories[at]
