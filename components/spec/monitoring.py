"""Stack model: exporters, Prometheus, alert thresholds, Grafana, optional Alertmanager."""
from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from components.facts.hardware import CUDA_CONTEXT_GIB, GPUS
from components.engines.vllm.facts import image_facts
from components.engines.capacity import communicator_gib  # pure: facts in, figures out
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
        image="nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", port=9400)
    node_exporter: ServiceSpec = ServiceSpec(image="prom/node-exporter:v1.8.2", port=9100)
    prometheus: ServiceSpec = ServiceSpec(image="prom/prometheus:v2.55.1", port=9090)
    grafana: ServiceSpec = ServiceSpec(image="grafana/grafana:11.3.0", port=3000)
    alertmanager: ServiceSpec | None = None
    """Enable with an image and port; receivers come from the secret `alertmanagerConfig`."""
    retention_days: int = Field(default=15, ge=1)
    scrape_interval_seconds: int = Field(default=15, ge=1, le=300)
    thresholds: AlertThresholds = AlertThresholds()


def monitoring_issues(spec: StackSpec) -> list[SpecIssue]:
    """Cross-section rules of the monitoring section: secrets it needs, thresholds the pools make moot."""
    m = spec.monitoring
    if m is None:
        if "alertmanagerConfig" in spec.secrets:
            return [SpecIssue("alertmanagerConfig", "is set but monitoring is not configured; "
                              "add monitoring.alertmanager (image and port) or remove the secret")]
        return []
    issues: list[SpecIssue] = []
    if m.alertmanager is not None and "alertmanagerConfig" not in spec.secrets:
        issues.append(SpecIssue("monitoring.alertmanager", "needs the secret alertmanagerConfig holding "
                                "alertmanager.yml (pulumi config set --secret alertmanagerConfig < alertmanager.yml)"))
    if m.alertmanager is None and "alertmanagerConfig" in spec.secrets:
        issues.append(SpecIssue("monitoring.alertmanager", "is unset but the secret alertmanagerConfig is "
                                "given; set monitoring.alertmanager (image and port) to deploy Alertmanager"))
    ratio = m.thresholds.gpu_memory_used_ratio
    for pname, pool in spec.pools.items():
        g = spec.node(pool.nodes[0]).gpu if pool.nodes[0] in spec.nodes else None
        known = GPUS.get(g.model) if g is not None else None
        if known is None or pool.vllm is None:
            continue  # the pool's own checks name the missing node or the unknown GPU; not a vLLM budget
        if g is not None and pool.tensor_parallel > g.count:
            continue  # TP across nodes: not modelled (the capacity plan says so, the parallelism rule judges it)
        # FB_USED counts more than vLLM's budget: the CUDA context sits outside it, and so do the NCCL
        # communicators on images that start NCCL before they measure free memory (the capacity model's).
        facts = image_facts(pool.image)
        comm = 0.0 if facts is None or facts.nccl_in_budget else communicator_gib(
            pool.tensor_parallel, pool.pipeline_parallel, nvls=known.nvls)
        floor = round(pool.vllm.gpu_memory_utilization + (CUDA_CONTEXT_GIB + comm) / known.memory_gib, 4)
        if floor >= 1:
            continue  # the pool cannot start at all: memory-fit names that, with the utilization that starts
        if ratio <= floor:
            outside = f"its CUDA context (about {CUDA_CONTEXT_GIB:g} GiB)" + (
                f" and NCCL communicators (about {comm:.2f} GiB at TP {pool.tensor_parallel} x PP "
                f"{pool.pipeline_parallel})" if comm else "")
            issues.append(SpecIssue(
                "monitoring.thresholds.gpuMemoryUsedRatio",
                f"{ratio} would fire on every GPU of pool {pname!r}: vLLM takes gpuMemoryUtilization "
                f"{pool.vllm.gpu_memory_utilization} at start, plus {outside}, of the {known.memory_gib:g} GiB "
                f"{known.name}; set it above {floor}"))
    return issues
