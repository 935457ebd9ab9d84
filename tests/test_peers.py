"""Conformance with other projects' captured trees (issue 10): each case under fixtures/peers/<project>/<case>/ is
a root (``proc/...``, ``sys/fs/cgroup/...``) read by the real adapters, and a provenance.json that says where its
files came from, what the peer's own test asserts, and what apsi_memory must read from it.

Cases whose expectation waits on a fix name its issue in ``xfail`` and fail strictly until the fix lands.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import apsi_memory as memory
import sim
from apsi_memory.machinery.reading import read_memory

PEERS = Path(__file__).parent.parent / "fixtures" / "peers"
PROVENANCE_KEYS = {"project", "case", "repo", "path", "commit", "licence", "peer_test", "peer_asserts", "exercises",
                   "files_from_peer", "files_added", "expected", "agreement", "xfail", "notes"}
LIMITS_KEYS = ("usable_bytes", "source", "cgroup", "cgroup_version", "limit_file", "free_bytes", "group_guessed")
PSI_KEYS = {"psi_some": "some", "psi_full": "full", "psi_source": "source"}


def _provenances() -> list[tuple[Path, dict[str, Any]]]:
    return [(path.parent, json.loads(path.read_text())) for path in sorted(PEERS.glob("*/*/provenance.json"))]


def _params() -> Iterator[Any]:
    for root, case in _provenances():
        marks = [pytest.mark.xfail(strict=True, reason=case["xfail"])] if case["xfail"] else []
        yield pytest.param(root, case, id=f"{case['project']}/{case['case']}", marks=marks)


def _observed(root: Path, expected: dict[str, Any]) -> dict[str, Any]:
    """What the library reads from ``root``, for the keys the case states (a key the library lacks reads as
    ``<missing>``, so a field that an issue-10 fix adds fails until it exists)."""
    limits = memory.limits()
    observed = {key: getattr(limits, key, "<missing>") for key in LIMITS_KEYS if key in expected}
    psi = read_memory(str(root)).psi
    for key, field in PSI_KEYS.items():
        if key in expected:
            observed[key] = None if psi is None else getattr(psi, field)
    return observed


@pytest.mark.parametrize(("root", "case"), list(_params()))
def test_peer_tree_reads_as_expected(root: Path, case: dict[str, Any]) -> None:
    with sim.machine(root).use():
        assert _observed(root, case["expected"]) == case["expected"], case["agreement"]


def test_every_case_says_where_it_came_from() -> None:
    cases = _provenances()
    assert len(cases) >= 25 and len({case["project"] for _, case in cases}) >= 6
    for root, case in cases:
        assert set(case) == PROVENANCE_KEYS, root
        assert (root.parent / "LICENSE-NOTICE").is_file(), f"{root.parent.name} has no LICENSE-NOTICE"
        for name in case["files_from_peer"] + case["files_added"]:
            assert (root / name).is_file(), f"{root}: {name} is listed but missing"
        assert case["files_from_peer"], f"{root}: a case needs at least one file from the peer"
        assert case["agreement"].startswith(("agree", "semantic difference")), root


def test_readme_lists_every_case() -> None:
    readme = (PEERS / "README.md").read_text()
    for _, case in _provenances():
        assert f"| {case['project']} | {case['case']} |" in readme
