"""Wire the whole cluster from a validated spec: nodes, pools, gateway, monitoring."""
from __future__ import annotations

from typing import Any

from components.gpu_node import GpuNode, GpuNodeArgs
from components.planning.topology import images_for_node
from components.spec import StackSpec


def deploy(spec: StackSpec) -> dict[str, Any]:
    """Register every component of the stack; return the stack outputs to export."""
    outputs: dict[str, Any] = {}
    nodes = {n: GpuNode(n, GpuNodeArgs(spec, n, images_for_node(spec, n))) for n in spec.nodes}

    weights: dict[str, Any] = {}
    # --- model weights (issue 3: nodes) ---
    from components.model_weights import ModelWeights, ModelWeightsArgs

    # One component per model over every node of the pools serving it (plus its source node), so a
    # model's copy fans out once even when two pools serve it.
    for model in dict.fromkeys(p.model for p in spec.pools.values()):
        holders = [n for p in spec.pools.values() if p.model == model for n in p.nodes]
        source = spec.models[model].source.node
        members = list(dict.fromkeys(([source] if source else []) + holders))
        weights[model] = ModelWeights(f"weights-{model}",
                                      ModelWeightsArgs(spec, model, {n: nodes[n] for n in members}))

    # --- pools (issue 3: ray + vllm) ---
    from components.model_server import ModelServer, ModelServerArgs
    from components.planning.topology import all_instances
    from components.ray_cluster import RayCluster, RayClusterArgs

    # Each instance depends only on its own nodes and their weights: pools come up (or fail) apart.
    servers: dict[str, ModelServer] = {}
    for inst in all_instances(spec):
        model = spec.pools[inst.pool].model
        weights_ready = weights[model].ready if model in weights else {}
        members = {n: nodes[n] for n in inst.nodes}
        ray = (RayCluster(f"{inst.name}-ray", RayClusterArgs(spec, inst, members, weights_ready))
               if inst.uses_ray else None)
        servers[inst.name] = ModelServer(inst.name, ModelServerArgs(spec, inst, members, weights_ready, ray))
    outputs["endpoints"] = {name: s.endpoint for name, s in servers.items()}

    # --- gateway (issue 6) ---
    if spec.gateway is not None:
        import pulumi  # noqa: PLC0415 -- kept inside this block: the wiring file has one block per issue

        from components.gateway import Gateway, GatewayArgs  # noqa: PLC0415
        from components.spec import NAMESPACE  # noqa: PLC0415

        gateway_secrets = pulumi.Config(NAMESPACE)
        # No depends_on on the pools: the gateway serves 502 for a pool until a replica is up.
        gateway = Gateway("gateway", GatewayArgs(
            spec, nodes[spec.gateway.node], api_keys_secret=gateway_secrets.get_secret("gatewayApiKeys"),
            tls_cert=gateway_secrets.get_secret("gatewayTlsCert"),
            tls_key=gateway_secrets.get_secret("gatewayTlsKey")))
        outputs["gatewayUrl"] = gateway.url
        outputs["gatewayApiKeys"] = gateway.api_keys

    # --- monitoring (issue 7) ---
    if spec.monitoring is not None:
        import pulumi  # noqa: PLC0415 -- kept inside this block: the wiring file has one block per issue

        from components.monitoring import Monitoring, MonitoringArgs  # noqa: PLC0415
        from components.spec import NAMESPACE  # noqa: PLC0415

        secrets = pulumi.Config(NAMESPACE)
        monitoring = Monitoring("monitoring", MonitoringArgs(
            spec, nodes, grafana_admin_password=secrets.get_secret("grafanaAdminPassword"),
            alertmanager_config=secrets.get_secret("alertmanagerConfig")))
        outputs["prometheusUrl"] = monitoring.prometheus_url
        outputs["grafanaUrl"] = monitoring.grafana_url
        outputs["grafanaAdminPassword"] = monitoring.grafana_admin_password

    return outputs
