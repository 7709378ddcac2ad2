"""Host firewall: one nftables table of llm-cluster's own per node, and the scripts that load and remove it.

Why: Ray 2.x binds its GCS, dashboard, client server, raylet and object manager on every interface
and has no authentication (whoever reaches the GCS or the dashboard runs code on the cluster);
NCCL, Gloo and vLLM's workers listen on ephemeral ports; the exporters serve to anyone.

The table (`inet llm_cluster`, an input base chain with policy accept) closes exactly the ports the
stack puts on a node, Ray's worker range and the ephemeral range to every source but the cluster's
node addresses (and `firewall.trustedSources`); the gateway's ports (its port, and the plain-HTTP
port that redirects to it when `gateway.httpRedirectPort` is set) are open to `gateway.allowFrom`;
the SSH port is accepted before anything else. The rendezvous port of an instance on the engine's own
multi-node launcher (`pools.<pool>.vllm.masterPort`) is narrower still: open to that instance's nodes only. Nothing else is filtered, and no other table is
touched: a drop in any table drops, so other tables keep working as they did, and deleting ours
undoes exactly what it added. The file loads as one transaction (`table …; delete table …;
table … { … }`), so a re-run replaces the table atomically and a second run changes nothing.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass

from components.planning.nodes.scripts import refuse_heredoc_end
from components.spec import StackSpec
from components.spec.topology import all_instances, host_ports

TABLE = "llm_cluster"
FAMILY = "inet"
RULES_DIR = "/etc/llm-cluster"
UNIT = "llm-cluster-firewall.service"
UNIT_FILE = f"/etc/systemd/system/{UNIT}"
# Ray's default --min-worker-port/--max-worker-port: worker processes' gRPC servers (ray start leaves them).
RAY_WORKER_PORTS = (10002, 19999)
_HEREDOC = "LLM_CLUSTER_NFT"

q = shlex.quote


@dataclass(frozen=True)
class Guarded:
    """A port or range the firewall closes to everything but the cluster, and why."""

    first: int
    last: int
    what: str

    def nft(self) -> str:
        """The element as nft writes it."""
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


def gateway_ports(spec: StackSpec) -> list[int]:
    """The ports clients reach the gateway on: its port, and the redirect to it when nginx listens there."""
    g = spec.gateway
    if g is None:
        return []
    # nginx listens on httpRedirectPort only in front of TLS (plain HTTP on it would carry keys in clear).
    return [g.port, *([g.http_redirect_port] if g.tls and g.http_redirect_port is not None else [])]


def guarded_ports(spec: StackSpec, node: str) -> list[Guarded]:
    """Every port the stack's services use on this node (the gateway's own excepted), sorted."""
    g = spec.gateway
    public = set(gateway_ports(spec)) if g is not None and g.node == node else set()
    out = [
        Guarded(port, port, key)
        for n, port, key in host_ports(spec)
        if n == node and not (port in public and key.startswith("gateway."))
    ]
    if any(node in inst.nodes and inst.uses_ray for inst in all_instances(spec)):
        out.append(Guarded(*RAY_WORKER_PORTS, "Ray worker ports (ray start defaults)"))
    first, last = spec.firewall.ephemeral_ports
    out.append(Guarded(first, last, "ephemeral ports: NCCL, Gloo, raylet, object manager, vLLM workers"))
    return sorted(out, key=lambda p: (p.first, p.last))


def instance_only_ports(spec: StackSpec, node: str) -> list[tuple[int, list[str], str]]:
    """(port, addresses, stack key) of the ports only an instance's own nodes may reach here: the rendezvous
    port of an instance on the engine's own multi-node launcher (its head is this node), open to its nodes
    and to nothing else of the cluster (a stray connection to a torch.distributed store can stall the launch)."""
    out = []
    for inst in all_instances(spec):
        if inst.native_launcher and inst.head == node and inst.master_port is not None:
            key = next(k for n, port, k in host_ports(spec) if n == node and port == inst.master_port)
            out.append((inst.master_port, [spec.nodes[n].address for n in inst.nodes], key))
    return out


def merged(ports: list[Guarded]) -> list[tuple[int, int]]:
    """Overlapping or adjacent ranges joined: nft refuses overlapping elements in one set."""
    spans: list[list[int]] = []
    for p in sorted(ports, key=lambda p: (p.first, p.last)):
        if spans and p.first <= spans[-1][1] + 1:
            spans[-1][1] = max(spans[-1][1], p.last)
        else:
            spans.append([p.first, p.last])
    return [(a, b) for a, b in spans]


def cluster_sources(spec: StackSpec) -> list[str]:
    """The node addresses plus firewall.trustedSources, as nft set elements (deduplicated, stack order)."""
    return list(dict.fromkeys([spec.nodes[n].address for n in spec.nodes] + list(spec.firewall.trusted_sources)))


def _split(cidrs: list[str]) -> tuple[list[str], list[str]]:
    """IPv4 and IPv6 elements apart (one set per family), collapsed: nft refuses overlapping intervals
    (a trusted subnet holding a node's address). A single host is written as its address."""
    nets = [ipaddress.ip_network(c) for c in cidrs]

    def family(version: int) -> list[str]:
        ours = list(dict.fromkeys(n for n in nets if n.version == version))
        # Stack order when nothing overlaps (readable); collapsed (sorted) when something does.
        overlap = any(a.overlaps(b) for i, a in enumerate(ours) for b in ours[i + 1 :])
        kept = list(ipaddress.collapse_addresses(ours)) if overlap else ours
        return [str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n) for n in dict.fromkeys(kept)]

    return family(4), family(6)


