"""The process's own tools, below every kernel reading: the C library calls (``libc``: ``madvise``, ``mincore``,
``cachestat``, ``fallocate``, hole punching, ``malloc_trim``), userfaultfd write protection (``uffd``), work done
once per process and again after a fork (``once``), files written so a reader sees the old or the new
(``fileio``), a Ctrl-C kept even where a finalizer swallowed it (``interrupts``), the library's folders and the
``APSI_*`` variables that move them (``paths``), and the checks of
owner, mode and type before a folder or key is trusted (``trust``).

Nothing here knows of memory levels, machines or arrays.

May import: nothing of ours but errors and units.
"""
