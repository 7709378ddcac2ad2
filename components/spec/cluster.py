"""Stack model: SSH access, nodes, NCCL, models and pools."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PrivateAttr, ValidationError, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError

from components.facts.hardware import DTYPE_ALIASES, GPUS
from components.spec import engines as deployed_engines
from components.spec.base import NAME_PATTERN, Spec

Port = Annotated[int, Field(ge=1, le=65535)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


# A POSIX user name (portable filename characters, no leading '-'), at most 32 as Linux allows.
USER_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
HOST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
# An NFS export `server:/path`: a host name or IPv4 address, and a path of safe characters only.
SHARE_PATTERN = r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:/[A-Za-z0-9._+/-]*"


def ipv4_address(v: str) -> str:
    """An IPv4 address; IPv6 is refused by name (addr:port and user@addr are built without brackets)."""
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        raise ValueError(f"{v!r} is not an IPv4 address") from None
    if ip.version == 6:
        raise ValueError(f"{v!r}: IPv6 cluster addresses are not supported yet; give the node's IPv4 address")
    return v


def not_blank(v: str, what: str) -> str:
    """A text value that must say something, without whitespace around it (it lands in files and argv)."""
    if not v.strip() or v != v.strip():
        raise ValueError(f"{v!r} is not allowed: give {what}, without spaces around it")
    return v


# OpenSSH's host key types (sshkey.c keytypes[]): what the first field of a known_hosts key is.
HOST_KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
)


def _ssh_strings(blob: bytes) -> list[bytes] | None:
    """The length-prefixed strings a public key blob is made of (RFC 4253 §6.6), or None when they do not
    make up the blob exactly (a key cut short in the copy)."""
    out, at = [], 0
    while at < len(blob):
        size = int.from_bytes(blob[at : at + 4], "big")
        if at + 4 + size > len(blob):
            return None
        out.append(blob[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def ssh_host_key(v: str) -> str:
    """A node's public host key as known_hosts holds it after the host name: `<type> <base64>`, the blob's
    own first string the same type. A line pasted whole from ssh-keyscan, host name first, would make a
    known_hosts line that matches no host: SSH would fail at `up`."""
    not_blank(v, "the node's public host key as ssh-keyscan prints it (ssh-ed25519 AAAA…)")
    fields = v.split()
    if fields[0] not in HOST_KEY_TYPES:
        if len(fields) > 1 and fields[1] in HOST_KEY_TYPES:
            raise ValueError(
                f"{v!r} is not allowed: it starts with a host name ({fields[0]!r}); give the key "
                f"only, the part after it ({fields[1]} AAAA…)"
            )
        raise ValueError(f"{v!r} is not allowed: a host key starts with its type, one of {', '.join(HOST_KEY_TYPES)}")
    try:
        strings = _ssh_strings(base64.b64decode(fields[1] if len(fields) > 1 else "", validate=True))
    except binascii.Error:
        strings = None
    if not strings or len(strings) < 2 or strings[0] != fields[0].encode():
        raise ValueError(
            f"{v!r} is not allowed: the key after {fields[0]} is not an {fields[0]} key in base64 "
            "(copy it whole from ssh-keyscan or /etc/ssh/ssh_host_*_key.pub)"
        )
    return v


def posix_user(v: str) -> str:
    """ssh.user: a POSIX user name. It lands in ssh logins and in the scripts: nothing a shell or a comment line
    would read twice."""
    if not re.fullmatch(USER_PATTERN, v):
        raise ValueError(
            f"{v!r} is not a POSIX user name (letters, digits, '.', '_', '-', not "
            "starting with '-', at most 32 characters)"
        )
    return v


class SshSpec(Spec):
    """How the operator's machine reaches every node."""

    user: str = "root"
    """Remote user; must be allowed to run docker and write /etc/hosts (root or passwordless sudo)."""
    port: Port = 22
    agent: bool = True
    """Authenticate with the running ssh-agent (SSH_AUTH_SOCK)."""
    key_path: str | None = None
    """Private key file on the operator's machine (used by ssh for the Docker provider and commands)."""
    host_key_checking: bool = False
    """When true every node must state its `hostKey`; when false host keys are not checked."""
    dial_error_limit: int = Field(default=10, ge=-1)
    per_dial_timeout_seconds: int = Field(default=15, ge=1, le=600)

    @field_validator("key_path")
    @classmethod
    def _key_file(cls, v: str | None) -> str | None:
        return (
            v
            if v is None
            else not_blank(
                v,
                "the private key file's path on the operator's machine "
                "(~/.ssh/id_ed25519), or leave keyPath out to use the agent",
            )
        )

    @field_validator("user")
    @classmethod
    def _posix_user(cls, v: str) -> str:
        return posix_user(v)


