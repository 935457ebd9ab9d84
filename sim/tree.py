"""Fake machines: ``/proc`` and cgroup trees written under a temporary root, read by the real adapters.

A ``SimTree`` writes the same files, in the same formats, that the kernel shows; the adapters read them through
their ``root`` argument (or ``APSI_FS_ROOT`` for a subprocess), exactly as they read ``/``. The scenario functions
at the bottom build the machines users run on: a bare host, Docker on cgroup v1, a Kubernetes pod on v2, a systemd
slice whose parent has the smaller limit, a cgroup namespace, a hybrid v1+v2 host, PSI disabled, v1 with 64 KiB
pages, a service without the memory controller under a limited slice, a service with ``memory.high`` below
``memory.max``, a process outside the reader's cgroup namespace, a group that is not under its mount's root, v1 with
``memory.use_hierarchy`` 0, and children of one limited parent (v1 and v2).
"""

from __future__ import annotations

import os
from pathlib import Path

GiB = 1 << 30
MiB = 1 << 20
KiB = 1 << 10

# What v1 prints for "no limit": PAGE_COUNTER_MAX pages, rounded down to the page size.
def v1_unlimited(page_size: int = 4096) -> int:
    return (2**63 - 1) // page_size * page_size


V1_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids")


class SimTree:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._mounts: list[str] = []
        self._cgroup_lines: list[str] = []

    def __str__(self) -> str:
        return str(self.root)

    def write(self, path: str, text: str) -> Path:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    # -- /proc -----------------------------------------------------------------------------------------------------

    def meminfo(self, total: int, available: int, swap_total: int = 0, swap_free: int = 0,
                with_available: bool = True) -> SimTree:
        free = available // 2
        lines = [f"MemTotal:       {total // KiB} kB", f"MemFree:        {free // KiB} kB"]
        if with_available:
            lines.append(f"MemAvailable:   {available // KiB} kB")
        lines += [f"Buffers:        {0} kB", f"Cached:         {(available - free) // KiB} kB",
                  f"SwapTotal:      {swap_total // KiB} kB", f"SwapFree:       {swap_free // KiB} kB",
                  "HugePages_Total:       0"]
        self.write("/proc/meminfo", "\n".join(lines) + "\n")
        return self

    def process(self, rss: int = 40 * MiB, cpus: str = "0-1", load: float = 0.34) -> SimTree:
        self.write("/proc/self/status", f"Name:\tpython3\nVmRSS:\t{rss // KiB} kB\nCpus_allowed_list:\t{cpus}\n")
        self.write("/proc/loadavg", f"{load:.2f} 0.30 0.25 1/200 4242\n")
        return self

    def psi(self, some: float = 0.0, full: float | None = 0.0, path: str = "/proc/pressure/memory") -> SimTree:
        text = f"some avg10={some:.2f} avg60=0.00 avg300=0.00 total=0\n"
        if full is not None:
            text += f"full avg10={full:.2f} avg60=0.00 avg300=0.00 total=0\n"
        self.write(path, text)
        return self

    def psi_disabled(self, path: str = "/proc/pressure/memory") -> SimTree:
        """With ``psi=0`` the file is there but reading it fails; a directory of that name fails the same way."""
        target = self.root / path.lstrip("/")
        target.unlink(missing_ok=True)
        target.mkdir(parents=True)
        return self

    # -- cgroups ---------------------------------------------------------------------------------------------------

    def mount(self, mount_point: str, fstype: str, options: str, root: str = "/", source: str | None = None) -> SimTree:
        """A mountinfo line; ``source=""`` is an empty mount source (the kernel prints nothing for it)."""
        mount_id = 30 + len(self._mounts)
        self._mounts.append(f"{mount_id} 25 0:{mount_id} {root} {mount_point} rw,nosuid,nodev,noexec,relatime "
                            f"shared:{mount_id} - {fstype} {fstype if source is None else source} rw,{options}")
        self._write_mounts()
        return self

    def member(self, line: str) -> SimTree:
        """A line of /proc/self/cgroup, e.g. ``4:memory:/docker/abc`` or ``0::/kubepods/pod1``."""
        self._cgroup_lines.append(line)
        self.write("/proc/self/cgroup", "\n".join(self._cgroup_lines) + "\n")
        return self

    def _write_mounts(self) -> None:
        base = ["22 27 0:21 / /proc rw,relatime - proc proc rw",
                "25 27 0:24 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755"]
        self.write("/proc/self/mountinfo", "\n".join(base + self._mounts) + "\n")

    def v1_group(self, directory: str, limit: int | None = None, usage: int = 0, inactive_file: int = 0,
                 hierarchical_limit: int | None = None, page_size: int = 4096,
                 use_hierarchy: bool = True) -> SimTree:
        """A v1 group's files. ``use_hierarchy=False`` (possible before Linux 5.11): the group's children are not
        charged to it, so its limit does not apply to them."""
        unlimited = v1_unlimited(page_size)
        limit = unlimited if limit is None else limit
        self.write(f"{directory}/memory.limit_in_bytes", f"{limit}\n")
        self.write(f"{directory}/memory.usage_in_bytes", f"{usage}\n")
        self.write(f"{directory}/memory.use_hierarchy", f"{int(use_hierarchy)}\n")
        hierarchical = limit if hierarchical_limit is None else hierarchical_limit
        self.write(f"{directory}/memory.stat",
                   f"cache {inactive_file}\nrss {max(0, usage - inactive_file)}\ninactive_file {inactive_file}\n"
                   f"hierarchical_memory_limit {hierarchical}\nhierarchical_memsw_limit {unlimited}\n"
                   f"total_inactive_file {inactive_file}\n")
        return self

    def v2_group(self, directory: str, limit: int | None = None, high: int | None = None, current: int = 0,
                 inactive_file: int = 0, pressure: tuple[float, float] | None = None,
                 events: dict[str, int] | None = None, oom_group: bool | None = None) -> SimTree:
        """A v2 group's files; ``events`` (``memory.events`` counters, e.g. ``{"high": 304}``) and ``oom_group``
        (``memory.oom.group``) are written only where given, as on kernels and trees without them."""
        self.write(f"{directory}/memory.max", f"{'max' if limit is None else limit}\n")
        self.write(f"{directory}/memory.high", f"{'max' if high is None else high}\n")
        self.write(f"{directory}/memory.current", f"{current}\n")
        self.write(f"{directory}/memory.stat", f"anon {max(0, current - inactive_file)}\nfile {inactive_file}\n"
                                              f"inactive_file {inactive_file}\nactive_file 0\n")
        self.write(f"{directory}/cgroup.controllers", "cpuset cpu io memory pids\n")
        if pressure is not None:
            self.psi(*pressure, path=f"{directory}/memory.pressure")
        if events is not None:
            self.v2_events(directory, **events)
        if oom_group is not None:
            self.write(f"{directory}/memory.oom.group", f"{int(oom_group)}\n")
        return self

    def v2_events(self, directory: str, **counts: int) -> SimTree:
        """``memory.events`` as the kernel prints it, every counter 0 but ``counts``."""
        names = ("low", "high", "max", "oom", "oom_kill", "oom_group_kill")
        self.write(f"{directory}/memory.events", "".join(f"{name} {counts.get(name, 0)}\n" for name in names))
        return self


