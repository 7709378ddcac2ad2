"""Node preflight: parsers of nvidia-smi, ibstat, ibv_devices, docker info, df, chronyc and timedatectl,
and the node check.

Standard library only, and Python 3.8-compatible: the preflight script ships this file's source to
the node (`python3 -` with a heredoc) and runs `main()` there, so one tested implementation parses
both the fixtures here and the real outputs on the server. Everything above `collect` is pure.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import ssl
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

GIB = 1024**3


@dataclass(frozen=True)
class Finding:
    """One preflight result: an error stops the deployment, a warning is printed."""

    level: str  # "error" | "warning"
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.level.upper()}: {self.what}\n    fix: {self.fix}"


# --- parsers --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuInfo:
    """One GPU row of `nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total`."""

    name: str
    compute_cap: Optional[str]  # "7.0"; None when the driver predates the compute_cap field
    driver_version: str
    memory_mib: Optional[int]


GPU_QUERY_FIELDS = "name,compute_cap,driver_version,memory.total"
GPU_QUERY_FIELDS_OLD_DRIVER = "name,driver_version,memory.total"


def parse_gpu_query(text: str) -> List[GpuInfo]:
    """Rows of `nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader` (compute_cap may be absent)."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if not line.strip():
            continue
        if len(cells) == 4:
            name, cap, driver, mem = cells
        elif len(cells) == 3:
            name, driver, mem = cells
            cap = None
        else:
            raise ValueError(f"unexpected nvidia-smi --query-gpu row: {line!r}")
        m = re.match(r"^(\d+)\s*MiB$", mem)
        gpus.append(GpuInfo(name, cap, driver, int(m.group(1)) if m else None))
    return gpus


@dataclass(frozen=True)
class Topology:
    """`nvidia-smi topo -m`: the link between every GPU pair and from every NIC to every GPU."""

    gpus: Tuple[str, ...]
    links: Dict[Tuple[str, str], str]  # (GPU0, GPU1) -> "NV2" | "PIX" | "SYS" | …
    nics: Dict[str, Dict[str, str]]  # mlx5_0 -> {GPU0: "PIX", …}

    def nvlink_peers(self, gpu: str) -> List[str]:
        """GPUs this one reaches over NVLink (NV#)."""
        return [b for (a, b), kind in self.links.items() if a == gpu and kind.startswith("NV")]

    @property
    def has_nvlink(self) -> bool:
        """Whether any GPU pair is joined by NVLink."""
        return any(kind.startswith("NV") for kind in self.links.values())


