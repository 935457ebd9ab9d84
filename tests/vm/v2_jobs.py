"""The programs tests/vm/test_v2_headline.py runs inside a real v2 group, sized for a 512 MiB group under TCG; they
reuse the v1 jobs of tests/real (``siblings_job.one``, ``moving_jobs.job``/``neighbour``) where those fit.

    python v2_jobs.py big memory.array|numpy.ones MiB
    python v2_jobs.py sibling memory.array|numpy.zeros MiB READY_DIR COUNT
    python v2_jobs.py moving memory.array|numpy MiB SECONDS
    python v2_jobs.py neighbour TOTAL STEP PAUSE HOLD
    python v2_jobs.py lowered memory.array|numpy.ones MiB LATER_MiB   (waits for a line on stdin in between)
    python v2_jobs.py limits
    python v2_jobs.py watch SECONDS
    python v2_jobs.py triggers SECONDS
    python v2_jobs.py delegate GROUP UID JOB ARGS...   (as root: enters GROUP/init, becomes UID, then GROUP/work)

Run them as ``python -m tests.vm.v2_jobs ...`` from the checkout's root (they import ``tests.real``). Each prints
its result on its last line (JSON where there are figures); a process the kernel killed prints nothing more."""

from __future__ import annotations

import errno
import json
import os
import select
import sys
import time
from typing import Any, NoReturn

import numpy as np

import apsi_memory as memory
from apsi_memory.adapters.psi import open_trigger, trigger_line
from tests.real import moving_jobs, siblings_job

MiB = 1 << 20
BLOCK = 16 * MiB  # filled a block at a time: no temporary as big as the array


def _make(kind: str, nbytes: int) -> Any:
    if kind == "memory.array":
        return memory.array(nbytes, "uint8")
    return np.ones(nbytes, "uint8") if kind == "numpy.ones" else np.zeros(nbytes, "uint8")


def _fill(x: Any, first: int) -> int:
    """Block ``i`` gets ``(first + i) % 251 + 1``; returns the sum the array must have."""
    expected = 0
    for i, start in enumerate(range(0, x.size, BLOCK)):
        value = (first + i) % 251 + 1
        x[start:start + BLOCK] = value
        expected += value * (min(x.size, start + BLOCK) - start)
    return expected


def _where(x: Any) -> str:
    return "SSD" if memory.on_disk(x) else "RAM"


def big(kind: str, mib: int) -> int:
    x = _make(kind, mib * MiB)
    expected = _fill(x, 0)
    right = int(x.sum(dtype=np.int64)) == expected
    print(json.dumps({"where": _where(x), "right": right}), flush=True)
    return 0 if right else 1


def sibling(kind: str, mib: int, ready_dir: str, count: int) -> int:
    """Every sibling has imported NumPy and the library (seconds under TCG) before any places: a file barrier."""
    siblings_job.wait_for_all(ready_dir, count, 180)
    line = siblings_job.one(kind, mib, 0.0)
    print(line, flush=True)
    return 0 if line.startswith("ok") else 1


def moving(kind: str, mib: int, seconds: float) -> int:
    moving_jobs.SIZE = mib * MiB  # the v1 job's 1.2 GiB does not fit a 512 MiB group
    return moving_jobs.job(kind, seconds)


def lowered(kind: str, mib: int, later_mib: int) -> int:
    """A filled array, then (after the test lowered the limit and said so) what the library reads and where a
    later array of ``later_mib`` goes."""
    before = memory.limits().usable_bytes
    x = _make(kind, mib * MiB)
    x_sum = _fill(x, 0)
    print("ready", _where(x), flush=True)
    sys.stdin.readline()
    after, level = memory.limits().usable_bytes, str(memory.pressure().level)
    y = _make(kind, later_mib * MiB)
    y_sum = _fill(y, 7)
    right = int(x.sum(dtype=np.int64)) == x_sum and int(y.sum(dtype=np.int64)) == y_sum
    print(json.dumps({"usable_before_mib": before // MiB, "usable_after_mib": after // MiB, "level_after": level,
                      "first": _where(x), "later": _where(y), "right": right}), flush=True)
    return 0 if right else 1


def limits() -> int:
    """What ``limits()`` reads here (``python -m tests.vm.v2_jobs limits`` behind ``unshare -C`` and the like)."""
    lim = memory.limits()
    with open("/proc/self/cgroup") as f:
        own = f.read().strip()
    print(json.dumps({"usable_mib": lim.usable_bytes // MiB, "source": lim.source, "cgroup": lim.cgroup,
                      "limit_file": lim.limit_file, "cgroup_problem": lim.cgroup_problem, "oom_group": lim.oom_group,
                      "proc_self_cgroup": own, "text": str(lim), "pressure": str(memory.pressure()),
                      "uid": os.getuid()}), flush=True)
    return 0