def known_gpu_model(v: str) -> str:
    """A GPU model the hardware facts know (components.facts.hardware.GPUS)."""
    if v not in GPUS:
        raise ValueError(f"unknown GPU model {v!r}; known: {', '.join(sorted(GPUS))}")
    return v


class GpuSpec(Spec):
    """The GPUs in one node, as `nvidia-smi --query-gpu=name` names them."""

    model: str
    count: int = Field(ge=1, le=16)

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        return known_gpu_model(v)


def bandwidth_floor(min_write_bandwidth_gbps: float | None, rate_gbps: int) -> float:
    """The ib_write_bw average the RDMA preflight requires: the stated floor, else 95 % of the port rate."""
    return min_write_bandwidth_gbps or round(rate_gbps * 0.95, 1)


def roce_gid_index(link_layer: str, gid_index: int | None) -> None:
    """RoCE (an ethernet link layer) needs its GID index; InfiniBand does not."""
    if link_layer == "ethernet" and gid_index is None:
        raise ValueError("gidIndex is required for RoCE (linkLayer: ethernet); RoCEv2 is usually 3")


class HcaSpec(Spec):
    """The RDMA NIC NCCL uses between nodes."""

    device: str = Field(pattern=r"^[A-Za-z0-9_]+$")
    port: int = Field(default=1, ge=1, le=8)
    link_layer: Literal["ethernet", "infiniband"] = "ethernet"
    """`ethernet` for RoCE (then a GID index is required), `infiniband` for IB."""
    gid_index: int | None = Field(default=None, ge=0, le=255)
    rate_gbps: int = Field(default=200, ge=1)
    """Expected port rate; preflight fails when `ibstat` reports less."""
    min_write_bandwidth_gbps: float | None = Field(default=None, gt=0)
    """`ib_write_bw` floor between the nodes of a multi-node instance before Ray starts; default
    95 % of rateGbps (190 for a 200 Gb HCA, the runbook's figure)."""

    @property
    def bandwidth_floor_gbps(self) -> float:
        """The ib_write_bw average the RDMA preflight requires."""
        return bandwidth_floor(self.min_write_bandwidth_gbps, self.rate_gbps)

    @model_validator(mode="after")
    def _roce_needs_gid(self) -> HcaSpec:
        roce_gid_index(self.link_layer, self.gid_index)
        return self


