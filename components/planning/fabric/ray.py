"""Ray planning for multi-node vLLM: `ray start` argv, the GPU readiness gate, the head's entry script.

Restart semantics (the runbook runs `docker exec -it ray-head bash -c 'vllm serve …'`, which dies with
the shell and needs a person to start it again; here nothing is manual):
- The Ray head container *is* the multi-node server. Its entrypoint is `ray-head.sh`: it starts the
  Ray head, waits (without a deadline) until every GPU of the instance has joined, then `exec`s the
  container's command, the full `vllm serve` argv. vLLM's ray.init() joins that cluster (RAY_ADDRESS).
- Every container restarts `unless-stopped`, so docker also starts them again when a node boots.
- vLLM dies, or the head container or node restarts: docker starts the head again; the workers lose
  the GCS, their `ray start --block` exits (after Ray's GCS reconnect timeout, 60 s by default), docker
  restarts them, they join the new head, and vLLM starts once all GPUs are back.
- A worker node dies: its Ray actors and NCCL peers are gone, and vLLM's API server shuts down when a
  request meets the dead engine (its default; VLLM_KEEP_ALIVE_ON_ENGINE_DEATH unset), which restarts
  the head as above. (Read from vLLM 0.9.2's launcher, not observed on hardware.) A server that stays
  up but broken would only be marked unhealthy (docker restarts no unhealthy container), so vLLM runs
  under the watchdog (components.engines.base.watchdog_script), which exits when /health fails for
  the pool's restartUnhealthyAfterSeconds, and the chain above follows.
- `pulumi destroy`, or a replacement (delete before replace: names and GPUs are fixed), stops each
  container with SIGTERM and a grace period, so vLLM frees its GPUs and exits cleanly.

Metrics: Ray serves Prometheus metrics (`--metrics-export-port`) only from the dashboard agent of
`ray[default]`; the vLLM image installs `ray[cgraph]`, which has none, so a `ray` scrape job would
always be down. ray-head.sh instead polls `ray status` every RAY_METRICS_INTERVAL_S for as long as
the container runs and writes the cluster's nodes and GPUs as a node-exporter textfile
(ray_textfile_metrics) into NODE_TEXTFILE_DIR, a host directory node-exporter reads.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from components.engines.base import container_name
from components.spec import StackSpec
from components.spec.topology import Instance

# Where ray-head.sh is uploaded inside the head container (the image has no such folder of its own).
RAY_HEAD_SCRIPT = "/opt/llm-cluster/ray-head.sh"
# node-exporter's textfile directory: the same path on every node's host, in its node-exporter
# (read-only, --collector.textfile.directory) and in the Ray heads (which write into it).
NODE_TEXTFILE_DIR = "/var/lib/llm-cluster/node-exporter"
# How often ray-head.sh rewrites its textfile (Prometheus' default scrape interval).
RAY_METRICS_INTERVAL_S = 15
# What the textfile holds, each a gauge labelled ray_cluster=<instance>, with its HELP text.
RAY_TEXTFILE_METRICS: dict[str, str] = {
    "llm_ray_nodes": "Nodes alive in the Ray cluster (ray status on its head; 0 when ray status fails).",
    "llm_ray_gpus": "GPUs in the Ray cluster (ray status on its head; 0 when ray status fails).",
    "llm_ray_status_up": "1 when ray status on the head answered at the last poll, 0 when it failed.",
}

_GPU_LINE = re.compile(r"^\s*([0-9.]+)/([0-9.]+)\s+GPU\b", re.M)
_NODE_LINE = re.compile(r"^\s+(\d+)\s+node_\S+")


@dataclass(frozen=True)
class RayStatus:
    """What `ray status` says about the cluster: active nodes and GPUs."""

    nodes: int
    gpus_total: float
    gpus_used: float


def parse_ray_status(text: str) -> RayStatus:
    """Parse `ray status` output; the Python twin of the gate's awk (same lines, same answers)."""
    nodes, active = 0, False
    for line in text.splitlines():
        if line and not line[0].isspace():
            active = line.startswith("Active:")
            continue
        m = _NODE_LINE.match(line)
        if active and m:
            nodes += int(m.group(1))
    gpu_match = _GPU_LINE.search(text)
    used, total = (float(gpu_match.group(1)), float(gpu_match.group(2))) if gpu_match else (0.0, 0.0)
    return RayStatus(nodes, total, used)


def ray_textfile(instance: Instance, directory: str = NODE_TEXTFILE_DIR) -> str:
    """The head's node-exporter textfile (`*.prom`, the only names node-exporter reads)."""
    return f"{directory.rstrip('/')}/llm-ray-{instance.name}.prom"


def gpus_per_node(spec: StackSpec, instance: Instance) -> int:
    """GPUs each Ray node advertises: the whole node (its containers get every GPU)."""
    g = spec.node(instance.head).gpu
    assert g is not None  # the spec refuses nodes without GPUs
    return g.count


