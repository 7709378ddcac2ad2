"""`python -m ops.doctor`: read-only checks of a live cluster, one per row of the runbook's troubleshooting
table and more; each finding says what was seen and what to do. Exit 0 nothing failed, 1 something
failed, 2 invalid stack.

It reads the same stack file and SSH settings as the deployment and runs one read-only bash probe per
node over SSH (`bash -s`, sections marked `@@doctor <name>` / `@@rc <status>`); the checks are pure
functions of those sections, so tests feed them recorded outputs. Nothing is changed on a node: the
probe reads files, `docker inspect`/`logs`/`exec … ray status`, the kernel log, nft's table, and
connects to the peers' ports; `--bandwidth` also runs ib_write_bw between the nodes of each
multi-node instance (it loads the link for a second).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from components.engines.base import container_name, native_worker_role, nccl_env, server_container_name
from components.engines.registry import ENGINES, engine_for
from components.facts.startup_failures import all_failures, any_pattern
from components.node_programs.fabric import nccl_fix, parse_nccl_net
from components.node_programs.preflight import parse_chrony_tracking, parse_timedatectl
from components.planning.fabric.ray import parse_ray_status, ray_status_argv, want_gpus
from components.planning.fabric.rdma import rdma_script
from components.planning.nodes import firewall
from components.planning.nodes.scripts import operator_file_path, root_steps
from components.spec import StackSpec
from components.spec.topology import Instance, all_instances, host_ports
from plan.cli import run as run_cli
from plan.stackfile import load_spec

ROOT = Path(__file__).resolve().parent.parent

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2
# Server log lines worth reading back: NCCL's transport, Xid, and every engine's fatal startup errors.
LOG_PATTERN = "|".join(
    (
        r"NCCL INFO (NET/|Using network)|NCCL WARN|NVRM: Xid",
        any_pattern(dict.fromkeys(f for e in ENGINES.values() for f in e.startup_failures)),
        *dict.fromkeys(line for e in ENGINES.values() for line in e.capacity_log_lines.values()),
    )
)
KERNEL_PATTERN = r"NVRM: Xid|Out of memory: Killed process|oom-kill"
READ_MIB = 1024  # weights read-throughput sample per node (direct I/O, one file)
SLOW_READ_MBPS = 500.0


@dataclass(frozen=True)
class Finding:
    """One check's verdict on one target (a node, an instance, a pair)."""

    check: str
    target: str
    status: str  # "ok" | "warn" | "fail"
    seen: str
    do: str = ""


# --- the probe ---------------------------------------------------------------------------------------

Sections = dict[str, tuple[int, str]]  # name -> (exit status, output)


def parse_sections(text: str) -> Sections:
    """The probe's output split into its sections."""
    out: Sections = {}
    name, lines = None, []
    for line in text.splitlines():
        m = re.match(r"^@@doctor (\S+)$", line)
        if m:
            name, lines = m.group(1), []
            continue
        m = re.match(r"^@@rc (\d+)$", line)
        if m and name is not None:
            out[name] = (int(m.group(1)), "\n".join(lines) + ("\n" if lines else ""))
            name = None
            continue
        if name is not None:
            lines.append(line)
    return out


def _section(name: str, command: str) -> str:
    # The section's status is its last command's (the port probe's is always 0: its lines say it all).
    return (
        f"echo '@@doctor {name}'\n{{ {command}\n}} 2>&1\n"
        '# shellcheck disable=SC2320  # the group\'s status, whatever its last command\nrc=$?\necho "@@rc $rc"\n'
    )


def node_containers(spec: StackSpec, node: str) -> list[tuple[Instance, str, str]]:
    """(instance, container, role) of every GPU container on the node."""
    out = []
    for inst in all_instances(spec):
        if node not in inst.nodes:
            continue
        if inst.uses_ray:
            role = "ray-head" if node == inst.head else "ray-worker"
            out.append((inst, container_name(inst, role), role))
        elif inst.native_launcher and node != inst.head:
            role = native_worker_role(engine_for(spec.pools[inst.pool]))
            out.append((inst, container_name(inst, role), role))
        else:
            out.append((inst, server_container_name(engine_for(spec.pools[inst.pool]), inst), "server"))
    return out