class NodeDefaults(Spec):
    """Values every node takes unless it states its own."""

    gpu: GpuSpec | None = None
    hca: HcaSpec | None = None
    interface: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]+$")
    driver_min_version: str | None = Field(default=None, pattern=r"^\d+(\.\d+){0,2}$")
    disk_path: str = "/data"
    min_free_disk_gib: int = Field(default=0, ge=0)
    """Free space the preflight requires at diskPath on top of the weights still to copy there."""
    memory_gib: float | None = Field(default=None, gt=0, le=65536)
    """Host RAM in GiB (`free -g`); unset: the reference server's 380 (components.facts.servers)."""
    cpu_cores: int | None = Field(default=None, ge=1, le=65536)
    """Logical CPUs (`nproc`); unset: the reference server's 80 (components.facts.servers)."""

    @field_validator("disk_path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return absolute_path(v, "on the nodes")


def ssh_host(v: str) -> str:
    """nodes.<node>.sshAddress: a host name is fine here (only SSH resolves it); an address must be IPv4 like the
    cluster's."""
    if HOST_RE.fullmatch(v) and not v.replace(".", "").isdigit():
        return v
    if ":" in v or v.replace(".", "").isdigit():
        return ipv4_address(v)
    raise ValueError(f"{v!r} is not a host name or IPv4 address")


class NodeSpec(Spec):
    """One GPU server."""

    address: str
    """Cluster address: VLLM_HOST_IP, Ray node IP, /etc/hosts and gateway upstreams use it."""
    ssh_address: str | None = None
    """Address SSH and Docker use, when it differs from the cluster address."""
    host_key: Annotated[str, AfterValidator(ssh_host_key)] | None = None
    gpu: GpuSpec | None = None
    hca: HcaSpec | None = None
    interface: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]+$")
    """Management interface for NCCL/GLOO bootstrap sockets (NCCL_SOCKET_IFNAME)."""
    driver_min_version: str | None = Field(default=None, pattern=r"^\d+(\.\d+){0,2}$")
    disk_path: str | None = None
    min_free_disk_gib: int | None = Field(default=None, ge=0)
    memory_gib: float | None = Field(default=None, gt=0, le=65536)
    """Host RAM in GiB; what vLLM's CPU swap space and CPU offload of every instance on the node must fit in."""
    cpu_cores: int | None = Field(default=None, ge=1, le=65536)
    """Logical CPUs (`nproc`); llama.cpp's threads are split between the node's serving instances by it."""

    @field_validator("disk_path")
    @classmethod
    def _absolute_disk(cls, v: str | None) -> str | None:
        return v if v is None else absolute_path(v, "on the node")

    @field_validator("address")
    @classmethod
    def _ip(cls, v: str) -> str:
        return ipv4_address(v)

    @field_validator("ssh_address")
    @classmethod
    def _ssh_host(cls, v: str | None) -> str | None:
        return v if v is None else ssh_host(v)


def cidr(v: str) -> str:
    """An IPv4 or IPv6 network in CIDR form (a bare address is one host); host bits must be zero."""
    try:
        net = ipaddress.ip_network(v, strict=True)
    except ValueError as e:
        try:
            hint = f"; did you mean {ipaddress.ip_network(v, strict=False)}?"
        except ValueError:
            hint = ""
        raise ValueError(f"{v!r} is not a CIDR network ({e}){hint}") from None
    return str(net)


Cidr = Annotated[str, AfterValidator(cidr)]


def port_range(v: tuple[int, int]) -> tuple[int, int]:
    """[first, last] of a port range, first <= last."""
    if v[0] > v[1]:
        raise ValueError(f"{v[0]} > {v[1]}: give [first, last] of the range")
    return v


class FirewallSpec(Spec):
    """The host firewall llm-cluster manages on every node: one nftables table of its own."""

    managed: bool = True
    """`false` leaves the host firewall to the operator (the policy pack then says which ports to close)."""
    trusted_sources: list[Cidr] = Field(default_factory=list)
    """Networks treated like the cluster's nodes (an operator or monitoring subnet): they reach Ray's
    dashboard, Prometheus and Grafana."""
    ephemeral_ports: tuple[Port, Port] = (32768, 60999)
    """The nodes' ip_local_port_range, where NCCL, Gloo and Ray pick their ports (Linux' default);
    the firewall refuses to load on a node whose range reaches outside it."""

    @field_validator("ephemeral_ports")
    @classmethod
    def _ordered(cls, v: tuple[int, int]) -> tuple[int, int]:
        return port_range(v)


