from __future__ import annotations

from typing import Callable, ContextManager

import pytest

from tests.realcg import ChildGroup, child_group


@pytest.fixture
def memcg() -> Callable[[int], ContextManager[ChildGroup]]:
    """``with memcg(1 << 30) as group: group.run([...])`` — a real v1 child memory cgroup, removed afterwards."""
    return child_group
