"""Monitoring plan: Prometheus scrape config, alert rules, Grafana provisioning and the password script."""

from __future__ import annotations

import json
import shlex
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import yaml

from components.engines.base import container_name
from components.engines.registry import engine_for
from components.planning.fabric.ray import (
    NODE_TEXTFILE_DIR,
    RAY_METRICS_INTERVAL_S,
    ray_textfile,
)
from components.planning.monitoring.engine_metrics import ServingMetrics, omitted, pool_metrics, serving_metrics
from components.planning.nodes.scripts import put_files_lines, written_files  # noqa: F401 (re-exported)
from components.spec.monitoring import MonitoringSpec
from components.spec.stack import StackSpec
from components.spec.topology import Instance, all_instances

# Files are laid out under /etc in the containers: `prometheus/…` -> /etc/prometheus/…, and so on.
PROMETHEUS_CONFIG = "prometheus/prometheus.yml"
PROMETHEUS_RULES = "prometheus/rules/llm-cluster.rules.yml"
GRAFANA_DATASOURCE = "grafana/provisioning/datasources/llm-cluster.yaml"
GRAFANA_DASHBOARD_PROVIDER = "grafana/provisioning/dashboards/llm-cluster.yaml"
GRAFANA_DASHBOARDS_DIR = "grafana/dashboards/llm-cluster"
ALERTMANAGER_CONFIG = "alertmanager/alertmanager.yml"
ALERTMANAGER_CONFIG_PATH = "/etc/" + ALERTMANAGER_CONFIG

# The generated files live on the monitoring host, written by one command per service and
# bind-mounted read-only into its container (directories, never single files: a file replaced by
# rename stays the old inode in a file mount). A changed file is then an update of that command,
# which reloads the running service, not a new container. `<root>/<rel>` on the host is
# container_path(rel) in the container.
HOST_CONFIG_ROOT = "/etc/llm-cluster/monitoring"
CONFIG_DIRS: dict[str, tuple[str, ...]] = {
    "prometheus": ("prometheus",),
    # Not all of /etc/grafana: the image's grafana.ini lives there.
    "grafana": ("grafana/provisioning", "grafana/dashboards"),
    "alertmanager": ("alertmanager",),
}
# The official images run Prometheus and Alertmanager as nobody, Grafana as 472:0.
CONFIG_OWNERS = {"prometheus": "65534:65534", "grafana": "472:0", "alertmanager": "65534:65534"}

GRAFANA_PASSWORD_FILE = "/etc/llm-cluster/grafana/admin-password"
GRAFANA_PASSWORD_MOUNT = "/run/secrets/grafana-admin-password"
# The official Grafana image runs as uid 472, gid 0: the mounted password file must be readable by it.
GRAFANA_FILE_OWNER = "472:0"
DATASOURCE_UID = "prometheus"

# Fixed windows for availability alerts: a lost node or engine matters within minutes, whatever
# for_minutes says about performance conditions.
SERVICE_DOWN_FOR = "2m"
NODE_DOWN_FOR = "2m"
RAY_NODES_LOST_FOR = "1m"
# A Ray head's textfile older than this (4 missed rewrites) means its writer, or the head, is gone.
RAY_TEXTFILE_STALE_SECONDS = 4 * RAY_METRICS_INTERVAL_S


def container_path(rel: str) -> str:
    """Where a generated file (key of monitoring_files) lives inside its container."""
    return "/etc/" + rel


def host_config_path(rel: str, root: str = HOST_CONFIG_ROOT) -> str:
    """Where a generated file (key of monitoring_files) lives on the monitoring host."""
    return f"{root}/{rel}"


def config_mounts(service: str) -> list[tuple[str, str]]:
    """(host directory, container directory) pairs a service's container mounts read-only."""
    return [(host_config_path(d), container_path(d)) for d in CONFIG_DIRS[service]]


