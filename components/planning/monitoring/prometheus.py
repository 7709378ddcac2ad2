"""Monitoring plan: Prometheus scrape targets and config, the services' command lines, config files on the host.

Alert rules are in alerts.py, Grafana in grafana.py, the files of a stack together in files.py."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import yaml

from components.engines.registry import engine_for
from components.planning.fabric.ray import (
    NODE_TEXTFILE_DIR,
)
from components.planning.nodes.scripts import put_files_lines, written_files  # noqa: F401 (re-exported)
from components.spec.monitoring import MonitoringSpec
from components.spec.stack import StackSpec
from components.spec.topology import all_instances

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


def monitoring_spec(spec: StackSpec) -> MonitoringSpec:
    if spec.monitoring is None:
        raise ValueError("the stack has no monitoring section")
    return spec.monitoring


def node_pools(spec: StackSpec) -> dict[str, str]:
    """Node -> the pool it serves (nodes outside every pool are absent)."""
    return {n: pname for pname, p in spec.pools.items() for n in p.nodes}


def scrape_targets(spec: StackSpec) -> list[ScrapeTarget]:
    """Every endpoint: exporters per node, engine instances, the gateway, the monitors (Ray: see alert_groups)."""
    m = monitoring_spec(spec)
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


def to_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=10_000, allow_unicode=True)


def prometheus_config(spec: StackSpec) -> str:
    """prometheus.yml: one job per kind of endpoint, static targets from the spec, rules beside it."""
    m = monitoring_spec(spec)
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
    return to_yaml(config)


# --- container command lines ---------------------------------------------------------------------
# Every monitoring container runs on the host network and binds the node's cluster address only:
# the policy pack refuses internal ports reachable beyond the cluster network.


def node_exporter_args(spec: StackSpec, node: str) -> list[str]:
    """node-exporter flags: the host's root at /host, the textfile directory (Ray heads), cluster address only."""
    m = monitoring_spec(spec)
    return [
        "--path.rootfs=/host",
        f"--collector.textfile.directory={NODE_TEXTFILE_DIR}",
        f"--web.listen-address={host_port(spec.node(node).address, m.node_exporter.port)}",
    ]


def dcgm_exporter_env(spec: StackSpec, node: str) -> list[str]:
    """dcgm-exporter environment (its entrypoint reads flags from these variables)."""
    m = monitoring_spec(spec)
    return [
        f"DCGM_EXPORTER_LISTEN={host_port(spec.node(node).address, m.dcgm_exporter.port)}",
        "DCGM_EXPORTER_KUBERNETES=false",
    ]


def prometheus_args(spec: StackSpec) -> list[str]:
    """Prometheus flags: generated config, retention from the stack, lifecycle API for reloads."""
    m = monitoring_spec(spec)
    return [
        f"--config.file={container_path(PROMETHEUS_CONFIG)}",
        "--storage.tsdb.path=/prometheus",
        f"--storage.tsdb.retention.time={m.retention_days}d",
        f"--web.listen-address={host_port(spec.node(m.node).address, m.prometheus.port)}",
        "--web.enable-lifecycle",
    ]


def grafana_env(spec: StackSpec) -> list[str]:
    """Grafana settings: cluster address, admin password from the mounted file, no phoning home."""
    m = monitoring_spec(spec)
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
    m = monitoring_spec(spec)
    assert m.alertmanager is not None
    return [
        f"--config.file={ALERTMANAGER_CONFIG_PATH}",
        "--storage.path=/alertmanager",
        f"--web.listen-address={host_port(spec.node(m.node).address, m.alertmanager.port)}",
        # An empty cluster address disables gossip, which would otherwise listen on 0.0.0.0:9094.
        "--cluster.listen-address=",
    ]


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
    return f"http://{host_port(spec.node(monitoring_spec(spec).node).address, port)}"


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
