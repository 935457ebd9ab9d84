"""One reading of the memory this process really has: the host's view narrowed by its cgroup."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import psutil

from .adapters.cgroup import CgroupMemory, Layout, read_cgroup_memory, read_layout
from .adapters.files import KernelFiles
from .adapters.procfs import MemInfo, read_meminfo
from .adapters.psi import Psi, read_psi
from .adapters.root import resolve
from .decide import free_memory, usable_memory
from .errors import CorruptFileError


@dataclass(frozen=True)
class MemoryReading:
    host: MemInfo
    cgroup: CgroupMemory | None
    psi: Psi | None
    cgroup_problem: str | None = None  # why a group that exists was not read (the reading is the host's)
    psi_problem: str | None = None  # why stalls are not available although a PSI file is there

    @property
    def limited(self) -> bool:
        return self.cgroup is not None and self.cgroup.limit is not None and self.cgroup.limit < self.host.total

    @property
    def usable(self) -> int:
        return usable_memory(self.host.total, self.cgroup.limit if self.limited and self.cgroup else None)

    @property
    def free(self) -> int:
        group_free = self.cgroup.free if self.limited and self.cgroup else None
        return free_memory(self.host.available, group_free, self.usable)

    @property
    def source(self) -> str:
        if self.limited:
            assert self.cgroup is not None
            return f"container (cgroup v{self.cgroup.version})"
        return "host"


def _host_from_psutil() -> MemInfo:
    """Where there is no /proc/meminfo (macOS, Windows), psutil knows the host; there are no cgroups."""
    vm, swap = psutil.virtual_memory(), psutil.swap_memory()
    return MemInfo(int(vm.total), int(vm.available), int(swap.total), int(swap.free))


class MemoryReader:
    """Takes ``MemoryReading``s of one root, keeping its kernel files open (``adapters.files``) and where the group
    is while ``/proc/self/cgroup`` and ``mountinfo`` read the same. Limits, usage and PSI are read afresh every
    time (a pod is resized in place). One reading at a time: readings from several threads wait for each other."""

    def __init__(self, root: str | None = None) -> None:
        self.root = resolve(root)
        self.files = KernelFiles(self.root)
        self._layout: Layout | None = None
        self._lock = threading.Lock()

    def read(self) -> MemoryReading:
        if self.files.forked():  # a lock held by a thread of the parent at fork would never be released here
            self._lock = threading.Lock()
        with self._lock:
            self._layout = layout = read_layout(self.files, self._layout)
            return _reading(self.files, layout)

    def close(self) -> None:
        with self._lock:  # not under a reading another thread is taking
            self.files.close()


def read_memory(root: str | None = None) -> MemoryReading:
    """One reading, opening and closing its files (a ``Machine`` keeps a ``MemoryReader`` instead)."""
    reader = MemoryReader(root)
    try:
        return reader.read()
    finally:
        reader.close()


def _reading(files: KernelFiles, layout: Layout) -> MemoryReading:
    host = read_meminfo(files) or _host_from_psutil()
    group = read_cgroup_memory(host.total, files, layout)
    try:
        psi, psi_problem = read_psi(files, layout), None
    except CorruptFileError as exc:  # a stall reading we cannot parse must never hide the memory limit
        psi, psi_problem = None, str(exc)
    if isinstance(group, str):
        return MemoryReading(host, None, psi, group, psi_problem)
    return MemoryReading(host, group, psi, None, psi_problem)