def host_port(address: str, port: int) -> str:
    """`host:port` for a listener or a target (IPv6 in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


@dataclass(frozen=True)
class ScrapeTarget:
    """One /metrics endpoint Prometheus scrapes, with the labels that name it."""

    job: str
    address: str
    port: int
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """host:port as Prometheus writes it."""
        return host_port(self.address, self.port)


def _monitoring(spec: StackSpec) -> MonitoringSpec:
    if spec.monitoring is None:
        raise ValueError("the stack has no monitoring section")
    return spec.monitoring


def node_pools(spec: StackSpec) -> dict[str, str]:
    """Node -> the pool it serves (nodes outside every pool are absent)."""
    return {n: pname for pname, p in spec.pools.items() for n in p.nodes}


def scrape_targets(spec: StackSpec) -> list[ScrapeTarget]:
    """Every endpoint: exporters per node, engine instances, the gateway, the monitors (Ray: see alert_groups)."""
    m = _monitoring(spec)
    pools = node_pools(spec)
    targets: list[ScrapeTarget] = []
    for job, svc in (("node", m.node_exporter), ("dcgm", m.dcgm_exporter)):
        for n in spec.nodes:
            labels = {"instance": n, "node": n} | ({"pool": pools[n]} if n in pools else {})
            targets.append(ScrapeTarget(job, spec.node(n).address, svc.port, labels))
    for inst in all_instances(spec):
        # One job per engine: each exports its own metric names (components.planning.monitoring.engine_metrics).
        targets.append(
            ScrapeTarget(
                engine_for(spec.pools[inst.pool]).metrics_job,
                spec.node(inst.head).address,
                inst.port,
                {"instance": inst.name, "node": inst.head, "pool": inst.pool},
            )
        )
    g = spec.gateway
    if g is not None:
        # nginx's own metrics listener, plain HTTP on the cluster network whether or not the gateway serves TLS.
        targets.append(
            ScrapeTarget("gateway", spec.node(g.node).address, g.metrics_port, {"instance": g.node, "node": g.node})
        )
    mon_addr = spec.node(m.node).address
    targets.append(ScrapeTarget("prometheus", mon_addr, m.prometheus.port, {"instance": m.node, "node": m.node}))
    if m.alertmanager is not None:
        targets.append(
            ScrapeTarget("alertmanager", mon_addr, m.alertmanager.port, {"instance": m.node, "node": m.node})
        )
    return targets


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=10_000, allow_unicode=True)


def prometheus_config(spec: StackSpec) -> str:
    """prometheus.yml: one job per kind of endpoint, static targets from the spec, rules beside it."""
    m = _monitoring(spec)
    interval = f"{m.scrape_interval_seconds}s"
    jobs: dict[str, list[ScrapeTarget]] = {}
    for t in scrape_targets(spec):
        jobs.setdefault(t.job, []).append(t)
    scrape_configs = []
    for job, targets in jobs.items():
        # Every exporter serves plain HTTP on the cluster network (the gateway's metrics too, even with TLS).
        cfg: dict[str, Any] = {"job_name": job, "scheme": "http"}
        cfg["static_configs"] = [{"targets": [t.target], "labels": t.labels} for t in targets]
        scrape_configs.append(cfg)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        # Relative to the config file: /etc/prometheus/rules in the container, a tmpdir in tests.
        "rule_files": ["rules/*.yml"],
    }
    if m.alertmanager is not None:
        am = host_port(spec.node(m.node).address, m.alertmanager.port)
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]}
    config["scrape_configs"] = scrape_configs
    return _yaml(config)


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
    m = _monitoring(spec)
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
    return header + _yaml(
        {
            "groups": [
                {"name": name, "rules": [r.to_yaml_dict() for r in rules]} for name, rules in alert_groups(spec).items()
            ]
        }
    )


# --- Grafana -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """A time-series panel: title, unit and PromQL queries with their legends."""

    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (expr, legendFormat)


def _rate(metric: str, sel: str) -> str:
    return f"rate({metric}{{{sel}}}[$__rate_interval])"


def _quantiles(metric: str, sel: str) -> tuple[tuple[str, str], ...]:
    return tuple(
        (f"histogram_quantile({q}, sum by (pool, le) ({_rate(metric, sel)}))", f"{{{{pool}}}} p{round(q * 100)}")
        for q in (0.5, 0.95, 0.99)
    )


DCGM_SEL = 'job="dcgm", node=~"$node"'
NODE_SEL = 'job="node", node=~"$node"'


def serving_panels(groups: list[ServingMetrics]) -> tuple[Panel, ...]:
    """The pools' panels: each query once per engine group that exports its metric."""

    def each(*logical: str) -> list[tuple[ServingMetrics, str]]:
        return [(g, f'job="{g.job}", pool=~"$pool"') for g in groups if g.has(*logical)]

    panels = (
        Panel(
            "Generation throughput per pool",
            "tokens/s (generated)",
            tuple(
                q
                for g, sel in each("generation_tokens", "prompt_tokens")
                for q in (
                    (f"sum by (pool) ({_rate(g['generation_tokens'], sel)})", "{{pool}} generated"),
                    (f"sum by (pool) ({_rate(g['prompt_tokens'], sel)})", "{{pool}} prompt"),
                )
            ),
        ),
        Panel(
            "Time to first token",
            "s",
            tuple(
                q
                for g, sel in each("time_to_first_token")
                for q in _quantiles(f"{g['time_to_first_token']}_bucket", sel)
            ),
        ),
        Panel(
            "Time per output token",
            "s",
            tuple(
                q
                for g, sel in each("time_per_output_token")
                for q in _quantiles(f"{g['time_per_output_token']}_bucket", sel)
            ),
        ),
        Panel(
            "KV cache usage",
            "percentunit",
            tuple((f"{g['kv_cache_usage']}{{{sel}}}", "{{instance}}") for g, sel in each("kv_cache_usage")),
        ),
        Panel(
            "Queue depth",
            "short",
            tuple(
                q
                for g, sel in each("requests_waiting", "requests_running")
                for q in (
                    (f"sum by (pool) ({g['requests_waiting']}{{{sel}}})", "{{pool}} waiting"),
                    (f"sum by (pool) ({g['requests_running']}{{{sel}}})", "{{pool}} running"),
                )
            ),
        ),
        Panel(
            "Preemptions",
            "short",
            tuple((f"sum by (pool) ({_rate(g['preemptions'], sel)})", "{{pool}}") for g, sel in each("preemptions")),
        ),
    )
    return tuple(p for p in panels if p.queries)


