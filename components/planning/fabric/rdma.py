"""The RDMA preflight of a multi-node instance: ib_write_bw between every pair of its nodes, before Ray starts."""

from __future__ import annotations

import json

from components.node_programs import NODE_PROGRAMS
from components.planning.nodes.scripts import run_shipped_python, ssh_argv
from components.spec import StackSpec
from components.spec.topology import Instance

FABRIC_SOURCE = NODE_PROGRAMS / "fabric.py"
_HEREDOC = "LLM_CLUSTER_FABRIC_PY"


def rdma_plan(spec: StackSpec, instance: Instance) -> dict[str, object]:
    """What the head runs: the nodes (the head itself locally), the HCA, the floor and what to check."""
    head = spec.node(instance.head)
    hca = head.hca
    assert hca is not None  # the spec requires an HCA on every node of a multi-node pool
    key = f"nodes.{instance.head}.hca.minWriteBandwidthGbps (or nodeDefaults.hca)"
    hints = (
        f"ibstat {hca.device} on both nodes (Active/LinkUp at {hca.rate_gbps} Gb/s), cables and switch ports, "
        + (
            f"PFC/ECN for RoCE on the switch and that GID index {hca.gid_index} is RoCE v2 (show_gids), "
            if hca.link_layer == "ethernet"
            else ""
        )
        + f"the HCA's PCIe link (lspci -vv: LnkSta), and that nothing else loads {hca.device}; "
        f"the floor is {key}"
    )
    return {
        "instance": instance.name,
        "device": hca.device,
        "port": hca.port,
        "gid_index": hca.gid_index if hca.link_layer == "ethernet" else None,
        "floor_gbps": hca.bandwidth_floor_gbps,
        "ssh": ssh_argv(spec.ssh.port, spec.ssh.host_key_checking),
        "nodes": [
            {
                "name": n,
                "address": spec.node(n).address,
                "login": f"{spec.ssh.user}@{spec.node(n).address}",
                **({"local": "1"} if n == instance.head else {}),
            }
            for n in instance.nodes
        ],
        "hints": hints,
    }


def rdma_script(spec: StackSpec, instance: Instance) -> str:
    """Bash for the head node: ship fabric.py and test every pair (exit 1 naming the pair, figure and fix)."""
    plan = json.dumps(rdma_plan(spec, instance), sort_keys=True)
    return f"""#!/usr/bin/env bash
# llm-cluster: RDMA bandwidth between the nodes of {instance.name} (ib_write_bw, every pair), before Ray starts
set -euo pipefail
command -v ib_write_bw >/dev/null 2>&1 || {{
  echo "ERROR: ib_write_bw is missing on $(hostname)" >&2
  echo "    fix: install perftest on every node of {instance.name} (apt-get install perftest), or set preflight.rdmaBandwidth: false" >&2
  exit 1
}}
{run_shipped_python(FABRIC_SOURCE, _HEREDOC, plan)}"""
