"""Data larger than RAM, a block of rows at a time: ``chunks`` (a generator of blocks) and ``map`` (a function
of each block, on threads, into a spilled result, or on a Dask cluster with ``engine=client``), ``reduce`` (a
function of each block, on threads, combined into one value), with ``to_dask`` for clusters that do not share
this machine's files.

May import: system, adapters, machinery, arrays, blocks, dask.
"""

from .chunking import chunks
from .mapping import map, to_dask
from .reducing import reduce

__all__ = ["chunks", "map", "reduce", "to_dask"]