def _pool_variable_query(groups: list[ServingMetrics]) -> str:
    if len(groups) == 1 and groups[0].has("requests_running"):
        return f"label_values({groups[0]['requests_running']}, pool)"
    return 'label_values(up{job=~"' + "|".join(dict.fromkeys(g.job for g in groups)) + '"}, pool)'


GATEWAY_PANELS: tuple[Panel, ...] = (
    Panel(
        "Gateway requests by key, model and status",
        "reqps",
        (
            (
                'sum by (key_id, model, status) (rate(llm_gateway_requests_total{job="gateway"}[$__rate_interval]))',
                "{{key_id}} {{model}} {{status}}",
            ),
        ),
    ),
    Panel(
        "Gateway 5xx ratio per pool",
        "percentunit",
        (
            (
                'sum by (pool) (rate(llm_gateway_requests_total{job="gateway", status=~"5.."}[$__rate_interval])) / '
                'sum by (pool) (rate(llm_gateway_requests_total{job="gateway"}[$__rate_interval]))',
                "{{pool}}",
            ),
        ),
    ),
    Panel(
        "Gateway upstream failures",
        "short",
        (
            (
                'sum by (pool, upstream) (increase(llm_gateway_upstream_failures_total{job="gateway"}[$__rate_interval]))',
                "{{pool}} {{upstream}}",
            ),
        ),
    ),
)
GPU_PANELS: tuple[Panel, ...] = (
    Panel(
        "GPU utilization per node", "percent", ((f"avg by (node) (DCGM_FI_DEV_GPU_UTIL{{{DCGM_SEL}}})", "{{node}}"),)
    ),
    Panel(
        "GPU memory used per node",
        "percentunit",
        (
            (
                f"sum by (node) (DCGM_FI_DEV_FB_USED{{{DCGM_SEL}}}) / (sum by (node) (DCGM_FI_DEV_FB_USED{{{DCGM_SEL}}}) "
                f"+ sum by (node) (DCGM_FI_DEV_FB_FREE{{{DCGM_SEL}}}))",
                "{{node}}",
            ),
        ),
    ),
    Panel(
        "GPU temperature per node (hottest GPU)",
        "celsius",
        ((f"max by (node) (DCGM_FI_DEV_GPU_TEMP{{{DCGM_SEL}}})", "{{node}}"),),
    ),
    Panel("GPU power per node", "watt", ((f"sum by (node) (DCGM_FI_DEV_POWER_USAGE{{{DCGM_SEL}}})", "{{node}}"),)),
    Panel(
        "Last Xid error per GPU",
        "short",
        ((f"max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS{{{DCGM_SEL}}})", "{{node}} GPU {{gpu}}"),),
    ),
    Panel(
        "Node CPU busy",
        "percentunit",
        (
            (
                f'1 - avg by (node) (rate(node_cpu_seconds_total{{{NODE_SEL}, mode="idle"}}[$__rate_interval]))',
                "{{node}}",
            ),
        ),
    ),
    Panel(
        "Node memory available",
        "percentunit",
        ((f"node_memory_MemAvailable_bytes{{{NODE_SEL}}} / node_memory_MemTotal_bytes{{{NODE_SEL}}}", "{{node}}"),),
    ),
)


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
    }


