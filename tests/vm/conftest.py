"""Fixtures of the tests that need a real cgroup v2 kernel: skipped, with the reason, on any other kernel."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import pytest

from tests.realcg import ChildGroup, child_group, v2_skip_reason


@pytest.fixture
def v2_group() -> Callable[..., ContextManager[ChildGroup]]:
    """``with v2_group(512 << 20, prefix=...) as group:`` — a real v2 child memory group (``memory.max``,
    ``memory.swap.max`` 0), removed afterwards; the test skips, with the reason, outside a cgroup v2 kernel."""
    reason = v2_skip_reason()
    if reason:
        pytest.skip(reason)
    return child_group
