"""One reading of the memory this process really has: the host's view narrowed by its cgroup."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from .adapters.cgroup import CgroupMemory, read_cgroup_memory, read_layout
from .adapters.procfs import MemInfo, read_meminfo
from .adapters.psi import Psi, read_psi
from .adapters.root import resolve


@dataclass(frozen=True)
class MemoryReading:
    host: MemInfo
    cgroup: CgroupMemory | None
    psi: Psi | None

    @property
    def limited(self) -> bool:
        return self.cgroup is not None and self.cgroup.limit is not None and self.cgroup.limit < self.host.total

    @property
    def usable(self) -> int:
        """What the kernel lets this process use before it is killed: the smaller of RAM and the cgroup limit."""
        if self.limited:
            assert self.cgroup is not None and self.cgroup.limit is not None
            return self.cgroup.limit
        return self.host.total

    @property
    def free(self) -> int:
        """The smaller of the host's available memory and the cgroup's headroom, within [0, usable]."""
        free = self.host.available
        if self.limited:
            assert self.cgroup is not None and self.cgroup.free is not None
            free = min(free, self.cgroup.free)
        return max(0, min(free, self.usable))

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
    return MemoryReading(host, read_cgroup_memory(host.total, root, layout), read_psi(root, layout))