def _machine(root: str | os.PathLike[str], total: int = 64 * GiB, available: int = 60 * GiB) -> SimTree:
    return SimTree(root).meminfo(total, available).process().psi()


# -- scenarios ---------------------------------------------------------------------------------------------------

def host(root: str | os.PathLike[str], total: int = 8 * GiB, available: int = 7 * GiB) -> SimTree:
    """A laptop: no cgroup limit, the host's memory is what there is (v2 root group, no memory files)."""
    tree = _machine(root, total, available)
    tree.mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member("0::/user.slice/user-1000.slice/session-2.scope")
    return tree


def docker_v1(root: str | os.PathLike[str], limit: int = 4 * GiB, usage: int = 1 * GiB,
              inactive_file: int = 256 * MiB) -> SimTree:
    """``docker run -m 4g`` on a v1 host: the memory mount's root is ``/docker/<id>``, the group is its top."""
    cid = "/docker/3f2a9c0e7b1d"
    tree = _machine(root)
    for hierarchy, controller in enumerate(V1_CONTROLLERS, start=1):
        tree.mount(f"/sys/fs/cgroup/{controller}", "cgroup", controller, root=cid)
        tree.member(f"{hierarchy}:{controller}:{cid}")
    return tree.v1_group("/sys/fs/cgroup/memory", limit, usage, inactive_file)


