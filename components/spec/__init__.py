"""The stack model: what a user states in `Pulumi.<stack>.yaml`, validated before any resource exists."""

from components.spec.base import SpecError, SpecIssue
from components.spec.cluster import (
    FirewallSpec,
    GpuSpec,
    HcaSpec,
    ModelSpec,
    NcclSpec,
    NodeSpec,
    PoolSpec,
    PreflightSpec,
    SshSpec,
    WeightsSource,
)
from components.spec.gateway import ApiKeySpec, GatewaySpec, RateLimitSpec
from components.spec.images import ImagesSpec
from components.spec.monitoring import AlertThresholds, MonitoringSpec, ServiceSpec
from components.spec.stack import NAMESPACE, SECRET_KEYS, SECTIONS, StackSpec

__all__ = [
    "AlertThresholds",
    "ApiKeySpec",
    "FirewallSpec",
    "GatewaySpec",
    "GpuSpec",
    "HcaSpec",
    "ImagesSpec",
    "ModelSpec",
    "MonitoringSpec",
    "NAMESPACE",
    "NcclSpec",
    "NodeSpec",
    "PoolSpec",
    "PreflightSpec",
    "RateLimitSpec",
    "SECRET_KEYS",
    "SECTIONS",
    "ServiceSpec",
    "SpecError",
    "SpecIssue",
    "SshSpec",
    "StackSpec",
    "WeightsSource",
]
