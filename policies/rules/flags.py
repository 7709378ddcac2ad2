"""Rule 8 as a policy: every server flag is real in the pool's engine version and has a valid value. The checks
are each engine's own (`LaunchRule`s of topic "flags"; engines judged from their image table get engine-flags,
policies/rules/engines.py)."""

from __future__ import annotations

from policies.rules.common import launch_policies

POLICIES = launch_policies("flags")
