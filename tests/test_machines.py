"""The numbers users see on each kind of machine, read by the real adapters from sim trees."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import apsi_memory as memory
from apsi_memory import CorruptFileError, SizeError
from sim import tree as machines
from sim.tree import GiB, MiB, SimTree

BuildMachine = Callable[..., SimTree]


def test_bare_host_plans_with_the_host(sim_machine: BuildMachine) -> None:
    sim_machine(machines.host, total=8 * GiB, available=7 * GiB)
    limits = memory.limits()
    assert (limits.usable_bytes, limits.free_bytes, limits.source) == (8 * GiB, 7 * GiB, "host")
    assert str(limits) == "8.0 GB usable (host), 7.0 GB free, budget 4.9 GB"


def test_docker_v1_group_is_found_through_the_mount_root(sim_machine: BuildMachine) -> None:
    # /proc/self/cgroup says /docker/<id>; the memory mount's root is that same path, so the group is the mount.
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=256 * MiB)
    limits = memory.limits()
    assert limits.usable_bytes == 4 * GiB and limits.source == "container (cgroup v1)"
    assert limits.free_bytes == 4 * GiB - 768 * MiB  # usage minus inactive file cache
    assert limits.cgroup == "/docker/3f2a9c0e7b1d"
    assert limits.limit_file == "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    assert str(limits) == "4.0 GB usable (container (cgroup v1)), 3.2 GB free, budget 2.3 GB"


def test_kubernetes_pod_limit_is_found_up_the_v2_hierarchy(sim_machine: BuildMachine) -> None:
    sim_machine(machines.kubernetes_v2, limit=4 * GiB, current=3 * GiB, inactive_file=1 * GiB)
    limits = memory.limits()
    assert (limits.usable_bytes, limits.free_bytes) == (4 * GiB, 2 * GiB)
    assert limits.source == "container (cgroup v2)" and limits.limit_file.endswith("pod1234.slice/memory.max")


def test_pod_pressure_comes_from_the_pods_own_psi(sim_machine: BuildMachine) -> None:
    sim_machine(machines.kubernetes_v2, pod_psi=(16.0, 3.0))
    reading = memory.pressure()
    assert reading.psi_source.endswith("cri-containerd-abcdef.scope/memory.pressure")
    assert reading.level == "high"  # host PSI is 0 %, the pod stalls 16 % of the time
    assert str(reading) == "high: 2.0 GB free (50 %), stalls 16.0 % (some) / 3.0 % (full) — some ≥ 15 %"
    assert reading.cause == "some ≥ 15 %"


def test_systemd_slice_parent_has_the_smaller_limit(sim_machine: BuildMachine) -> None:
    sim_machine(machines.systemd_slice, slice_limit=2 * GiB, service_limit=6 * GiB, slice_usage=1536 * MiB)
    limits = memory.limits()
    assert limits.usable_bytes == 2 * GiB and limits.limit_file == "/sys/fs/cgroup/batch.slice/memory.max"
    assert limits.free_bytes == 512 * MiB  # the slice's headroom, though the service alone uses less


def test_cgroup_namespace_path_is_root(sim_machine: BuildMachine) -> None:
    sim_machine(machines.cgroup_namespace, limit=3 * GiB, current=1 * GiB)
    limits = memory.limits()
    assert (limits.usable_bytes, limits.free_bytes, limits.cgroup) == (3 * GiB, 2 * GiB, "/")
    assert memory.pressure().psi_source == "/sys/fs/cgroup/memory.pressure"


def test_hybrid_reads_memory_from_v1_and_psi_from_the_unified_tree(sim_machine: BuildMachine) -> None:
    sim_machine(machines.hybrid, limit=5 * GiB, usage=2 * GiB, unified_psi=(7.0, 1.0))
    limits, reading = memory.limits(), memory.pressure()
    assert limits.usable_bytes == 5 * GiB and limits.cgroup_version == 1
    assert reading.some == 7.0 and reading.psi_source.startswith("/sys/fs/cgroup/unified/system.slice")


def test_v1_unlimited_with_64k_pages_is_the_host(sim_machine: BuildMachine) -> None:
    sim_machine(machines.v1_unlimited_64k)
    limits = memory.limits()
    assert limits.source == "host" and limits.usable_bytes == 16 * GiB and limits.limit_bytes is None


def test_memory_high_counts_as_a_limit(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.cgroup_namespace, limit=3 * GiB, current=1 * GiB)
    tree.v2_group("/sys/fs/cgroup", limit=3 * GiB, high=2 * GiB, current=1 * GiB)
    assert memory.limits().usable_bytes == 2 * GiB
    assert memory.limits().limit_file == "/sys/fs/cgroup/memory.high"


def test_hierarchical_limit_of_an_invisible_parent_wins_on_v1(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.docker_v1, limit=4 * GiB)
    tree.v1_group("/sys/fs/cgroup/memory", limit=4 * GiB, usage=1 * GiB, hierarchical_limit=3 * GiB)
    assert memory.limits().usable_bytes == 3 * GiB


def test_page_cache_is_not_pressure(sim_machine: BuildMachine) -> None:
    # 3.9 of 4 GiB charged, but 3.5 GiB of it is inactive page cache the kernel drops first.
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=3994 * MiB, inactive_file=3584 * MiB)
    assert memory.pressure().level == "ok"


def test_limits_are_reread_on_each_call_after_a_resize(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.cgroup_namespace, limit=3 * GiB, current=1 * GiB)
    assert memory.limits().usable_bytes == 3 * GiB
    tree.write("/sys/fs/cgroup/memory.max", f"{6 * GiB}\n")  # kubectl patch ... resize in place
    assert memory.limits().usable_bytes == 6 * GiB


def test_free_is_the_smaller_of_host_and_cgroup(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.docker_v1, limit=4 * GiB, usage=0)
    tree.meminfo(total=64 * GiB, available=1 * GiB)  # an overcommitted host
    assert memory.limits().free_bytes == 1 * GiB


@pytest.mark.parametrize("scenario", [machines.psi_disabled, machines.no_psi])
def test_psi_absent_or_disabled_is_not_available_never_zero(sim_machine: BuildMachine, scenario: BuildMachine) -> None:
    sim_machine(scenario)
    reading = memory.pressure()
    assert reading.some is None and reading.full is None and reading.psi_source is None
    assert str(reading).endswith("stalls not available")
    assert memory.pressure().to_dict()["some"] is None


def test_missing_cgroup_files_fall_back_to_the_host(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.docker_v1, limit=4 * GiB)
    for name in ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat"):
        os.remove(tree.root / "sys/fs/cgroup/memory" / name)
    assert memory.limits().source == "host" and memory.limits().usable_bytes == 64 * GiB


def test_unreadable_cgroup_file_falls_back_to_the_host(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.docker_v1, limit=4 * GiB)
    usage = tree.root / "sys/fs/cgroup/memory/memory.usage_in_bytes"
    os.remove(usage)
    usage.mkdir()  # exists, but reading fails (as a file the kernel refuses to read would)
    assert memory.limits().source == "host"


def test_no_cgroup_information_at_all_is_the_host(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.host)
    os.remove(tree.root / "proc/self/cgroup")
    os.remove(tree.root / "proc/self/mountinfo")
    assert memory.limits().usable_bytes == 8 * GiB


@pytest.mark.parametrize(("name", "content", "problem"), [
    ("memory.limit_in_bytes", "lots\n", "expected a byte count, got 'lots'"),
    ("memory.stat", "cache\n", "line 'cache' is not 'name value'"),
])
def test_corrupt_cgroup_file_is_a_named_error(sim_machine: BuildMachine, name: str, content: str, problem: str) -> None:
    tree = sim_machine(machines.docker_v1)
    tree.write(f"/sys/fs/cgroup/memory/{name}", content)
    with pytest.raises(CorruptFileError, match=f"/sys/fs/cgroup/memory/{name}: {problem}"):
        memory.limits()


def test_default_budget_is_70_percent_of_free(sim_machine: BuildMachine) -> None:
    sim_machine(machines.docker_v1, limit=4 * GiB, usage=1 * GiB, inactive_file=0)
    assert memory.budget().bytes == int(0.7 * 3 * GiB) and memory.budget().source == "70 % of free"


def test_budget_set_in_gb_env_and_back_to_auto(sim_machine: BuildMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    sim_machine(machines.host)
    monkeypatch.setenv("APSI_RAM_BUDGET", "12GB")
    assert memory.budget().bytes == 12 * GiB and str(memory.budget()) == "12.0 GB (APSI_RAM_BUDGET)"
    with pytest.warns(memory.BudgetWarning):  # 16 GB on an 8 GB host
        assert memory.budget(16).bytes == 16 * GiB
    assert float(memory.budget()) == 16.0  # set beats the environment
    assert memory.limits().budget_bytes == 16 * GiB
    assert memory.budget("auto").source == "APSI_RAM_BUDGET"
    monkeypatch.setenv("APSI_RAM_BUDGET", "twelve")
    with pytest.raises(SizeError, match="APSI_RAM_BUDGET: cannot read 'twelve' as a size"):
        memory.budget()


def test_a_bad_budget_leaves_the_old_one(sim_machine: BuildMachine) -> None:
    sim_machine(machines.host)
    memory.budget(2)
    with pytest.raises(SizeError):
        memory.budget("2 elephants")
    assert memory.budget().bytes == 2 * GiB


def test_readings_have_a_json_form(sim_machine: BuildMachine) -> None:
    sim_machine(machines.kubernetes_v2)
    assert memory.pressure().to_dict()["level"] == "moderate"  # some 12 %, full 3 %
    limits = memory.limits().to_dict()
    assert limits["usable_bytes"] == 4 * GiB and limits["cgroup_version"] == 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), st.integers(1, 128).map(lambda n: n * 256 * MiB)), min_size=1, max_size=5))
def test_the_smallest_limit_up_the_hierarchy_always_wins(limits: list[int | None]) -> None:
    with tempfile.TemporaryDirectory() as root:
        tree = SimTree(root).meminfo(total=64 * GiB, available=60 * GiB)
        names = [f"level{i}" for i in range(len(limits))]
        tree.mount("/sys/fs/cgroup", "cgroup2", "nsdelegate").member("0::/" + "/".join(names))
        for depth, limit in enumerate(limits):
            tree.v2_group("/sys/fs/cgroup/" + "/".join(names[:depth + 1]), limit=limit)
        from apsi_memory.machinery.reading import read_memory

        reading = read_memory(root)
        real = [limit for limit in limits if limit is not None and limit < 64 * GiB]
        assert reading.usable == (min(real) if real else 64 * GiB)
        assert 0 <= reading.free <= reading.usable