def parse_topo(text: str) -> Topology:
    """Parse the matrix of `nvidia-smi topo -m` (GPU and NIC rows; affinity columns are ignored)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header_i = next((i for i, ln in enumerate(lines) if re.match(r"^\s+GPU0\b", ln)), None)
    if header_i is None:
        raise ValueError("no GPU0 header row in nvidia-smi topo -m output")
    # Device columns are single tokens; "CPU Affinity" and what follows are not devices.
    columns = []
    for token in lines[header_i].split():
        if token in ("CPU", "NUMA", "GPU") or token.startswith("Affinity"):
            break
        columns.append(token)
    gpus = tuple(c for c in columns if re.match(r"^GPU\d+$", c))
    links: Dict[Tuple[str, str], str] = {}
    nics: Dict[str, Dict[str, str]] = {}
    for ln in lines[header_i + 1:]:
        if ln.startswith("Legend"):
            break
        cells = ln.split()
        row, values = cells[0], cells[1:1 + len(columns)]
        if len(values) < len(columns):
            raise ValueError(f"topo row {row!r} has {len(values)} cells, expected {len(columns)}")
        if row in gpus:
            for col, kind in zip(columns, values):
                if col in gpus and col != row:
                    links[(row, col)] = kind
        else:
            nics[row] = {col: kind for col, kind in zip(columns, values) if col in gpus}
    return Topology(gpus, links, nics)


@dataclass(frozen=True)
class IbPort:
    """One port of an HCA as ibstat reports it."""

    state: str
    physical_state: str
    rate_gbps: int
    link_layer: str


def parse_ibstat(text: str) -> Dict[str, Dict[int, IbPort]]:
    """`ibstat`: CA name -> port number -> state, physical state, rate and link layer."""
    cas: Dict[str, Dict[int, IbPort]] = {}
    ca: Optional[str] = None
    port: Optional[int] = None
    fields: Dict[str, str] = {}

    def flush() -> None:
        if ca is not None and port is not None:
            cas[ca][port] = IbPort(fields.get("State", "?"), fields.get("Physical state", "?"),
                                   int(fields.get("Rate", "0") or 0), fields.get("Link layer", "?"))

    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            flush()
            ca, port, fields = m.group(1), None, {}
            cas[ca] = {}
            continue
        m = re.match(r"^\s+Port (\d+):\s*$", line)
        if m and ca is not None:
            flush()
            port, fields = int(m.group(1)), {}
            continue
        m = re.match(r"^\s+([A-Za-z ]+):\s*(.*?)\s*$", line)
        if m and port is not None:
            fields[m.group(1)] = m.group(2)
    flush()
    return cas


def parse_ibv_devices(text: str) -> Dict[str, str]:
    """`ibv_devices`: verbs device name -> node GUID."""
    devices = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 2 and re.match(r"^[0-9a-fA-F]{16}$", cells[1]):
            devices[cells[0]] = cells[1]
    return devices


def parse_docker_runtimes(text: str) -> Tuple[List[str], Optional[str]]:
    """`docker info`: the registered runtimes and the default one."""
    runtimes: List[str] = []
    default = None
    for line in text.splitlines():
        m = re.match(r"^\s*Runtimes:\s*(.*)$", line)
        if m:
            runtimes = m.group(1).split()
        m = re.match(r"^\s*Default Runtime:\s*(\S+)", line)
        if m:
            default = m.group(1)
    return runtimes, default


def parse_df_available(text: str) -> int:
    """`df -Pk <path>`: bytes available on the file system holding the path."""
    rows = [ln.split() for ln in text.splitlines()[1:] if ln.strip()]
    if not rows or len(rows[-1]) < 6:
        raise ValueError(f"unexpected df -Pk output: {text!r}")
    return int(rows[-1][-3]) * 1024


@dataclass(frozen=True)
class ClockState:
    """Whether the node's clock is disciplined, by which service, and its offset when chrony knows it."""

    source: str  # "chrony" | "timedatectl"
    synchronised: bool
    offset_s: Optional[float] = None  # chrony's estimate of system time minus NTP time
    reference: str = ""


def parse_chrony_tracking(text: str) -> ClockState:
    """`chronyc tracking`: synchronised when the leap status is not "Not synchronised" and a source is chosen."""
    fields = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z][A-Za-z ()]*?)\s*:\s*(.*?)\s*$", line)
        if m:
            fields[m.group(1)] = m.group(2)
    if "Leap status" not in fields:
        raise ValueError(f"no Leap status in chronyc tracking output: {text[:200]!r}")
    offset = None
    m = re.match(r"^([0-9.]+) seconds (fast|slow) of NTP time", fields.get("System time", ""))
    if m:
        offset = float(m.group(1)) * (1 if m.group(2) == "fast" else -1)
    reference = fields.get("Reference ID", "")
    synced = fields["Leap status"] != "Not synchronised" and not reference.startswith("00000000")
    return ClockState("chrony", synced, offset, reference)


def parse_timedatectl(text: str) -> ClockState:
    """`timedatectl status`: "System clock synchronized" (systemd >= 239) or "NTP synchronized" (older)."""
    for line in text.splitlines():
        m = re.match(r"^\s*(System clock synchronized|NTP synchronized):\s*(\S+)", line)
        if m:
            return ClockState("timedatectl", m.group(2) == "yes")
    raise ValueError(f"no synchronized line in timedatectl output: {text[:200]!r}")


def version_tuple(version: str) -> Tuple[int, ...]:
    """'560.28.03' -> (560, 28, 3) for comparisons."""
    return tuple(int(p) for p in re.findall(r"\d+", version))