def peer_targets(spec: StackSpec, node: str) -> list[tuple[str, str, int, str]]:
    """(peer, address, port, what) this node must reach: every other node's service ports, but a port the
    firewall opens to one instance's nodes only (its launcher's rendezvous) from those nodes alone."""
    mine = spec.nodes[node].address
    only = {(n, port): addresses for n in spec.nodes for port, addresses, _ in firewall.instance_only_ports(spec, n)}
    return [
        (n, spec.nodes[n].address, port, key)
        for n, port, key in host_ports(spec)
        if n != node and mine in only.get((n, port), [mine])
    ]


def probe_script(spec: StackSpec, node: str) -> str:
    """The read-only bash probe of one node."""
    q = shlex.quote
    n = spec.node(node)
    parts = [
        "#!/usr/bin/env bash\n# llm-cluster doctor: read-only probe of " + node + "\nset -u\n",
        _section("date", "date +%s.%N"),
        _section("chrony", "chronyc -n tracking"),
        _section("timedatectl", "timedatectl status"),
        _section(
            "kernel",
            f"(dmesg -T 2>/dev/null || journalctl -k -b --no-pager 2>/dev/null) | "
            f"grep -E {q(KERNEL_PATTERN)} | tail -n 50",
        ),
    ]
    if spec.firewall.managed:
        parts.append(_section("nft", f"nft list table {firewall.FAMILY} {firewall.TABLE}"))
    targets = peer_targets(spec, node)
    if targets:
        lines = "\n".join(
            f"if timeout 2 bash -c {q(f'</dev/tcp/{a}/{p}')} 2>/dev/null; then s=open; "
            f'else s=closed; fi; echo {q(f"{peer} {a} {p} {what}")} "$s"'
            for peer, a, p, what in targets
        )
        parts.append(_section("ports", lines))
    if n.hca is not None:
        base = f"/sys/class/infiniband/{n.hca.device}/ports/{n.hca.port}"
        parts.append(_section("ibstat", f"ibstat {q(n.hca.device)}"))
        if n.hca.gid_index is not None:
            parts.append(
                _section(
                    "gid", f"cat {q(f'{base}/gid_attrs/types/{n.hca.gid_index}')} {q(f'{base}/gids/{n.hca.gid_index}')}"
                )
            )
    if n.interface is not None:
        parts.append(_section("iface", f"ip -o -4 addr show dev {q(n.interface)}"))
    for inst, name, _role in node_containers(spec, node):
        parts.append(
            _section(
                f"inspect:{name}",
                "docker inspect -f '{{.State.Status}} {{.HostConfig.NetworkMode}} {{json .Config.Env}}' " + q(name),
            )
        )
        parts.append(
            _section(f"logs:{name}", f"docker logs --tail 5000 {q(name)} 2>&1 | grep -E {q(LOG_PATTERN)} | tail -n 200")
        )
        if inst.uses_ray and node == inst.head:
            parts.append(_section(f"ray:{inst.name}", " ".join(q(a) for a in ray_status_argv(spec, inst, name))))
    models = dict.fromkeys(spec.pools[i.pool].model for i, _, _ in node_containers(spec, node))
    for m in models:
        path = spec.models[m].path
        parts.append(
            _section(
                f"weights:{m}",
                f"findmnt -n -o FSTYPE -T {q(path)}; "
                f"f=$(find {q(path)} -maxdepth 1 -type f -name '*.safetensors' -size +100M | head -n 1); "
                f'if [ -n "$f" ]; then dd if="$f" of=/dev/null bs=1M count={READ_MIB} iflag=direct '
                "2>&1 | tail -n 1; fi",
            )
        )
    g = spec.gateway
    if g is not None and g.node == node:
        for inst in all_instances(spec):
            url = f"http://{spec.node(inst.head).address}:{inst.port}{engine_for(spec.pools[inst.pool]).health_path}"
            parts.append(_section(f"health:{inst.name}", f"curl -s -o /dev/null -m 10 -w '%{{http_code}}\\n' {q(url)}"))
        # Today's usage-log file on the host (gateway.usageLog.dir), one JSON line a request.
        today = f"{g.usage_log.dir.rstrip('/')}/usage-$(date -u +%F).log"
        parts.append(_section("gateway-log", f'grep -E \'"status":(502|504)\' "{today}" 2>/dev/null | tail -n 2000'))
    return "".join(parts)


# --- the checks (pure) ---------------------------------------------------------------------------


@dataclass
class Observed:
    """What the probes returned, per node, and the operator's clock around each probe."""

    sections: dict[str, Sections] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # node -> why SSH failed
    bracket: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (before, after)
    rdma: dict[str, tuple[int, str]] = field(default_factory=dict)  # instance -> (status, output), --bandwidth