def kubernetes_v2(root: str | os.PathLike[str], limit: int = 4 * GiB, current: int = 3 * GiB,
                  inactive_file: int = 1 * GiB, pod_psi: tuple[float, float] = (12.0, 3.0)) -> SimTree:
    """A pod with a 4 GiB limit on a v2 node, without a cgroup namespace: the whole hierarchy is visible."""
    pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice"
    container = f"{pod}/cri-containerd-abcdef.scope"
    tree = _machine(root).mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member(f"0::{container}")
    tree.v2_group("/sys/fs/cgroup/kubepods.slice")
    tree.v2_group("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice")
    tree.v2_group(f"/sys/fs/cgroup{pod}", limit=limit, current=current, inactive_file=inactive_file)
    return tree.v2_group(f"/sys/fs/cgroup{container}", current=current, inactive_file=inactive_file,
                         pressure=pod_psi)


def systemd_slice(root: str | os.PathLike[str], slice_limit: int = 2 * GiB, service_limit: int = 6 * GiB,
                  slice_usage: int = 1536 * MiB, service_usage: int = 512 * MiB) -> SimTree:
    """A service with MemoryMax=6G inside a slice with MemoryMax=2G: the parent's smaller limit is the real one."""
    tree = _machine(root).mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member("0::/batch.slice/job.service")
    tree.v2_group("/sys/fs/cgroup/batch.slice", limit=slice_limit, current=slice_usage)
    return tree.v2_group("/sys/fs/cgroup/batch.slice/job.service", limit=service_limit, current=service_usage)


def cgroup_namespace(root: str | os.PathLike[str], limit: int = 3 * GiB, current: int = 1 * GiB) -> SimTree:
    """A container with its own cgroup namespace: /proc/self/cgroup says ``0::/``, the mount shows the group."""
    tree = _machine(root).mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member("0::/")
    return tree.v2_group("/sys/fs/cgroup", limit=limit, current=current, pressure=(1.0, 0.0))


def hybrid(root: str | os.PathLike[str], limit: int = 5 * GiB, usage: int = 2 * GiB,
           unified_psi: tuple[float, float] = (7.0, 1.0)) -> SimTree:
    """systemd's hybrid layout: memory on v1, an empty v2 tree at /sys/fs/cgroup/unified that carries PSI."""
    group = "/system.slice/app.service"
    tree = _machine(root)
    tree.mount("/sys/fs/cgroup/memory", "cgroup", "memory").member(f"4:memory:{group}")
    tree.mount("/sys/fs/cgroup/unified", "cgroup2", "nsdelegate").member(f"0::{group}")
    tree.v1_group("/sys/fs/cgroup/memory")
    tree.v1_group("/sys/fs/cgroup/memory/system.slice")
    tree.v1_group(f"/sys/fs/cgroup/memory{group}", limit, usage)
    return tree.psi(*unified_psi, path=f"/sys/fs/cgroup/unified{group}/memory.pressure")


def psi_disabled(root: str | os.PathLike[str]) -> SimTree:
    """Booted with ``psi=0``: the pressure files exist but cannot be read."""
    tree = docker_v1(root)
    tree.psi_disabled()
    return tree


def no_psi(root: str | os.PathLike[str]) -> SimTree:
    """A kernel before 4.20: no pressure files at all."""
    tree = docker_v1(root)
    (tree.root / "proc/pressure/memory").unlink()
    return tree


