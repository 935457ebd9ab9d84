"""The command line, ``apsi-memory``: ``status``, ``limits``, ``pressure``, ``budget`` and the rest (``main``);
the files the library keeps, listed and cleaned (``leftovers`` prints what ``inventory`` finds). Each command has
``--json`` with stable keys.

May import: decide, system, adapters, machinery, arrays, store, status.
"""

from .commands import main

__all__ = ["main"]
