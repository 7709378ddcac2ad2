"""GpuNode: one server reached over SSH — connection, Docker provider, /etc/hosts block, preflight, images.

SSH authentication, in the order the stack states it:
- `ssh.keyPath`: commands get the key file's content (read when the program runs, kept a secret);
  the Docker provider's ssh gets `-i <keyPath>`.
- the secret config `sshPrivateKey`: commands get it as `private_key`; the Docker provider runs the
  local `ssh` binary, which cannot take key material, so a local command writes it to a 0600 file
  under ~/.ssh/llm-cluster/<stack>/ (removed on destroy) and ssh gets `-i` that file.
- `ssh.agent`: commands and Docker's ssh use the running ssh-agent (SSH_AUTH_SOCK).
Host keys: with `hostKeyChecking` each node's `hostKey` pins the commands' connection, and a local
known_hosts file pins Docker's ssh (StrictHostKeyChecking=yes); without it neither checks.
Images (components.planning.image_supply): pulled from their own registry, or from `images.registry`
(the provider's registry auth from the secrets registryUsername/registryPassword), or loaded from the
node's tarballs (`images.tarballs`) by a command the image then depends on: the provider's RemoteImage
looks for a local image before it pulls (findImage), so a loaded image is never pulled.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import local, remote

from components import marks
from components.planning.image_supply import ImageSupply, load_script, node_supplies, supply, unload_script
from components.planning.nodes import firewall
from components.planning.nodes.clock import clock_script
from components.planning.nodes.scripts import (
    bash_command,
    hosts_create_script,
    hosts_delete_script,
    hosts_entries,
    known_hosts_line,
    node_expectation,
    operator_file_create_script,
    operator_file_delete_script,
    operator_file_path,
    preflight_script,
    root_steps,
    script_hash,
)
from components.resources.base import Component
from components.spec import StackSpec
from components.spec.topology import resource_suffix


@dataclass(frozen=True)
class GpuNodeArgs:
    """The stack, which node, and the images its containers need."""

    spec: StackSpec
    node: str
    images: list[str]


def read_key_file(key_path: str) -> str:
    """The private key at ssh.keyPath on the operator's machine; a RunError naming the key when unreadable."""
    path = os.path.expanduser(key_path)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise pulumi.RunError(
            f"ssh.keyPath: cannot read the private key {key_path!r} ({e.strerror}); "
            "fix the path or use ssh.agent / the secret sshPrivateKey"
        ) from None


def registry_auth(spec: StackSpec) -> list[docker.ProviderRegistryAuthArgs] | None:
    """The Docker provider's auth for images.registry, from the secrets (none: an open registry)."""
    host = spec.images.registry_host
    if host is None or "registryPassword" not in spec.secrets:
        return None
    config = pulumi.Config()
    return [
        docker.ProviderRegistryAuthArgs(
            address=host,
            username=config.require_secret("registryUsername"),
            password=config.require_secret("registryPassword"),
        )
    ]