def v1_unlimited_64k(root: str | os.PathLike[str]) -> SimTree:
    """An arm64 host with 64 KiB pages: v1's "no limit" is a different huge number than on x86."""
    tree = _machine(root, total=16 * GiB, available=12 * GiB)
    tree.mount("/sys/fs/cgroup/memory", "cgroup", "memory").member("4:memory:/user.slice")
    tree.v1_group("/sys/fs/cgroup/memory", page_size=65536)
    return tree.v1_group("/sys/fs/cgroup/memory/user.slice", usage=3 * GiB, page_size=65536)


def v1_without_hierarchy(root: str | os.PathLike[str], parent_limit: int = 1 * GiB, group_limit: int | None = 2 * GiB,
                         parent_usage: int = 900 * MiB, usage: int = 512 * MiB) -> SimTree:
    """A kernel before 5.11 without systemd: the v1 root and every group under it keep ``memory.use_hierarchy``
    0. ``/batch`` has a 1 GiB limit, but its child ``/batch/job`` (ours) is not charged to it: only the job's own
    limit (and its ``hierarchical_memory_limit``, which the kernel computes stopping at ``/batch``) applies."""
    tree = _machine(root, total=16 * GiB, available=12 * GiB)
    tree.mount("/sys/fs/cgroup/memory", "cgroup", "memory").member("4:memory:/batch/job")
    tree.v1_group("/sys/fs/cgroup/memory", use_hierarchy=False)
    tree.v1_group("/sys/fs/cgroup/memory/batch", parent_limit, parent_usage, use_hierarchy=False)
    return tree.v1_group("/sys/fs/cgroup/memory/batch/job", group_limit, usage, use_hierarchy=False)


def service_without_memory_controller(root: str | os.PathLike[str], slice_limit: int = 1 * GiB,
                                      slice_usage: int = 256 * MiB) -> SimTree:
    """``MemoryMax=1G`` on a slice, a service under it with CPU accounting only: the slice's
    ``cgroup.subtree_control`` does not hand ``memory`` down, so the service has no memory files and the kernel
    charges (and limits) the slice. A big host, as on the capture the issue came from."""
    tree = _machine(root, total=2048 * GiB, available=2000 * GiB)
    tree.mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member("0::/batch.slice/job.service")
    tree.v2_group("/sys/fs/cgroup/batch.slice", limit=slice_limit, current=slice_usage)
    tree.write("/sys/fs/cgroup/batch.slice/cgroup.subtree_control", "cpu pids\n")
    tree.write("/sys/fs/cgroup/batch.slice/job.service/cgroup.controllers", "cpu pids\n")
    tree.write("/sys/fs/cgroup/batch.slice/job.service/cpu.max", "max 100000\n")
    return tree


def memory_high_below_max(root: str | os.PathLike[str], high: int = 512 * MiB, limit: int = 1 * GiB,
                          current: int = 300 * MiB, high_events: int = 0, oom_group: bool | None = None) -> SimTree:
    """A v2 service with ``MemoryHigh=512M`` and ``MemoryMax=1G``: above ``memory.high`` the kernel throttles and
    counts ``high`` in ``memory.events``, at ``memory.max`` it kills. Its own ``memory.pressure`` at 0."""
    tree = _machine(root).mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member("0::/app.slice/job.service")
    tree.v2_group("/sys/fs/cgroup/app.slice")
    return tree.v2_group("/sys/fs/cgroup/app.slice/job.service", limit=limit, high=high, current=current,
                         pressure=(0.0, 0.0), events={"high": high_events}, oom_group=oom_group)


