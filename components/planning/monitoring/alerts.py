"""Prometheus alert rules: what each one watches, its threshold and how long it waits."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from components.engines.base import container_name
from components.planning.fabric.ray import (
    RAY_METRICS_INTERVAL_S,
    ray_textfile,
)
from components.planning.monitoring.engine_metrics import omitted, pool_metrics, serving_metrics
from components.planning.monitoring.prometheus import (
    monitoring_spec,
    scrape_targets,
    to_yaml,
)
from components.spec.stack import StackSpec
from components.spec.topology import Instance, affinity_pools, all_instances

# Fixed windows for availability alerts: a lost node or engine matters within minutes, whatever
# for_minutes says about performance conditions.
SERVICE_DOWN_FOR = "2m"
# A replica of a prefix-affinity pool with more than this many times the pool's mean in flight: the load
# bound keeps it near loadFactor x the mean, so this much means the bound is not holding.
ROUTING_IMBALANCE = 2
NODE_DOWN_FOR = "2m"
RAY_NODES_LOST_FOR = "1m"
# A Ray head's textfile older than this (4 missed rewrites) means its writer, or the head, is gone.
RAY_TEXTFILE_STALE_SECONDS = 4 * RAY_METRICS_INTERVAL_S


@dataclass(frozen=True)
class AlertRule:
    """One Prometheus alerting rule."""

    alert: str
    expr: str
    severity: str
    summary: str
    description: str
    for_: str | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def to_yaml_dict(self) -> dict[str, Any]:
        """The rule as it appears in a rules file."""
        out: dict[str, Any] = {"alert": self.alert, "expr": self.expr}
        if self.for_:
            out["for"] = self.for_
        out["labels"] = {"severity": self.severity, **self.labels}
        out["annotations"] = {"summary": self.summary, "description": self.description}
        return out


def _gpu_selector(inst: Instance) -> str:
    """DCGM label matchers for the GPUs an instance owns (dcgm-exporter's `gpu` is the index)."""
    nodes = "|".join(inst.nodes)
    sel = f'job="dcgm", node=~"{nodes}"'
    if inst.gpu_ids is not None:
        sel += ', gpu=~"' + "|".join(str(g) for g in inst.gpu_ids) + '"'
    return sel


def alert_groups(spec: StackSpec) -> dict[str, list[AlertRule]]:
    """Every alert, grouped; thresholds and expected counts come from the stack."""
    m = monitoring_spec(spec)
    t = m.thresholds
    for_ = f"{t.for_minutes}m"
    instances = all_instances(spec)
    ray_instances = [i for i in instances if i.uses_ray]
    serving: list[AlertRule] = []
    groups = serving_metrics(spec)
    for g in groups:
        sel = f'job="{g.job}"'
        if g.has("generation_tokens", "requests_running"):
            # Runbook: rate(vllm:num_generation_tokens_total[5m]) < 1000 -- a metric vLLM 0.9.2 does not
            # export, and a threshold that fires whenever traffic is low. Here: tokens stop while work is queued.
            serving.append(
                AlertRule(
                    "ThroughputDrop",
                    f"sum by (pool) (rate({g['generation_tokens']}{{{sel}}}[5m])) < "
                    f"{t.min_generation_tokens_per_second:g} and on (pool) "
                    f"sum by (pool) ({g['requests_running']}{{{sel}}}) > 0",
                    "warning",
                    "Pool {{ $labels.pool }} generates almost nothing while requests are running",
                    '{{ $value | printf "%.2f" }} tokens/s with requests in flight (floor '
                    f"{t.min_generation_tokens_per_second:g}): a stalled engine (NCCL hang, stuck worker).",
                    for_,
                )
            )
        if g.has("time_to_first_token"):
            # Runbook: histogram_quantile over vllm:e2e_request_latency_seconds_bucket, i.e. end-to-end
            # latency labelled as TTFT. Here: the time-to-first-token histogram, per pool.
            serving.append(
                AlertRule(
                    "HighTTFT",
                    "histogram_quantile(0.95, sum by (pool, le) "
                    f"(rate({g['time_to_first_token']}_bucket{{{sel}}}[5m]))) > "
                    f"{t.ttft_p95_seconds:g}",
                    "warning",
                    f"TTFT p95 of pool {{{{ $labels.pool }}}} above {t.ttft_p95_seconds:g}s",
                    'Time to first token p95 is {{ $value | printf "%.2f" }}s.',
                    for_,
                )
            )
        if g.has("kv_cache_usage"):
            serving.append(
                AlertRule(
                    "KVCacheFull",
                    f"{g['kv_cache_usage']}{{{sel}}} > {t.kv_cache_usage_ratio:g}",
                    "warning",
                    "KV cache of {{ $labels.instance }} nearly full",
                    'KV cache usage {{ $value | printf "%.3f" }}: new requests wait and running ones get preempted.',
                    for_,
                )
            )
        # Runbook: up{job="vllm"} == 0 only; a vanished target (or a whole pool gone) never fired.
        serving.append(
            AlertRule(
                "ServiceDown",
                f"up{{{sel}}} == 0",
                "critical",
                f"{g.title} instance {{{{ $labels.instance }}}} is down",
                "{{ $labels.instance }} (pool {{ $labels.pool }}) does not answer /metrics; a restarted "
                "instance reloads its weights for minutes before it serves again.",
                SERVICE_DOWN_FOR,
            )
        )
    for pname in spec.pools:
        g = pool_metrics(spec, pname)
        serving.append(
            AlertRule(
                "PoolDown",
                f'(count(up{{job="{g.job}", pool="{pname}"}} == 1) or vector(0)) == 0',
                "critical",
                f"Pool {pname} has no serving instance",
                f"No {g.title} instance of pool {pname} answers (or none is scraped): requests routed to it fail.",
                SERVICE_DOWN_FOR,
                {"pool": pname},
            )
        )

    gpu: list[AlertRule] = [
        # Runbook: DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_TOTAL; dcgm-exporter exports no FB_TOTAL.
        AlertRule(
            "GPUMemoryHigh",
            'DCGM_FI_DEV_FB_USED{job="dcgm"} / (DCGM_FI_DEV_FB_USED{job="dcgm"} + '
            f'DCGM_FI_DEV_FB_FREE{{job="dcgm"}}) > {t.gpu_memory_used_ratio:g}',
            "critical",
            "GPU {{ $labels.gpu }} of {{ $labels.node }} almost out of memory",
            'Framebuffer {{ $value | printf "%.3f" }} used (vLLM reserves its gpuMemoryUtilization, its CUDA '
            "context and, from vLLM 0.11, NCCL's buffers beside it; more means another process or a leak).",
            for_,
        ),
        AlertRule(
            "GPUXidError",
            'DCGM_FI_DEV_XID_ERRORS{job="dcgm"} > 0',
            "critical",
            "GPU {{ $labels.gpu }} of {{ $labels.node }} reported Xid {{ $value }}",
            "Xid {{ $value }} (48: double-bit ECC, 79: fallen off the bus, 13/31/43: kernel faults); "
            "check `nvidia-smi -q` and dmesg, drain and reset the GPU.",
            None,
        ),
        AlertRule(
            "GPUTemperatureHigh",
            f'DCGM_FI_DEV_GPU_TEMP{{job="dcgm"}} > {t.gpu_temperature_celsius:g}',
            "warning",
            "GPU {{ $labels.gpu }} of {{ $labels.node }} is hot",
            f"{{{{ $value }}}} C (threshold {t.gpu_temperature_celsius:g} C); the GPU throttles soon.",
            for_,
        ),
    ]
    # Runbook: DCGM_FI_DEV_GPU_UTIL < 30 fired on idle-by-design GPUs, nodes outside every pool and
    # GPUs still loading weights. Here: one rule per instance, only while that instance has work.
    for inst in instances:
        g = pool_metrics(spec, inst.pool)
        if not g.has("requests_running"):
            continue  # said in the rules file's header (omitted_rules)
        gpu.append(
            AlertRule(
                "GPULowUtilization",
                f"avg by (node) (DCGM_FI_DEV_GPU_UTIL{{{_gpu_selector(inst)}}}) < "
                f"{t.gpu_low_utilization_percent:g} and on () "
                f'sum({g["requests_running"]}{{job="{g.job}", instance="{inst.name}"}}) > 0',
                "info",
                f"GPUs of {inst.name} on {{{{ $labels.node }}}} idle while it has requests",
                'Average GPU utilization {{ $value | printf "%.0f" }}% with requests running.',
                f"{2 * t.for_minutes}m",
                {"pool": inst.pool, "vllm_instance": inst.name},
            )
        )

    nodes: list[AlertRule] = [
        AlertRule(
            "NodeDown",
            'up{job="node"} == 0',
            "critical",
            "Node {{ $labels.node }} is unreachable",
            "node-exporter on {{ $labels.node }} does not answer: the host is down or off the network.",
            NODE_DOWN_FOR,
        ),
        AlertRule(
            "DCGMExporterDown",
            'up{job="dcgm"} == 0 unless on (node) up{job="node"} == 0',
            "warning",
            "No GPU metrics from {{ $labels.node }}",
            "dcgm-exporter on {{ $labels.node }} does not answer while the node does: GPU alerts for it are blind.",
            for_,
        ),
    ]
    for job, count in Counter(tgt.job for tgt in scrape_targets(spec)).items():
        nodes.append(
            AlertRule(
                "TargetsMissing",
                f'(count(up{{job="{job}"}}) or vector(0)) < {count}',
                "warning",
                f"Prometheus scrapes fewer {job} targets than the stack has",
                f"{{{{ $value }}}} of {count} {job} targets are configured: prometheus.yml is not the generated one.",
                for_,
                {"job": job},
            )
        )

    # Ray's own metrics need ray[default], which the vLLM image lacks: each head writes llm_ray_*
    # into a node-exporter textfile (components.planning.fabric.ray), scraped with its node's job="node".
    ray: list[AlertRule] = []
    for inst in ray_instances:
        want, head = len(inst.nodes), container_name(inst, "ray-head")
        textfile = ray_textfile(inst).rsplit("/", 1)[1]
        file_re = textfile.replace(".", "[.]")  # `file` is the path node-exporter read (1.5: the full path)
        ray.append(
            AlertRule(
                "RayNodesLost",
                f'max(llm_ray_nodes{{job="node", ray_cluster="{inst.name}"}}) < {want}',
                "critical",
                f"Ray cluster {inst.name} lost nodes",
                f"{{{{ $value }}}} of {want} Ray nodes of {inst.name} are in the cluster (ray status on its head "
                f"{inst.head}; 0 when ray status fails, llm_ray_status_up 0): the TP x PP engine of pool "
                f"{inst.pool} cannot run without all of them.",
                RAY_NODES_LOST_FOR,
                {"pool": inst.pool, "ray_cluster": inst.name},
            )
        )
        # Without a fresh textfile RayNodesLost sees nothing (or a frozen count): say so.
        ray.append(
            AlertRule(
                "RayMetricsStale",
                f'(time() - max(node_textfile_mtime_seconds{{job="node", file=~"(.*/)?{file_re}"}}) '
                f"> {RAY_TEXTFILE_STALE_SECONDS}) or "
                f'((count(llm_ray_nodes{{job="node", ray_cluster="{inst.name}"}}) or vector(0)) == 0)',
                "warning",
                f"No fresh Ray metrics from {inst.name}",
                f"node-exporter on {inst.head} has no {textfile} rewritten within {RAY_TEXTFILE_STALE_SECONDS}s "
                f"(the head container {head} rewrites it every {RAY_METRICS_INTERVAL_S}s): the container is "
                f"not running or its metrics writer stopped, so RayNodesLost cannot see this cluster. Check "
                f"`docker ps -a` and `docker logs {head}` on {inst.head}.",
                SERVICE_DOWN_FOR,
                {"pool": inst.pool, "ray_cluster": inst.name},
            )
        )

    gateway: list[AlertRule] = []
    if spec.gateway is not None:
        gateway = [
            AlertRule(
                "GatewayDown",
                'up{job="gateway"} == 0',
                "critical",
                "The gateway on {{ $labels.node }} is down",
                "The gateway's nginx does not answer /metrics on its metrics port: the node or the gateway's "
                "container is down (then clients get no answer either), and the other gateway alerts are blind.",
                SERVICE_DOWN_FOR,
            ),
            AlertRule(
                "Gateway5xxRateHigh",
                'sum by (pool) (rate(llm_gateway_requests_total{job="gateway", status=~"5.."}[5m])) / '
                'sum by (pool) (rate(llm_gateway_requests_total{job="gateway"}[5m])) > '
                f"{t.gateway_5xx_ratio:g}",
                "warning",
                "Gateway answers 5xx for pool {{ $labels.pool }}",
                f'{{{{ $value | printf "%.3f" }}}} of requests end in 5xx (threshold {t.gateway_5xx_ratio:g}).',
                for_,
            ),
            AlertRule(
                "GatewayUpstreamFailures",
                'sum by (pool, upstream) (increase(llm_gateway_upstream_failures_total{job="gateway"}[5m])) > '
                f"{t.gateway_upstream_failures:g}",
                "warning",
                "Upstream {{ $labels.upstream }} of pool {{ $labels.pool }} keeps failing",
                '{{ $value | printf "%.0f" }} failed attempts in 5 minutes; nginx passes them to other '
                "upstreams, so capacity is reduced.",
                for_,
            ),
        ]
        if affinity_pools(spec):
            in_flight = 'llm_gateway_upstream_in_flight{job="gateway"}'
            floor = spec.gateway.routing.min_in_flight
            gateway.append(
                AlertRule(
                    "GatewayRoutingImbalance",
                    f"max by (pool) ({in_flight}) > {ROUTING_IMBALANCE:g} * avg by (pool) ({in_flight}) "
                    f"and max by (pool) ({in_flight}) > {floor}",
                    "warning",
                    "Prefix affinity loads one replica of pool {{ $labels.pool }} far above the others",
                    '{{ $value | printf "%.0f" }} requests in flight on its busiest replica, over '
                    f"{ROUTING_IMBALANCE:g} x the pool's mean: the load bound (gateway.routing.loadFactor) is not "
                    "holding, or replicas are ejected; see the gateway's routing outcomes.",
                    for_,
                )
            )

    groups = {"llm-serving": serving, "llm-gpu": gpu, "llm-nodes": nodes, "llm-ray": ray, "llm-gateway": gateway}
    return {k: v for k, v in groups.items() if v}


# The serving alerts and the logical metrics each needs: an engine without them gets no such rule.
ALERT_METRICS = {
    "ThroughputDrop": ("generation_tokens", "requests_running"),
    "HighTTFT": ("time_to_first_token",),
    "KVCacheFull": ("kv_cache_usage",),
    "GPULowUtilization": ("requests_running",),
}


def omitted_rules(spec: StackSpec) -> list[str]:
    """The serving alerts some pools go without, because their engine does not export what they measure."""
    return omitted(serving_metrics(spec), ALERT_METRICS)


def alert_rules(spec: StackSpec) -> str:
    """The Prometheus rules file (YAML text); a header says which alerts an engine's pools go without."""
    header = "".join(f"# not generated: {line}\n" for line in omitted_rules(spec))
    return header + to_yaml(
        {
            "groups": [
                {"name": name, "rules": [r.to_yaml_dict() for r in rules]} for name, rules in alert_groups(spec).items()
            ]
        }
    )
