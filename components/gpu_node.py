"""GpuNode: one server reached over SSH — connection, Docker provider, pulled images."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.base import Component
from components.planning.topology import resource_suffix
from components.spec import StackSpec


@dataclass(frozen=True)
class GpuNodeArgs:
    """The stack, which node, and the images its containers need."""

    spec: StackSpec
    node: str
    images: list[str]


class GpuNode(Component):
    """A GPU server: the handles (connection, Docker provider, images) other components build on."""

    TYPE = "llm-cluster:node:GpuNode"

    def __init__(self, name: str, args: GpuNodeArgs, opts: pulumi.ResourceOptions | None = None):
        spec, node = args.spec, args.spec.node(args.node)
        super().__init__(name, {"node": args.node, "address": node.address,
                                "gpuModel": node.gpu.model if node.gpu else None,
                                "gpuCount": node.gpu.count if node.gpu else None,
                                "images": list(args.images)}, opts)
        ssh = spec.ssh
        host = node.ssh_address or node.address
        self.address: str = node.address
        self.connection: remote.ConnectionArgs = remote.ConnectionArgs(
            host=host, port=ssh.port, user=ssh.user, host_key=node.host_key,
            dial_error_limit=ssh.dial_error_limit, per_dial_timeout=ssh.per_dial_timeout_seconds,
        )
        ssh_opts = ["-o", f"StrictHostKeyChecking={'yes' if ssh.host_key_checking else 'no'}",
                    "-o", f"Port={ssh.port}"]
        if ssh.key_path:
            ssh_opts += ["-i", ssh.key_path]
        self.provider: docker.Provider = docker.Provider(
            self.child("docker"), host=f"ssh://{ssh.user}@{host}", ssh_opts=ssh_opts, opts=self.opts())
        self.ready: list[pulumi.Resource] = []
        self.images: dict[str, docker.RemoteImage] = {
            ref: docker.RemoteImage(
                self.child(f"image-{resource_suffix(ref)}"), name=ref, keep_locally=True,
                opts=self.opts(provider=self.provider, depends_on=self.ready))
            for ref in args.images
        }
        self.register_outputs({"address": node.address})