class PreflightSpec(Spec):
    """Deploy-time checks beyond each node's own preflight (GPUs, driver, HCA, runtime, disk)."""

    max_clock_offset_seconds: float = Field(default=1.0, gt=0)
    """How far a node's clock may be from the operator's (Ray and TLS need synchronised clocks)."""
    rdma_bandwidth: bool = True
    """`ib_write_bw` between every pair of nodes of a multi-node instance before Ray starts."""
    nccl_all_reduce: bool = True
    """A short NCCL all-reduce across a multi-node instance before vLLM starts: refused on NET/Socket."""


class NcclSpec(Spec):
    """NCCL/GLOO settings every GPU container gets (HCA, GID index and interface come from nodes)."""

    ib_disable: bool = False
    debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = "WARN"
    extra_env: dict[EnvName, str] = Field(default_factory=dict)


def source_node(v: str) -> str:
    """models.<m>.source.node: a name, not blank (whether it is a node is check_models')."""
    if not v.strip():
        raise ValueError(f"{v!r} is not allowed: name the node that holds the weights, or use sharedMount or present")
    return v


def nfs_share(v: str) -> str:
    """models.<m>.source.sharedMount: an NFS export server:/path of safe characters only."""
    if not re.fullmatch(SHARE_PATTERN, v):
        raise ValueError(
            f"{v!r} is not an NFS share server:/path (a host name or IPv4 address, then an "
            "absolute path of letters, digits and . _ + / -)"
        )
    return v


def one_source(node: str | None, shared_mount: str | None, present: bool) -> None:
    """A model's weights come from exactly one of a node, a shared mount, or being present."""
    given = [k for k, v in (("node", node), ("sharedMount", shared_mount), ("present", present or None)) if v]
    if len(given) != 1:
        raise ValueError(f"state exactly one of node, sharedMount, present (got {given or 'none'})")


class WeightsSource(Spec):
    """Where a model's weights come from: copied from a node that has them, or a shared mount."""

    node: str | None = None
    """A node that already holds the weights at the model's path; others get a fan-out copy."""
    shared_mount: str | None = None
    """`server:/export` NFS share mounted at the model path on every node instead of copying."""

    @field_validator("node")
    @classmethod
    def _node_named(cls, v: str | None) -> str | None:
        return v if v is None else source_node(v)

    @field_validator("shared_mount")
    @classmethod
    def _share(cls, v: str | None) -> str | None:
        return v if v is None else nfs_share(v)

    present: bool = False
    """The weights are already on every node (verified, never copied)."""

    @model_validator(mode="after")
    def _exactly_one(self) -> WeightsSource:
        one_source(self.node, self.shared_mount, self.present)
        return self


def served_name(name: str) -> str:
    """A name clients send as `model`: something they can type and the gateway can match exactly."""
    if not name.strip() or name != name.strip() or any(not c.isprintable() for c in name):
        raise ValueError(
            f"{name!r} is not allowed: a served name is what clients send as `model`: not empty, "
            "no leading or trailing whitespace, no control characters"
        )
    return name


ServedName = Annotated[str, AfterValidator(served_name)]


def group_size(v: int) -> int:
    """models.<m>.groupSize: a group of weights, or -1 for per channel; never 0."""
    if v == 0:
        raise ValueError(
            "0 is not allowed: a group of 0 weights does not exist; give the checkpoint's "
            "group_size (128, 64, 32), or -1 for per-channel quantization"
        )
    return v


def quantization_method(v: str) -> str:
    """models.<m>.quantization: a method one of the deployed engines' known versions takes."""
    known = deployed_engines.quantization_methods()
    if v not in known:
        raise ValueError(f"unknown quantization {v!r}; the known engine versions know: {', '.join(sorted(known))}")
    return v


def one_architecture(arch: str | None, config_json: str | None) -> None:
    """A model states its architecture by exactly one of a catalog name or a config.json."""
    if (arch is None) == (config_json is None):
        raise ValueError("state exactly one of arch (a catalog name) or configJson (a path)")


