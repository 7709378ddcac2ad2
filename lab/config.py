"""The lab's view of a stack file: its hosts, their addresses (all inside the lab subnet) and shim choices."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
LAB_DIR = Path(__file__).resolve().parent
# 198.18.0.0/15 is reserved for network benchmarking (RFC 2544): no real host lives there. The lab
# uses one /24 of it and refuses a stack with any address outside.
SUBNET = ipaddress.ip_network("198.18.0.0/24")
BRIDGE = "lab-br0"
BRIDGE_ADDRESS = "198.18.0.1"  # the machine's own side: people and tests reach the lab here
REGISTRY_ADDRESS = "198.18.0.2"  # the registry mirror host (namespace lab-registry)
CLIENT_ADDRESS = "198.18.0.3"  # a client outside the cluster (namespace lab-client)
# Registries the stand-in images are served under besides Docker Hub (which --registry-mirror covers):
# each lab host's /etc/hosts points them at the mirror host, as a private DNS would.
REGISTRY_ALIASES = ("nvcr.io", "ghcr.io")
STATE = Path(os.environ.get("LLM_CLUSTER_LAB_STATE", "/var/lib/llm-cluster-lab"))
CACHE = Path(os.environ.get("LLM_CLUSTER_LAB_CACHE", "/var/cache/llm-cluster/lab"))
# Shim choices (lab:hosts.<node>): what each fake-GPU tool prints, from captured real outputs.
TOPOLOGIES = ("nvlink", "pcie")
HCA_STATES = ("roce-active", "down")


# The tiny models the real engine serves (lab/vllm_cpu.py KINDS; that module is not imported here: it is the
# engine's, and tests/lab/test_vllm_image.py checks the two agree).
REAL_VLLM_MODELS = ("qwen3-tiny", "qwen3-moe-tiny", "deepseek-v3-tiny")


class LabConfigError(ValueError):
    """The stack cannot be run in the lab (an address outside the lab subnet, a bad shim choice)."""


@dataclass(frozen=True)
class LabHost:
    """One test host: a network namespace `lab-<node>` with its own sshd, dockerd and files."""

    node: str
    address: str
    host_key_pub: str
    gpus: int
    topo: str
    hca: str

    @property
    def netns(self) -> str:
        return f"lab-{self.node}"

    @property
    def dir(self) -> Path:
        return STATE / "hosts" / self.node


@dataclass(frozen=True)
class LabStack:
    """The hosts of a lab stack and the stack file they come from."""

    name: str
    path: Path
    user: str
    hosts: tuple[LabHost, ...]
    # lab:realVllm.models: model name -> the tiny model (lab/vllm_cpu.py KINDS) the real engine serves for it;
    # empty: the stack's vLLM pools run the lab's stand-in.
    real_vllm: tuple[tuple[str, str], ...] = ()

    def host(self, node: str) -> LabHost:
        return next(h for h in self.hosts if h.node == node)


def lab_address(value: str, where: str) -> str:
    """An IPv4 address inside the lab subnet (and not one the lab keeps for itself), or LabConfigError."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise LabConfigError(f"{where}: {value!r} is not an IPv4 address") from None
    if ip not in SUBNET:
        raise LabConfigError(
            f"{where}: {value} is outside the lab subnet {SUBNET}; the lab sends traffic "
            "only to its own hosts (use addresses 198.18.0.10-198.18.0.254)"
        )
    if str(ip) in (BRIDGE_ADDRESS, REGISTRY_ADDRESS, CLIENT_ADDRESS) or ip in (
        SUBNET.network_address,
        SUBNET.broadcast_address,
    ):
        raise LabConfigError(
            f"{where}: {value} is kept by the lab itself (bridge, registry, client); "
            "use addresses 198.18.0.10-198.18.0.254"
        )
    return str(ip)


def load_lab_stack(path: Path) -> LabStack:
    """Read the hosts of a stack file for the lab; LabConfigError when one cannot be a lab host."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    config = doc.get("config") or {}
    ssh = config.get("llm-cluster:ssh") or {}
    nodes = config.get("llm-cluster:nodes") or {}
    shims = config.get("lab:hosts") or {}
    if not nodes:
        raise LabConfigError(f"{path}: no llm-cluster:nodes")
    hosts = []
    for node, spec in nodes.items():
        for key in ("address", "sshAddress"):
            if spec.get(key) is not None:
                lab_address(str(spec[key]), f"llm-cluster:nodes.{node}.{key}")
        if "sshAddress" in spec and spec["sshAddress"] != spec["address"]:
            raise LabConfigError(f"llm-cluster:nodes.{node}.sshAddress: a lab host has one address")
        key = spec.get("hostKey")
        if not key:
            raise LabConfigError(
                f"llm-cluster:nodes.{node}.hostKey: the lab pins every host key (lab/hostkeys/{node}.pub)"
            )
        pub = LAB_DIR / "hostkeys" / f"{node}.pub"
        if not pub.exists() or pub.read_text().split()[:2] != key.split()[:2]:
            raise LabConfigError(
                f"llm-cluster:nodes.{node}.hostKey differs from lab/hostkeys/{node}.pub "
                f"(generate one with: ssh-keygen -t ed25519 -N '' -f lab/hostkeys/{node})"
            )
        choice = shims.get(node) or {}
        topo, hca = choice.get("topo", "nvlink"), choice.get("hca", "roce-active")
        if topo not in TOPOLOGIES:
            raise LabConfigError(f"lab:hosts.{node}.topo: {topo!r}; allowed: {', '.join(TOPOLOGIES)}")
        if hca not in HCA_STATES:
            raise LabConfigError(f"lab:hosts.{node}.hca: {hca!r}; allowed: {', '.join(HCA_STATES)}")
        gpus = int(choice.get("gpus", 8))
        if not 1 <= gpus <= 8:
            raise LabConfigError(f"lab:hosts.{node}.gpus: {gpus}; the captured table has 8 GPUs (1-8)")
        hosts.append(LabHost(node, str(spec["address"]), key, gpus, topo, hca))
    if len({h.address for h in hosts}) != len(hosts):
        raise LabConfigError("llm-cluster:nodes: two lab hosts share an address")
    name = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    real = (config.get("lab:realVllm") or {}).get("models") or {}
    models = config.get("llm-cluster:models") or {}
    for model, kind in real.items():
        if model not in models:
            raise LabConfigError(f"lab:realVllm.models.{model}: not a model of llm-cluster:models")
        if kind not in REAL_VLLM_MODELS:
            raise LabConfigError(f"lab:realVllm.models.{model}: {kind!r}; the lab makes: {', '.join(REAL_VLLM_MODELS)}")
    return LabStack(
        name, path, str(ssh.get("user", "root")), tuple(hosts), tuple((str(m), str(k)) for m, k in real.items())
    )
