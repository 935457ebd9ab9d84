"""Thin OS adapters. Each kernel file has a pure ``parse_x(text)`` and a one-line reader around it.

Every reader takes ``root``: the directory that stands for ``/`` (psutil's ``PROCFS_PATH`` idea, one level up so
cgroup mounts move with ``/proc``). The library passes its machine's root (``apsi_memory.machine().root``: ``/`` unless
``APSI_FS_ROOT`` names a directory, or a ``sim.machine(tree)``) — the seam through which ``sim/`` trees feed the
real adapters. ``clock`` is the same seam for time; ``processes`` tells whether a process still runs (pid and
start time).

May import: decide.
"""