class ModelSpec(Spec):
    """One model checkpoint on the nodes."""

    path: str
    """Absolute directory on every node of the pools that serve it."""
    arch: str | None = None
    """Catalog name of the architecture (see `python -m ops.capacity --list`)."""
    config_json: str | None = None
    """Path (on the operator's machine) of the checkpoint's config.json, for models not in the catalog."""
    quantization: str | None = None
    """vLLM `--quantization` method of the checkpoint; unset for fp16/bf16 checkpoints."""
    quant_bits: int = Field(default=4, ge=2, le=8)
    group_size: int = Field(default=128, ge=-1, le=8192)
    """The checkpoint's quantization group (config.json group_size); -1 is per channel (no groups)."""
    dtype: Literal[tuple(DTYPE_ALIASES)] = "half"  # type: ignore[valid-type]
    served_names: list[ServedName] = Field(default_factory=list)
    """Names clients send as `model`; the first is the one responses carry. Default: the model key."""
    source: WeightsSource
    revision: Annotated[str, AfterValidator(lambda v: not_blank(v, "a revision label, e.g. '2'"))] = "1"
    """Bump to force the weights to be re-synced and re-verified on every node."""
    size_gib: float | None = Field(default=None, gt=0)
    """On-disk size, for the free-space preflight; estimated from the architecture when unset."""
    trust_remote_code: bool = False

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        return absolute_path(v, "on the nodes")

    @field_validator("group_size")
    @classmethod
    def _group(cls, v: int) -> int:
        return group_size(v)

    @field_validator("served_names")
    @classmethod
    def _served(cls, v: list[str]) -> list[str]:
        return listed_once(v, "")

    @field_validator("quantization")
    @classmethod
    def _known_method(cls, v: str | None) -> str | None:
        return v if v is None else quantization_method(v)

    @model_validator(mode="after")
    def _arch_source(self) -> ModelSpec:
        one_architecture(self.arch, self.config_json)
        return self


# Environment every GPU container gets from the nodes' and NCCL keys (each engine adds its own: the registry's
# TYPED_ENV).
TYPED_ENV: dict[str, str] = {
    "NCCL_IB_HCA": "nodes.<node>.hca.device",
    "NCCL_IB_GID_INDEX": "nodes.<node>.hca.gidIndex",
    "NCCL_SOCKET_IFNAME": "nodes.<node>.interface",
    "GLOO_SOCKET_IFNAME": "nodes.<node>.interface",
    "NCCL_IB_DISABLE": "nccl.ibDisable",
    "NCCL_DEBUG": "nccl.debug",
}


def _fraction(v: float) -> float:
    """A fraction in (0, 1]; a percentage (90) is refused saying it is a fraction."""
    if not 0 < v <= 1:
        hint = f"; {v:g}% is {v / 100:g}" if 2 <= v <= 100 else ""
        raise ValueError(f"{v:g} is not allowed: this is a fraction, 0 < x <= 1{hint}")
    return v


Fraction = Annotated[float, AfterValidator(_fraction)]


