"""Grafana: the dashboards' panels and variables, the provisioning files and the admin password script."""

from __future__ import annotations

import json
import shlex
import textwrap
from dataclasses import dataclass
from typing import Any

from components.planning.monitoring.engine_metrics import ServingMetrics, serving_metrics
from components.planning.monitoring.prometheus import (
    GRAFANA_DASHBOARD_PROVIDER,
    GRAFANA_DASHBOARDS_DIR,
    GRAFANA_DATASOURCE,
    GRAFANA_PASSWORD_FILE,
    container_path,
    host_port,
    monitoring_spec,
    to_yaml,
)
from components.spec.stack import StackSpec

# The official Grafana image runs as uid 472, gid 0: the mounted password file must be readable by it.
GRAFANA_FILE_OWNER = "472:0"
DATASOURCE_UID = "prometheus"

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
            "Prefix cache hit rate per instance",
            "percentunit",
            tuple(
                (
                    f"sum by (instance) ({_rate(g['prefix_cache_hits'], sel)}) / "
                    f"sum by (instance) ({_rate(g['prefix_cache_queries'], sel)})",
                    "{{instance}}",
                )
                for g, sel in each("prefix_cache_hits", "prefix_cache_queries")
            )
            # An engine that counts the prompt tokens it computed beside those it reused (llama.cpp): hits over both.
            + tuple(
                (
                    f"sum by (instance) ({_rate(g['prefix_cache_hits'], sel)}) / "
                    f"(sum by (instance) ({_rate(g['prefix_cache_hits'], sel)}) + "
                    f"sum by (instance) ({_rate(g['prefix_cache_misses'], sel)}))",
                    "{{instance}}",
                )
                for g, sel in each("prefix_cache_hits", "prefix_cache_misses")
            ),
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
GATEWAY_PANELS += (
    Panel(
        "Gateway routing outcomes (prefix affinity)",
        "reqps",
        (
            (
                'sum by (pool, outcome) (rate(llm_gateway_routing_total{job="gateway"}[$__rate_interval]))',
                "{{pool}} {{outcome}}",
            ),
        ),
    ),
    Panel(
        "Requests in flight per replica (prefix affinity)",
        "short",
        (('llm_gateway_upstream_in_flight{job="gateway"}', "{{pool}} {{upstream}}"),),
    ),
    Panel(
        "Replicas drained at the gateway (prefix affinity; 1 = no new request)",
        "short",
        (('llm_gateway_upstream_drained{job="gateway"}', "{{pool}} {{upstream}}"),),
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
    m = monitoring_spec(spec)
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
    files = {GRAFANA_DATASOURCE: to_yaml(datasource), GRAFANA_DASHBOARD_PROVIDER: to_yaml(provider)}
    for name, model in dashboards(spec).items():
        files[f"{GRAFANA_DASHBOARDS_DIR}/{name}"] = json.dumps(model, indent=2) + "\n"
    return files


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