def _dashboard(
    uid: str, title: str, sections: list[tuple[str, tuple[Panel, ...]]], variables: list[dict[str, Any]]
) -> dict[str, Any]:
    ds = {"type": "prometheus", "uid": DATASOURCE_UID}
    panels: list[dict[str, Any]] = []
    y = 0
    for section, section_panels in sections:
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": section,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, p in enumerate(section_panels):
            panels.append(
                {
                    "id": len(panels) + 1,
                    "type": "timeseries",
                    "title": p.title,
                    "datasource": ds,
                    "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                    "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                    "targets": [
                        {"refId": chr(ord("A") + j), "datasource": ds, "expr": expr, "legendFormat": legend}
                        for j, (expr, legend) in enumerate(p.queries)
                    ],
                }
            )
        y += 8 * ((len(section_panels) + 1) // 2)
    return {
        "uid": uid,
        "title": title,
        "tags": ["llm-cluster"],
        "editable": False,
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "browser",
        "templating": {"list": variables},
        "panels": panels,
    }


def dashboards(spec: StackSpec) -> dict[str, dict[str, Any]]:
    """Dashboard JSON models by file name: serving (pools, gateway) and GPU nodes."""
    groups = serving_metrics(spec)
    serving_sections = [("Pools", serving_panels(groups))]
    if spec.gateway is not None:
        serving_sections.append(("Gateway", GATEWAY_PANELS))
    return {
        "llm-serving.json": _dashboard(
            "llm-serving", "LLM serving", serving_sections, [_variable("pool", _pool_variable_query(groups))]
        ),
        "gpu-nodes.json": _dashboard(
            "llm-gpu-nodes",
            "GPU nodes",
            [("GPUs and hosts", GPU_PANELS)],
            [_variable("node", 'label_values(up{job="node"}, node)')],
        ),
    }


def grafana_provisioning(spec: StackSpec) -> dict[str, str]:
    """Datasource and dashboard-provider YAML plus dashboard JSON, by path (see container_path)."""
    m = _monitoring(spec)
    datasource = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": f"http://{host_port(spec.node(m.node).address, m.prometheus.port)}",
                "isDefault": True,
                "editable": False,
                "jsonData": {"timeInterval": f"{m.scrape_interval_seconds}s"},
            }
        ],
    }
    provider = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "llm-cluster",
                "folder": "LLM cluster",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "options": {"path": container_path(GRAFANA_DASHBOARDS_DIR)},
            }
        ],
    }
    files = {GRAFANA_DATASOURCE: _yaml(datasource), GRAFANA_DASHBOARD_PROVIDER: _yaml(provider)}
    for name, model in dashboards(spec).items():
        files[f"{GRAFANA_DASHBOARDS_DIR}/{name}"] = json.dumps(model, indent=2) + "\n"
    return files


def prometheus_files(spec: StackSpec) -> dict[str, str]:
    """The Prometheus container's files: config and rules."""
    return {PROMETHEUS_CONFIG: prometheus_config(spec), PROMETHEUS_RULES: alert_rules(spec)}


def monitoring_files(spec: StackSpec) -> dict[str, str]:
    """Every generated Prometheus and Grafana file by relative path (see container_path)."""
    return prometheus_files(spec) | grafana_provisioning(spec)


# --- container command lines ---------------------------------------------------------------------
# Every monitoring container runs on the host network and binds the node's cluster address only:
# the policy pack refuses internal ports reachable beyond the cluster network.


def node_exporter_args(spec: StackSpec, node: str) -> list[str]:
    """node-exporter flags: the host's root at /host, the textfile directory (Ray heads), cluster address only."""
    m = _monitoring(spec)
    return [
        "--path.rootfs=/host",
        f"--collector.textfile.directory={NODE_TEXTFILE_DIR}",
        f"--web.listen-address={host_port(spec.node(node).address, m.node_exporter.port)}",
    ]


