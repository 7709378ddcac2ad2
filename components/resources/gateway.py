"""Gateway: nginx + Lua on one node, the cluster's single OpenAI endpoint (routing, keys, limits, the
usage log) and its Prometheus metrics (served by the same nginx on the cluster address)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import marks
from components.planning.gateway.image import BUILD_CONTEXT
from components.planning.gateway.keys import key_digests, key_ids, keys_delete_script, keys_script
from components.planning.gateway.layout import (
    CONTAINER_CONF_DIR,
    CONTAINER_KEYS_DIR,
    CONTAINER_NAME,
    CONTAINER_TLS_DIR,
    DIGESTS_FILE,
    HOST_CONF_DIR,
    HOST_DIGESTS_DIR,
    HOST_TLS_DIR,
    nginx_argv,
)
from components.planning.gateway.nginx import (
    config_delete_script,
    config_script,
    healthcheck_probe,
    readiness_script,
    usage_dir_script,
)
from components.planning.gateway.routing import exposed_paths, routes, split
from components.planning.gateway.tls import tls_delete_script, tls_from_stdin_script, tls_generate_script
from components.planning.image_supply import builds_gateway
from components.planning.nodes.scripts import bash_command, script_hash
from components.resources.base import Component
from components.resources.gpu_node import GpuNode
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
    """The nginx container with the generated config, its API keys and a readiness check.

    It depends only on its node (and images): it comes up before the models finish loading and
    answers 502 for a pool until one of its replicas accepts connections.
    """

    TYPE = marks.GATEWAY

    def __init__(self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None):
        spec, node = args.spec, args.node
        g = spec.gateway
        if g is None:
            raise ValueError("Gateway needs the stack's gateway section")
        # A gatewayApiKeys secret without auth is refused by the spec (gateway.auth).
        ids = key_ids(spec)
        key_source = ("secret" if args.api_keys_secret is not None else "generated") if g.auth else "none"
        super().__init__(
            name,
            {
                "node": g.node,
                "port": g.port,
                "image": g.image,
                "authRequired": g.auth,
                "apiKeyIds": ids,
                "keySource": key_source,
                "tls": g.tls,
                "tlsSource": ("secret" if args.tls_cert is not None else "generated") if g.tls else "none",
                "httpRedirectPort": g.http_redirect_port,
                "routes": routes(spec),
                "split": split(spec),
                "pathRoutes": dict(g.path_routes),
                "exposedPaths": exposed_paths(spec),
                "metricsPort": g.metrics_port,
            },
            opts,
        )
        image = self._image(spec, node)
        deps: list[pulumi.Resource] = [*node.ready]
        # No delete: the usage log is the operator's record and outlives the gateway.
        usage_dir = remote.Command(
            self.child("usage-dir"),
            connection=node.connection,
            create=bash_command(usage_dir_script(g.usage_log.dir), sudo=node.sudo),
            opts=self.opts(depends_on=deps),
        )
        volumes = [
            docker.ContainerVolumeArgs(host_path=HOST_CONF_DIR, container_path=CONTAINER_CONF_DIR, read_only=True),
            docker.ContainerVolumeArgs(host_path=g.usage_log.dir, container_path=g.usage_log.dir),
        ]

        # Without auth there are no keys anywhere: nothing generated, written, mounted or exported.
        self.api_keys: pulumi.Output[str] | None = None
        digests_stdin: pulumi.Output[str] | None = None
        if g.auth and args.api_keys_secret is not None:
            keys = pulumi.Output.secret(args.api_keys_secret)
            # Only the digests reach the host; a key that does not match the stack's ids stops the
            # deployment with a message naming them.
            digests_stdin = pulumi.Output.secret(keys.apply(lambda text: key_digests(json.loads(text), ids)))
            self.api_keys = keys
        elif g.auth:
            # No `triggers`: a changed id list updates the command in place, and the script keeps the
            # keys it already made (a replace would run `delete` and drop every key).
            # bash_command: the SSH user's login shell may be dash; the scripts are bash.
            keys_cmd = remote.Command(
                self.child("keys"),
                connection=node.connection,
                create=bash_command(keys_script(ids), sudo=node.sudo),
                delete=bash_command(keys_delete_script(), sudo=node.sudo),
                # stdout is the keys: a secret in state, and kept out of the engine's log.
                logging=remote.Logging.STDERR,
                opts=self.opts(additional_secret_outputs=["stdout"], depends_on=list(node.ready)),
            )
            self.api_keys = pulumi.Output.secret(keys_cmd.stdout)
            deps.append(keys_cmd)
        if g.auth:
            volumes.append(
                docker.ContainerVolumeArgs(
                    host_path=HOST_DIGESTS_DIR, container_path=CONTAINER_KEYS_DIR, read_only=True
                )
            )

        # TLS: the stack's certificate, or one from a private CA made on the host (its cert an output).
        self.ca_cert: pulumi.Output[str] | None = None
        if g.tls:
            if args.tls_cert is not None and args.tls_key is not None:
                tls_cmd = remote.Command(
                    self.child("tls"),
                    connection=node.connection,
                    create=bash_command(tls_from_stdin_script(), sudo=node.sudo),
                    delete=bash_command(tls_delete_script(), sudo=node.sudo),
                    stdin=pulumi.Output.secret(pulumi.Output.concat(args.tls_cert, "\n", args.tls_key)),
                    # A changed secret must run the script again (stdin alone is not a diff of `create`).
                    triggers=[
                        pulumi.Output.secret(pulumi.Output.concat(args.tls_cert, args.tls_key).apply(script_hash))
                    ],
                    logging=remote.Logging.STDERR,
                    opts=self.opts(depends_on=deps),
                )
            else:
                script = tls_generate_script(spec)
                tls_cmd = remote.Command(
                    self.child("tls"),
                    connection=node.connection,
                    create=bash_command(script, sudo=node.sudo),
                    delete=bash_command(tls_delete_script(), sudo=node.sudo),
                    logging=remote.Logging.STDERR,
                    opts=self.opts(depends_on=deps),
                )
                self.ca_cert = tls_cmd.stdout
            deps.append(tls_cmd)
            volumes.append(
                docker.ContainerVolumeArgs(host_path=HOST_TLS_DIR, container_path=CONTAINER_TLS_DIR, read_only=True)
            )

        # The config: files on the host, written and reloaded by an update of this command; the
        # container never changes for it.
        config = remote.Command(
            self.child("config"),
            connection=node.connection,
            create=bash_command(
                config_script(
                    spec,
                    digests_from_stdin=(f"{HOST_DIGESTS_DIR}/{DIGESTS_FILE}" if digests_stdin is not None else None),
                ),
                sudo=node.sudo,
            ),
            delete=bash_command(config_delete_script(), sudo=node.sudo),
            stdin=digests_stdin,
            triggers=[digests_stdin.apply(script_hash)] if digests_stdin is not None else None,
            logging=remote.Logging.STDERR,
            opts=self.opts(depends_on=deps),
        )

        scheme = "https" if g.tls else "http"
        container = docker.Container(
            self.child("nginx"),
            name=CONTAINER_NAME,
            image=image.image_id,
            network_mode="host",
            restart="unless-stopped",
            command=nginx_argv(),
            volumes=volumes,
            envs=["NGINX_ENTRYPOINT_QUIET_LOGS=1"],
            # Two descriptors per proxied stream (client and replica) for worker_connections 16384.
            ulimits=[docker.ContainerUlimitArgs(name="nofile", soft=65536, hard=65536)],
            labels=[
                docker.ContainerLabelArgs(label="llm-cluster.role", value="gateway"),
                docker.ContainerLabelArgs(label="llm-cluster.image", value=g.image),
            ],
            # The usage log is on the host volume; stdout/stderr carry nginx's error log only.
            log_opts={"max-size": "100m", "max-file": "10"},
            healthcheck=docker.ContainerHealthcheckArgs(
                tests=healthcheck_probe(spec), interval="30s", timeout="5s", retries=3, start_period="5s"
            ),
            opts=self.opts(
                provider=node.provider, delete_before_replace=True, depends_on=[*deps, image, config, usage_dir]
            ),
        )

        self.ready: remote.Command = remote.Command(
            self.child("ready"),
            connection=node.connection,
            create=bash_command(readiness_script(g.port, g.tls, READY_TIMEOUT_SECONDS, g.node, g.auth)),
            # A new container (a replace) must be checked again.
            triggers=[container.id],
            opts=self.opts(depends_on=[container]),
        )
        self.container: docker.Container = container
        self.config: remote.Command = config
        self.url: pulumi.Output[str] = pulumi.Output.from_input(f"{scheme}://{node.address}:{g.port}")
        self.register_outputs({"url": self.url, "apiKeys": self.api_keys, "caCert": self.ca_cert})

    def _image(self, spec: StackSpec, node: GpuNode) -> docker.RemoteImage:
        """The nginx image: built on the node with the tested nginx and Lua module (the default), or pulled."""
        g = spec.gateway
        assert g is not None
        if not builds_gateway(spec):  # pulled, or supplied by images.registry / images.tarballs
            return node.images[g.image]
        # Built by the node's Docker engine from the committed Dockerfile (the context is sent over
        # the provider's ssh connection); a changed Dockerfile is a new tag, hence a new image. The
        # build arguments say where apt fetches the pinned packages (gateway.imageBuild).
        return docker.RemoteImage(
            self.child("image"),
            name=g.image,
            keep_locally=True,
            build=docker.RemoteImageBuildArgs(
                context=BUILD_CONTEXT, dockerfile="Dockerfile", build_args=g.image_build.args()
            ),
            opts=self.opts(provider=node.provider, depends_on=list(node.ready)),
        )