# --- the check -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Expectation:
    """What the stack says about one node: the preflight checks the server against it."""

    node: str
    gpu_model: str
    gpu_count: int
    compute_cap: str  # "7.0"
    nvlink: bool  # SXM parts: NVLink expected between the GPUs
    max_tensor_parallel: int  # widest TP a pool runs on this node (0: no pool)
    driver_min: Optional[str]
    hca: Optional[Dict[str, object]]  # device, port, link_layer, rate_gbps
    disk_path: str
    min_free_gib: int
    models: List[Dict[str, object]] = field(default_factory=list)  # path, size_bytes to be copied here
    firewall: bool = False  # llm-cluster loads its nftables table here: nft must exist
    max_clock_offset_s: float = 1.0
    memory_gib: float = 0.0  # the RAM the stack states for the node (what host-memory judged against); 0: none
    memory_key: str = ""  # the stack key it comes from
    meminfo_path: str = "/proc/meminfo"
    cpu_cores: int = 0  # the logical CPUs the stack states (llama.cpp's threads are split from it); 0: none
    cpu_key: str = ""  # the stack key it comes from
    cpuinfo_path: str = "/proc/cpuinfo"
    registry: str = ""  # host[:port] of images.registry: dockerd must trust it; "" = none
    docker_certs_dir: str = "/etc/docker/certs.d"  # where dockerd looks for a registry's CA
    tarballs: List[str] = field(default_factory=list)  # images.tarballs: every file the plan `docker load`s here

    def to_json(self) -> str:
        """The form the preflight script passes to the node."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Expectation":
        """Inverse of to_json."""
        return cls(**json.loads(text))


@dataclass
class Outputs:
    """Raw command outputs collected on the node; None when the command is missing or failed."""

    gpus: Optional[str] = None
    topo: Optional[str] = None
    ibstat: Optional[str] = None
    ibv_devices: Optional[str] = None
    docker_info: Optional[str] = None
    container_cli: bool = False  # nvidia-container-cli on PATH (docker --gpus uses its hook)
    df: Optional[str] = None
    present_bytes: Dict[str, int] = field(default_factory=dict)  # model path -> bytes already there
    nft: Optional[str] = None  # `nft --version`
    chrony: Optional[str] = None  # `chronyc -n tracking`
    timedatectl: Optional[str] = None  # `timedatectl status`, when chrony gives nothing
    meminfo: Optional[str] = None  # /proc/meminfo
    cpuinfo: Optional[str] = None  # /proc/cpuinfo
    registry_cas: List[str] = field(default_factory=list)  # <certs dir>/<registry>/*.crt
    registry_tls: Optional[Tuple[str, str]] = None  # ("ok" | "untrusted" | "unreachable", detail); None: not asked
    tarballs_missing: List[str] = field(default_factory=list)  # planned tarballs that are not a non-empty file
    errors: Dict[str, str] = field(default_factory=dict)  # command -> why it produced nothing


def _missing(out: Outputs, key: str, tool: str, install: str) -> List[Finding]:
    why = out.errors.get(key, "no output")
    return [Finding("error", f"`{tool}` gave nothing ({why})", install)]


def check_gpus(exp: Expectation, out: Outputs) -> List[Finding]:
    """GPU count, model, compute capability and driver version against the stack."""
    if out.gpus is None:
        return _missing(out, "gpus", "nvidia-smi --query-gpu", "install the NVIDIA driver "
                        f"(>= {exp.driver_min or 'the stack minimum'}) and check `nvidia-smi` runs")
    gpus = parse_gpu_query(out.gpus)
    where = f"nodes.{exp.node}.gpu (or nodeDefaults.gpu)"
    found: List[Finding] = []
    names = sorted({g.name for g in gpus})
    if len(gpus) != exp.gpu_count:
        found.append(Finding("error", f"{exp.node} has {len(gpus)} GPU(s), the stack expects {exp.gpu_count}",
                             "check for a GPU fallen off the bus (`nvidia-smi -q`, dmesg Xid errors) "
                             f"or set {where}.count to {len(gpus)}"))
    wrong = [n for n in names if n != exp.gpu_model]
    if wrong:
        found.append(Finding("error", f"{exp.node} has {', '.join(wrong)}, the stack expects {exp.gpu_model}",
                             f"set {where}.model to {wrong[0]!r}"))
    caps = sorted({g.compute_cap for g in gpus if g.compute_cap and g.compute_cap != exp.compute_cap})
    if caps and not wrong:
        found.append(Finding("error", f"{exp.node} reports compute capability {', '.join(caps)}, "
                             f"{exp.gpu_model} is {exp.compute_cap}",
                             "the GPU table (components/facts/hardware.py) or the driver is wrong; "
                             "report it with `nvidia-smi -q` output"))
    drivers = sorted({g.driver_version for g in gpus})
    if exp.driver_min and drivers:
        old = [d for d in drivers if version_tuple(d) < version_tuple(exp.driver_min)]
        if old:
            found.append(Finding("error", f"{exp.node} runs NVIDIA driver {', '.join(old)}, the stack needs "
                                 f">= {exp.driver_min}",
                                 f"upgrade the driver to {exp.driver_min} or newer (same version on all nodes)"))
    return found


def check_topology(exp: Expectation, out: Outputs) -> List[Finding]:
    """NVLink vs PCIe between the GPUs, and where the HCA sits."""
    if out.topo is None:
        return _missing(out, "topo", "nvidia-smi topo -m", "install the NVIDIA driver and check `nvidia-smi topo -m`")
    topo = parse_topo(out.topo)
    found: List[Finding] = []
    if exp.nvlink and not topo.has_nvlink:
        found.append(Finding("error", f"{exp.node}: `nvidia-smi topo -m` shows no NVLink between any GPUs, "
                             f"but {exp.gpu_model} is an NVLink (SXM) part",
                             "check `nvidia-smi nvlink -s` and the NVLink/fabric state, or set the GPU model "
                             "to the PCIe variant if these are PCIe cards"))
    elif exp.nvlink:
        lonely = [g for g in topo.gpus if not topo.nvlink_peers(g)]
        if lonely:
            found.append(Finding("warning", f"{exp.node}: {', '.join(lonely)} have no NVLink peer",
                                 "check `nvidia-smi nvlink -s` for links down; TP traffic to them goes over PCIe"))
    elif not topo.has_nvlink and exp.max_tensor_parallel >= 8:
        found.append(Finding("warning", f"{exp.node}: GPUs talk over PCIe only and a pool runs "
                             f"tensorParallel {exp.max_tensor_parallel} here; all-reduce will be slow",
                             "consider tensorParallel 4 with replicasPerNode 2 on PCIe nodes"))
    hca = exp.hca
    if hca is not None and hca["device"] in topo.nics:
        near = [g for g, kind in topo.nics[str(hca["device"])].items() if kind in ("PIX", "PXB")]
        if not near:
            found.append(Finding("warning", f"{exp.node}: {hca['device']} is not behind a PCIe switch with any GPU",
                                 "GPUDirect RDMA will cross the CPU; pick the HCA closest to the GPUs if there is one"))
    return found


def check_hca(exp: Expectation, out: Outputs) -> List[Finding]:
    """The HCA NCCL uses: present, port Active/LinkUp at the expected rate and link layer."""
    hca = exp.hca
    if hca is None:
        return []
    device, port = str(hca["device"]), int(hca["port"])  # type: ignore[call-overload]
    where = f"nodes.{exp.node}.hca (or nodeDefaults.hca)"
    if out.ibstat is None:
        return _missing(out, "ibstat", "ibstat", "install infiniband-diags (and the MLNX_OFED/rdma-core driver)")
    cas = parse_ibstat(out.ibstat)
    found: List[Finding] = []
    if out.ibv_devices is not None and device not in parse_ibv_devices(out.ibv_devices):
        found.append(Finding("error", f"{exp.node}: ibv_devices does not list {device}",
                             "load the RDMA driver (rdma-core / MLNX_OFED) so the verbs device exists"))
    if device not in cas:
        return found + [Finding("error", f"{exp.node}: no HCA {device}; ibstat shows {', '.join(cas) or 'none'}",
                                f"set {where}.device to one of them")]
    if port not in cas[device]:
        return found + [Finding("error", f"{exp.node}: {device} has no port {port}",
                                f"set {where}.port to one of {', '.join(map(str, cas[device]))}")]
    p = cas[device][port]
    if p.state != "Active" or p.physical_state != "LinkUp":
        fix = ("the link is up but no subnet manager assigned it: start opensm or check the switch's SM"
               if p.physical_state == "LinkUp" else "check the cable, the switch port and `ibstat` on the peer")
        found.append(Finding("error", f"{exp.node}: {device} port {port} is {p.state}/{p.physical_state}, "
                             "not Active/LinkUp", fix))
    if p.rate_gbps < int(hca["rate_gbps"]):  # type: ignore[call-overload]
        found.append(Finding("error", f"{exp.node}: {device} port {port} runs at {p.rate_gbps} Gb/s, "
                             f"the stack expects {hca['rate_gbps']}",
                             f"check cable/transceiver and switch port speed, or set {where}.rateGbps"))
    if p.link_layer.lower() != str(hca["link_layer"]):
        found.append(Finding("error", f"{exp.node}: {device} port {port} link layer is {p.link_layer}, "
                             f"the stack says {hca['link_layer']}",
                             f"set {where}.linkLayer to {p.link_layer.lower()!r}"))
    return found


def check_container_runtime(exp: Expectation, out: Outputs) -> List[Finding]:
    """Docker present, with the NVIDIA runtime registered or its --gpus hook installed."""
    if out.docker_info is None:
        return _missing(out, "docker_info", "docker info",
                        "install Docker (>= 19.03) and let the SSH user run it (root or the docker group)")
    runtimes, _default = parse_docker_runtimes(out.docker_info)
    if "nvidia" not in runtimes and not out.container_cli:
        return [Finding("error", f"{exp.node}: Docker has no nvidia runtime ({' '.join(runtimes) or 'none'}) "
                        "and nvidia-container-cli is missing",
                        "install nvidia-container-toolkit, then `nvidia-ctk runtime configure --runtime=docker` "
                        "and `systemctl restart docker`")]
    return []


def check_disk(exp: Expectation, out: Outputs) -> List[Finding]:
    """Free space at diskPath for the weights still to come plus minFreeDiskGib (left free after the copy)."""
    if out.df is None:
        return _missing(out, "df", f"df -Pk {exp.disk_path}", f"create {exp.disk_path} (nodes.{exp.node}.diskPath)")
    available = parse_df_available(out.df)
    to_copy = sum(max(0, int(m["size_bytes"]) - out.present_bytes.get(str(m["path"]), 0))  # type: ignore[call-overload]
                  for m in exp.models)
    need = to_copy + exp.min_free_gib * GIB
    if available < need:
        return [Finding("error", f"{exp.node}: {available / GIB:.0f} GiB free at {exp.disk_path}, "
                        f"need {need / GIB:.0f} GiB (weights still to copy: {to_copy / GIB:.0f} GiB, "
                        f"minFreeDiskGib: {exp.min_free_gib})",
                        f"free space on {exp.disk_path} or point nodes.{exp.node}.diskPath at a larger disk")]
    return []


def parse_mem_total(text: str) -> int:
    """Bytes of RAM the kernel manages (MemTotal in /proc/meminfo, in kB)."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemTotal line")


