"""The optional progress bar of ``chunks`` and ``map``: a tqdm bar counting rows when asked for, else nothing.

tqdm is an optional extra, imported only when a bar is asked for; without it the call says how to install it.
"""

from __future__ import annotations

from typing import Protocol

from ..errors import MissingExtraError


class Progress(Protocol):
    def update(self, n: int) -> object: ...

    def close(self) -> None: ...


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(show: bool, total_rows: int, what: str) -> Progress:
    """A tqdm bar counting rows (throughput and time left included) when asked for; tqdm is imported only then."""
    if not show:
        return _NoProgress()
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]
    except ImportError:
        raise MissingExtraError("progress=True needs tqdm: pip install 'apsi-memory[progress]', or pip install "
                                "'.[progress]' in a checkout of apsi_memory") from None
    bar: Progress = tqdm(total=total_rows, unit=" rows", unit_scale=True, desc=what)
    return bar
