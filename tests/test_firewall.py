"""Host firewall: the generated nftables ruleset (exact, `nft -c`), its scripts (shellcheck), the
GpuNode wiring and policy advice, and the real thing loaded in network namespaces of our own."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.planning.nodes import firewall
from components.spec import SpecError, StackSpec
from plan.harness import ProgramRun
from plan.stackfile import load_stack_file
from tests.support import tool

NS = "llm-cluster:"


def spec_of(config: dict[str, Any]) -> StackSpec:
    return load_stack_config(config, set())


def test_a_chat_node_closes_its_services_and_the_ephemeral_range_to_all_but_the_cluster(prod_spec: StackSpec) -> None:
    assert firewall.ruleset(prod_spec, "gpu-04") == textwrap.dedent("""\
        # llm-cluster host firewall of gpu-04: `nft delete table inet llm_cluster` removes all of it.
        # Closed to all but the cluster's nodes and firewall.trustedSources (TCP):
        #   8000         pools.chat.port
        #   9100         monitoring.nodeExporter.port
        #   9400         monitoring.dcgmExporter.port
        #   32768-60999  ephemeral ports: NCCL, Gloo, raylet, object manager, vLLM workers
        table inet llm_cluster
        delete table inet llm_cluster
        table inet llm_cluster {
        \tset cluster_v4 {
        \t\ttype ipv4_addr
        \t\tflags interval
        \t\telements = { 192.168.10.11, 192.168.10.12, 192.168.10.13, 192.168.10.14, 192.168.10.15, 192.168.10.16 }
        \t}
        \tchain input {
        \t\ttype filter hook input priority filter; policy accept;
        \t\tiifname "lo" accept
        \t\tct state established,related accept
        \t\ttcp dport 22 accept comment "SSH is never blocked"
        \t\tip saddr @cluster_v4 accept comment "cluster nodes and trusted sources"
        \t\ttcp dport { 8000, 9100, 9400, 32768-60999 } drop comment "llm-cluster services: cluster only"
        \t}
        }
        """)


def test_the_ray_head_also_closes_ray_ports_and_opens_the_gateway_to_allow_from(prod_spec: StackSpec) -> None:
    rules = firewall.ruleset(prod_spec, "gpu-01")
    assert "tcp dport { 3000, 6379, 8000, 8265, 9090, 9100, 9145, 9400, 10001-19999, 32768-60999 } drop" in rules
    # The gateway port is never in the cluster-only set; anyone may reach it by default.
    assert "\t\ttcp dport 443 ip saddr @gateway_v4 accept" in rules and "elements = { 0.0.0.0/0 }" in rules
    assert "\t\ttcp dport 443 ip6 saddr @gateway_v6 accept" in rules and "elements = { ::/0 }" in rules
    order = [
        rules.index(s)
        for s in (
            "tcp dport 22 accept",
            "ip saddr @cluster_v4 accept",
            "tcp dport 443 ip saddr",
            "tcp dport 443 drop",
            "10001-19999",
        )
    ]
    assert order == sorted(order)
    # The Ray worker (no GCS there) still closes Ray's worker range.
    assert "tcp dport { 9100, 9400, 10002-19999, 32768-60999 } drop" in firewall.ruleset(prod_spec, "gpu-02")


def test_allow_from_trusted_sources_and_ephemeral_ports_come_from_the_stack(config: dict[str, Any]) -> None:
    config[NS + "gateway"]["allowFrom"] = ["10.20.0.0/16", "2001:db8::/32"]
    config[NS + "firewall"] = {"trustedSources": ["10.99.0.0/24", "192.168.10.11"], "ephemeralPorts": [40000, 50000]}
    rules = firewall.ruleset(spec_of(config), "gpu-01")
    assert (
        "elements = { 192.168.10.11, 192.168.10.12, 192.168.10.13, 192.168.10.14, 192.168.10.15, "
        "192.168.10.16, 10.99.0.0/24 }" in rules
    )
    assert "elements = { 10.20.0.0/16 }" in rules and "elements = { 2001:db8::/32 }" in rules
    assert "cluster_v6" not in rules
    assert "10001-19999, 40000-50000 }" in rules
    # A trusted subnet holding node addresses: one element, since nft refuses overlapping intervals.
    config[NS + "firewall"] = {"trustedSources": ["192.168.10.0/28"]}
    rules = firewall.ruleset(spec_of(config), "gpu-01")
    assert "elements = { 192.168.10.0/28, 192.168.10.16 }" in rules


def test_overlapping_sources_still_pass_nft_check(config: dict[str, Any], tmp_path: Path) -> None:
    config[NS + "firewall"] = {"trustedSources": ["192.168.10.0/24", "192.168.0.0/16", "fd00::/8", "fd00::1"]}
    config[NS + "gateway"]["allowFrom"] = ["10.0.0.0/8", "10.1.0.0/16"]
    (tmp_path / "rules.nft").write_text(firewall.ruleset(spec_of(config), "gpu-01"))
    subprocess.run([tool("nft"), "-c", "-f", str(tmp_path / "rules.nft")], check=True, capture_output=True, text=True)


def test_the_http_redirect_port_is_open_to_allow_from_beside_the_tls_port(
    config: dict[str, Any], tmp_path: Path
) -> None:
    config[NS + "gateway"].update(httpRedirectPort=80, allowFrom=["10.20.0.0/16", "2001:db8::/32"])
    spec = spec_of(config)
    rules = firewall.ruleset(spec, "gpu-01")
    # Clients sent to HTTPS by the 308 on port 80 must reach port 80 first: both ports, same sources.
    assert '\t\ttcp dport { 443, 80 } ip saddr @gateway_v4 accept comment "gateway.allowFrom"\n' in rules
    assert '\t\ttcp dport { 443, 80 } ip6 saddr @gateway_v6 accept comment "gateway.allowFrom"\n' in rules
    assert '\t\ttcp dport { 443, 80 } drop comment "gateway: not in gateway.allowFrom"\n' in rules
    closed = re.search(r"tcp dport \{ ([^}]*) \} drop comment \"llm-cluster services", rules)
    assert closed is not None and "80" not in closed.group(1).split(", ")
    assert "80" not in [p.nft() for p in firewall.guarded_ports(spec, "gpu-01")]
    (tmp_path / "rules.nft").write_text(rules)
    subprocess.run([tool("nft"), "-c", "-f", str(tmp_path / "rules.nft")], check=True, capture_output=True, text=True)
    # Another node does not serve the gateway: nothing of it opened there.
    assert "dport { 443, 80 }" not in firewall.ruleset(spec, "gpu-02")


def test_a_service_port_inside_a_range_merges_instead_of_overlapping(config: dict[str, Any]) -> None:
    config[NS + "pools"]["chat"]["port"] = 40000
    rules = firewall.ruleset(spec_of(config), "gpu-04")
    assert "#   40000        pools.chat.port" in rules
    assert "tcp dport { 9100, 9400, 32768-60999 } drop" in rules


@pytest.mark.parametrize(
    ("change", "path", "message"),
    [
        (
            lambda c: c[NS + "gateway"].update(allowFrom=["10.0.0.1/8"]),
            "gateway.allowFrom[0]",
            "'10.0.0.1/8' is not a CIDR network (10.0.0.1/8 has host bits set); did you mean 10.0.0.0/8?",
        ),
        (lambda c: c[NS + "gateway"].update(allowFrom=[]), "gateway.allowFrom", "[] is not allowed: must not be empty"),
        (
            lambda c: c.update({NS + "firewall": {"trustedSources": ["office"]}}),
            "firewall.trustedSources[0]",
            "'office' is not a CIDR network ('office' does not appear to be an IPv4 or IPv6 network)",
        ),
        (
            lambda c: c.update({NS + "firewall": {"ephemeralPorts": [60999, 32768]}}),
            "firewall.ephemeralPorts",
            "60999 > 32768: give [first, last] of the range",
        ),
        (
            lambda c: c.update({NS + "firewall": {"enabled": False}}),
            "firewall.enabled",
            "unknown key 'enabled'; allowed keys here: ephemeralPorts, managed, trustedSources",
        ),
    ],
)
def test_bad_firewall_settings_are_refused_naming_the_key(
    config: dict[str, Any], change: Any, path: str, message: str
) -> None:
    change(config)
    with pytest.raises(SpecError) as err:
        spec_of(config)
    assert [(i.path, i.message) for i in err.value.issues] == [(path, message)]


@pytest.mark.parametrize("node", [f"gpu-0{i}" for i in range(1, 7)])
def test_every_nodes_ruleset_passes_nft_check(prod_spec: StackSpec, node: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.nft"
    path.write_text(firewall.ruleset(prod_spec, node))
    subprocess.run([tool("nft"), "-c", "-f", str(path)], check=True, capture_output=True, text=True)


def test_scripts_are_shellcheck_clean(prod_spec: StackSpec, tmp_path: Path) -> None:
    for name, text in (
        ("create.sh", firewall.create_script(prod_spec, "gpu-01")),
        ("delete.sh", firewall.delete_script("gpu-01")),
    ):
        (tmp_path / name).write_text(text)
        subprocess.run([tool("shellcheck"), "-s", "bash", str(tmp_path / name)], check=True)


def test_gpu_node_loads_the_firewall_after_preflight_and_before_any_container(prod_run: ProgramRun) -> None:
    fw = prod_run.get("gpu-02-firewall")
    assert fw.dependencies == [prod_run.get("gpu-02-preflight").urn]
    assert fw.options.get("deleteBeforeReplace") is True
    inputs = fw.plain_inputs()
    assert 'nft -c -f "$tmp"' in inputs["create"] and "nft delete table inet llm_cluster" in inputs["delete"]
    worker = prod_run.get("reasoning-gpu-01-ray-worker-gpu-02")
    assert fw.urn in worker.dependencies
    node = prod_run.get("gpu-02")
    assert node.inputs["firewallManaged"] is True


def test_an_unmanaged_firewall_registers_nothing_and_gets_the_advisory(
    config: dict[str, Any], stack_runner: Any
) -> None:
    from tests.support.policies import analyze, only

    config[NS + "firewall"] = {"managed": False}
    run = stack_runner(config)
    assert not [r for r in run.registrations if r.name.endswith("-firewall")]
    props = run.get("gpu-04").plain_inputs()
    assert props["firewallManaged"] is False
    assert analyze("llm-cluster:node:GpuNode", "gpu-04", {**props, "gpuCount": 8.0}) == only(
        "host-firewall",
        "firewall.managed is false: node gpu-04 relies on your own firewall. Ray's GCS, dashboard and client "
        "ports run code for anyone who reaches them; let only the cluster's nodes reach TCP 8000 (pools.chat.port), "
        "9100 (monitoring.nodeExporter.port), 9400 (monitoring.dcgmExporter.port), 32768-60999 (ephemeral ports: "
        "NCCL, Gloo, raylet, object manager, vLLM workers) (keep SSH and the gateway open), or set "
        "firewall.managed: true.",
        level="advisory",
    )
    assert analyze("llm-cluster:node:GpuNode", "gpu-04", {**props, "firewallManaged": True}) == []


# --- for real: network namespaces opsfw-* on 198.18.9.0/24 -----------------------------------------

SUBNET = "198.18.9"
# Names of this process's own (opsfw-<pid>-…): several runs of the suite may share the machine. The
# subnet is private to each run's bridge namespace, so the addresses never meet.
_RUN = f"opsfw-{os.getpid()}"
N1, N2, OUT = f"{_RUN}-n1", f"{_RUN}-n2", f"{_RUN}-out"
HOSTS = {N1: f"{SUBNET}.1", N2: f"{SUBNET}.2", OUT: f"{SUBNET}.100"}
BRIDGE_NS = f"{_RUN}-br"
# gpu-01 of the reference stack: gateway 443, Ray head 6379/8265/10001, vLLM 8000, exporters, Grafana;
# 15000 in Ray's worker range, 40000 ephemeral (NCCL), 7000 nobody's (left alone), 22 SSH.
PROBE_PORTS = [22, 443, 3000, 6379, 7000, 8000, 8265, 9100, 9400, 10001, 15000, 40000]
CLUSTER_ONLY = [3000, 6379, 8000, 8265, 9100, 9400, 10001, 15000, 40000]

LISTEN = """
import socket, sys, threading
socks = []
for p in map(int, sys.argv[1:]):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", p)); s.listen(64)
    socks.append(s)
