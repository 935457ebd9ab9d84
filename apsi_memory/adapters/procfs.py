"""``/proc``: meminfo, the process's cgroups and mounts, load, this process's RSS and CPUs, and when a process
started."""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import CorruptFileError
from .files import KernelFiles
from .root import read_text, resolve


class MemInfo(NamedTuple):
    total: int
    available: int
    swap_total: int
    swap_free: int


_MEMINFO_FIELDS = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree")
_ESTIMATE_FIELDS = ("MemFree", "Buffers", "Cached")  # read only without MemAvailable: the estimate before it


def parse_meminfo(text: str, path: str = "/proc/meminfo") -> MemInfo:
    """The fields this library uses (every placement takes a reading: the three of the estimate only where the
    kernel has no MemAvailable)."""
    fields = _meminfo_fields(text, _MEMINFO_FIELDS, path)
    if "MemTotal" not in fields:
        raise CorruptFileError(path, "no MemTotal line")
    total, available = fields["MemTotal"], fields.get("MemAvailable")
    if available is None:  # MemAvailable arrived in Linux 3.14; before it, free + reclaimable page cache
        available = sum(_meminfo_fields(text, _ESTIMATE_FIELDS, path).values())
    return MemInfo(total, min(total, available), fields.get("SwapTotal", 0), fields.get("SwapFree", 0))


def _meminfo_fields(text: str, names: tuple[str, ...], path: str) -> dict[str, int]:
    """``names``' values, found where the kernel writes them (``Name:`` at the start of a line); where one is not
    found so (an old kernel, odd spacing) every line is looked at. A name with nothing after its colon is absent."""
    lines, rests = "\n" + text, {}
    for name in names:
        start = lines.rfind(f"\n{name}:")
        if start < 0:
            rests = _meminfo_rests(text, names)
            break
        end = lines.find("\n", start + 1)
        rests[name] = lines[start + len(name) + 2:end if end >= 0 else len(lines)]
    return {name: value for name, rest in rests.items() if (value := _meminfo_value(name, rest, path)) is not None}


