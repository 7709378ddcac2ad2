"""Where each pool's instances run: nodes, head, GPUs and port of every serving instance."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.spec import engines as deployed_engines
from components.spec.cluster import PoolSpec

if TYPE_CHECKING:  # annotations only: the stack module reads this one
    from components.spec.stack import StackSpec


@dataclass(frozen=True)
class Instance:
    """One engine server: a single-node replica, or a TP×PP instance across nodes (on Ray for vLLM)."""

    pool: str
    name: str  # unique in the stack; container and resource names derive from it
    nodes: tuple[str, ...]  # the head first
    port: int
    tensor_parallel: int
    pipeline_parallel: int
    gpu_ids: tuple[int, ...] | None  # GPUs of a replica that shares its node; None = all GPUs
    # How it starts across its nodes: "single" (one node), "ray", or "native" (the engine's own launcher on
    # every node, rank 0 on the head serving the API); "none" for an engine that cannot span nodes.
    launcher: str = "single"
    master_port: int | None = None  # the native launcher's rendezvous port on the head

    @property
    def head(self) -> str:
        """The node whose address serves the OpenAI API (and runs the Ray head, or the launcher's rank 0)."""
        return self.nodes[0]

    @property
    def spans_nodes(self) -> bool:
        """One server across several nodes (on Ray, or on the engine's own launcher)."""
        return len(self.nodes) > 1

    @property
    def uses_ray(self) -> bool:
        """An instance spanning nodes on a Ray cluster (the default way across nodes)."""
        return self.spans_nodes and self.launcher == "ray"

    @property
    def native_launcher(self) -> bool:
        """Instances spanning nodes on the engine's own launcher: one container per node, no Ray."""
        return self.spans_nodes and self.launcher == "native"


def launcher_of(pool: PoolSpec) -> deployed_engines.Launcher:
    """How the pool's instances that span nodes start, as its engine reads the pool's options block."""
    engine = deployed_engines.deployed().get(pool.engine)
    return engine.launcher(pool.options) if engine is not None else deployed_engines.Launcher("none")


def nodes_per_instance(pool: PoolSpec, gpus_per_node: int) -> int:
    """Nodes one instance spans: the GPUs it needs (TP×PP) over the GPUs of a node, at least PP."""
    need = pool.tensor_parallel * pool.pipeline_parallel
    return max(pool.pipeline_parallel, math.ceil(need / gpus_per_node))


def instances(spec: StackSpec, pool_name: str) -> list[Instance]:
    """Every instance of a pool, in node order: the layout components, gateway and monitoring share."""
    pool = spec.pools[pool_name]
    gpus = spec.node(pool.nodes[0]).gpu
    assert gpus is not None  # the spec refuses nodes without GPUs
    span = nodes_per_instance(pool, gpus.count)
    launch = launcher_of(pool) if span > 1 else deployed_engines.Launcher("single")
    out: list[Instance] = []
    for start in range(0, len(pool.nodes) - span + 1, span):
        group = tuple(pool.nodes[start : start + span])
        if span > 1 or pool.replicas_per_node == 1:
            out.append(
                Instance(
                    pool_name,
                    f"{pool_name}-{group[0]}",
                    group,
                    pool.port,
                    pool.tensor_parallel,
                    pool.pipeline_parallel,
                    None,
                    launch.kind,
                    launch.port,  # set by native launchers only
                )
            )
            continue
        width = pool.tensor_parallel * pool.pipeline_parallel
        for r in range(pool.replicas_per_node):
            out.append(
                Instance(
                    pool_name,
                    f"{pool_name}-{group[0]}-r{r}",
                    group,
                    pool.port + r,
                    pool.tensor_parallel,
                    pool.pipeline_parallel,
                    tuple(range(r * width, (r + 1) * width)),
                )
            )
    return out


def all_instances(spec: StackSpec) -> list[Instance]:
    """Instances of every pool, pools in stack order."""
    return [i for p in spec.pools for i in instances(spec, p)]


def host_ports(spec: StackSpec) -> list[tuple[str, int, str]]:
    """Every TCP/UDP listener the stack puts on a node's host network: (node, port, stack key)."""
    out: list[tuple[str, int, str]] = []
    for pname, p in spec.pools.items():
        for inst in instances(spec, pname):
            out.append((inst.head, inst.port, f"pools.{pname}.port"))
            if inst.uses_ray:
                out += [
                    (inst.head, p.ray_port, f"pools.{pname}.rayPort"),
                    (inst.head, p.ray_dashboard_port, f"pools.{pname}.rayDashboardPort"),
                    (inst.head, p.ray_client_port, f"pools.{pname}.rayClientPort"),
                ]
            elif inst.native_launcher and inst.master_port is not None:
                out.append((inst.head, inst.master_port, f"pools.{pname}.{launcher_of(p).port_key}"))
    g = spec.gateway
    if g is not None:
        out += [(g.node, g.port, "gateway.port"), (g.node, g.metrics_port, "gateway.metricsPort")]
        if g.http_redirect_port is not None:
            out.append((g.node, g.http_redirect_port, "gateway.httpRedirectPort"))
    m = spec.monitoring
    if m is not None:
        for n in spec.nodes:
            out += [
                (n, m.dcgm_exporter.port, "monitoring.dcgmExporter.port"),
                (n, m.node_exporter.port, "monitoring.nodeExporter.port"),
            ]
        out += [
            (m.node, m.prometheus.port, "monitoring.prometheus.port"),
            (m.node, m.grafana.port, "monitoring.grafana.port"),
        ]
        if m.alertmanager is not None:
            out.append((m.node, m.alertmanager.port, "monitoring.alertmanager.port"))
    return out


def resource_suffix(text: str) -> str:
    """A name fragment from an image ref or path: `vllm/vllm-openai:v0.9.2` -> `vllm-openai-v0-9-2`."""
    last = text.rstrip("/").split("/")[-1]
    return "".join(c if c.isalnum() else "-" for c in last.lower()).strip("-")


def weights_nodes(spec: StackSpec, model: str) -> list[str]:
    """Nodes that need a model's weights: its source node first, then every node of the pools serving it."""
    source = spec.models[model].source.node
    holders = [n for p in spec.pools.values() if p.model == model for n in p.nodes]
    return list(dict.fromkeys(([source] if source else []) + holders))


def pool_routing(spec: StackSpec, pool: str) -> str:
    """How the gateway picks a replica of the pool: `prefix` (affinity with bounded load) or `least_conn`."""
    assert spec.gateway is not None
    return spec.pools[pool].routing or spec.gateway.routing.policy


def affinity_pools(spec: StackSpec) -> list[str]:
    """The pools routed by prefix affinity: set to `prefix`, with two or more instances to choose from. Pools
    that share a model keep their weighted least_conn split in the model's own upstream; a path route that
    pins one of them reaches the pool's upstream, with its affinity."""
    if spec.gateway is None:
        return []
    return [p for p in spec.pools if pool_routing(spec, p) == "prefix" and len(instances(spec, p)) >= 2]