def want_gpus(spec: StackSpec, instance: Instance) -> int:
    """GPUs the gate waits for: every GPU of every node of the instance."""
    return gpus_per_node(spec, instance) * len(instance.nodes)


def head_address(spec: StackSpec, instance: Instance) -> str:
    """`<head address>:<rayPort>`: the GCS address workers join and `ray status` asks."""
    return f"{spec.node(instance.head).address}:{spec.pools[instance.pool].ray_port}"


def ray_head_start_argv(spec: StackSpec, instance: Instance) -> list[str]:
    """`ray start --head` for the instance's head node (not blocking: the script goes on to vLLM)."""
    pool = spec.pools[instance.pool]
    address = spec.node(instance.head).address
    return [
        "ray",
        "start",
        "--head",
        f"--port={pool.ray_port}",
        f"--node-ip-address={address}",
        f"--num-gpus={gpus_per_node(spec, instance)}",
        # Dashboard on the cluster address only: it can run jobs, so never 0.0.0.0.
        f"--dashboard-host={address}",
        f"--dashboard-port={pool.ray_dashboard_port}",
        f"--ray-client-server-port={pool.ray_client_port}",
        "--disable-usage-stats",
    ]


def ray_worker_argv(spec: StackSpec, instance: Instance, node: str) -> list[str]:
    """`ray start --block` joining the head: it exits when the head goes, so docker restarts it to rejoin."""
    return [
        "ray",
        "start",
        "--block",
        f"--address={head_address(spec, instance)}",
        f"--node-ip-address={spec.node(node).address}",
        f"--num-gpus={gpus_per_node(spec, instance)}",
        "--disable-usage-stats",
    ]


def ray_status_argv(spec: StackSpec, instance: Instance, container: str | None = None) -> list[str]:
    """`ray status` against the instance's GCS; through `docker exec` into `container` when given."""
    status = ["ray", "status", "--address", head_address(spec, instance)]
    return ["docker", "exec", container, *status] if container else status


def gate_hints(spec: StackSpec, instance: Instance) -> list[str]:
    """What to check when workers do not join, with this instance's ports, interfaces and containers."""
    pool = spec.pools[instance.pool]
    head = spec.node(instance.head)
    ifaces = sorted({spec.node(n).interface or "?" for n in instance.nodes})
    return [
        f"the firewall lets the workers reach {head.address} on TCP {pool.ray_port} (GCS) and "
        f"{pool.ray_client_port} (client) and the nodes reach each other on Ray's high ports",
        f"NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME ({', '.join(ifaces)}) carry the nodes' cluster addresses",
        "the nodes' clocks are in sync (chrony)",
        *(f"docker logs {container_name(instance, 'ray-worker')} on {n}" for n in instance.nodes[1:]),
    ]


# Same parse as parse_ray_status(): the total after "/" on the GPU line, and the node counts listed
# under "Active:". Reads $status, sets $gpus and $nodes (0 when the text has neither).
_PARSE_STATUS = """gpus=$(awk '$2 == "GPU" { split($1, a, "/"); printf "%d", a[2]; exit }' <<<"$status")
nodes=$(awk '/^Active:/ { on = 1; next } /^[^ ]/ { on = 0 } on && $2 ~ /^node_/ { n += $1 } END { printf "%d", n }' <<<"$status")
gpus=${gpus:-0}"""


def _status_cmd_line(status_cmd: Sequence[str]) -> str:
    return f"status_cmd=({' '.join(shlex.quote(a) for a in status_cmd)})"


def _gate_lines(
    want: int, timeout_s: int, instance: str, want_nodes: int | None, hints: Sequence[str], interval_s: int
) -> str:
    """The polling loop (on "${status_cmd[@]}") of the deploy-time gate and ray-head.sh (timeout 0 = wait forever)."""
    nodes_wanted = f"/{want_nodes}" if want_nodes else ""
    check = "; ".join(hints) if hints else "ray status on the head and docker logs of the workers"
    parse = textwrap.indent(_PARSE_STATUS, "  ")
    return f"""want={int(want)}
timeout={int(timeout_s)}
instance={shlex.quote(instance)}
start=$SECONDS
last=""
next_report=0
gpus=0
nodes=0
while :; do
  status=$("${{status_cmd[@]}}" 2>&1) || status=""
{parse}
  elapsed=$((SECONDS - start))
  if [[ "$gpus/$nodes" != "$last" ]] || (( elapsed >= next_report )); then
    echo "ray: $gpus/$want GPUs, $nodes node(s)"
    last="$gpus/$nodes"
    next_report=$((elapsed + 30))
  fi
  if (( gpus >= want )); then
    break
  fi
  if (( timeout > 0 && elapsed >= timeout )); then
    echo "ray gate $instance: timed out after ${{timeout}}s with $gpus of $want GPUs on $nodes{nodes_wanted} node(s):" \\
      "$((want - gpus)) GPUs missing. Check: "{shlex.quote(check)} >&2
    exit 1
  fi
  sleep {int(interval_s)}
done"""


