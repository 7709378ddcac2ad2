"""Wire the whole cluster from a validated spec: nodes, weights, pools, gateway, monitoring."""

from __future__ import annotations

from typing import Any

import pulumi

from components.engines.registry import engine_for
from components.planning.image_supply import images_for_node
from components.planning.qualification import node_qualifications
from components.resources.gateway import Gateway, GatewayArgs
from components.resources.gpu_node import GpuNode, GpuNodeArgs
from components.resources.model_server import ModelServer, ModelServerArgs
from components.resources.model_weights import ModelWeights, ModelWeightsArgs
from components.resources.monitoring import Monitoring, MonitoringArgs
from components.resources.qualification import ImageQualification, ImageQualificationArgs
from components.resources.ray_cluster import RayCluster, RayClusterArgs
from components.resources.smoke import SmokeTest, SmokeTestArgs
from components.spec import NAMESPACE, StackSpec
from components.spec.topology import all_instances, resource_suffix, weights_nodes


def deploy(spec: StackSpec) -> dict[str, Any]:
    """Register every component of the stack; return the stack outputs to export."""
    secrets = pulumi.Config(NAMESPACE)
    outputs: dict[str, Any] = {}
    # Nodes prepare in parallel: nothing orders one node after another.
    nodes = {n: GpuNode(n, GpuNodeArgs(spec, n, images_for_node(spec, n))) for n in spec.nodes}

    # One component per model over every node that needs it, so a model's copy fans out once even
    # when two pools serve it.
    weights: dict[str, ModelWeights] = {}
    for model in dict.fromkeys(p.model for p in spec.pools.values()):
        weights[model] = ModelWeights(
            f"weights-{model}", ModelWeightsArgs(spec, model, {n: nodes[n] for n in weights_nodes(spec, model)})
        )

    # The qualification gate of each serving image on each of its nodes: it needs only the pulled image,
    # so it runs while the weights still copy, and every server of that image on the node waits for it.
    qualifications: dict[tuple[str, str], pulumi.Resource] = {
        (q.node, q.image): ImageQualification(
            f"{q.node}-qualify-{resource_suffix(q.image)}", ImageQualificationArgs(q, nodes[q.node])
        ).check
        for q in node_qualifications(spec)
    }

    # Each instance depends only on its own nodes and their weights: pools come up (or fail) apart.
    servers: dict[str, ModelServer] = {}
    for inst in all_instances(spec):
        weights_ready = weights[spec.pools[inst.pool].model].ready
        members = {n: nodes[n] for n in inst.nodes}
        on_ray = inst.uses_ray and engine_for(spec.pools[inst.pool]).multi_node == "ray"
        image = spec.pools[inst.pool].image
        # A pool without the gate waits for none, not even another pool's gate of the same image on the node.
        gated = spec.pools[inst.pool].qualification_gate
        qualified = {n: qualifications[(n, image)] for n in inst.nodes if gated and (n, image) in qualifications}
        ray = (
            RayCluster(f"{inst.name}-ray", RayClusterArgs(spec, inst, members, weights_ready, qualified=qualified))
            if on_ray
            else None
        )
        servers[inst.name] = ModelServer(
            inst.name, ModelServerArgs(spec, inst, members, weights_ready, qualified=qualified, ray=ray)
        )
    outputs["endpoints"] = {name: s.endpoint for name, s in servers.items()}

    # The gateway and monitoring wait on their nodes only, never on model loading: the gateway
    # answers 502 for a pool until one of its replicas is up, and monitoring watches the loading.
    if spec.gateway is not None:
        gateway = Gateway(
            "gateway",
            GatewayArgs(
                spec,
                nodes[spec.gateway.node],
                api_keys_secret=secrets.get_secret("gatewayApiKeys"),
                tls_cert=secrets.get_secret("gatewayTlsCert"),
                tls_key=secrets.get_secret("gatewayTlsKey"),
            ),
        )
        outputs["gatewayUrl"] = gateway.url
        outputs["gatewayApiKeys"] = gateway.api_keys
        if gateway.ca_cert is not None:
            # Clients trust the generated certificate through this (not a secret: a CA certificate).
            outputs["gatewayCaCert"] = gateway.ca_cert
        if spec.gateway.smoke_test and servers:
            # Last: every server healthy and the gateway up, then one answer per served name.
            SmokeTest("smoke", SmokeTestArgs(spec, nodes[spec.gateway.node], gateway, list(servers.values())))

    if spec.monitoring is not None:
        monitoring = Monitoring(
            "monitoring",
            MonitoringArgs(
                spec,
                nodes,
                grafana_admin_password=secrets.get_secret("grafanaAdminPassword"),
                alertmanager_config=secrets.get_secret("alertmanagerConfig"),
            ),
        )
        outputs["prometheusUrl"] = monitoring.prometheus_url
        outputs["grafanaUrl"] = monitoring.grafana_url
        outputs["grafanaAdminPassword"] = monitoring.grafana_admin_password

    return outputs
