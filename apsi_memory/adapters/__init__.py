"""Thin OS adapters. Each kernel file has a pure ``parse_x(text)`` and a one-line reader around it.

Every reader takes ``root``: the directory that stands for ``/`` (psutil's ``PROCFS_PATH`` idea, one level up so
cgroup mounts move with ``/proc``). It defaults to ``root.ROOT``, which is ``/`` unless ``APSI_FS_ROOT`` names a
directory — the seam through which ``sim/`` trees feed the real adapters."""
