"""Hit, miss and eviction counts: ``Store.stats()`` and a ``@cached`` function's ``stats()``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .keys import encode_key


class CacheStats(NamedTuple):
    """Counts in this process since the store was opened (or the function decorated): ``hits`` (a value came back,
    from RAM or the SSD), ``misses`` (the key was not there, or its value could not be read) and ``evictions``
    (entries this process removed, least recently used first, to keep the store within ``disk_gb``)."""

    hits: int
    misses: int
    evictions: int


class Counts:
    """The running counts behind a ``CacheStats``; with a ``prefix``, evictions count only keys starting with it
    (the entries of one ``@cached`` function)."""

    __slots__ = ("__weakref__", "_encoded", "evictions", "hits", "misses", "prefix")

    def __init__(self, prefix: bytes = b"") -> None:
        self.prefix = prefix
        self._encoded = encode_key(prefix) if prefix else b""  # as the store's keys are kept (``keys.encode_key``)
        self.hits = self.misses = self.evictions = 0

    def evicted(self, keys: Iterable[bytes]) -> None:
        """Count the evicted ``keys`` (encoded) that start with the prefix."""
        self.evictions += sum(key.startswith(self._encoded) for key in keys)

    def snapshot(self) -> CacheStats:
        return CacheStats(self.hits, self.misses, self.evictions)
