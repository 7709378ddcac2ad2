"""Facts about the servers' host side (RAM, cores) and what vLLM asks of it, each with its source."""

from __future__ import annotations

from dataclasses import dataclass

from components.facts.evidence import Sourced, unverified


@dataclass(frozen=True)
class ServerFacts:
    """One server model's host side: what a node is taken to have when its stack entry does not say."""

    name: str
    memory_gib: float
    cpu_cores: int
    source: Sourced


# The runbook's servers (6 x 8 x V100-SXM2-32GB): "380 GB RAM, 80 cores", taken as GiB as `free -g` prints it.
REFERENCE_SERVER = ServerFacts(
    name="the reference cluster's GPU servers",
    memory_gib=380,
    cpu_cores=80,
    source=unverified("the runbook's cluster description (380 GB RAM, 80 cores per server); not read from a node"),
)
