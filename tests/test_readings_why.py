"""Readings that say why (issue 10, items 2 and 6): PSI that cannot be parsed, the cause of a level, the budget
warning, and the JSON keys of ``limits --json`` / ``pressure --json`` (an interface: keys are added, never renamed)."""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Callable

import pytest

import apsi_memory as memory
from apsi_memory.adapters import psi
from apsi_memory.cli import commands as cli
from sim import tree as machines
from sim.tree import GiB, SimTree

BuildMachine = Callable[..., SimTree]

LIMITS_KEYS = {"usable_bytes", "free_bytes", "budget_bytes", "source", "cgroup", "cgroup_version", "limit_bytes",
               "limit_file", "working_set_bytes", "host_total_bytes", "host_available_bytes",
               "group_guessed", "cgroup_problem",  # new in issue 10
               "siblings_reserved_bytes", "siblings",  # new in issue 18
               "oom_group"}  # new in issue 27
PRESSURE_KEYS = {"level", "free_bytes", "usable_bytes", "free_fraction", "some", "full", "psi_source",
                 "cause", "psi_problem",  # new in issue 10
                 "stalls_ignored",  # new in issue 22
                 "throttled_s", "oom_group"}  # new in issue 27


def _json(command: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert cli.main([command, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.mark.parametrize("scenario", [machines.host, machines.docker_v1, machines.kubernetes_v2,
                                      machines.outside_namespace, machines.group_not_under_mount_root])
def test_json_keys_are_pinned(sim_machine: BuildMachine, scenario: BuildMachine,
                              capsys: pytest.CaptureFixture[str]) -> None:
    sim_machine(scenario)
    assert set(_json("limits", capsys)) == LIMITS_KEYS
    assert set(_json("pressure", capsys)) == PRESSURE_KEYS


# -- item 2: PSI ---------------------------------------------------------------------------------------------------

def test_psi_lines_other_than_some_and_full_are_skipped() -> None:
    reading = psi.parse_psi("some avg10=1.50 avg60=0 avg300=0 total=1\nfull avg10=0.25 avg60=0 avg300=0 total=1\n"
                            "stall_ratio 7 per mille\n")
    assert (reading.some, reading.full) == (1.5, 0.25)


def test_unparsable_psi_never_hides_the_memory_limit(sim_machine: BuildMachine,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    tree = sim_machine(machines.cgroup_namespace, limit=3 * GiB, current=1 * GiB)
    tree.write("/sys/fs/cgroup/memory.pressure", "some avg10=lots avg60=0 avg300=0 total=0\n")
    assert memory.limits().usable_bytes == 3 * GiB
    assert cli.main(["limits"]) == 0 and capsys.readouterr().out.startswith("3.0 GB usable (container (cgroup v2))")
    reading = memory.pressure()
    assert reading.some is None and reading.full is None and reading.psi_source is None
    problem = "/sys/fs/cgroup/memory.pressure: line 'some avg10=lots avg60=0 avg300=0 total=0' has no numeric avg10"
    assert reading.psi_problem == problem
    assert str(reading) == f"ok: 2.0 GB free (67 %), stalls not available ({problem})"


def test_a_malformed_memory_file_is_still_an_error(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.cgroup_namespace)
    tree.write("/sys/fs/cgroup/memory.max", "lots\n")
    with pytest.raises(memory.CorruptFileError, match="/sys/fs/cgroup/memory.max: expected a byte count"):
        memory.limits()


# -- item 6: readings say why ---------------------------------------------------------------------------------------

def test_pressure_names_the_signal_that_set_the_level(sim_machine: BuildMachine) -> None:
    tree = sim_machine(machines.cgroup_namespace, limit=3 * GiB, current=1 * GiB)
    tree.psi(6.3, 0.0, path="/sys/fs/cgroup/memory.pressure")
    reading = memory.pressure()
    assert reading.level == "moderate" and reading.cause == "some ≥ 5 %"
    assert str(reading) == "moderate: 2.0 GB free (67 %), stalls 6.3 % (some) / 0.0 % (full) — some ≥ 5 %"
    assert reading.to_dict()["cause"] == "some ≥ 5 %"


def test_a_calm_reading_has_no_cause(sim_machine: BuildMachine) -> None:
    sim_machine(machines.host)
    assert memory.pressure().cause is None and "—" not in str(memory.pressure())


def test_limits_fields_are_documented_on_the_typed_object() -> None:
    assert memory.Limits.__doc__ is not None
    undocumented = [f.name for f in dataclasses.fields(memory.Limits) if f"``{f.name}``" not in memory.Limits.__doc__]
    assert undocumented == []


def test_a_budget_above_usable_warns_once_when_set(sim_machine: BuildMachine) -> None:
    sim_machine(machines.docker_v1, limit=1 * GiB, usage=0)
    with pytest.warns(memory.BudgetWarning) as caught:
        assert memory.budget(16).bytes == 16 * GiB
    assert [str(w.message) for w in caught] == [(
        "budget 16.0 GB (budget(16): a number is GB) is more than the 1.0 GB usable here; arrays are still placed by "
        "what is free")]
    assert caught[0].filename == __file__  # shown at the caller's line, where the mistake is
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert memory.budget().bytes == 16 * GiB  # reading it back does not warn again
        assert memory.limits().budget_bytes == 16 * GiB
        memory.budget("512MB")  # within what is usable: no warning
