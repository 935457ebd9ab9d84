"""The library's loggers (``apsi_memory.siblings``, ``.limits``, ...; docs: "What it logs"), with ``logging``
imported by the first one made, not by ``import apsi_memory``: a first store or reading loads it only if it has
something to log (issue 29 item 4: ``logging`` with ``traceback`` and ``string`` is ~3 ms of a ~25 ms first store).

A library's loggers print nothing until the program configures logging (the logging HOWTO's rule): every logger
made here has the package's NullHandler above it, without which Python's last-resort handler printed each WARNING
(fit_batch's halvings) to stderr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging


def logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, the package's logger given its NullHandler first. Modules on a first call's
    path (a store, a reading) call this where they log; the others make theirs at import."""
    import logging

    package = logging.getLogger("apsi_memory")
    if not package.handlers:  # once: a program's own handler there (rare) has the same effect as ours
        package.addHandler(logging.NullHandler())
    return logging.getLogger(name)
