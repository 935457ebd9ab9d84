"""``apsi_memory.__version__``: the installed distribution's version, so it can never disagree with pyproject.

Read on first use: ``importlib.metadata`` and the search for the distribution cost tens of milliseconds, which
``import apsi_memory`` and every ``apsi-memory`` command would otherwise pay.
"""

from __future__ import annotations

import functools

DISTRIBUTION = "apsi-memory"


@functools.cache
def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:  # imported from a checkout that was never installed (PYTHONPATH=.)
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
