"""Monitoring: dcgm-exporter and node-exporter on every node; Prometheus, Grafana, Alertmanager on one."""
from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.base import Component
from components.gpu_node import GpuNode
from components.planning.monitoring import (
    ALERTMANAGER_CONFIG_PATH, GRAFANA_PASSWORD_FILE, GRAFANA_PASSWORD_MOUNT, alertmanager_args,
    container_path, dcgm_exporter_env, grafana_env, grafana_password_delete_script,
    grafana_password_generate_script, grafana_password_store_script, grafana_provisioning, host_port,
    node_exporter_args, prometheus_args, prometheus_files,
)
from components.planning.node_scripts import bash_command
from components.planning.ray import NODE_TEXTFILE_DIR
from components.spec import StackSpec


@dataclass(frozen=True)
class MonitoringArgs:
    """The stack, its nodes, and the monitoring secrets from config (None when not set)."""

    spec: StackSpec
    nodes: dict[str, GpuNode]
    grafana_admin_password: pulumi.Output[str] | None = None
    """When None, a password is generated on the monitoring node and exported as a secret."""
    alertmanager_config: pulumi.Output[str] | None = None
    """alertmanager.yml (secret); required when monitoring.alertmanager is set."""


class Monitoring(Component):
    """Exporters per node, Prometheus with generated config and rules, Grafana with provisioned dashboards.

    Every container uses the host network and binds the node's cluster address. Prometheus and
    Grafana config travel as container uploads, so a changed file replaces the container. Grafana
    keeps no state worth keeping (everything it shows is provisioned) and sets its admin password,
    read from a 0600 file on the host, only when it creates its database: so the container is
    replaced with the command that wrote the file (`replace_with`), and a new password replaces it.
    (Not a label with the command's id: unknown at a first preview, it would blind the policy pack.)
    """

    TYPE = "llm-cluster:monitoring:Monitoring"

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        m = spec.monitoring
        if m is None:
            raise ValueError("Monitoring needs the stack's monitoring section")
        if m.alertmanager is not None and args.alertmanager_config is None:
            raise ValueError("monitoring.alertmanager needs the secret alertmanagerConfig")
        exporters = [{"node": n, "kind": kind, "port": svc.port}
                     for n in spec.nodes
                     for kind, svc in (("dcgm-exporter", m.dcgm_exporter), ("node-exporter", m.node_exporter))]
        super().__init__(name, {"node": m.node, "prometheusPort": m.prometheus.port,
                                "grafanaPort": m.grafana.port, "exporters": exporters,
                                "alertmanager": m.alertmanager is not None}, opts)
        self._nodes = args.nodes

        for n in spec.nodes:
            self._container(n, "dcgm-exporter", m.dcgm_exporter.image,
                            envs=dcgm_exporter_env(spec, n), gpus="all",
                            capabilities=docker.ContainerCapabilitiesArgs(adds=["SYS_ADMIN"]))
            # node-exporter's documented container form: host network and PID namespace, the
            # host's / read-only at /host with rslave propagation so later mounts show up. The
            # textfile directory (Ray heads write their cluster's size there) is its own read-only
            # volume: docker creates it on every node, so the collector never finds it missing.
            self._container(n, "node-exporter", m.node_exporter.image,
                            command=node_exporter_args(spec, n), pid_mode="host",
                            mounts=[docker.ContainerMountArgs(
                                target="/host", source="/", type="bind", read_only=True,
                                bind_options=docker.ContainerMountBindOptionsArgs(propagation="rslave"))],
                            volumes=[docker.ContainerVolumeArgs(host_path=NODE_TEXTFILE_DIR,
                                                                container_path=NODE_TEXTFILE_DIR, read_only=True)])

        mon = m.node
        node = args.nodes[mon]
        data = docker.Volume(self.child("prometheus-data"), name="llm-cluster-prometheus-data",
                             opts=self.opts(provider=node.provider, depends_on=list(node.ready)))
        self._container(mon, "prometheus", m.prometheus.image, command=prometheus_args(spec),
                        uploads=_uploads(prometheus_files(spec)),
                        volumes=[docker.ContainerVolumeArgs(volume_name=data.name, container_path="/prometheus")])

        password_file = self._admin_password(node, args.grafana_admin_password)
        self._container(mon, "grafana", m.grafana.image, envs=grafana_env(spec),
                        uploads=_uploads(grafana_provisioning(spec)),
                        volumes=[docker.ContainerVolumeArgs(host_path=GRAFANA_PASSWORD_FILE,
                                                            container_path=GRAFANA_PASSWORD_MOUNT, read_only=True)],
                        extra_deps=[password_file], replace_with=[password_file])

        if m.alertmanager is not None and args.alertmanager_config is not None:
            self._container(mon, "alertmanager", m.alertmanager.image, command=alertmanager_args(spec),
                            uploads=[docker.ContainerUploadArgs(
                                file=ALERTMANAGER_CONFIG_PATH,
                                content=pulumi.Output.secret(args.alertmanager_config))])

        address = spec.node(mon).address
        self.prometheus_url: pulumi.Output[str] = pulumi.Output.from_input(
            f"http://{host_port(address, m.prometheus.port)}")
        self.grafana_url: pulumi.Output[str] = pulumi.Output.from_input(
            f"http://{host_port(address, m.grafana.port)}")
        self.register_outputs({"prometheusUrl": self.prometheus_url, "grafanaUrl": self.grafana_url})

    def _admin_password(self, node: GpuNode, given: pulumi.Output[str] | None) -> remote.Command:
        """The Grafana admin password file on the host: stored from config, or generated once there."""
        # bash whatever the login shell is: the scripts use pipefail, which dash lacks.
        delete = bash_command(grafana_password_delete_script())
        if given is None:
            cmd = remote.Command(
                self.child("grafana-admin-password"), connection=node.connection,
                create=bash_command(grafana_password_generate_script()), delete=delete,
                # stdout carries the password: secret, and kept out of the engine's log.
                logging=remote.Logging.STDERR,
                opts=self.opts(additional_secret_outputs=["stdout"], depends_on=list(node.ready)))
            self.grafana_admin_password: pulumi.Output[str] = pulumi.Output.secret(cmd.stdout)
            return cmd
        secret = pulumi.Output.secret(given)
        cmd = remote.Command(
            self.child("grafana-admin-password"), connection=node.connection,
            create=bash_command(grafana_password_store_script()), delete=delete, stdin=secret,
            # A new password replaces the command (new id), which replaces the Grafana container.
            # Delete first: the old command's delete removes the very file the new one would write.
            triggers=[secret], logging=remote.Logging.STDERR,
            opts=self.opts(depends_on=list(node.ready), delete_before_replace=True))
        self.grafana_admin_password = secret
        return cmd

    def _container(self, node_name: str, role: str, image_ref: str, *,
                   extra_deps: list[pulumi.Resource] | None = None,
                   replace_with: list[pulumi.Resource] | None = None, **kwargs: object) -> docker.Container:
        """A monitoring container on a node: host network, fixed name, restart and replace policies."""
        node = self._nodes[node_name]
        image = node.images[image_ref]
        return docker.Container(
            self.child(f"{node_name}-{role}"),
            name=role, image=image.image_id, network_mode="host", restart="unless-stopped",
            labels=[docker.ContainerLabelArgs(label=k, value=v) for k, v in
                    {"llm-cluster.role": role, "llm-cluster.image": image_ref}.items()],
            **kwargs,  # type: ignore[arg-type]
            opts=self.opts(provider=node.provider, delete_before_replace=True,
                           depends_on=[*node.ready, image, *(extra_deps or [])], replace_with=replace_with))


def _uploads(files: dict[str, str]) -> list[docker.ContainerUploadArgs]:
    return [docker.ContainerUploadArgs(file=container_path(rel), content=text) for rel, text in files.items()]
