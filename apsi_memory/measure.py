"""One reading of the memory this process really has: the host's view narrowed by its cgroup."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from .adapters.cgroup import CgroupMemory, read_cgroup_memory, read_layout
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


def read_memory(root: str | None = None) -> MemoryReading:
    root = resolve(root)
    host = read_meminfo(root) or _host_from_psutil()
    layout = read_layout(root)
    group = read_cgroup_memory(host.total, root, layout)
    try:
        psi, psi_problem = read_psi(root, layout), None
    except CorruptFileError as exc:  # a stall reading we cannot parse must never hide the memory limit
        psi, psi_problem = None, str(exc)
    if isinstance(group, str):
        return MemoryReading(host, None, psi, group, psi_problem)
    return MemoryReading(host, group, psi, None, psi_problem)