# A Docker image reference: [registry[:port]/]path[:tag][@sha256:digest]; the path is lower-case (Docker
# refuses "repository name must be lowercase"), a tag letters, digits, _ . - (at most 128).
# The first component is a registry only when it has a dot or a port, or is localhost (Docker's rule).
_REGISTRY = r"(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?/|[A-Za-z0-9-]+:[0-9]+/)"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(
    rf"^{_REGISTRY}?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


def image_reference(v: str) -> str:
    """A Docker image reference as `docker pull` takes it; refused with what is wrong in words."""
    if v != v.strip() or any(c.isspace() for c in v):
        raise ValueError(f"{v!r}: an image reference holds no whitespace")
    if IMAGE_REF.match(v):
        return v
    # The repository is what is left without the digest, then without a tag (a ':' in the last segment: one in
    # the first is a registry's port); its path is after the registry, which keeps its case.
    named = v.split("@", 1)[0]
    repo = named.rsplit(":", 1)[0] if ":" in named.rsplit("/", 1)[-1] else named
    path = repo.split("/", 1)[1] if "/" in repo and re.search(r"[.:]|^localhost$", repo.split("/", 1)[0]) else repo
    if path != path.lower():
        fixed = v[: len(repo) - len(path)] + path.lower() + v[len(repo) :]
        raise ValueError(f"{v!r}: Docker refuses it (repository name must be lowercase): write {fixed!r}")
    raise ValueError(
        f"{v!r} is not an image reference: [registry/]repository[:tag][@sha256:digest], the "
        "repository of lower-case letters, digits and . _ - separated by /"
    )


ImageRef = Annotated[str, AfterValidator(image_reference)]


def listed_once(v: list[str], what: str) -> list[str]:
    """The list, refused naming the first entry that repeats an earlier one."""
    seen = [n for i, n in enumerate(v) if n in v[:i]]
    if seen:
        raise ValueError(f"{what}{seen[0]!r} is listed twice")
    return v


def absolute_path(v: str, where: str) -> str:
    """An absolute path without whitespace or quotes (it lands in scripts and mounts)."""
    if not v.startswith("/"):
        raise ValueError(f"{v!r} must be an absolute path {where} (starting with /)")
    bad = sorted({c for c in v if c.isspace() or c in "'\"\\"})
    if bad:
        raise ValueError(f"{v!r}: the path may not hold whitespace, quotes or backslashes (found {bad!r})")
    return v


def known_image(v: str) -> str:
    """pools.<pool>.imageFacts.like: an image whose facts an engine's table holds."""
    if not deployed_engines.knows_image(v):
        raise ValueError(f"{v!r} is not a known image; known: {', '.join(deployed_engines.declarable_images())}")
    return v


class ImageFactsSpec(Spec):
    """Facts of a private image build, declared by the stack: a known image's facts with these replaced
    (each replaced fact is marked unverified; the policy pack and the qualification gate hold the image to them)."""

    like: str
    """A known image whose other facts the build shares (an engine's image facts table)."""
    version: str | None = Field(default=None, pattern=r"^\d+\.\d+(\.\d+)?([a-z0-9.+-]*)$")
    cuda: str | None = None
    torch: str | None = None
    torch_arch_list: list[Annotated[int, Field(ge=30, le=200)]] | None = None
    """Compute capabilities with kernels in the build's torch (torch.cuda.get_arch_list(): sm_70 -> 70)."""
    triton: str | None = None

    @field_validator("like")
    @classmethod
    def _known(cls, v: str) -> str:
        return known_image(v)

    def overrides(self) -> dict[str, object]:
        """The declared facts, by ImageFacts field name."""
        return {k: v for k, v in self.model_dump(exclude={"like"}).items() if v is not None}


class PoolSpec(Spec):
    """A set of nodes serving one model: replicas (pipelineParallel 1) or Ray TP×PP instances."""

    model: str
    nodes: list[str] = Field(min_length=1)
    engine: str = ""
    """The serving engine: vllm, lmdeploy (TurboMind), llamacpp; other engines the runbooks name are
    known and refused with the reason for the pool's GPU."""
    image: ImageRef = ""
    """Serving image; unset: the engine's default (its package's facts)."""
    image_facts: ImageFactsSpec | None = None
    """Facts of the image when it is a private build the facts table does not know."""
    tensor_parallel: int = Field(ge=1, le=16)
    pipeline_parallel: int = Field(default=1, ge=1, le=16)
    """Nodes one instance spans; >1 runs the instance on a Ray cluster across those nodes (vLLM: or on its own
    launcher, `vllm.multiNode: native`)."""
    replicas_per_node: int = Field(default=1, ge=1, le=16)
    """With pipelineParallel 1: instances per node, each on its own tensorParallel GPUs."""
    port: Port = 8000
    """First vLLM port on each node; replica i on a node listens on port + i."""
    ray_port: Port = 6379
    """The Ray head's GCS port (instances on Ray only; rayDashboardPort and rayClientPort too)."""
    ray_dashboard_port: Port = 8265
    ray_client_port: Port = 10001
    shm_size_gib: int = Field(default=32, ge=1, le=65536)
    """/dev/shm of each container in GiB (tmpfs: RAM of the node, checked against its memoryGib)."""
    env: dict[EnvName, str] = Field(default_factory=dict)
    """Extra environment for every container of the pool (VLLM_USE_V1 is set by the product where the image reads it)."""
    offline: bool = True
    """The servers run with the model hub and the engine's telemetry off (HF_HUB_OFFLINE=1,
    TRANSFORMERS_OFFLINE=1, usage stats off: each engine's own variables); the weights are on the
    nodes. `false` lets them reach the hub (refused when images.airGapped); `env` overrides one variable."""
    read_timeout_seconds: int = Field(default=600, ge=1, le=86400)
    """Gateway read timeout for this pool's upstreams (long generations stream for minutes)."""
    drain_seconds: int = Field(default=60, ge=0, le=3600)
    """How long a stopped server lets the requests it holds finish (vLLM `--shutdown-timeout`, where the image
    has it; the container's stop timeout is set above it). 0: vLLM's own default, which aborts them."""
    load_timeout_minutes: int = Field(default=30, ge=1)
    """How long the readiness gate waits for /health (weights load 5–15 min on local disks)."""
    ray_gate_timeout_seconds: int = Field(default=300, ge=10)
    routing: Literal["prefix", "least_conn"] | None = None
    """How the gateway picks this pool's replica (gateway.routing.policy when unset): prefix affinity with
    bounded load, or least_conn."""
    max_unavailable: int = Field(default=1, ge=1)
    """Instances `make rollout` replaces at once (the others keep serving); the plan diff recommends a
    rollout when a change would restart more of them together."""
    qualification_gate: bool = True
    """Each server of the pool waits for the qualification gate of its image on its node (a GPU check run in
    the image). `false` starts them without it — only for a rehearsal on hardware the gate cannot pass (the
    lab's CPU engines): the plan prints it, and the policy pack's mandatory `qualification-gate` refuses it
    unless the stack's policy config lowers that rule."""
    restart_unhealthy_after_seconds: int = Field(default=300, ge=0)
    """Restart a server whose /health fails this long after it has served (0: never). docker alone
    does not restart an unhealthy container; a server that never becomes healthy within
    loadTimeoutMinutes is restarted too."""

    @field_validator("nodes")
    @classmethod
    def _no_repeats(cls, v: list[str]) -> list[str]:
        return listed_once(v, "node ")

    @classmethod
    def _allowed_keys(cls) -> set[str]:
        return super()._allowed_keys() | set(deployed_engines.options_keys())

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        return super()._refuse_unknown_keys(keys_of_a_registered_engine(data, cls._allowed_keys()))

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: str) -> str:
        return registered_engine(v)

    @model_validator(mode="before")
    @classmethod
    def _default_engine_and_image(cls, data: Any) -> Any:
        return engine_and_image_filled(data)

    @model_validator(mode="wrap")
    @classmethod
    def _engine_options(cls, data: Any, handler: Any) -> PoolSpec:
        return pool_with_options(cls.__name__, data, handler)

    _options: Spec | None = PrivateAttr(default=None)

    @property
    def options(self) -> Spec | None:
        """The options block of the pool's engine (None for an engine the project does not deploy)."""
        return self._options

    def __getattr__(self, name: str) -> Any:
        # pools.<pool>.<key> reads as an attribute too (pool.vllm.maxModelLen): the block when it is the
        # pool's engine's, None for another engine's key.
        if not name.startswith("_") and name in deployed_engines.DEPLOYED_KEYS:
            return self._options if deployed_engines.DEPLOYED_KEYS[name] == self.engine else None
        return super().__getattr__(name)  # type: ignore[misc]