def ray_gate_script(
    status_cmd: Sequence[str],
    want_gpus: int,
    timeout_s: int,
    instance: str,
    *,
    want_nodes: int | None = None,
    hints: Sequence[str] = (),
    interval_s: int = 5,
) -> str:
    """Bash that polls `ray status` until `want_gpus` GPUs are in the cluster; exits 1 naming what is missing."""
    return f"""#!/usr/bin/env bash
# Readiness gate for {instance}: wait until Ray reports {want_gpus} GPUs.
set -euo pipefail
{_status_cmd_line(status_cmd)}
{_gate_lines(want_gpus, timeout_s, instance, want_nodes, hints, interval_s)}
echo "ray gate $instance: $gpus GPUs on $nodes node(s) after $((SECONDS - start))s"
"""


def ray_metrics_writer(status_cmd: Sequence[str], cluster: str, textfile: str, interval_s: int) -> str:
    """Bash lines that start, in the background, the loop writing a Ray cluster's node-exporter textfile."""
    label = '{ray_cluster="' + cluster.replace("\\", "\\\\").replace('"', '\\"') + '"}'
    values = {"llm_ray_nodes": "$nodes", "llm_ray_gpus": "$gpus", "llm_ray_status_up": "$up"}
    words = []
    for name, help_text in RAY_TEXTFILE_METRICS.items():
        words += [
            shlex.quote(f"# HELP {name} {help_text}"),
            shlex.quote(f"# TYPE {name} gauge"),
            shlex.quote(f"{name}{label} ") + f'"{values[name]}"',
        ]
    text = " \\\n        ".join(words)
    parse = textwrap.indent(_PARSE_STATUS, "    ")
    return f"""# Ray's own metrics need ray[default]'s dashboard agent, which this image lacks: publish the
# cluster's nodes and GPUs for node-exporter's textfile collector instead, every {interval_s} s for as
# long as the container runs. Started in the background before the wait and the exec below (exec
# replaces this shell, not its children); written to a temporary file and renamed, so node-exporter
# never reads half a file.
textfile={shlex.quote(textfile)}
publish_ray_metrics() {{
  # A failed poll or write is retried at the next round: nothing may end the writer.
  set +e
  local dir=${{textfile%/*}} name=${{textfile##*/}} status up gpus nodes tmp failing=0
  local -a cmd=({" ".join(shlex.quote(a) for a in status_cmd)})
  mkdir -p "$dir"
  rm -f "$dir/.$name".*  # temporary files of a writer killed mid-write
  while :; do
    if status=$(timeout 30 "${{cmd[@]}}" 2>/dev/null); then up=1; else up=0; status=""; fi
{parse}
    if tmp=$(mktemp "$dir/.$name.XXXXXX") &&
      printf '%s\\n' \\
        {text} >"$tmp" &&
      chmod 0644 "$tmp" && mv -f "$tmp" "$textfile"; then
      failing=0
    else
      rm -f "$tmp"
      if (( ! failing )); then
        echo "ray metrics: cannot write $textfile; retrying every {interval_s}s" >&2
      fi
      failing=1
    fi
    sleep {int(interval_s)}
  done
}}
publish_ray_metrics &"""


def ray_head_script(
    spec: StackSpec,
    instance: Instance,
    *,
    interval_s: int = 5,
    textfile_dir: str = NODE_TEXTFILE_DIR,
    metrics_interval_s: int = RAY_METRICS_INTERVAL_S,
) -> str:
    """ray-head.sh: start the Ray head and its metrics writer, wait for all the instance's GPUs, then exec the command."""
    nodes = len(instance.nodes)
    start = " ".join(shlex.quote(a) for a in ray_head_start_argv(spec, instance))
    # No deadline inside the container: exiting would restart the head and throw out the workers that
    # already joined; the deploy-time gate is the one that times out and says what is missing.
    gate = _gate_lines(want_gpus(spec, instance), 0, instance.name, nodes, gate_hints(spec, instance), interval_s)
    writer = ray_metrics_writer(
        ray_status_argv(spec, instance), instance.name, ray_textfile(instance, textfile_dir), metrics_interval_s
    )
    return f"""#!/usr/bin/env bash
# Ray head of {instance.name}: start Ray, wait for the {nodes} nodes' GPUs, then run the container's
# command (vllm serve). Runs at every start of the container, so a restart needs no manual step.
set -euo pipefail
if (( $# == 0 )); then
  echo "usage: ray-head.sh <command to run once the cluster is complete>..." >&2
  exit 2
fi
{start}
# vLLM's ray.init() joins this cluster, not a new local one.
export RAY_ADDRESS={shlex.quote(head_address(spec, instance))}
{_status_cmd_line(ray_status_argv(spec, instance))}
{writer}
{gate}
echo "ray: cluster complete, starting: $*"
exec "$@"
"""
