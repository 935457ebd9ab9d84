"""Arrays that live where they fit: ``memory.array`` in RAM within the budget, else memory-mapped from a spill
file (``array``, ``spill``); moved to the SSD in place when memory gets tight (``moving``); sent to another
process by ``multiprocessing`` as a reference to their file, not a copy (``sending``); and temporaries reused
instead of allocated again (``pool``); kept as a ``.npy`` that outlives the process (``keeping``).

May import: decide, system, adapters, machinery.
"""

from .keeping import keep
from .placement import ArrayRecord, array, free, on_disk, report
from .pools import Pool, pool

__all__ = ["ArrayRecord", "Pool", "array", "free", "keep", "on_disk", "pool", "report"]
