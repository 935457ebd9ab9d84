"""Fixtures of the tests that need a real cgroup v2 kernel: skipped, with the reason, on any other kernel."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import pytest

from tests.realcg import ChildGroup, child_group, v2_skip_reason
from tests.vm.v2_run import slowdown


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each VM test's timeout stretched by the guest's slowdown (``v2_run.slowdown``): on a busy host the guest
    gets a share of its CPUs, and a test sized for an idle one would time out where nothing is wrong."""
    factor = slowdown()
    for item in items:
        marker = item.get_closest_marker("timeout")
        if factor > 1 and marker is not None and marker.args and "tests/vm/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.timeout(marker.args[0] * factor), append=False)


@pytest.fixture
def v2_group() -> Callable[..., ContextManager[ChildGroup]]:
    """``with v2_group(512 << 20, prefix=...) as group:`` — a real v2 child memory group (``memory.max``,
    ``memory.swap.max`` 0), removed afterwards; the test skips, with the reason, outside a cgroup v2 kernel."""
    reason = v2_skip_reason()
    if reason:
        pytest.skip(reason)
    return child_group
