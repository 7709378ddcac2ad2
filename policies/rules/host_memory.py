"""Rule 14 as a policy: the CPU-side memory of a pool's servers fits the RAM of each of its nodes. The checks
are each engine's own (`LaunchRule`s of topic "host_memory")."""

from __future__ import annotations

from policies.rules.common import launch_policies

POLICIES = launch_policies("host_memory")