def keys_of_a_registered_engine(data: Any, allowed: set[str]) -> Any:
    """A pool's mapping as the unknown-key check reads it. A pool on an engine that is not registered has that
    engine's options block too: the engine is the mistake to name (the block is checked again once the engine
    is known), so its keys are not."""
    if (
        isinstance(data, dict)
        and isinstance(data.get("engine"), str)
        and data["engine"] not in deployed_engines.engine_names()
    ):
        return {k: v for k, v in data.items() if k in allowed}
    return data


def registered_engine(v: str) -> str:
    """pools.<pool>.engine: a registered engine, refused as pydantic refuses a Literal (the words say the names)."""
    names = deployed_engines.engine_names()
    if v not in names:
        quoted = [repr(n) for n in names]
        raise PydanticCustomError(
            "literal_error",
            "Input should be {expected}",
            {"expected": ", ".join(quoted[:-1]) + " or " + quoted[-1]},
        )
    return v


def engine_and_image_filled(data: Any) -> Any:
    """A pool's mapping with its engine and image defaults filled in. Both depend on the registry (the image on
    the engine), so they are filled in before the (frozen) model is built."""
    if isinstance(data, dict):
        engine = data.get("engine") or deployed_engines.DEFAULT_ENGINE[0]
        data = {**data, "engine": engine}
        known = deployed_engines.deployed().get(engine) if isinstance(engine, str) else None
        if not data.get("image") and known is not None:
            data = {**data, "image": known.default_image}
    return data


