"""Gateway: nginx + njs on one node, the cluster's single OpenAI endpoint (routing, keys, limits, usage),
and the exporter that turns its usage log into Prometheus metrics."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.base import Component
from components.gpu_node import GpuNode
from components.planning.gateway import (
    CONTAINER_NAME, EXPORTER_CONTAINER_NAME, EXPORTER_PATH, HOST_DIGESTS_DIR, container_layout, exporter_argv,
    exporter_probe, exporter_source, exposed_paths, gateway_files, healthcheck_probe, key_digests, key_ids,
    keys_delete_script, keys_script, readiness_script, routes,
)
from components.planning.node_scripts import bash_command
from components.spec import StackSpec

READY_TIMEOUT_SECONDS = 120


@dataclass(frozen=True)
class GatewayArgs:
    """The stack, the node the gateway runs on, and the gateway's secrets from config (None = unset)."""

    spec: StackSpec
    node: GpuNode
    api_keys_secret: pulumi.Output[str] | None = None
    """Config `gatewayApiKeys` (JSON {id: key}); when None the keys are generated on the node (with auth)."""
    tls_cert: pulumi.Output[str] | None = None
    tls_key: pulumi.Output[str] | None = None


class Gateway(Component):
    """The nginx container with the generated config, its API keys, a readiness check, and the metrics exporter.

    It depends only on its node (and images): it comes up before the models finish loading and
    answers 502 for a pool until one of its replicas accepts connections.
    """

    TYPE = "llm-cluster:gateway:Gateway"

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None):
        spec, node = args.spec, args.node
        g = spec.gateway
        if g is None:
            raise ValueError("Gateway needs the stack's gateway section")
        if g.tls and (args.tls_cert is None or args.tls_key is None):
            raise ValueError("gateway.tls needs the secrets gatewayTlsCert and gatewayTlsKey")
        # A gatewayApiKeys secret without auth is refused by the spec (gateway.auth).
        ids = key_ids(spec)
        key_source = ("secret" if args.api_keys_secret is not None else "generated") if g.auth else "none"
        super().__init__(name, {
            "node": g.node, "port": g.port, "image": g.image, "authRequired": g.auth, "apiKeyIds": ids,
            "keySource": key_source, "tls": g.tls,
            "routes": routes(spec), "pathRoutes": dict(g.path_routes), "exposedPaths": exposed_paths(spec),
            "metricsPort": g.metrics_port, "exporterImage": g.exporter_image,
        }, opts)
        layout = container_layout(spec)
        image = node.images[g.image]
        exporter = self._exporter(spec, node)

        uploads = [docker.ContainerUploadArgs(file=f"{layout.conf_dir}/{rel}", content=text)
                   for rel, text in gateway_files(spec).items()]
        volumes: list[docker.ContainerVolumeArgs] = []
        # After the exporter: the first requests' log lines find it listening.
        deps: list[pulumi.Resource] = [*node.ready, image, exporter]
        # Without auth there are no keys anywhere: nothing generated, uploaded or mounted, no output.
        self.api_keys: pulumi.Output[str] | None = None
        if g.auth and args.api_keys_secret is not None:
            keys = pulumi.Output.secret(args.api_keys_secret)
            # Only the digests enter the container; a key that does not match the stack's ids stops the
            # deployment with a message naming them.
            digests = keys.apply(lambda text: key_digests(json.loads(text), ids))
            uploads.append(docker.ContainerUploadArgs(file=layout.digests_file, content=pulumi.Output.secret(digests)))
            self.api_keys = keys
        elif g.auth:
            # No `triggers`: a changed id list updates the command in place, and the script keeps the
            # keys it already made (a replace would run `delete` and drop every key).
            # bash_command: the SSH user's login shell may be dash; the scripts are bash.
            keys_cmd = remote.Command(
                self.child("keys"), connection=node.connection, create=bash_command(keys_script(ids), sudo=node.sudo),
                delete=bash_command(keys_delete_script(), sudo=node.sudo),
                # stdout is the keys: a secret in state, and kept out of the engine's log.
                logging=remote.Logging.STDERR,
                opts=self.opts(additional_secret_outputs=["stdout"], depends_on=list(node.ready)))
            self.api_keys = pulumi.Output.secret(keys_cmd.stdout)
            volumes.append(docker.ContainerVolumeArgs(
                host_path=HOST_DIGESTS_DIR, container_path=layout.digests_file.rsplit("/", 1)[0], read_only=True))
            deps.append(keys_cmd)
        if g.tls and args.tls_cert is not None and args.tls_key is not None:
            uploads += [
                docker.ContainerUploadArgs(file=f"{layout.tls_dir}/cert.pem", content=pulumi.Output.secret(args.tls_cert)),
                docker.ContainerUploadArgs(file=f"{layout.tls_dir}/key.pem", content=pulumi.Output.secret(args.tls_key)),
            ]

        scheme = "https" if g.tls else "http"
        container = docker.Container(
            self.child("nginx"), name=CONTAINER_NAME, image=image.image_id, network_mode="host",
            restart="unless-stopped", uploads=uploads, volumes=volumes,
            envs=["NGINX_ENTRYPOINT_QUIET_LOGS=1"],
            # Two descriptors per proxied stream (client and replica) for worker_connections 16384.
            ulimits=[docker.ContainerUlimitArgs(name="nofile", soft=65536, hard=65536)],
            labels=[docker.ContainerLabelArgs(label="llm-cluster.role", value="gateway"),
                    docker.ContainerLabelArgs(label="llm-cluster.image", value=g.image),
                    # nginx reads the key digests at start: a changed id list must restart it.
                    docker.ContainerLabelArgs(label="llm-cluster.key-ids", value=",".join(ids))],
            # The usage log goes to stdout: bounded by the json-file driver's rotation.
            log_opts={"max-size": "100m", "max-file": "10"},
            healthcheck=docker.ContainerHealthcheckArgs(
                tests=healthcheck_probe(spec), interval="30s", timeout="5s", retries=3, start_period="5s"),
            opts=self.opts(provider=node.provider, delete_before_replace=True, depends_on=deps))

        self.ready: remote.Command = remote.Command(
            self.child("ready"), connection=node.connection,
            create=bash_command(readiness_script(g.port, g.tls, READY_TIMEOUT_SECONDS, g.node, g.auth)),
            # A new container (a replace) must be checked again.
            triggers=[container.id],
            opts=self.opts(depends_on=[container]))
        self.container: docker.Container = container
        self.exporter: docker.Container = exporter
        self.url: pulumi.Output[str] = pulumi.Output.from_input(f"{scheme}://{node.address}:{g.port}")
        self.register_outputs({"url": self.url, "apiKeys": self.api_keys})

    def _exporter(self, spec: StackSpec, node: GpuNode) -> docker.Container:
        """The metrics exporter: our one-file Python program in the official image, on the host network."""
        g = spec.gateway
        assert g is not None
        if g.exporter_image not in node.images:
            raise ValueError(f"node {g.node} does not pull gateway.exporterImage {g.exporter_image}: "
                             "images_for_node must list it for the gateway's node")
        image = node.images[g.exporter_image]
        return docker.Container(
            self.child("exporter"), name=EXPORTER_CONTAINER_NAME, image=image.image_id, network_mode="host",
            restart="unless-stopped", command=exporter_argv(spec),
            uploads=[docker.ContainerUploadArgs(file=EXPORTER_PATH, content=exporter_source())],
            # UDP on loopback in, HTTP out, both on ports >= 1024 (the spec's bounds): no root needed.
            user="65534:65534",
            labels=[docker.ContainerLabelArgs(label="llm-cluster.role", value="gateway-exporter"),
                    docker.ContainerLabelArgs(label="llm-cluster.image", value=g.exporter_image)],
            log_opts={"max-size": "10m", "max-file": "3"},
            healthcheck=docker.ContainerHealthcheckArgs(
                tests=exporter_probe(spec), interval="30s", timeout="5s", retries=3, start_period="5s"),
            opts=self.opts(provider=node.provider, delete_before_replace=True, depends_on=[*node.ready, image]))