# MemTotal is what the kernel manages: a few percent below the installed RAM (firmware, kernel image).
MEMORY_SHORTFALL = 0.9


def _proc_figure(node: str, text: Optional[str], path: str, parse: Callable[[str], int],
                 ) -> Tuple[Optional[int], List[Finding]]:
    """A figure parsed from a /proc file the node gave (None when not read), or a warning that it does not parse."""
    if text is None:
        return None, []
    try:
        return parse(text), []
    except ValueError as e:
        return None, [Finding("warning", f"{node}: cannot read {path} ({e})", "check /proc is mounted")]


def check_memory(exp: Expectation, out: Outputs) -> List[Finding]:
    """The node has about the RAM the stack says (host-memory judged swap space and CPU offload against it)."""
    if not exp.memory_gib:
        return []
    total, found = _proc_figure(exp.node, out.meminfo, exp.meminfo_path, parse_mem_total)
    if total is not None and total < MEMORY_SHORTFALL * exp.memory_gib * GIB:
        return [Finding("warning", f"{exp.node} has {total / GIB:.0f} GiB of RAM (MemTotal), the stack says "
                        f"{exp.memory_gib:g} GiB ({exp.memory_key}): the host-memory check judged swap space and "
                        "CPU offload against the larger figure",
                        f"state the node's RAM: {exp.memory_key.split(',')[0]}: {total // GIB}")]
    return found