def _meminfo_rests(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """What follows the colon on each line of one of ``names`` (the last line of a name wins)."""
    rests = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name.strip() in names:
            rests[name.strip()] = rest
    return rests


def _meminfo_value(name: str, rest: str, path: str) -> int | None:
    """``   8000 kB`` in bytes; None for nothing after the colon (the field counts as absent)."""
    words = rest.split()
    if not words:
        return None
    try:
        value = int(words[0])
    except ValueError:
        raise CorruptFileError(path, f"field {name!r} has a non-numeric value {words[0]!r}") from None
    return value * 1024 if len(words) > 1 and words[1] == "kB" else value


def read_meminfo(files: KernelFiles) -> MemInfo | None:
    text = files.read("/proc/meminfo")
    return None if text is None else parse_meminfo(text)


class CgroupEntry(NamedTuple):
    """A line of ``/proc/self/cgroup``: ``4:memory:/docker/abc`` (v1) or ``0::/kubepods/pod1`` (v2)."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str


def parse_self_cgroup(text: str, path: str = "/proc/self/cgroup") -> list[CgroupEntry]:
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].startswith("/"):
            raise CorruptFileError(path, f"line {line!r} is not 'id:controllers:/path'")
        controllers = tuple(c for c in parts[1].split(",") if c)
        entries.append(CgroupEntry(int(parts[0]), controllers, parts[2]))
    return entries


class Mount(NamedTuple):
    """The fields of a ``/proc/self/mountinfo`` line this library needs."""

    root: str  # the path inside the filesystem that is mounted (a cgroup path for cgroup mounts)
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\040, \\011, \\012, \\134."""
    if "\\" not in field:
        return field
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def parse_mountinfo(text: str, path: str = "/proc/self/mountinfo") -> list[Mount]:
    """By proc(5)'s field rules: fields are split on single spaces (the kernel escapes a space inside one as
    ``\\040``), six fixed ones, optional ``tag:value`` ones up to a lone ``-``, then the filesystem type, the
    mount source and the super options. The source may be empty (mount(2) accepts ``""``; two spaces follow the
    type): splitting on runs of whitespace would take the options for the source and lose them."""
    return parse_mountinfo_lines(text, path)[0]


def parse_mountinfo_lines(text: str, path: str = "/proc/self/mountinfo") -> tuple[list[Mount], list[str]]:
    """The mounts, and the lines skipped as ones the kernel could not have written (a tree written by hand or by
    another tool): one bad line must not hide the memory mount beside it. A file with no readable line at all is
    corrupt."""
    mounts, skipped = [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            mounts.append(_mount(line, path))
        except CorruptFileError:
            skipped.append(line)
    if skipped and not mounts:
        raise CorruptFileError(path, f"line {skipped[0]!r} is not a mountinfo line")
    return mounts, skipped


def _mount(line: str, path: str) -> Mount:
    fields = line.split(" ")
    separator = fields.index("-", 6) if "-" in fields[6:] else -1
    if separator < 0 or len(fields) < separator + 3:
        raise CorruptFileError(path, f"line {line!r} is not a mountinfo line")
    fstype, options = fields[separator + 1], fields[separator + 3] if len(fields) > separator + 3 else ""
    return Mount(_unescape(fields[3]), _unescape(fields[4]), _unescape(fstype),
                 tuple(_unescape(option) for option in options.split(",") if option))


def parse_loadavg(text: str, path: str = "/proc/loadavg") -> float:
    """The 1-minute load average."""
    words = text.split()
    try:
        return float(words[0])
    except (IndexError, ValueError):
        raise CorruptFileError(path, f"expected a load average first, got {text[:40]!r}") from None


def read_loadavg(root: str | None = None) -> float | None:
    text = read_text(resolve(root), "/proc/loadavg")
    return None if text is None else parse_loadavg(text)


class ProcStatus(NamedTuple):
    rss: int | None
    cpus: int | None  # CPUs this process may run on: what ``nproc`` prints


def parse_cpu_list(text: str, path: str = "/proc/self/status") -> int:
    """Count the CPUs of a list such as ``0-3,8,10-11``."""
    count = 0
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise CorruptFileError(path, f"CPU list {text.strip()!r} is not like '0-3,8'") from None
        if high < low:
            raise CorruptFileError(path, f"CPU range {part!r} runs backwards")
        count += high - low + 1
    return count


def parse_proc_status(text: str, path: str = "/proc/self/status") -> ProcStatus:
    rss = cpus = None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "VmRSS":
            words = value.split()
            if not words or not words[0].isdigit():
                raise CorruptFileError(path, f"VmRSS value {value.strip()!r} is not 'N kB'")
            rss = int(words[0]) * 1024
        elif name == "Cpus_allowed_list":
            cpus = parse_cpu_list(value, path)
    return ProcStatus(rss, cpus)


def read_proc_status(root: str | None = None) -> ProcStatus | None:
    text = read_text(resolve(root), "/proc/self/status")
    return None if text is None else parse_proc_status(text)


def parse_stat_start_time(text: str) -> str | None:
    """Field 22 of ``/proc/<pid>/stat``: when the process started, in clock ticks after boot (``None`` if the line
    is cut short)."""
    fields = _after_command(text)
    return fields[19] if len(fields) > 19 else None


def parse_stat_parent(text: str) -> int | None:
    """Field 4 of ``/proc/<pid>/stat``: the parent's pid (``None`` if the line is cut short or odd)."""
    fields = _after_command(text)
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _after_command(text: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` line from field 3 on. The command name (field 2) may hold spaces and
    parentheses: fields are counted after its closing one."""
    return text.rpartition(")")[2].split()


def read_start_time(pid: int, root: str | None = None) -> str | None:
    """When process ``pid`` started, or ``None`` when no such process runs (or the root shows no processes)."""
    text = read_text(resolve(root), f"/proc/{pid}/stat")
    return None if text is None else parse_stat_start_time(text)