class GpuNode(Component):
    """A GPU server: the handles (connection, Docker provider, images) other components build on."""

    TYPE = marks.GPU_NODE

    def __init__(self, name: str, args: GpuNodeArgs, opts: pulumi.ResourceOptions | None = None):
        spec, node = args.spec, args.spec.node(args.node)
        supplies = [s.as_dict() for s in node_supplies(spec, args.node)]
        super().__init__(
            name,
            {
                "node": args.node,
                "address": node.address,
                "gpuModel": node.gpu.model if node.gpu else None,
                "gpuCount": node.gpu.count if node.gpu else None,
                "images": list(args.images),
                # The policy pack's air-gap rule reads where each image comes from.
                "airGapped": spec.images.air_gapped,
                "imageSupply": supplies,
                # The policy pack's host-firewall advice reads these two.
                "firewallManaged": spec.firewall.managed,
                "firewallClosedPorts": firewall.advisory_ports(spec, args.node),
            },
            opts,
        )
        ssh = spec.ssh
        host = node.ssh_address or node.address
        self.address: str = node.address

        private_key: pulumi.Input[str] | None = None
        docker_key: str | None = None
        docker_files: list[pulumi.Resource] = []
        if ssh.key_path:
            private_key = pulumi.Output.secret(read_key_file(ssh.key_path))
            docker_key = ssh.key_path
        elif "sshPrivateKey" in spec.secrets:
            private_key = pulumi.Config().require_secret("sshPrivateKey")
            docker_key = operator_file_path(pulumi.get_stack(), args.node, "key")
            docker_files.append(self._operator_file("ssh-key", docker_key, private_key))
        passphrase = (
            pulumi.Config().require_secret("sshPrivateKeyPassword")
            if private_key is not None and "sshPrivateKeyPassword" in spec.secrets
            else None
        )
        # agent_socket_path stays unset: the provider then reads SSH_AUTH_SOCK, as ssh does.
        # A hostKey pins the connection only with hostKeyChecking, as it pins Docker's ssh below.
        self.connection: remote.ConnectionArgs = remote.ConnectionArgs(
            host=host,
            port=ssh.port,
            user=ssh.user,
            private_key=private_key,
            private_key_password=passphrase,
            host_key=node.host_key if ssh.host_key_checking else None,
            dial_error_limit=ssh.dial_error_limit,
            per_dial_timeout=ssh.per_dial_timeout_seconds,
        )

        ssh_opts = ["-o", f"Port={ssh.port}"]
        if ssh.host_key_checking and node.host_key:
            known_hosts = operator_file_path(pulumi.get_stack(), args.node, "known_hosts")
            docker_files.append(
                self._operator_file("known-hosts", known_hosts, known_hosts_line(host, ssh.port, node.host_key))
            )
            ssh_opts += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"]
        else:
            ssh_opts += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        if docker_key:
            ssh_opts += ["-i", docker_key]
        self.provider: docker.Provider = docker.Provider(
            self.child("docker"),
            host=f"ssh://{ssh.user}@{host}",
            ssh_opts=ssh_opts,
            registry_auth=registry_auth(spec),
            opts=self.opts(depends_on=docker_files),
        )

        # Steps that write system files run through `sudo -n` when the SSH user is not root.
        self.sudo: bool = root_steps(spec)
        hosts = hosts_create_script(hosts_entries(spec))
        self.hosts: remote.Command = remote.Command(
            self.child("hosts"),
            connection=self.connection,
            create=bash_command(hosts, sudo=self.sudo),
            delete=bash_command(hosts_delete_script(), sudo=self.sudo),
            triggers=[script_hash(hosts)],
            # A replacement must not run the old delete after the new create: it would remove the block.
            opts=self.opts(delete_before_replace=True),
        )
        preflight = preflight_script(node_expectation(spec, args.node), ssh.user)
        # Read-only checks: nothing to undo, so no delete.
        self.preflight: remote.Command = remote.Command(
            self.child("preflight"),
            connection=self.connection,
            create=bash_command(preflight),
            triggers=[script_hash(preflight)],
            opts=self.opts(),
        )
        # From the operator's machine, with Docker's ssh settings: the node's clock against this one's.
        clock = clock_script(
            ["ssh", "-o", "BatchMode=yes", *ssh_opts],
            f"{ssh.user}@{host}",
            args.node,
            spec.preflight.max_clock_offset_seconds,
        )
        self.clock: local.Command = local.Command(
            self.child("clock"),
            create=bash_command(clock),
            triggers=[script_hash(clock)],
            opts=self.opts(depends_on=docker_files),
        )
        self.ready: list[pulumi.Resource] = [self.hosts, self.preflight, self.clock]
        self.firewall: remote.Command | None = None
        if spec.firewall.managed:
            rules = firewall.create_script(spec, args.node)
            # Before any container listens: every service of the node waits on `ready`.
            self.firewall = remote.Command(
                self.child("firewall"),
                connection=self.connection,
                create=bash_command(rules, sudo=self.sudo),
                delete=bash_command(firewall.delete_script(args.node), sudo=self.sudo),
                triggers=[script_hash(rules)],
                # A replacement's delete would drop the table the new create just loaded.
                opts=self.opts(delete_before_replace=True, depends_on=[self.preflight]),
            )
            self.ready.append(self.firewall)
        # Keyed by the stack's reference (facts and labels use it); each named as the node holds it.
        self.images: dict[str, docker.RemoteImage] = {ref: self._image(supply(spec, ref)) for ref in args.images}
        # The air-gapped stack policy reads these (a stack policy sees a component's outputs).
        self.register_outputs({"address": node.address, "airGapped": spec.images.air_gapped, "imageSupply": supplies})

    def _image(self, s: ImageSupply) -> docker.RemoteImage:
        """The image on this node: pulled, or found after its tarball's load step."""
        after: list[pulumi.Resource] = [self.preflight]
        if s.via == "tarball":
            load = load_script(s)
            after = [
                remote.Command(
                    self.child(f"image-load-{resource_suffix(s.image)}"),
                    connection=self.connection,
                    create=bash_command(load),
                    delete=bash_command(unload_script(s)),
                    triggers=[script_hash(load)],
                    # A replacement's old delete must not remove the image the new create just loaded.
                    opts=self.opts(delete_before_replace=True, depends_on=[self.preflight]),
                )
            ]
        return docker.RemoteImage(
            self.child(f"image-{resource_suffix(s.image)}"),
            name=s.ref,
            keep_locally=True,
            opts=self.opts(provider=self.provider, depends_on=after),
        )

    def _operator_file(self, suffix: str, path: str, content: pulumi.Input[str]) -> local.Command:
        """A file on the operator's machine for Docker's ssh, written from stdin (secrets stay secret)."""
        create = operator_file_create_script(path)
        return local.Command(
            self.child(suffix),
            create=bash_command(create),
            stdin=content,
            delete=bash_command(operator_file_delete_script(path)),
            triggers=[script_hash(create)],
            opts=self.opts(delete_before_replace=True),
        )