def dcgm_exporter_env(spec: StackSpec, node: str) -> list[str]:
    """dcgm-exporter environment (its entrypoint reads flags from these variables)."""
    m = _monitoring(spec)
    return [
        f"DCGM_EXPORTER_LISTEN={host_port(spec.node(node).address, m.dcgm_exporter.port)}",
        "DCGM_EXPORTER_KUBERNETES=false",
    ]


def prometheus_args(spec: StackSpec) -> list[str]:
    """Prometheus flags: generated config, retention from the stack, lifecycle API for reloads."""
    m = _monitoring(spec)
    return [
        f"--config.file={container_path(PROMETHEUS_CONFIG)}",
        "--storage.tsdb.path=/prometheus",
        f"--storage.tsdb.retention.time={m.retention_days}d",
        f"--web.listen-address={host_port(spec.node(m.node).address, m.prometheus.port)}",
        "--web.enable-lifecycle",
    ]


def grafana_env(spec: StackSpec) -> list[str]:
    """Grafana settings: cluster address, admin password from the mounted file, no phoning home."""
    m = _monitoring(spec)
    return [
        f"GF_SERVER_HTTP_ADDR={spec.node(m.node).address}",
        f"GF_SERVER_HTTP_PORT={m.grafana.port}",
        "GF_SECURITY_ADMIN_USER=admin",
        f"GF_SECURITY_ADMIN_PASSWORD__FILE={GRAFANA_PASSWORD_MOUNT}",
        "GF_USERS_ALLOW_SIGN_UP=false",
        "GF_AUTH_ANONYMOUS_ENABLED=false",
        "GF_ANALYTICS_REPORTING_ENABLED=false",
        "GF_ANALYTICS_CHECK_FOR_UPDATES=false",
    ]


def alertmanager_args(spec: StackSpec) -> list[str]:
    """Alertmanager flags: config from the secret, cluster address, HA gossip off (one instance)."""
    m = _monitoring(spec)
    assert m.alertmanager is not None
    return [
        f"--config.file={ALERTMANAGER_CONFIG_PATH}",
        "--storage.path=/alertmanager",
        f"--web.listen-address={host_port(spec.node(m.node).address, m.alertmanager.port)}",
        # An empty cluster address disables gossip, which would otherwise listen on 0.0.0.0:9094.
        "--cluster.listen-address=",
    ]


# --- Grafana admin password on the host ----------------------------------------------------------


def _private_write(path: str, owner: str, fill: str) -> str:
    """Shell lines that write a file atomically, 0600 and owned by `owner`; `fill` writes "$tmp"."""
    q, d, o = shlex.quote(path), shlex.quote(path.rsplit("/", 1)[0]), shlex.quote(owner)
    return f"""install -d -m 0700 {d}
umask 077
tmp=$(mktemp {q}.XXXXXX)
{fill}
chown {o} "$tmp"
chmod 0600 "$tmp"
mv -f "$tmp" {q}
"""


def grafana_password_generate_script(path: str = GRAFANA_PASSWORD_FILE, owner: str = GRAFANA_FILE_OWNER) -> str:
    """Create the admin password file once (random, 0600, readable by Grafana's uid) and print it."""
    # 24 random bytes -> 32 URL-safe characters, kept in a variable so they never reach a log.
    fill = "password=$(head -c 24 /dev/urandom | base64 | tr '/+' '_-')\nprintf '%s' \"$password\" > \"$tmp\""
    write = textwrap.indent(_private_write(path, owner, fill), "  ")
    q = shlex.quote(path)
    return (
        f"# Grafana admin password: generated once on this host, printed for the stack's secret output.\n"
        f"set -euo pipefail\nif [ ! -s {q} ]; then\n{write}fi\ncat {q}\n"
    )


def grafana_password_store_script(path: str = GRAFANA_PASSWORD_FILE, owner: str = GRAFANA_FILE_OWNER) -> str:
    """Write the password given on stdin to the admin password file (0600, Grafana's uid), atomically."""
    return "set -euo pipefail\n" + _private_write(path, owner, 'cat > "$tmp"')