def _get(obs: Observed, node: str, name: str) -> tuple[int, str] | None:
    return obs.sections.get(node, {}).get(name)


def check_reachable(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Every node answers over SSH (the other checks need it)."""
    return [
        Finding(
            "ssh",
            n,
            "fail",
            f"SSH to {spec.ssh.user}@{spec.node(n).ssh_address or spec.node(n).address} failed: {obs.unreachable[n]}",
            "check the node is up and ssh.* settings (user, key, port)",
        )
        if n in obs.unreachable
        else Finding("ssh", n, "ok", "reachable")
        for n in nodes
    ]


def check_clock(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 1 (Ray cannot see a worker: clocks). chrony or timedatectl says synchronised, and the node's
    date is within preflight.maxClockOffsetSeconds of this machine's."""
    out = []
    bound = spec.preflight.max_clock_offset_seconds
    fix = "install chrony on every node with the same NTP servers (apt-get install chrony; chronyc sources)"
    for n in nodes:
        if n in obs.unreachable:
            continue
        chrony, tdc = _get(obs, n, "chrony"), _get(obs, n, "timedatectl")
        try:
            state = (
                parse_chrony_tracking(chrony[1])
                if chrony and chrony[0] == 0
                else parse_timedatectl(tdc[1])
                if tdc and tdc[0] == 0
                else None
            )
        except ValueError:
            state = None
        if state is None:
            out.append(Finding("clock", n, "fail", "neither chronyc tracking nor timedatectl answered", fix))
            continue
        if not state.synchronised:
            out.append(Finding("clock", n, "fail", f"{state.source} says the clock is not synchronised", fix))
            continue
        date = _get(obs, n, "date")
        before, after = obs.bracket.get(n, (0.0, 0.0))
        try:
            remote = float(date[1].strip()) if date else None
        except ValueError:
            remote = None
        if remote is not None and after:
            lo, hi = remote - after, remote - before
            if lo > bound or hi < -bound:
                off = lo if lo > 0 else hi
                out.append(
                    Finding(
                        "clock",
                        n,
                        "fail",
                        f"synchronised ({state.source}) but {abs(off):.1f} s "
                        f"{'ahead of' if off > 0 else 'behind'} this machine (bound {bound:g} s)",
                        "point chrony on the nodes and on this machine at the same NTP servers",
                    )
                )
                continue
        out.append(
            Finding(
                "clock",
                n,
                "ok",
                f"synchronised ({state.source}"
                + (f", offset {state.offset_s * 1000:+.3f} ms)" if state.offset_s is not None else ")"),
            )
        )
    return out


def check_firewall(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 1 (firewall blocks 6379/10001): llm-cluster's table is loaded, and every node reaches its peers' ports."""
    out = []
    for n in nodes:
        if n in obs.unreachable:
            continue
        if spec.firewall.managed:
            nft = _get(obs, n, "nft")
            if nft is None or nft[0] != 0 or f"table {firewall.FAMILY} {firewall.TABLE}" not in nft[1]:
                out.append(
                    Finding(
                        "firewall",
                        n,
                        "fail",
                        f"no nftables table {firewall.FAMILY} {firewall.TABLE} "
                        "(Ray's ports are open to anyone who reaches the node)",
                        f"run pulumi up (it loads the table); after a reboot check systemctl status {firewall.UNIT}",
                    )
                )
            else:
                out.append(Finding("firewall", n, "ok", f"table {firewall.FAMILY} {firewall.TABLE} loaded"))
        ports = _get(obs, n, "ports")
        closed = [ln.rsplit(" ", 1)[0] for ln in (ports[1].splitlines() if ports else []) if ln.endswith(" closed")]
        if closed:
            out.append(
                Finding(
                    "ports",
                    n,
                    "fail",
                    f"{n} cannot reach: " + "; ".join(closed),
                    "the service is down (docker ps on the peer) or a firewall between the nodes drops "
                    "it: the nodes must reach each other on every port (Ray, NCCL, vLLM, exporters)",
                )
            )
        elif ports:
            out.append(Finding("ports", n, "ok", f"reaches {len(ports[1].splitlines())} peer port(s)"))
    return out


def _inspect(obs: Observed, node: str, name: str) -> tuple[str, str, dict[str, str]] | None:
    got = _get(obs, node, f"inspect:{name}")
    if got is None or got[0] != 0:
        return None
    status, mode, env_json = (got[1].strip().split(" ", 2) + ["", "", "[]"])[:3]
    try:
        env = dict(e.split("=", 1) for e in json.loads(env_json) if "=" in e)
    except ValueError:
        env = {}
    return status, mode, env


def check_containers(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 1 (container without --network host) and row 2 (NCCL variables): each GPU container runs on the
    host network with the NCCL variables the stack sets; the host has the GID and interface they name."""
    out = []
    for n in nodes:
        if n in obs.unreachable:
            continue
        want = nccl_env(spec, n)
        for _inst, name, _role in node_containers(spec, n):
            got = _inspect(obs, n, name)
            if got is None:
                out.append(
                    Finding(
                        "container",
                        f"{n}/{name}",
                        "fail",
                        "no such container",
                        "run pulumi up; docker ps -a on the node",
                    )
                )
                continue
            status, mode, env = got
            if status != "running":
                out.append(
                    Finding(
                        "container",
                        f"{n}/{name}",
                        "fail",
                        f"{status}",
                        f"docker logs {name} on {n} says why; docker starts it again (unless-stopped)",
                    )
                )
            if mode != "host":
                out.append(
                    Finding(
                        "network-host",
                        f"{n}/{name}",
                        "fail",
                        f"network mode {mode}",
                        "Ray and NCCL need the host network: recreate it with pulumi up",
                    )
                )
            wrong = [
                f"{k}={env.get(k, '(unset)')} (stack: {v})"
                for k, v in want.items()
                if k.startswith("NCCL_IB") or k.endswith("SOCKET_IFNAME")
                if env.get(k) != v
            ]
            if wrong:
                out.append(
                    Finding(
                        "nccl-env",
                        f"{n}/{name}",
                        "fail",
                        "; ".join(wrong),
                        "the container was started by hand or before a stack change: pulumi up replaces it",
                    )
                )
        node = spec.node(n)
        gid = _get(obs, n, "gid")
        if node.hca is not None and node.hca.gid_index is not None and gid is not None:
            lines = gid[1].split()
            kind = " ".join(lines[:-1]) if gid[0] == 0 else ""
            empty = not lines or set(lines[-1].replace(":", "")) <= {"0"}
            if gid[0] != 0 or kind != "RoCE v2" or empty:
                out.append(
                    Finding(
                        "gid",
                        n,
                        "fail",
                        f"GID index {node.hca.gid_index} of {node.hca.device} port "
                        f"{node.hca.port} is {kind or 'missing'}{' (all zero)' if empty and gid[0] == 0 else ''}",
                        "NCCL_IB_GID_INDEX must name the RoCE v2 GID of the cluster address (show_gids); "
                        f"set nodes.{n}.hca.gidIndex to it",
                    )
                )
            else:
                out.append(Finding("gid", n, "ok", f"GID {node.hca.gid_index} is RoCE v2"))
        iface = _get(obs, n, "iface")
        if node.interface is not None and iface is not None:
            if iface[0] != 0 or f" {node.address}/" not in iface[1]:
                out.append(
                    Finding(
                        "interface",
                        n,
                        "fail",
                        f"{node.interface} does not hold {node.address} ({iface[1].strip() or 'no such interface'})",
                        f"NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME must carry the cluster address: fix "
                        f"nodes.{n}.interface",
                    )
                )
    return out


def check_ray(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 1: `ray status` on each Ray head shows every node and GPU of the instance."""
    out = []
    for inst in all_instances(spec):
        if not inst.uses_ray or inst.head not in nodes or inst.head in obs.unreachable:
            continue
        got = _get(obs, inst.head, f"ray:{inst.name}")
        want = want_gpus(spec, inst)
        status = parse_ray_status(got[1]) if got and got[0] == 0 else None
        if status is not None and status.nodes >= len(inst.nodes) and status.gpus_total >= want:
            out.append(Finding("ray", inst.name, "ok", f"{status.nodes} nodes, {status.gpus_total:g} GPUs"))
            continue
        seen = (
            f"ray status: {status.nodes}/{len(inst.nodes)} nodes, {status.gpus_total:g}/{want} GPUs"
            if status
            else f"ray status failed: {(got[1].strip().splitlines() or ['no output'])[-1] if got else 'not run'}"
        )
        pool = spec.pools[inst.pool]
        out.append(
            Finding(
                "ray",
                inst.name,
                "fail",
                seen,
                f"workers reach {spec.node(inst.head).address} on TCP {pool.ray_port} and "
                f"{pool.ray_client_port} (doctor's ports check), the nodes' clocks agree (clock), the "
                "containers run on the host network (network-host), docker logs "
                f"{container_name(inst, 'ray-worker')} on " + ", ".join(inst.nodes[1:]),
            )
        )
    return out


def check_nccl_transport(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Rows 2 and 3: NET/IB, not NET/Socket, in the multi-node servers' logs."""
    out = []
    for inst in all_instances(spec):
        if not inst.spans_nodes:
            continue
        engine = engine_for(spec.pools[inst.pool])
        for n in inst.nodes:
            if n not in nodes or n in obs.unreachable:
                continue
            if inst.uses_ray:
                name = container_name(inst, "ray-head" if n == inst.head else "ray-worker")
            else:
                name = container_name(inst, engine.server_role if n == inst.head else native_worker_role(engine))
            got = _get(obs, n, f"logs:{name}")
            net = parse_nccl_net(got[1] if got else "")
            node = spec.node(n)
            hca = node.hca.device if node.hca else "?"
            gid = node.hca.gid_index if node.hca and node.hca.link_layer == "ethernet" else None
            if net.fell_back:
                out.append(
                    Finding(
                        "nccl",
                        f"{n}/{name}",
                        "fail",
                        f"NCCL uses NET/Socket ({', '.join(net.socket_interfaces) or '?'})"
                        + (f"; {'; '.join(net.warnings)}" if net.warnings else ""),
                        "check " + nccl_fix(hca, gid, node.interface or "?"),
                    )
                )
            elif net.networks:
                out.append(Finding("nccl", f"{n}/{name}", "ok", f"NET/IB: {', '.join(net.ib_devices) or 'IB'}"))
            else:
                out.append(
                    Finding(
                        "nccl",
                        f"{n}/{name}",
                        "warn",
                        "no NCCL INFO lines in the log",
                        "set nccl.debug: INFO and pulumi up to see the transport (NET/IB vs NET/Socket)",
                    )
                )
    return out


def check_server_logs(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 4 (OOM at start), row 5 (dtype/kernel not supported) and every other fatal startup error its
    engine prints (components/facts/startup_failures.py), in every server's log; OOM kills in the kernel log."""
    out = []
    for n in nodes:
        if n in obs.unreachable:
            continue
        for inst, name, _role in node_containers(spec, n):
            got = _get(obs, n, f"logs:{name}")
            pool = spec.pools[inst.pool]
            engine = engine_for(pool)
            for failure, line in all_failures(got[1] if got else "", engine.startup_failures):
                out.append(
                    Finding(
                        failure.check,
                        f"{n}/{name}",
                        "fail",
                        line[:200],
                        failure.advice(inst.pool, pool.model, engine.memory_keys),
                    )
                )
        kernel = _get(obs, n, "kernel")
        if kernel and re.search(r"Out of memory: Killed process|oom-kill", kernel[1]):
            out.append(
                Finding(
                    "oom",
                    n,
                    "fail",
                    "kernel OOM killer: " + _first(kernel[1], r"Out of memory|oom-kill"),
                    "host RAM ran out (weights load in RAM first): lower swapSpaceGib, or fewer replicas",
                )
            )
    return out


def logged_capacity(text: str, lines: Mapping[str, str]) -> dict[str, float]:
    """The memory figures a server logged at its last start (the last line of each kind)."""
    out = {}
    for key, pattern in lines.items():
        found = re.findall(pattern, text)
        if found:
            last = found[-1] if isinstance(found[-1], str) else next(g for g in found[-1] if g)
            out[key] = float(last.replace(",", ""))
    return out


# The memory terms a log may state beside its KV cache, and the plan's key for each (GiB per GPU).
MEMORY_TERMS = (
    ("weights_gib", "weights_gib_per_gpu", "weights"),
    ("activation_gib", "activation_gib", "activation peak"),
    ("non_torch_gib", "non_torch_gib", "non-torch memory"),
)


def _terms(logged: Mapping[str, float], plan: Mapping[str, object]) -> tuple[str, str]:
    """The logged terms beside the plan's ("weights 7.15 GiB logged, 7.16 planned; ..."), and the one the plan
    undercounted most, in words ("" when none is undercounted)."""
    seen, worst, over = [], "", 0.0
    for key, plan_key, name in MEMORY_TERMS:
        planned = plan.get(plan_key)
        if key not in logged or not isinstance(planned, (int, float)):
            continue
        seen.append(f"{name} {logged[key]:.2f} GiB logged, {planned:.2f} planned")
        if logged[key] - planned > over:
            over, worst = logged[key] - planned, f"{name}: {logged[key]:.2f} GiB logged, {planned:.2f} planned"
    return "; ".join(seen), worst


def check_capacity(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """The KV cache each server's engine logged at start against the plan's estimate: below the estimate's
    pessimistic end is a warning (the plan promised more than the engine holds), within it ok."""
    out = []
    plans: dict[str, dict[str, object]] = {}  # pool -> its estimate, made once for all its instances
    for n in nodes:
        if n in obs.unreachable:
            continue
        for inst, name, _role in node_containers(spec, n):
            engine = engine_for(spec.pools[inst.pool])
            got = _get(obs, n, f"logs:{name}")
            logged = logged_capacity(got[1] if got else "", engine.capacity_log_lines)
            if "kv_tokens" not in logged:
                continue
            if inst.pool not in plans:
                plans[inst.pool] = engine.capacity(spec, inst.pool)
            plan = plans[inst.pool]
            planned = plan.get("kv_tokens")
            if not isinstance(planned, (int, float)) or not planned:
                continue
            low = plan.get("kv_tokens_low", planned)
            assert isinstance(low, (int, float))
            tokens = int(logged["kv_tokens"])
            error = (planned - tokens) / planned
            seen = f"{tokens:,} KV tokens logged at start, {int(planned):,} planned ({-error:+.1%})"
            if "kv_cache_gib" in logged:
                seen += f"; KV cache {logged['kv_cache_gib']} GiB per GPU logged, {plan.get('kv_cache_gib_per_gpu')} planned"
            terms, worst = _terms(logged, plan)
            seen += f"; {terms}" if terms else ""
            if tokens < low:
                out.append(
                    Finding(
                        "capacity",
                        f"{n}/{name}",
                        "warn",
                        seen,
                        f"the estimate was optimistic for pools.{inst.pool} beyond its measured error: the pool holds "
                        f"{tokens / float(plan.get('max_model_len') or tokens):.1f} full-length requests, not the planned "
                        f"{plan.get('max_concurrency')}. "
                        + (f"The plan undercounted most the {worst}. " if worst else "")
                        + f"Size {engine.memory_keys} from the logged figure, and "
                        "add this log to the capacity accuracy bench (tests/fixtures/vllm-startup-logs).",
                    )
                )
            else:
                out.append(Finding("capacity", f"{n}/{name}", "ok", seen))
    return out


def _first(text: str, pattern: str) -> str:
    return next((ln.strip()[:200] for ln in text.splitlines() if re.search(pattern, ln)), "")


def check_xid(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 7 (a replica 502s: Xid errors): NVRM Xid lines in the kernel log."""
    out = []
    for n in nodes:
        if n in obs.unreachable:
            continue
        kernel = _get(obs, n, "kernel")
        xids = sorted(
            {m.group(1) for m in re.finditer(r"NVRM: Xid \([^)]*\): (\d+)", kernel[1] if kernel else "")}, key=int
        )
        if xids:
            out.append(
                Finding(
                    "xid",
                    n,
                    "fail",
                    f"GPU Xid error(s) {', '.join(xids)}: " + _first(kernel[1] if kernel else "", r"NVRM: Xid"),
                    "Xid 48/63/64/79/94/95 mean a GPU fault: drain the node, nvidia-smi -q, reset or RMA "
                    "the GPU; 13/31/43 are usually the application (docker logs of its server)",
                )
            )
        else:
            out.append(Finding("xid", n, "ok", "no Xid in the kernel log"))
    return out


def check_weights(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 6 (weights load very slowly): the weights' file system (NFS?) and their read throughput."""
    out = []
    for n in nodes:
        if n in obs.unreachable:
            continue
        for m in dict.fromkeys(spec.pools[i.pool].model for i, _, _ in node_containers(spec, n)):
            got = _get(obs, n, f"weights:{m}")
            if got is None:
                continue
            lines = got[1].strip().splitlines()
            fstype = lines[0].strip() if lines else "?"
            speed = _dd_mbps(got[1])
            where = f"{n}/{spec.models[m].path}"
            seen = f"on {fstype}" + (f", read {speed:.0f} MB/s" if speed is not None else "")
            if fstype.startswith("nfs"):
                out.append(
                    Finding(
                        "weights",
                        where,
                        "warn",
                        seen,
                        f"loading over NFS is slow: copy the weights to local disk (models.{m}.source.node) "
                        "or warm the page cache with a read first",
                    )
                )
            elif speed is not None and speed < SLOW_READ_MBPS:
                out.append(
                    Finding(
                        "weights",
                        where,
                        "warn",
                        seen,
                        "the disk reads slowly: check iostat -x for a busy or degraded device",
                    )
                )
            else:
                out.append(Finding("weights", where, "ok", seen))
    return out


def _dd_mbps(text: str) -> float | None:
    m = re.search(r"copied, [0-9.,]+ s, ([0-9.,]+) ([kMG]B)/s", text)
    if not m:
        return None
    return float(m.group(1).replace(",", ".")) * {"kB": 0.001, "MB": 1.0, "GB": 1000.0}[m.group(2)]


def check_replicas(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 7 (a replica answers 502): each instance's health as the gateway's node sees it, and the
    upstreams the gateway logged 502/504 for today (its usage log)."""
    g = spec.gateway
    if g is None or g.node in obs.unreachable or g.node not in obs.sections:
        return []
    out = []
    for inst in all_instances(spec):
        got = _get(obs, g.node, f"health:{inst.name}")
        code = got[1].strip() if got else ""
        name = (
            container_name(inst, "ray-head")
            if inst.uses_ray
            else server_container_name(engine_for(spec.pools[inst.pool]), inst)
        )
        if code == "200":
            out.append(Finding("replica", inst.name, "ok", "healthy from the gateway's node"))
        else:
            out.append(
                Finding(
                    "replica",
                    inst.name,
                    "fail",
                    f"health answered {code or 'nothing'} from {g.node}",
                    f"docker logs {name} on {inst.head}, and the kernel log there for Xid errors; the "
                    f"gateway skips it for gateway.failTimeoutSeconds ({g.fail_timeout_seconds} s)",
                )
            )
    log = _get(obs, g.node, "gateway-log")
    counts: dict[str, int] = {}
    for line in log[1].splitlines() if log else []:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("status") in (502, 504):
            counts[str(doc.get("upstream") or "none")] = counts.get(str(doc.get("upstream") or "none"), 0) + 1
    if counts:
        out.append(
            Finding(
                "gateway-5xx",
                g.node,
                "warn",
                "502/504 today by upstream: " + ", ".join(f"{u} {c}" for u, c in sorted(counts.items())),
                "the upstreams named are the replicas that failed: see their replica findings",
            )
        )
    return out


def check_rdma(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Row 3 (slow cross-node throughput), with --bandwidth: ib_write_bw retested between every pair."""
    out = []
    for name, (rc, text) in obs.rdma.items():
        lines = text.strip().splitlines()
        if rc == 0:
            out.append(Finding("rdma", name, "ok", "; ".join(ln.split(": ", 1)[-1] for ln in lines)))
        else:
            errors = [ln.split(": ", 2)[-1] for ln in lines if ln.startswith("ERROR")]
            fix = next((ln.strip()[5:] for ln in lines if ln.strip().startswith("fix: ")), "")
            out.append(Finding("rdma", name, "fail", "; ".join(errors) or (lines[-1] if lines else "no output"), fix))
    return out


CHECKS: list[Callable[[StackSpec, Observed, Sequence[str]], list[Finding]]] = [
    check_reachable,
    check_clock,
    check_firewall,
    check_containers,
    check_ray,
    check_nccl_transport,
    check_rdma,
    check_server_logs,
    check_capacity,
    check_weights,
    check_replicas,
    check_xid,
]


def diagnose(spec: StackSpec, obs: Observed, nodes: Sequence[str]) -> list[Finding]:
    """Every finding, in check order."""
    return [f for check in CHECKS for f in check(spec, obs, nodes)]


# --- running it ----------------------------------------------------------------------------------

Runner = Callable[[str, str], tuple[int, str, str]]  # (node, script) -> (status, stdout, stderr)


def ssh_runner(spec: StackSpec, stack: str) -> Runner:
    """bash -s over ssh with the stack's SSH settings (the key file `pulumi up` wrote when the key is a secret)."""

    def run(node: str, script: str) -> tuple[int, str, str]:
        n = spec.node(node)
        opts = ["-o", "BatchMode=yes", "-o", f"Port={spec.ssh.port}", "-o", "ConnectTimeout=10"]
        if not spec.ssh.host_key_checking:
            opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR"]
        key = spec.ssh.key_path or (
            os.path.expanduser(operator_file_path(stack, node, "key")) if "sshPrivateKey" in spec.secrets else None
        )
        if key:
            opts += ["-i", os.path.expanduser(key)]
        # The kernel log and nft's table need root: a non-root user's probe runs through sudo -n, as
        # the deployment's root steps do.
        shell = "sudo -n bash -s" if root_steps(spec) else "bash -s"
        argv = ["ssh", *opts, f"{spec.ssh.user}@{n.ssh_address or n.address}", shell]
        try:
            p = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return 124, "", "no answer within 300 s"
        return p.returncode, p.stdout, p.stderr

    return run


def observe(spec: StackSpec, nodes: Sequence[str], run: Runner, bandwidth: bool) -> Observed:
    """Probe every node (and with --bandwidth, every multi-node instance's pairs)."""
    obs = Observed()
    for n in nodes:
        before = time.time()
        rc, out, err = run(n, probe_script(spec, n))
        after = time.time()
        if rc == 255 or "@@doctor" not in out:
            obs.unreachable[n] = (err.strip().splitlines() or [f"exit status {rc}"])[-1]
            continue
        obs.sections[n] = parse_sections(out)
        obs.bracket[n] = (before, after)
    if bandwidth:
        for inst in all_instances(spec):
            if inst.spans_nodes and inst.head in nodes and inst.head not in obs.unreachable:
                rc, out, err = run(inst.head, rdma_script(spec, inst))
                obs.rdma[inst.name] = (rc, out + err)
    return obs


def render(stack: str, findings: list[Finding], nodes: Sequence[str]) -> str:
    """The text report: one line per finding, what to do under each that is not ok."""
    failed = sum(f.status == "fail" for f in findings)
    warned = sum(f.status == "warn" for f in findings)
    lines = [f"doctor {stack}: {len(nodes)} node(s), {len(findings)} finding(s): {failed} failed, {warned} warning(s)"]
    width = max((len(f.check) for f in findings), default=4)
    twidth = max((len(f.target) for f in findings), default=4)
    for f in findings:
        lines.append(f"{f.status.upper():<4}  {f.check:<{width}}  {f.target:<{twidth}}  {f.seen}")
        if f.status != "ok" and f.do:
            lines.append(f"{'':<{width + twidth + 10}}do: {f.do}")
    return "\n".join(lines) + "\n"


def stack_options(p: argparse.ArgumentParser) -> None:
    """--stack NAME or --config PATH, as `python -m plan` takes them."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--stack", default="prod", help="Pulumi.<stack>.yaml (default: prod)")
    where.add_argument("--config", type=Path, help="any stack file")


def spec_from_args(args: argparse.Namespace) -> tuple[str, Path, StackSpec] | None:
    """(stack name, path, spec) from --stack/--config; None after saying why it is invalid."""
    path = args.config or ROOT / f"Pulumi.{args.stack}.yaml"
    loaded = load_spec(path, None if args.config else args.stack)
    if loaded is None:
        return None
    return loaded[0].name, path, loaded[1]


def main(argv: list[str] | None = None, run: Runner | None = None) -> int:
    """The command line; `run` replaces SSH in tests."""
    p = argparse.ArgumentParser(prog="python -m ops.doctor", description=__doc__.split("\n\n")[0])
    stack_options(p)
    p.add_argument("--node", action="append", help="only this node (repeatable)")
    p.add_argument("--json", action="store_true", help="findings as JSON")
    p.add_argument(
        "--bandwidth",
        action="store_true",
        help="also retest ib_write_bw between the nodes of each multi-node instance (loads the link briefly)",
    )
    args = p.parse_args(argv)
    loaded = spec_from_args(args)
    if loaded is None:
        return EXIT_INVALID
    stack, _path, spec = loaded
    unknown = [n for n in args.node or [] if n not in spec.nodes]
    if unknown:
        print(
            f"doctor: --node {unknown[0]!r} is not a node of {stack}; nodes are: {', '.join(spec.nodes)}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    nodes = args.node or list(spec.nodes)
    obs = observe(spec, nodes, run or ssh_runner(spec, stack), args.bandwidth)
    findings = diagnose(spec, obs, nodes)
    if args.json:
        print(
            json.dumps(
                {
                    "stack": stack,
                    "nodes": nodes,
                    "failed": sum(f.status == "fail" for f in findings),
                    "findings": [asdict(f) for f in findings],
                },
                indent=2,
            )
        )
    else:
        sys.stdout.write(render(stack, findings, nodes))
    return EXIT_FAILED if any(f.status == "fail" for f in findings) else EXIT_OK


if __name__ == "__main__":
    run_cli(main)