def pool_with_options(title: str, data: Any, handler: Any) -> PoolSpec:
    """The pool `handler` builds, with its engine's options block. The blocks are the registered engines' own
    models, validated under their own key so an error names pools.<pool>.<key>.<option>; exactly the block of
    the pool's engine is allowed."""
    if not isinstance(data, dict):
        return handler(data)  # type: ignore[no-any-return]
    keys = deployed_engines.options_keys()
    blocks = {k: data[k] for k in keys if k in data}
    errors: list[Any] = []
    pool = None
    try:
        pool = handler({k: v for k, v in data.items() if k not in blocks})
    except ValidationError as err:
        errors += _relayed(err)
    options: dict[str, Spec] = {}
    for key, block in blocks.items():
        try:
            options[key] = _options_holder(key).model_validate({key: block}).__dict__[key]
        except ValidationError as err:
            errors += _relayed(err)
    if errors:
        raise ValidationError.from_exception_data(title, errors)
    assert pool is not None
    engine = deployed_engines.deployed().get(pool.engine)
    wanted = engine.options_key if engine is not None else None
    if wanted is not None and wanted not in options:
        raise ValueError(
            f"engine {pool.engine} needs its options block `{wanted}` (e.g. {wanted}: "
            f"{{{engine.required_option}: ...}})"
        )
    stray = [k for k in keys if k in options and k != wanted]
    if stray:
        raise ValueError(
            f"`{stray[0]}` options do not apply to engine {pool.engine}; "
            + (f"state `{wanted}` instead" if wanted else "remove them")
        )
    pool.__pydantic_private__["_options"] = options.get(wanted) if wanted else None
    return pool  # type: ignore[no-any-return]


def _relayed(err: ValidationError) -> list[Any]:
    """pydantic's errors as line errors for one combined ValidationError, type, location and context kept."""
    return [
        {
            # The message is already written: pydantic_core fills in only `{<context key>}` and has no `{{` escape
            # (escaping doubled every brace a relayed message quoted: pools.<pool>.image '{x}' said '{{x}}').
            "type": PydanticCustomError(e["type"], e["msg"], e.get("ctx")),
            "loc": e["loc"],
            "input": e["input"],
        }
        for e in err.errors(include_url=False)
    ]


@cache
def _options_holder(key: str) -> type[Spec]:
    """A model with one field, `key`, of the engine's options model: its errors carry the key in their location."""
    engine = deployed_engines.deployed()[deployed_engines.options_keys()[key]]
    return create_model(f"{engine.options_model.__name__}Block", __base__=Spec, **{key: (engine.options_model, ...)})