def grafana_password_delete_script(path: str = GRAFANA_PASSWORD_FILE) -> str:
    """Remove the admin password file (and its directory when empty)."""
    q, d = shlex.quote(path), shlex.quote(path.rsplit("/", 1)[0])
    return f"""set -euo pipefail
rm -f {q}
if [ -d {d} ]; then
  rmdir --ignore-fail-on-non-empty {d}
fi
"""


# --- config files on the host, reloaded in place --------------------------------------------------


def _reload_lines(service: str, container: str, requests: list[str], root: str) -> str:
    """Run each HTTP reload request against the running container; a stopped one reads the files at start."""
    q = shlex.quote
    calls = "\n".join(f"  reload {r}" for r in requests)
    return f"""reload() {{  # reload <curl arguments>: POST, the service's answer on failure
  local body code
  body=$(mktemp)
  code=$(curl -sS -o "$body" -w '%{{http_code}}' -X POST --max-time 60 "$@") || code=000
  if [[ "$code" != 2* ]]; then
    echo "{service}: reload failed (HTTP $code): $(head -c 2000 "$body")" >&2
    echo "{service} keeps its previous config; check the files under {root} and \\`docker logs {container}\\`" >&2
    rm -f "$body"
    exit 1
  fi
  rm -f "$body"
}}
if [[ "$(docker inspect -f '{{{{.State.Running}}}}' {q(container)} 2>/dev/null)" == true ]]; then
{calls}
  echo "{service}: config reloaded"
else
  echo "{service}: container {container} not running yet; it reads these files when it starts"
fi
"""


def config_files_script(
    service: str,
    container: str,
    files: dict[str, str],
    reloads: list[str],
    stdin_file: str | None = None,
    secret: bool = False,
    root: str = HOST_CONFIG_ROOT,
) -> str:
    """Write a service's config files under the host root atomically, drop stale ones, reload the running service.

    `files` maps paths relative to the root (see monitoring_files) to their text; `stdin_file` is one
    more file whose content arrives on stdin (a secret). `reloads` are curl arguments, one request each.
    """
    mode = "0600" if secret else "0644"
    roots = [host_config_path(d, root) for d in CONFIG_DIRS[service]]
    lines = [
        "#!/usr/bin/env bash",
        f"# llm-cluster: write the {service} config under {root} and reload {service} in place",
        "set -euo pipefail",
    ]
    lines += put_files_lines(
        {host_config_path(rel, root): text for rel, text in files.items()},
        roots,
        CONFIG_OWNERS[service],
        mode,
        host_config_path(stdin_file, root) if stdin_file else None,
    )
    return "\n".join(lines) + "\n" + _reload_lines(service, container, reloads, root)


def config_files_delete_script(service: str) -> str:
    """Remove a service's config directories from the host (destroy)."""
    dirs = " ".join(shlex.quote(host_config_path(d)) for d in CONFIG_DIRS[service])
    return f"#!/usr/bin/env bash\n# llm-cluster: remove the {service} config from {HOST_CONFIG_ROOT}\nset -euo pipefail\nrm -rf -- {dirs}\n"


def monitoring_url(spec: StackSpec, port: int) -> str:
    """http://<monitoring node>:<port>, where Prometheus, Grafana and Alertmanager listen."""
    return f"http://{host_port(spec.node(_monitoring(spec).node).address, port)}"


def lifecycle_reloads(url: str) -> list[str]:
    """Prometheus and Alertmanager re-read their config on POST /-/reload (Prometheus: --web.enable-lifecycle)."""
    return [shlex.quote(f"{url}/-/reload")]


def grafana_reloads(url: str, password_file: str = GRAFANA_PASSWORD_FILE) -> list[str]:
    """Grafana's admin API re-reads provisioned datasources and dashboards; the password goes in through a pipe.

    POST /api/admin/provisioning/{datasources,dashboards}/reload with basic auth, 200 once the new
    entities are stored (grafana pkg/api/admin_provisioning.go). `-K <(…)` hands curl its config
    through a pipe, so the password never shows in the process list.
    """
    base = f"{url}/api/admin/provisioning"
    # curl's config quoting: backslashes and double quotes escaped.
    auth = f'-K <(printf \'user = "admin:%s"\\n\' "$(sed \'s/[\\\\"]/\\\\&/g\' {shlex.quote(password_file)})")'
    return [f"{auth} {shlex.quote(base + '/' + kind + '/reload')}" for kind in ("datasources", "dashboards")]
