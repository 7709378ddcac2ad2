"""Rule 13 as a policy: what an engine's own argument validation refuses at startup, across flags. The checks
are each engine's own (`LaunchRule`s of topic "engine_args")."""

from __future__ import annotations

from policies.rules.common import launch_policies

POLICIES = launch_policies("engine_args")