def parse_insecure_registries(docker_info: str) -> List[str]:
    """The running dockerd's `Insecure Registries:` (hosts, host:port, CIDRs): it does not verify their TLS."""
    out: List[str] = []
    indent: Optional[int] = None
    for line in docker_info.splitlines():
        depth = len(line) - len(line.lstrip())
        if line.strip() == "Insecure Registries:":
            indent = depth
        elif indent is not None:
            if depth <= indent or not line.strip():
                break
            out.append(line.strip())
    return out


def insecure(registry: str, entries: List[str]) -> bool:
    """Whether dockerd reaches `registry` (host[:port]) without verifying it: its name listed, or its address
    in a listed CIDR (docker's registry config: index names match exactly, CIDRs by IP)."""
    if registry in entries:
        return True
    host = split_host_port(registry)[0]
    try:
        addresses = [ipaddress.ip_address(host)]
    except ValueError:  # a name: dockerd looks it up and matches each of its addresses (localhost: 127.0.0.1)
        try:
            addresses = [ipaddress.ip_address(a[4][0]) for a in socket.getaddrinfo(host, None)]
        except (OSError, ValueError):
            return False
    networks = [ipaddress.ip_network(e, strict=False) for e in entries if "/" in e]
    return any(a in n for a in addresses for n in networks if a.version == n.version)


