"""Stack model: exporters, Prometheus, alert thresholds, Grafana."""
from __future__ import annotations

from pydantic import Field

from components.spec.base import Spec
from components.spec.cluster import Port


class ServiceSpec(Spec):
    """A monitoring container: pinned image and host port."""

    image: str
    port: Port


class AlertThresholds(Spec):
    """Alert thresholds; the defaults follow the runbooks, corrected where they were wrong."""

    min_generation_tokens_per_second: float = Field(default=100, ge=0)
    ttft_p95_seconds: float = Field(default=2.0, gt=0)
    gpu_memory_used_ratio: float = Field(default=0.95, gt=0, le=1)
    gpu_low_utilization_percent: float = Field(default=30, ge=0, le=100)
    kv_cache_usage_ratio: float = Field(default=0.98, gt=0, le=1)
    gpu_temperature_celsius: float = Field(default=85, gt=0)
    gateway_5xx_ratio: float = Field(default=0.05, gt=0, le=1)
    for_minutes: int = Field(default=5, ge=1)


class MonitoringSpec(Spec):
    """Per-node exporters plus Prometheus/Grafana (and optional Alertmanager) on one node."""

    node: str
    dcgm_exporter: ServiceSpec = ServiceSpec(
        image="nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", port=9400)
    node_exporter: ServiceSpec = ServiceSpec(image="prom/node-exporter:v1.8.2", port=9100)
    prometheus: ServiceSpec = ServiceSpec(image="prom/prometheus:v2.55.1", port=9090)
    grafana: ServiceSpec = ServiceSpec(image="grafana/grafana:11.3.0", port=3000)
    alertmanager: ServiceSpec | None = None
    """Enable with an image and port; receivers come from the secret `alertmanagerConfig`."""
    retention_days: int = Field(default=15, ge=1)
    scrape_interval_seconds: int = Field(default=15, ge=1, le=300)
    thresholds: AlertThresholds = AlertThresholds()