def serve(s):
    while True:
        c, _ = s.accept(); c.close()
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""

PROBE = """
import json, socket, sys
host, ports = sys.argv[1], map(int, sys.argv[2:])
res = {}
for p in ports:
    try:
        socket.create_connection((host, p), timeout=0.6).close(); res[p] = "open"
    except OSError:
        res[p] = "closed"
print(json.dumps(res))
"""


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=60)


def in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh("ip", "netns", "exec", ns, *argv, check=check)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_namespaces() -> None:
    """Ours, and those of earlier runs killed mid-way (their process is gone)."""
    stale = [
        name
        for name in sh("ip", "netns", "list").stdout.split()
        if (m := re.match(r"^opsfw-(\d+)-", name)) and not _alive(int(m.group(1)))
    ]
    for ns in [*HOSTS, BRIDGE_NS, *stale]:
        sh("ip", "netns", "delete", ns, check=False)


@contextlib.contextmanager
def namespaces() -> Iterator[None]:
    """Two cluster hosts and an outsider on one bridge; always removed."""
    tool("ip")
    remove_namespaces()  # a previous run killed mid-way
    try:
        sh("ip", "netns", "add", BRIDGE_NS)
        sh("ip", "-n", BRIDGE_NS, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", BRIDGE_NS, "link", "set", "br0", "up")
        for i, (ns, addr) in enumerate(HOSTS.items()):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", f"p{i}", "netns", BRIDGE_NS, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", BRIDGE_NS, "link", "set", f"p{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield
    finally:
        remove_namespaces()


@contextlib.contextmanager
def listening(ns: str, ports: list[int]) -> Iterator[None]:
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, "python3", "-c", LISTEN, *map(str, ports)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)


