"""Data larger than RAM, a block of rows at a time: ``chunks`` (a generator of blocks) and ``map`` (a function
of each block, on threads, into a spilled result, or on a Dask cluster with ``engine=client``), with ``to_dask``
for clusters that do not share this machine's files.

May import: system, adapters, machinery, arrays, blocks, dask.
"""

from .chunking import chunks
from .mapping import map, to_dask

__all__ = ["chunks", "map", "to_dask"]
