"""fit_batch's address-space cap: the pure decision (``decide.batchcap``: VmSize + free memory less a margin, never
above the hard limit, a user's lower limit kept; when not to cap), and the cap itself on this process — set while
the step runs, restored after it whatever it raised, shared by nested and concurrent calls, lifted in a forked
child, never set with a GPU framework, on a simulated machine, or with ``cap_address_space=False``; and a real
allocation refused by it, halved on. (In a real memory cgroup, against OOM kills: tests/real/test_fit_batch_cgroup.py.)
"""

from __future__ import annotations

import subprocess
import sys
import threading
import types
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import apsi_memory as memory
import sim
from apsi_memory.decide.batchcap import CAP_MARGIN_BYTES, address_space_cap, cap_margin, why_not_cap
from apsi_memory.devices import addresscap
from apsi_memory.devices.addresscap import capped, gpu_framework, vm_size
from sim.gpu import FakeGpuMachine

resource = pytest.importorskip("resource")  # no RLIMIT_AS off Unix; the decisions above it are pure

MiB, GiB = 1 << 20, 1 << 30
INFINITY = resource.RLIM_INFINITY

# -- the decision, in numbers --------------------------------------------------------------------------------------


@pytest.mark.parametrize("free, room", [
    (800 * MiB, 700 * MiB),  # an eighth of the free memory kept back
    (8 * GiB, 7 * GiB),
    (256 * MiB, 192 * MiB),  # at least 64 MiB ...
    (100 * MiB, 50 * MiB),  # ... but at most half of what is free
    (0, 0),
    (-5 * MiB, 0),  # over the limit already: no new mapping at all
])
def test_the_cap_is_what_is_mapped_plus_the_free_memory_less_a_margin(free: int, room: int) -> None:
    assert address_space_cap(1 * GiB, free, None, None) == 1 * GiB + room


def test_the_cap_is_never_above_the_hard_limit_and_a_users_lower_limit_is_kept() -> None:
    assert address_space_cap(1 * GiB, 8 * GiB, None, 2 * GiB) == 2 * GiB
    assert address_space_cap(1 * GiB, 8 * GiB, 3 * GiB, None) is None  # already lower: leave it
    assert address_space_cap(1 * GiB, 8 * GiB, 8 * GiB, None) is None  # equal: nothing to change
    assert address_space_cap(1 * GiB, 8 * GiB, 9 * GiB, None) == 8 * GiB


@given(st.integers(0, 1 << 44), st.integers(-(1 << 30), 1 << 42), st.integers(0, 1 << 40))
def test_the_cap_lies_between_what_is_mapped_and_that_plus_the_free_memory_and_grows_with_it(
        mapped: int, free: int, more: int) -> None:
    cap = address_space_cap(mapped, free, None, None)
    assert cap is not None and mapped <= cap <= mapped + max(free, 0)
    bigger = address_space_cap(mapped, free + more, None, None)
    assert bigger is not None and bigger >= cap