def probe(src: str, dst: str) -> dict[int, str]:
    out = in_ns(src, "python3", "-c", PROBE, dst, *map(str, PROBE_PORTS)).stdout
    return {int(k): v for k, v in json.loads(out).items()}


def lab_spec(config: dict[str, Any], allow_from: list[str] | None = None) -> StackSpec:
    for i, node in enumerate(config[NS + "nodes"].values(), start=1):
        node["address"] = f"{SUBNET}.{i}"
    if allow_from is not None:
        config[NS + "gateway"]["allowFrom"] = allow_from
    return spec_of(config)


def test_in_namespaces_outsiders_reach_only_gateway_and_ssh_and_cluster_hosts_reach_everything(
    config: dict[str, Any], tmp_path: Path
) -> None:
    tool("nft")
    spec = lab_spec(config)
    n1 = HOSTS[N1]
    create = tmp_path / "create.sh"
    delete = tmp_path / "delete.sh"
    create.write_text(firewall.create_script(spec, "gpu-01", rules_dir=str(tmp_path / "etc")))
    delete.write_text(firewall.delete_script("gpu-01", rules_dir=str(tmp_path / "etc")))
    with namespaces(), listening(N1, PROBE_PORTS):
        assert set(probe(OUT, n1).values()) == {"open"}  # nothing filtered yet
        # Someone else's table, which ours must leave alone.
        in_ns(N1, "nft", "add", "table", "inet", "opsfw_other")
        first = in_ns(N1, "bash", str(create))
        assert "firewall: table inet llm_cluster loaded" in first.stdout
        listed = in_ns(N1, "nft", "list", "table", "inet", "llm_cluster").stdout
        assert in_ns(N1, "bash", str(create)).returncode == 0  # a second run replaces, same table
        assert in_ns(N1, "nft", "list", "table", "inet", "llm_cluster").stdout == listed

        outside = probe(OUT, n1)
        assert {p for p, s in outside.items() if s == "open"} == {22, 443, 7000}
        assert probe(N2, n1) == {p: "open" for p in PROBE_PORTS}

        # allowFrom narrows the gateway for outsiders only.
        (tmp_path / "narrow.sh").write_text(
            firewall.create_script(lab_spec(config, ["203.0.113.0/24"]), "gpu-01", rules_dir=str(tmp_path / "etc"))
        )
        in_ns(N1, "bash", str(tmp_path / "narrow.sh"))
        assert probe(OUT, n1)[443] == "closed" and probe(OUT, n1)[22] == "open"
        assert probe(N2, n1)[443] == "open"

        gone = in_ns(N1, "bash", str(delete))
        assert "removed" in gone.stdout
        tables = in_ns(N1, "nft", "list", "tables").stdout
        assert "llm_cluster" not in tables and "table inet opsfw_other" in tables
        assert set(probe(OUT, n1).values()) == {"open"}
        assert in_ns(N1, "bash", str(delete)).returncode == 0  # deleting twice is fine
        assert not (tmp_path / "etc" / "firewall.nft").exists()
    assert not set(sh("ip", "netns", "list").stdout.split()) & {*HOSTS, BRIDGE_NS}