def split_host_port(registry: str) -> Tuple[str, int]:
    """`198.18.0.2:5000` -> ("198.18.0.2", 5000); a registry without a port is on HTTPS's 443."""
    host, sep, port = registry.rpartition(":")
    return (host, int(port)) if sep and port.isdigit() else (registry, 443)


def check_registry(exp: Expectation, out: Outputs) -> List[Finding]:
    """dockerd trusts the private registry (images.registry): listed insecure, or its certificate verifies
    against the CA in certs.d/<registry>/ or the system CAs, as dockerd verifies a pull."""
    if not exp.registry or out.docker_info is None or out.registry_tls is None:
        return []  # no registry, or no Docker (check_container_runtime says so)
    state, detail = out.registry_tls
    where = f"{exp.docker_certs_dir}/{exp.registry}"
    if state == "unreachable":
        return [Finding("error", f"{exp.node}: cannot reach the private registry {exp.registry} (images.registry) "
                        f"to check that dockerd trusts it: {detail}",
                        f"check images.registry, and that {exp.node} reaches {exp.registry} (route, firewall); "
                        "every image is pulled from it")]
    if state != "untrusted":
        return []
    cas = ", ".join(out.registry_cas)
    said = (f"its certificate does not verify against {cas} or the system CAs" if out.registry_cas else
            f"{where}/ holds no CA (*.crt), {exp.registry} is not among docker info's Insecure Registries, and its "
            "certificate does not verify against the system CAs")
    return [Finding("error", f"{exp.node}: dockerd does not trust the private registry {exp.registry} "
                    f"(images.registry): {said} ({detail}); every pull from it would fail",
                    f"copy the CA that signed {exp.registry}'s certificate to {where}/ca.crt on {exp.node} "
                    "(dockerd reads it at the next pull), or add it to the system CAs (update-ca-certificates) "
                    "and restart docker; a registry without TLS goes in insecure-registries of "
                    "/etc/docker/daemon.json")]


def check_tarballs(exp: Expectation, out: Outputs) -> List[Finding]:
    """The tarball directory (images.tarballs) holds every image the plan `docker load`s on this node."""
    if not out.tarballs_missing:
        return []
    folder = os.path.dirname(out.tarballs_missing[0])
    names = ", ".join(os.path.basename(t) for t in out.tarballs_missing)
    return [Finding("error", f"{exp.node}: {folder} (images.tarballs) lacks {len(out.tarballs_missing)} of the "
                    f"{len(exp.tarballs)} image tarball(s) the plan loads here: {names}",
                    f"copy them to {folder}/ on {exp.node}: `python -m plan.images` prints the script that "
                    "`docker save`s each under that name on a machine that reaches the registries")]


