"""``apsi_memory.__version__``: the installed distribution's version, so it can never disagree with pyproject."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "apsi-memory"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # imported from a checkout that was never installed (PYTHONPATH=.)
    __version__ = "0+unknown"
