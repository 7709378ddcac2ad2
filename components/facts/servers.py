"""Facts about the servers' host side (RAM, cores) and what vLLM asks of it, each with its source."""
from __future__ import annotations

from dataclasses import dataclass

from components.facts.evidence import Sourced, code, unverified


@dataclass(frozen=True)
class ServerFacts:
    """One server model's host side: what a node is taken to have when its stack entry does not say."""

    name: str
    memory_gib: float
    cpu_cores: int
    source: Sourced


# The runbook's servers (6 x 8 x V100-SXM2-32GB): "380 GB RAM, 80 cores", taken as GiB as `free -g` prints it.
REFERENCE_SERVER = ServerFacts(
    name="the reference cluster's GPU servers", memory_gib=380, cpu_cores=80,
    source=unverified("the runbook's cluster description (380 GB RAM, 80 cores per server); not read from a node"))

# vLLM refuses a CPU swap space of more than this share of the host's RAM, per instance:
# swap_space x tensor_parallel_size > 0.7 x psutil's total memory -> ValueError("Too large swap space. …"),
# and warns above 0.4. A container without a memory limit sees the host's total.
SWAP_SPACE_MAX_FRACTION = 0.7
SWAP_SPACE_WARN_FRACTION = 0.4
SWAP_SPACE_SOURCE = code("vllm/config.py CacheConfig.verify_with_parallel_config at v0.9.2 (swap space x "
                         "tensor_parallel_size against 0.7 of get_cpu_memory())")
