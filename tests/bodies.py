"""What the bodies of the tests' ``@cached`` functions ran, recorded through a module-level function: a body that
appended to a list of its test's (a closure) would rightly draw a ``CacheKeyWarning`` (a hidden input)."""

from __future__ import annotations

RUNS: list[object] = []


def ran(value: object = None) -> int:
    """Record one run of a body; how many there were so far."""
    RUNS.append(value)
    return len(RUNS)