def _set(name: str, kind: str, elements: list[str]) -> str:
    return f"\tset {name} {{\n\t\ttype {kind}\n\t\tflags interval\n\t\telements = {{ {', '.join(elements)} }}\n\t}}\n"


def _elements(spans: list[tuple[int, int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def ruleset(spec: StackSpec, node: str) -> str:
    """The nft ruleset of one node: `nft -f` loads (or atomically replaces) the table, nothing else."""
    ports = guarded_ports(spec, node)
    trusted4, trusted6 = _split(cluster_sources(spec))
    lines = [
        f"# llm-cluster host firewall of {node}: `nft delete table {FAMILY} {TABLE}` removes all of it.",
        "# Closed to all but the cluster's nodes and firewall.trustedSources (TCP):",
    ]
    lines += [f"#   {p.nft():<12} {p.what}" for p in ports]
    lines += [f"table {FAMILY} {TABLE}", f"delete table {FAMILY} {TABLE}", f"table {FAMILY} {TABLE} {{"]
    body = _set("cluster_v4", "ipv4_addr", trusted4)
    if trusted6:
        body += _set("cluster_v6", "ipv6_addr", trusted6)
    g = spec.gateway
    gateway_here = g is not None and g.node == node
    if gateway_here:
        assert g is not None
        allow4, allow6 = _split(list(g.allow_from))
        if allow4:
            body += _set("gateway_v4", "ipv4_addr", allow4)
        if allow6:
            body += _set("gateway_v6", "ipv6_addr", allow6)
    rules = [
        "type filter hook input priority filter; policy accept;",
        'iifname "lo" accept',
        "ct state established,related accept",
        f'tcp dport {spec.ssh.port} accept comment "SSH is never blocked"',
    ]
    for port, addresses, key in instance_only_ports(spec, node):
        rules += [
            f'tcp dport {port} ip saddr {{ {", ".join(addresses)} }} accept comment "{key}: the instance\'s nodes"',
            f'tcp dport {port} drop comment "{key}: the instance\'s nodes only"',
        ]
    rules.append('ip saddr @cluster_v4 accept comment "cluster nodes and trusted sources"')
    if trusted6:
        rules.append('ip6 saddr @cluster_v6 accept comment "cluster nodes and trusted sources"')
    if gateway_here:
        public = gateway_ports(spec)
        dport = str(public[0]) if len(public) == 1 else "{ " + ", ".join(map(str, public)) + " }"
        if allow4:
            rules.append(f'tcp dport {dport} ip saddr @gateway_v4 accept comment "gateway.allowFrom"')
        if allow6:
            rules.append(f'tcp dport {dport} ip6 saddr @gateway_v6 accept comment "gateway.allowFrom"')
        rules.append(f'tcp dport {dport} drop comment "gateway: not in gateway.allowFrom"')
    rules.append(f'tcp dport {{ {_elements(merged(ports))} }} drop comment "llm-cluster services: cluster only"')
    body += "\tchain input {\n" + "".join(f"\t\t{r}\n" for r in rules) + "\t}\n"
    return "\n".join(lines) + "\n" + body + "}\n"


def _unit(rules_file: str) -> str:
    return f"""[Unit]
Description=llm-cluster host firewall (nftables table {FAMILY} {TABLE})
DefaultDependencies=no
Before=network-pre.target docker.service
Wants=network-pre.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/sbin/nft -f {rules_file}
ExecStop=/usr/sbin/nft delete table {FAMILY} {TABLE}

[Install]
WantedBy=multi-user.target
"""


def create_script(spec: StackSpec, node: str, rules_dir: str = RULES_DIR) -> str:
    """Check the ruleset with `nft -c`, load it, keep it for boot (a systemd unit where systemd runs)."""
    rules = ruleset(spec, node)
    first, last = spec.firewall.ephemeral_ports
    unit = _unit(f"{rules_dir}/firewall.nft")
    for text in (rules, unit):
        refuse_heredoc_end(text, _HEREDOC, "firewall text")
    return f"""#!/usr/bin/env bash
# llm-cluster: host firewall of {node} (nftables table {FAMILY} {TABLE}; other tables untouched)
set -euo pipefail
command -v nft >/dev/null 2>&1 || {{
  echo "ERROR: nft is missing on $(hostname)" >&2
  echo "    fix: install nftables (apt-get install nftables), or set firewall.managed: false" >&2
  exit 1
}}
read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range
if (( lo < {first} || hi > {last} )); then
  echo "ERROR: $(hostname) picks ephemeral ports from $lo-$hi, outside firewall.ephemeralPorts {first}-{last}:" \\
    "NCCL and Ray could listen on ports the firewall leaves open" >&2
  echo "    fix: set firewall.ephemeralPorts to [$lo, $hi]" >&2
  exit 1
fi
rules={q(f"{rules_dir}/firewall.nft")}
mkdir -p {q(rules_dir)}
tmp=$(mktemp {q(rules_dir + "/.firewall.XXXXXX")})
trap 'rm -f "$tmp"' EXIT
cat > "$tmp" <<'{_HEREDOC}'
{rules.rstrip()}
{_HEREDOC}
nft -c -f "$tmp"
nft -f "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$rules"
if [ -d /run/systemd/system ]; then
  unit={q(UNIT_FILE)}
  cat > "$unit.new" <<'{_HEREDOC}'
{unit.rstrip()}
{_HEREDOC}
  if cmp -s "$unit.new" "$unit"; then rm -f "$unit.new"; else mv -f "$unit.new" "$unit"; systemctl daemon-reload; fi
  systemctl enable --quiet {q(UNIT)}
fi
echo "firewall: table {FAMILY} {TABLE} loaded on $(hostname) ($(nft list table {FAMILY} {TABLE} | grep -c ' accept\\| drop') rules)"
"""


def delete_script(node: str, rules_dir: str = RULES_DIR) -> str:
    """Remove the table, its file and its unit; nothing else."""
    return f"""#!/usr/bin/env bash
# llm-cluster: remove the host firewall of {node} (nftables table {FAMILY} {TABLE} only)
set -euo pipefail
if [ -d /run/systemd/system ] && [ -e {q(UNIT_FILE)} ]; then
  systemctl disable --quiet {q(UNIT)} || true
  rm -f {q(UNIT_FILE)}
  systemctl daemon-reload
fi
if command -v nft >/dev/null 2>&1 && nft list table {FAMILY} {TABLE} >/dev/null 2>&1; then
  nft delete table {FAMILY} {TABLE}
fi
rm -f {q(f"{rules_dir}/firewall.nft")}
echo "firewall: table {FAMILY} {TABLE} removed from $(hostname)"
"""


def advisory_ports(spec: StackSpec, node: str) -> list[str]:
    """What an operator's own firewall must close on this node (for the policy advisory when unmanaged)."""
    return [f"{p.nft()} ({p.what})" for p in guarded_ports(spec, node)]