@given(st.integers(0, 1 << 42))
def test_the_margin_is_an_eighth_at_least_and_half_at_most(free: int) -> None:
    margin = cap_margin(free)
    assert free // 8 <= margin <= free // 2
    assert margin >= min(CAP_MARGIN_BYTES, free // 2)


@pytest.mark.parametrize("asked, has_rlimit, real_kernel, gpu, words", [
    (True, True, True, None, None),
    (False, True, True, None, "cap_address_space=False"),
    (True, False, True, None, "no RLIMIT_AS"),
    (True, True, False, None, "simulated root"),
    (True, True, True, "torch", "torch may use a GPU"),
    (False, False, False, "cupy", "cap_address_space=False"),  # the caller's word first
])
def test_when_no_cap_is_set_and_why(asked: bool, has_rlimit: bool, real_kernel: bool, gpu: str | None,
                                    words: str | None) -> None:
    why = why_not_cap(asked, has_rlimit, real_kernel, gpu)
    assert why is None if words is None else why is not None and words in why


def test_vm_size_is_read_from_proc_status() -> None:
    text = "Name:\tpython\nVmPeak:\t 2000 kB\nVmSize:\t  1536 kB\nVmRSS:\t 100 kB\n"
    assert vm_size(text) == 1536 * 1024
    assert vm_size("Name:\tpython\n") is None
    assert vm_size("VmSize:\tlots\n") is None


def _fake(name: str, cuda: bool | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    if cuda is not None:
        module.cuda = types.SimpleNamespace(is_available=lambda: cuda)  # type: ignore[attr-defined]
    return module


@pytest.mark.parametrize("modules, found", [
    ({"torch": _fake("torch", cuda=True)}, "torch"),
    ({"torch": _fake("torch", cuda=False)}, None),  # the CPU build: capped like NumPy
    ({"torch": None}, None),  # blocked, as sim.gpu does
    ({"cupy": _fake("cupy")}, "cupy"),
    ({"jax": _fake("jax")}, "jax"),  # its backend is not asked (that would start it): any JAX counts
])
def test_gpu_frameworks_are_recognised_without_importing_any(monkeypatch: pytest.MonkeyPatch,
                                                            modules: dict[str, object], found: str | None) -> None:
    for name in ("torch", "cupy", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    assert gpu_framework() == found


# -- the cap on this process ---------------------------------------------------------------------------------------


def soft() -> int:
    return int(resource.getrlimit(resource.RLIMIT_AS)[0])


@pytest.fixture
def can_cap() -> Iterator[int]:
    """This process can be capped (Linux, the real kernel, no GPU framework); yields the soft limit before, and
    checks the test left it so."""
    why = addresscap.reason()
    if why is not None:
        pytest.skip(f"no address-space cap here: {why}")
    before = soft()
    yield before
    assert soft() == before


def _own_vm_size() -> int:
    with open(addresscap.STATUS) as f:
        found = vm_size(f.read())
    assert found is not None
    return found


def test_the_cap_holds_while_the_block_runs_and_is_restored_after(can_cap: int) -> None:
    with capped() as cap:
        assert cap is not None and soft() == cap
        assert cap >= _own_vm_size() - 64 * MiB  # room for what this process maps next, nothing taken away
    assert soft() == can_cap


def test_the_limit_is_restored_when_the_step_raises(can_cap: int) -> None:
    with pytest.raises(KeyError), capped():
        raise KeyError("a bug in the step")
    assert soft() == can_cap


def test_nested_calls_only_lower_the_cap_and_the_outer_one_restores(can_cap: int) -> None:
    with capped() as outer:
        with capped() as inner:
            assert inner is not None and outer is not None and inner <= outer
        assert soft() == inner  # the outer try still runs: still capped
    assert soft() == can_cap


def test_concurrent_calls_share_the_limit_and_the_last_to_end_restores(can_cap: int) -> None:
    entered, leave = threading.Event(), threading.Event()

    def other_try() -> None:
        with capped():
            entered.set()
            leave.wait(30)

    thread = threading.Thread(target=other_try)
    thread.start()
    try:
        assert entered.wait(30)
        with capped() as cap:
            leave.set()
            thread.join(30)
            assert soft() == cap  # the other thread's try ended first: this one keeps its cap
    finally:
        leave.set()
        thread.join(30)
    assert soft() == can_cap


def test_a_users_own_lower_limit_is_kept(can_cap: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    own = _own_vm_size() + 1 * GiB  # below VmSize + free on any machine this suite runs on with 2 GB free
    if memory.limits().free_bytes < 2 * GiB:
        pytest.skip("needs 2 GB free for a user's limit below the cap")
    resource.setrlimit(resource.RLIMIT_AS, (own, hard))
    try:
        with capped() as cap:
            assert cap == own and soft() == own
        assert soft() == own
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (can_cap, hard))


def test_no_cap_when_asked_not_to(can_cap: int) -> None:
    with capped(False) as cap:
        assert cap is None and soft() == can_cap


def test_no_cap_on_a_simulated_machine(sim_machine: object) -> None:
    sim_machine(sim.tree.docker_v1, limit=4 * GiB, usage=1 * GiB)  # type: ignore[operator]
    assert "simulated" in str(addresscap.reason())
    before = soft()
    seen: list[int] = []
    memory.fit_batch(lambda batch: seen.append(soft()), 8)
    assert seen == [before]


def test_no_cap_with_a_gpu_framework(can_cap: int) -> None:
    with FakeGpuMachine.of(1).installed("torch"):
        assert "torch may use a GPU" in str(addresscap.reason())
        seen: list[int] = []
        memory.fit_batch(lambda batch: seen.append(soft()), 8)
    assert seen == [can_cap]


def test_fit_batch_caps_each_try_and_restores_the_limit(can_cap: int) -> None:
    seen: list[int] = []

    def step(batch: int) -> int:
        seen.append(soft())
        if batch > 64:
            raise MemoryError("too big")
        return batch

    assert memory.fit_batch(step, 256) == (64, 64)
    assert len(seen) == 3 and all(cap != INFINITY and (can_cap == INFINITY or cap <= can_cap) for cap in seen)
    seen.clear()
    assert memory.fit_batch(step, 256, cap_address_space=False) == (64, 64)
    assert seen == [can_cap] * 3


def test_cap_address_space_must_be_a_bool() -> None:
    with pytest.raises(memory.ArgumentTypeError, match="cap_address_space must be True or False"):
        memory.fit_batch(len, 8, cap_address_space="yes")  # type: ignore[arg-type]


@pytest.fixture
def little_free(can_cap: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """The cap computed as if the group had 256 MiB free: VmSize + 192 MiB (a real cap on this process)."""
    monkeypatch.setattr(addresscap, "_mapped_and_free", lambda: (_own_vm_size(), 256 * MiB))
    return 192 * MiB


def test_an_allocation_the_cap_refuses_is_halved_on(little_free: int) -> None:
    # np.empty never touches its pages: without the cap 1 GiB is granted at once, whatever is free
    def step(batch: int) -> int:
        return int(np.empty(batch * MiB, dtype=np.uint8).nbytes)

    assert memory.fit_batch(step, 1024) == (128 * MiB, 128)
    assert memory.fit_batch(step, 1024, cap_address_space=False) == (1 * GiB, 1024)


@pytest.mark.torch
def test_a_pytorch_cpu_allocation_the_cap_refuses_is_halved_on(little_free: int) -> None:
    torch = pytest.importorskip("torch")

    def step(batch: int) -> int:
        return int(torch.empty(batch * MiB, dtype=torch.uint8).numel())

    assert memory.fit_batch(step, 1024) == (128 * MiB, 128)


FORK_CHILD = r"""
import os, resource
from apsi_memory.devices.addresscap import capped

with capped() as cap:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, str(resource.getrlimit(resource.RLIMIT_AS)[0]).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = int(os.read(read, 64))
    print(cap, resource.getrlimit(resource.RLIMIT_AS)[0], child, resource.RLIM_INFINITY)
"""


def test_a_child_forked_while_a_try_runs_gets_the_limits_back(can_cap: int) -> None:
    if can_cap != INFINITY:
        pytest.skip("this process runs under its own RLIMIT_AS")
    done = subprocess.run([sys.executable, "-c", FORK_CHILD], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    cap, parent, child, infinity = (int(word) for word in done.stdout.split())
    assert parent == cap != infinity  # the parent still runs its try under the cap
    assert child == infinity  # the child is a process of its own: the limits from before the try
