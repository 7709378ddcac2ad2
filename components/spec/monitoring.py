"""Stack model: exporters, Prometheus, alert thresholds, Grafana, optional Alertmanager."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from components.spec.base import Spec, SpecIssue
from components.spec.cluster import Fraction, ImageRef, Port

if TYPE_CHECKING:  # the stack module imports this one
    from components.spec.stack import StackSpec


class ServiceSpec(Spec):
    """A monitoring container: pinned image and host port."""

    image: ImageRef
    port: Port


class AlertThresholds(Spec):
    """Alert thresholds; the defaults follow the runbooks, corrected where they were wrong."""

    min_generation_tokens_per_second: float = Field(default=5, ge=0)
    """Pool-wide generation floor while requests are running: catches a stalled engine (an NCCL
    hang produces zero tokens with requests in flight). Never fires at idle, unlike the runbook's
    `rate(...) < 1000`, which fired every quiet night."""
    ttft_p95_seconds: float = Field(default=2.0, gt=0)
    """p95 of vLLM's time-to-first-token histogram (the runbook queried end-to-end latency)."""
    gpu_memory_used_ratio: Fraction = 0.99
    """FB_USED / (FB_USED + FB_FREE); must exceed every pool's gpuMemoryUtilization (vLLM takes it) plus
    what sits outside that budget on its GPU: the CUDA context (facts.hardware.CUDA_CONTEXT_GIB) and, on
    images that start NCCL before they measure (vLLM 0.11 on), the NCCL communicators. A vLLM GPU runs
    near full by design: at TP 8 on 0.19.1 and 0.90 a V100-32GB holds about 0.97 of its memory."""
    gpu_low_utilization_percent: float = Field(default=30, ge=0, le=100)
    """Fires only while the instance owning the GPUs has requests running (not idle, not loading)."""
    kv_cache_usage_ratio: Fraction = 0.98
    gpu_temperature_celsius: float = Field(default=85, gt=0)
    gateway_5xx_ratio: Fraction = 0.05
    gateway_upstream_failures: float = Field(default=3, ge=0)
    """Failed upstream attempts of one upstream per 5 minutes before the gateway alert fires."""
    for_minutes: int = Field(default=5, ge=1)
    """How long a performance condition must hold; availability alerts use shorter fixed windows."""


class MonitoringSpec(Spec):
    """Per-node exporters plus Prometheus/Grafana (and optional Alertmanager) on one node."""

    node: str
    dcgm_exporter: ServiceSpec = ServiceSpec(
        image="nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", port=9400
    )
    node_exporter: ServiceSpec = ServiceSpec(image="prom/node-exporter:v1.8.2", port=9100)
    prometheus: ServiceSpec = ServiceSpec(image="prom/prometheus:v2.55.1", port=9090)
    grafana: ServiceSpec = ServiceSpec(image="grafana/grafana:11.3.0", port=3000)
    alertmanager: ServiceSpec | None = None
    """Enable with an image and port; receivers come from the secret `alertmanagerConfig`."""
    retention_days: int = Field(default=15, ge=1)
    scrape_interval_seconds: int = Field(default=15, ge=1, le=300)
    thresholds: AlertThresholds = AlertThresholds()


def monitoring_issues(spec: StackSpec) -> list[SpecIssue]:
    """Cross-section rules of the monitoring section: the secrets it needs (the thresholds a pool's engine
    makes moot are the engine's to say: Engine.alert_issues)."""
    m = spec.monitoring
    if m is None:
        if "alertmanagerConfig" in spec.secrets:
            return [
                SpecIssue(
                    "alertmanagerConfig",
                    "is set but monitoring is not configured; "
                    "add monitoring.alertmanager (image and port) or remove the secret",
                )
            ]
        return []
    issues: list[SpecIssue] = []
    if m.alertmanager is not None and "alertmanagerConfig" not in spec.secrets:
        issues.append(
            SpecIssue(
                "monitoring.alertmanager",
                "needs the secret alertmanagerConfig holding "
                "alertmanager.yml (pulumi config set --secret alertmanagerConfig < alertmanager.yml)",
            )
        )
    if m.alertmanager is None and "alertmanagerConfig" in spec.secrets:
        issues.append(
            SpecIssue(
                "monitoring.alertmanager",
                "is unset but the secret alertmanagerConfig is "
                "given; set monitoring.alertmanager (image and port) to deploy Alertmanager",
            )
        )
    return issues