def _own_pressure() -> str:
    with open("/proc/self/cgroup") as f:
        path = f.read().strip().split("::", 1)[1]
    return os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.pressure")


def _takes(path: str, window_ms: int) -> str:
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, trigger_line(window_ms * 1000))
        return "taken"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    finally:
        os.close(fd)


def triggers(seconds: float) -> int:
    """Which PSI trigger windows the group's own ``memory.pressure`` takes from this uid (the kernel's rule: 0.5 to
    10 s; unprivileged, multiples of 2 s, Linux 6.5+), then the library's own trigger (``open_trigger``) polled
    for up to ``seconds`` after ``ready``: when it fired."""
    path = _own_pressure()
    windows = {str(ms): _takes(path, ms) for ms in (400, 500, 1000, 2000, 10000, 11000)}
    fd = open_trigger(path)
    print("ready", flush=True)
    fired = None
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        started = time.monotonic()
        if poller.poll(int(seconds * 1000)):
            fired = round(time.monotonic() - started, 1)
        os.close(fd)
    with open(path) as f:
        stalls = f.read().split()
    print(json.dumps({"path": path, "windows_ms": windows, "library_trigger": fd is not None,
                      "fired_after_s": fired, "stalls": " ".join(stalls[:5])}), flush=True)
    return 0


def delegate(group: str, uid: int, argv: list[str]) -> NoReturn:
    """What systemd does for a delegated unit: root puts the process in ``group/init``, the process becomes ``uid``
    (no passwd entry: an arbitrary uid, as OpenShift gives), makes ``group/work`` itself, enables memory for
    ``group``'s children and moves there (allowed: it owns ``group``'s ``cgroup.procs``), then runs a job."""
    init, work = os.path.join(group, "init"), os.path.join(group, "work")
    os.makedirs(init, exist_ok=True)
    with open(os.path.join(init, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(group, "cgroup.subtree_control"), "w") as f:
        f.write("+memory")
    with open(os.path.join(work, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    os.execv(sys.executable, [sys.executable, "-m", "tests.vm.v2_jobs", *argv])


def watch(seconds: float) -> int:
    """Reads ``pressure()`` every 0.25 s for up to ``seconds`` (after a first reading, then ``ready`` on stdout):
    every level seen, and while the library says the group is throttled (``throttled_s`` set: its ``memory.events``
    ``high`` count rose within ``decide.THROTTLE_WINDOW_S``) the levels and the first cause naming memory.high;
    stops 8 throttled readings in. Then what ``limits()`` calls usable."""
    first = memory.pressure()
    print("ready", first.level, flush=True)
    started = time.monotonic()
    levels: dict[str, int] = {}
    throttled: dict[str, int] = {}
    causes: list[str] = []
    cause, throttled_at = None, None
    while time.monotonic() - started < seconds and sum(throttled.values()) < 8:
        time.sleep(0.25)
        reading = memory.pressure()
        level = str(reading.level)
        levels[level] = levels.get(level, 0) + 1
        if reading.cause and reading.cause not in causes:
            causes.append(reading.cause)
        if getattr(reading, "throttled_s", None) is not None:  # cgroup v2's throttling, where the library reads it
            throttled[level] = throttled.get(level, 0) + 1
            throttled_at = throttled_at if throttled_at is not None else round(time.monotonic() - started, 1)
        if cause is None and "memory.high" in (reading.cause or ""):
            cause = reading.cause
    lim = memory.limits()
    print(json.dumps({"levels": levels, "throttled_levels": throttled, "throttled_at_s": throttled_at,
                      "cause": cause, "causes": causes, "usable_mib": lim.usable_bytes // MiB,
                      "limit_file": lim.limit_file, "last": str(memory.pressure())}), flush=True)
    return 0


if __name__ == "__main__":
    name, args = sys.argv[1], sys.argv[2:]
    if name == "big":
        sys.exit(big(args[0], int(args[1])))
    if name == "sibling":
        sys.exit(sibling(args[0], int(args[1]), args[2], int(args[3])))
    if name == "moving":
        sys.exit(moving(args[0], int(args[1]), float(args[2])))
    if name == "neighbour":
        sys.exit(moving_jobs.neighbour(int(args[0]), int(args[1]), float(args[2]), float(args[3])))
    if name == "limits":
        sys.exit(limits())
    if name == "watch":
        sys.exit(watch(float(args[0])))
    if name == "triggers":
        sys.exit(triggers(float(args[0])))
    if name == "delegate":
        delegate(args[0], int(args[1]), args[2:])
    sys.exit(lowered(args[0], int(args[1]), int(args[2])))
