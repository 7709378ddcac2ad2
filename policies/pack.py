"""The policy list shared by policies/__main__.py (the CLI's pack) and plan/analyze.py (the offline plan)."""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, Policy

from policies.rules import (
    airgap,
    capacity,
    containers,
    engine_args,
    engines,
    flags,
    hardware,
    host_memory,
    image,
    security,
    topology,
)

PACK_NAME = "llm-cluster-hardware"
PACK_VERSION = "0.2.0"
PACK_DESCRIPTION = (
    "Refuses at preview what the GPUs cannot run (each engine image's facts, with their sources), plus capacity, "
    "topology, security and container rules."
)
# Every policy states its own level; this is only the pack's fallback.
DEFAULT_LEVEL = EnforcementLevel.MANDATORY

POLICIES: list[Policy] = [
    *hardware.POLICIES,
    *image.POLICIES,
    *topology.POLICIES,
    *flags.POLICIES,
    *engine_args.POLICIES,
    *engines.POLICIES,
    *security.POLICIES,
    *capacity.POLICIES,
    *host_memory.POLICIES,
    *containers.POLICIES,
    *airgap.POLICIES,
]