def outside_namespace(root: str | os.PathLike[str], mount_root: str = "/") -> SimTree:
    """A process in another cgroup namespace than the reader's: ``/proc/self/cgroup`` climbs with ``..``. A group
    with a 1 GiB limit sits where that path would lead outside ``/sys/fs/cgroup``, a trap for a reader that climbs;
    with ``mount_root="/../.."`` the mount shows the group (a 2 GiB limit there)."""
    group = "/user-1000.slice/session-520.scope"
    tree = _machine(root).mount("/sys/fs/cgroup", "cgroup2", "nsdelegate", root=mount_root)
    tree.member(f"0::/../..{group}")
    tree.v2_group(f"/sys{group}", limit=1 * GiB, current=100 * MiB)  # outside the mount: must never be read
    relative = group if mount_root == "/../.." else ""
    return tree.v2_group(f"/sys/fs/cgroup{relative}", limit=2 * GiB, current=100 * MiB)


def group_not_under_mount_root(root: str | os.PathLike[str], limit: int = 1 * GiB) -> SimTree:
    """v1: ``/proc/self/cgroup`` names a group the memory mount (root ``/docker/3f2a``) does not show. The JVM reads
    the mount point; so do we, and say so."""
    tree = _machine(root).mount("/sys/fs/cgroup/memory", "cgroup", "memory", root="/docker/3f2a")
    tree.member("4:memory:/system.slice/other.service")
    return tree.v1_group("/sys/fs/cgroup/memory", limit=limit, usage=100 * MiB)


def nested(root: str | os.PathLike[str], version: int, child: str, child_limit: int | None = None,
           parent_limit: int | None = 2 * GiB, child_usage: int = 256 * MiB) -> SimTree:
    """A process in ``/batch/<child>`` (a Slurm step, a container of a pod, a service of a slice) whose parent
    ``/batch`` has the 2 GiB limit; the child has ``child_limit`` of its own (None: none). Trees for two children
    differ only in ``/proc/self/cgroup`` and the child's files: they stand for two processes of one machine."""
    tree = _machine(root, total=16 * GiB, available=12 * GiB)
    top, group = "/sys/fs/cgroup/memory" if version == 1 else "/sys/fs/cgroup", f"/batch/{child}"
    if version == 1:
        tree.mount(top, "cgroup", "memory").member(f"4:memory:{group}").v1_group(top)
        tree.v1_group(f"{top}/batch", parent_limit, 2 * child_usage)
        inherited = min(x for x in (child_limit, parent_limit, v1_unlimited()) if x is not None)
        return tree.v1_group(f"{top}{group}", child_limit, child_usage, hierarchical_limit=inherited)
    tree.mount(top, "cgroup2", "nsdelegate").member(f"0::{group}")
    tree.v2_group(f"{top}/batch", parent_limit, current=2 * child_usage)
    return tree.v2_group(f"{top}{group}", child_limit, current=child_usage)


def namespace_outer_mount(root: str | os.PathLike[str], depth: int = 1, limit: int = 512 * MiB,
                          current: int = 100 * MiB, pid: int = 4711, holds_pid: bool = True) -> SimTree:
    """``unshare -C`` in a group ``depth`` levels down that kept the outer cgroup2 mount (kind, Docker-in-Docker,
    LXC): ``/proc/self/cgroup`` says ``0::/``, the mount's root ``/..`` per level, the mount point is the host's
    root group. Ours (``limit``) lists ``pid`` in its ``cgroup.procs``; a sibling with a bigger limit lists other
    pids (``holds_pid=False``: ours does not list it either, as when the pid cannot be found)."""
    tree = _machine(root).mount("/sys/fs/cgroup", "cgroup2", "nsdelegate", root="/.." * depth).member("0::/")
    tree.write("/proc/self/stat", f"{pid} (python3) R 1 {pid} {pid} 0 -1 4194304\n")
    tree.write("/sys/fs/cgroup/cgroup.procs", "1\n")
    parent = "/sys/fs/cgroup" + "/kubepods" * (depth - 1)
    if depth > 1:
        tree.v2_group(parent)
    for name, group_limit, procs in (("other", 2 * GiB, "1200\n1201\n"),
                                     ("apsi-ns", limit, f"{pid}\n" if holds_pid else "1300\n")):
        tree.v2_group(f"{parent}/{name}", limit=group_limit, current=current)
        tree.write(f"{parent}/{name}/cgroup.procs", procs)
    return tree