def parse_cpu_count(text: str) -> int:
    """Logical CPUs the kernel lists in /proc/cpuinfo (one `processor` entry each, as `nproc` counts them)."""
    count = sum(1 for line in text.splitlines() if re.match(r"processor\s*:", line))
    if not count:
        raise ValueError("no processor entries")
    return count


def check_cpus(exp: Expectation, out: Outputs) -> List[Finding]:
    """The node has the CPUs the stack says (llama.cpp's threads per server are split from that figure)."""
    if not exp.cpu_cores:
        return []
    count, found = _proc_figure(exp.node, out.cpuinfo, exp.cpuinfo_path, parse_cpu_count)
    if count is not None and count < exp.cpu_cores:
        return [Finding("warning", f"{exp.node} has {count} CPUs ({exp.cpuinfo_path}), the stack says "
                        f"{exp.cpu_cores} ({exp.cpu_key}): the threads of its servers were planned for the larger "
                        "figure and would compete for the cores",
                        f"state the node's CPUs: {exp.cpu_key.split(',')[0]}: {count}")]
    return found


CHRONY_FIX = ("install chrony and point it at your NTP servers (apt-get install chrony; `chronyc sources` "
              "shows them): Ray's workers and TLS certificates need the nodes' clocks in step")


def check_clock(exp: Expectation, out: Outputs) -> List[Finding]:
    """The clock is disciplined by chrony or systemd-timesyncd, and chrony's offset is within the bound."""
    try:
        state = (parse_chrony_tracking(out.chrony) if out.chrony is not None
                 else parse_timedatectl(out.timedatectl) if out.timedatectl is not None else None)
    except ValueError as e:
        return [Finding("error", f"{exp.node}: cannot read the clock's state ({e})", CHRONY_FIX)]
    if state is None:
        why = out.errors.get("chrony") or out.errors.get("timedatectl") or "neither is installed"
        return [Finding("error", f"{exp.node}: no time synchronisation found (chronyc and timedatectl: {why})",
                        CHRONY_FIX)]
    if not state.synchronised:
        shown = "chronyc tracking: Leap status Not synchronised" if state.source == "chrony" \
            else "timedatectl: System clock synchronized: no"
        return [Finding("error", f"{exp.node}: the clock is not synchronised ({shown})", CHRONY_FIX)]
    if state.offset_s is not None and abs(state.offset_s) > exp.max_clock_offset_s:
        return [Finding("error", f"{exp.node}: chrony says the clock is {abs(state.offset_s):.3f} s "
                        f"{'fast' if state.offset_s > 0 else 'slow'} of NTP time (bound: "
                        f"preflight.maxClockOffsetSeconds {exp.max_clock_offset_s:g})",
                        "let chrony step the clock (`chronyc makestep`) and check its sources (`chronyc sources`)")]
    return []


def check_nft(exp: Expectation, out: Outputs) -> List[Finding]:
    """nftables is there when llm-cluster manages the host firewall."""
    if exp.firewall and out.nft is None:
        return [Finding("error", f"{exp.node}: `nft` is missing ({out.errors.get('nft', 'not installed')}); "
                        "llm-cluster loads the host firewall with it",
                        "install nftables (apt-get install nftables), or set firewall.managed: false and "
                        "close the cluster's ports yourself")]
    return []


CHECKS: List[Callable[[Expectation, Outputs], List[Finding]]] = [
    check_gpus, check_topology, check_hca, check_container_runtime, check_disk, check_clock, check_nft,
    check_memory, check_cpus, check_registry, check_tarballs]


def check_node(exp: Expectation, out: Outputs) -> List[Finding]:
    """Every preflight finding for one node, errors first."""
    found = [f for check in CHECKS for f in check(exp, out)]
    return sorted(found, key=lambda f: f.level != "error")


# --- on the node ---------------------------------------------------------------------------------

Runner = Callable[[List[str]], Tuple[int, str, str]]