def test_in_namespaces_the_master_port_answers_the_instances_nodes_only(tmp_path: Path) -> None:
    # The native-launcher example: reasoning on gpu-01 (n1) + gpu-02 (n2); gpu-03 (the third namespace) is a
    # cluster node outside the instance: it reaches vLLM's API, not the torch.distributed rendezvous.
    tool("nft")
    root = Path(__file__).resolve().parent.parent
    config = load_stack_file(root / "Pulumi.vllm-native-multinode.yaml", "vllm-native-multinode").config
    config[NS + "nodes"]["gpu-03"] = {}
    lab_spec(config)  # n1, n2 and a third address
    config[NS + "nodes"]["gpu-03"]["address"] = HOSTS[OUT]
    spec = spec_of(config)
    ports = ["29501", "8000", "6379"]
    create = tmp_path / "create.sh"
    create.write_text(firewall.create_script(spec, "gpu-01", rules_dir=str(tmp_path / "etc")))
    with namespaces(), listening(N1, [29501, 8000, 6379]):
        in_ns(N1, "bash", str(create))
        seen = {src: json.loads(in_ns(src, "python3", "-c", PROBE, HOSTS[N1], *ports).stdout) for src in (N2, OUT)}
    # 6379 is no port of this stack (no Ray): left alone, open to anyone.
    assert seen == {
        N2: {"29501": "open", "8000": "open", "6379": "open"},
        OUT: {"29501": "closed", "8000": "open", "6379": "open"},
    }


def test_the_script_refuses_a_node_whose_ephemeral_range_is_wider(config: dict[str, Any], tmp_path: Path) -> None:
    tool("nft")
    config[NS + "firewall"] = {"ephemeralPorts": [40000, 60999]}
    script = tmp_path / "create.sh"
    script.write_text(firewall.create_script(lab_spec(config), "gpu-04", rules_dir=str(tmp_path / "etc")))
    with namespaces():
        run = in_ns(N1, "bash", str(script), check=False)
        assert run.returncode == 1
        assert "fix: set firewall.ephemeralPorts to [32768, 60999]" in run.stderr
        assert "llm_cluster" not in in_ns(N1, "nft", "list", "tables").stdout
