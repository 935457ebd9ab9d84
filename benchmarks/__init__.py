"""Benchmarks (pytest-benchmark), peers side by side; each module prints its table of ratios at the end."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only named here: python -m benchmarks.dask_cgroup runs with the dask extra, without pytest
    import pytest


@contextmanager
def private_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``APSI_HOME`` (the key) and ``APSI_STORE_DIR`` under a temporary folder for one module, put back after."""
    home = tmp_path_factory.mktemp("home")
    saved = {k: os.environ.get(k) for k in ("APSI_HOME", "APSI_STORE_DIR")}
    os.environ["APSI_HOME"], os.environ["APSI_STORE_DIR"] = str(home), str(home / "stores")
    try:
        yield home
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def private_home_then(report: Callable[[], None]) -> Any:
    """A module's autouse fixture: its benchmarks run in a ``private_home``, then ``report()`` prints its table."""
    import pytest

    @pytest.fixture(scope="module", autouse=True)
    def environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
        with private_home(tmp_path_factory):
            yield
        report()

    return environment