def run_command(argv: List[str]) -> Tuple[int, str, str]:
    """Run a command; (127, "", reason) when it is not installed."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    except OSError as e:
        return 127, "", str(e)
    return p.returncode, p.stdout, p.stderr


def registry_tls(registry: str, cafiles: List[str], timeout_s: float = 10) -> Tuple[str, str]:
    """A TLS handshake with the registry verified as dockerd verifies it: the system CAs plus the CA files
    of its certs.d directory, the certificate's name against the registry's host."""
    host, port = split_host_port(registry)
    context = ssl.create_default_context()  # the system CAs (OpenSSL's store; dockerd's Go reads the same files)
    for cafile in cafiles:
        try:
            context.load_verify_locations(cafile)
        except (OSError, ssl.SSLError) as e:
            return "untrusted", f"{cafile} is not a PEM certificate: {e}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            with context.wrap_socket(sock, server_hostname=host):
                return "ok", ""
    except ssl.SSLCertVerificationError as e:
        return "untrusted", str(e.verify_message or e)
    except (OSError, ssl.SSLError) as e:
        return "unreachable", str(e)


def collect(exp: Expectation, run: Runner = run_command) -> Outputs:
    """Run the tools on the node and keep their raw outputs."""
    out = Outputs()

    def take(key: str, argv: List[str], accept_partial: bool = False) -> Optional[str]:
        code, stdout, stderr = run(argv)
        # ibstat exits non-zero when one CA of many fails (ibpanic) but still prints the others.
        if code == 0 or (accept_partial and stdout.strip()):
            return stdout
        out.errors[key] = (stderr.strip().splitlines() or [f"exit status {code}"])[-1]
        return None

    out.gpus = take("gpus", ["nvidia-smi", f"--query-gpu={GPU_QUERY_FIELDS}", "--format=csv,noheader"])
    if out.gpus is None:
        # Drivers before ~510 refuse the compute_cap field; the model name still identifies the GPU.
        out.gpus = take("gpus", ["nvidia-smi", f"--query-gpu={GPU_QUERY_FIELDS_OLD_DRIVER}", "--format=csv,noheader"])
    out.topo = take("topo", ["nvidia-smi", "topo", "-m"])
    if exp.hca is not None:
        out.ibstat = take("ibstat", ["ibstat"], accept_partial=True)
        out.ibv_devices = take("ibv_devices", ["ibv_devices"])
    out.docker_info = take("docker_info", ["docker", "info"], accept_partial=True)
    out.container_cli = run(["nvidia-container-cli", "--version"])[0] == 0
    out.df = take("df", ["df", "-Pk", exp.disk_path])
    out.chrony = take("chrony", ["chronyc", "-n", "tracking"])
    if out.chrony is None:
        out.timedatectl = take("timedatectl", ["timedatectl", "status"])
    if exp.firewall:
        out.nft = take("nft", ["nft", "--version"])
    try:
        with open(exp.meminfo_path) as f:
            out.meminfo = f.read()
    except OSError as e:
        out.errors["meminfo"] = str(e)
    try:
        with open(exp.cpuinfo_path) as f:
            out.cpuinfo = f.read()
    except OSError as e:
        out.errors["cpuinfo"] = str(e)
    if exp.registry and out.docker_info is not None and not insecure(
            exp.registry, parse_insecure_registries(out.docker_info)):
        folder = os.path.join(exp.docker_certs_dir, exp.registry)
        out.registry_cas = sorted(os.path.join(folder, f) for f in (os.listdir(folder) if os.path.isdir(folder) else [])
                                  if f.endswith(".crt"))
        out.registry_tls = registry_tls(exp.registry, out.registry_cas)
    out.tarballs_missing = [t for t in exp.tarballs if not (os.path.isfile(t) and os.path.getsize(t) > 0)]
    for m in exp.models:
        code, stdout, _ = run(["du", "-sb", str(m["path"])])
        out.present_bytes[str(m["path"])] = int(stdout.split()[0]) if code == 0 and stdout.strip() else 0
    return out


def main(argv: List[str]) -> int:
    """`python3 - <expectation json>`: print every finding; exit 1 when any is an error."""
    exp = Expectation.from_json(argv[0])
    findings = check_node(exp, collect(exp))
    for f in findings:
        print(f, file=sys.stderr if f.level == "error" else sys.stdout)
    errors = sum(f.level == "error" for f in findings)
    print(f"preflight {exp.node}: {errors} error(s), {len(findings) - errors} warning(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
