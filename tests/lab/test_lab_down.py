"""`lab down` on what a stopped run leaves: a host's namespace with its veth pair on the bridge.

The kernel removes a deleted namespace's links only when it cleans the namespace up, after
`ip netns del` has returned; `lab down` must not depend on that timing to report nothing left
behind. Runs between the modules whose labs are up (each takes its lab down at its end)."""

from __future__ import annotations

import subprocess

import pytest

from lab import hosts
from lab.config import BRIDGE

WHY_NOT = hosts.can_create_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"the lab does not run: {WHY_NOT}")


def test_down_removes_a_hosts_namespace_its_veth_pair_and_the_bridge_at_once() -> None:
    assert hosts.lab_namespaces() == [] and hosts.lab_links() == [], "a lab is up: this test would take it down"
    for argv in (
        ["ip", "netns", "add", "lab-gpu-99"],
        ["ip", "link", "add", "lab-v99", "type", "veth", "peer", "name", "bond0", "netns", "lab-gpu-99"],
        ["ip", "link", "add", BRIDGE, "type", "bridge"],
        ["ip", "link", "set", "lab-v99", "master", BRIDGE, "up"],
    ):
        subprocess.run(argv, check=True)
    assert sorted(hosts.lab_links()) == sorted([BRIDGE, "lab-v99"])
    assert hosts.down() == []
    assert hosts.lab_namespaces() == [] and hosts.lab_links() == []
