"""The hardware policies: what a pool's image cannot run on the GPU it is given. The checks are each engine's
own (`LaunchRule`s of topic "hardware", components/engines/<engine>/rules/)."""

from __future__ import annotations

from policies.rules.common import launch_policies

POLICIES = launch_policies("hardware")
