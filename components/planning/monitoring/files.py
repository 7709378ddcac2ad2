"""Every monitoring config file of a stack: Prometheus's config and rules, Grafana's provisioning."""

from __future__ import annotations

from components.planning.monitoring.alerts import alert_rules
from components.planning.monitoring.grafana import grafana_provisioning
from components.planning.monitoring.prometheus import PROMETHEUS_CONFIG, PROMETHEUS_RULES, prometheus_config
from components.spec.stack import StackSpec


def prometheus_files(spec: StackSpec) -> dict[str, str]:
    """The Prometheus container's files: config and rules."""
    return {PROMETHEUS_CONFIG: prometheus_config(spec), PROMETHEUS_RULES: alert_rules(spec)}


def monitoring_files(spec: StackSpec) -> dict[str, str]:
    """Every generated Prometheus and Grafana file by relative path (see container_path)."""
    return prometheus_files(spec) | grafana_provisioning(spec)
