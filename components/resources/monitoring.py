"""Monitoring: dcgm-exporter and node-exporter on every node; Prometheus, Grafana, Alertmanager on one."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import marks
from components.planning.fabric.ray import NODE_TEXTFILE_DIR
from components.planning.monitoring.files import prometheus_files
from components.planning.monitoring.grafana import (
    grafana_password_delete_script,
    grafana_password_generate_script,
    grafana_password_store_script,
    grafana_provisioning,
)
from components.planning.monitoring.prometheus import (
    ALERTMANAGER_CONFIG,
    GRAFANA_PASSWORD_FILE,
    GRAFANA_PASSWORD_MOUNT,
    alertmanager_args,
    config_files_delete_script,
    config_files_script,
    config_mounts,
    dcgm_exporter_env,
    grafana_env,
    grafana_reloads,
    lifecycle_reloads,
    monitoring_url,
    node_exporter_args,
    prometheus_args,
)
from components.planning.nodes.scripts import bash_command
from components.resources.base import Component
from components.resources.gpu_node import GpuNode
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

    Every container uses the host network and binds the node's cluster address. The Prometheus,
    Grafana and Alertmanager config lives in host directories that one command per service writes
    and the container mounts read-only: a changed scrape target, rule, dashboard or receiver is an
    update of that command, which reloads the running service (Prometheus and Alertmanager through
    POST /-/reload, Grafana through its provisioning reload API). The container is replaced only
    when its image or runtime settings change. Grafana keeps no state worth keeping (everything it
    shows is provisioned) and sets its admin password, read from a 0600 file on the host, only when
    it creates its database: so the container is replaced with the command that wrote the file
    (`replace_with`), and a new password replaces it. (Not a label with the command's id: unknown
    at a first preview, it would blind the policy pack.)
    """

    TYPE = marks.MONITORING

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None):
        spec = args.spec
        m = spec.monitoring
        if m is None:
            raise ValueError("Monitoring needs the stack's monitoring section")
        if m.alertmanager is not None and args.alertmanager_config is None:
            raise ValueError("monitoring.alertmanager needs the secret alertmanagerConfig")
        exporters = [
            {"node": n, "kind": kind, "port": svc.port}
            for n in spec.nodes
            for kind, svc in (("dcgm-exporter", m.dcgm_exporter), ("node-exporter", m.node_exporter))
        ]
        super().__init__(
            name,
            {
                "node": m.node,
                "prometheusPort": m.prometheus.port,
                "grafanaPort": m.grafana.port,
                "exporters": exporters,
                "alertmanager": m.alertmanager is not None,
            },
            opts,
        )
        self._nodes = args.nodes

        for n in spec.nodes:
            self._container(
                n,
                "dcgm-exporter",
                m.dcgm_exporter.image,
                envs=dcgm_exporter_env(spec, n),
                gpus="all",
                capabilities=docker.ContainerCapabilitiesArgs(adds=["SYS_ADMIN"]),
            )
            # node-exporter's documented container form: host network and PID namespace, the
            # host's / read-only at /host with rslave propagation so later mounts show up. The
            # textfile directory (Ray heads write their cluster's size there) is its own read-only
            # volume: docker creates it on every node, so the collector never finds it missing.
            self._container(
                n,
                "node-exporter",
                m.node_exporter.image,
                command=node_exporter_args(spec, n),
                pid_mode="host",
                mounts=[
                    docker.ContainerMountArgs(
                        target="/host",
                        source="/",
                        type="bind",
                        read_only=True,
                        bind_options=docker.ContainerMountBindOptionsArgs(propagation="rslave"),
                    )
                ],
                volumes=[
                    docker.ContainerVolumeArgs(
                        host_path=NODE_TEXTFILE_DIR, container_path=NODE_TEXTFILE_DIR, read_only=True
                    )
                ],
            )

        mon = m.node
        node = args.nodes[mon]
        data = docker.Volume(
            self.child("prometheus-data"),
            name="llm-cluster-prometheus-data",
            opts=self.opts(provider=node.provider, depends_on=list(node.ready)),
        )
        prometheus_config = self._config(
            node,
            "prometheus",
            config_files_script(
                "prometheus",
                "prometheus",
                prometheus_files(spec),
                lifecycle_reloads(monitoring_url(spec, m.prometheus.port)),
            ),
        )
        self._container(
            mon,
            "prometheus",
            m.prometheus.image,
            command=prometheus_args(spec),
            volumes=[
                docker.ContainerVolumeArgs(volume_name=data.name, container_path="/prometheus"),
                *_config_volumes("prometheus"),
            ],
            extra_deps=[prometheus_config],
        )

        password_file = self._admin_password(node, args.grafana_admin_password)
        # After the password file: the reload authenticates with it.
        grafana_config = self._config(
            node,
            "grafana",
            config_files_script(
                "grafana", "grafana", grafana_provisioning(spec), grafana_reloads(monitoring_url(spec, m.grafana.port))
            ),
            after=[password_file],
        )
        self._container(
            mon,
            "grafana",
            m.grafana.image,
            envs=grafana_env(spec),
            volumes=[
                docker.ContainerVolumeArgs(
                    host_path=GRAFANA_PASSWORD_FILE, container_path=GRAFANA_PASSWORD_MOUNT, read_only=True
                ),
                *_config_volumes("grafana"),
            ],
            extra_deps=[password_file, grafana_config],
            replace_with=[password_file],
        )

        if m.alertmanager is not None and args.alertmanager_config is not None:
            # The receivers (webhook URLs, tokens) are a secret: in on stdin, 0600 on the host.
            alertmanager_config = self._config(
                node,
                "alertmanager",
                config_files_script(
                    "alertmanager",
                    "alertmanager",
                    {},
                    lifecycle_reloads(monitoring_url(spec, m.alertmanager.port)),
                    stdin_file=ALERTMANAGER_CONFIG,
                    secret=True,
                ),
                stdin=pulumi.Output.secret(args.alertmanager_config),
            )
            self._container(
                mon,
                "alertmanager",
                m.alertmanager.image,
                command=alertmanager_args(spec),
                volumes=_config_volumes("alertmanager"),
                extra_deps=[alertmanager_config],
            )

        self.prometheus_url: pulumi.Output[str] = pulumi.Output.from_input(monitoring_url(spec, m.prometheus.port))
        self.grafana_url: pulumi.Output[str] = pulumi.Output.from_input(monitoring_url(spec, m.grafana.port))
        self.register_outputs({"prometheusUrl": self.prometheus_url, "grafanaUrl": self.grafana_url})

    def _admin_password(self, node: GpuNode, given: pulumi.Output[str] | None) -> remote.Command:
        """The Grafana admin password file on the host: stored from config, or generated once there."""
        # bash whatever the login shell is: the scripts use pipefail, which dash lacks.
        delete = bash_command(grafana_password_delete_script(), sudo=node.sudo)
        if given is None:
            cmd = remote.Command(
                self.child("grafana-admin-password"),
                connection=node.connection,
                create=bash_command(grafana_password_generate_script(), sudo=node.sudo),
                delete=delete,
                # stdout carries the password: secret, and kept out of the engine's log.
                logging=remote.Logging.STDERR,
                opts=self.opts(additional_secret_outputs=["stdout"], depends_on=list(node.ready)),
            )
            self.grafana_admin_password: pulumi.Output[str] = pulumi.Output.secret(cmd.stdout)
            return cmd
        secret = pulumi.Output.secret(given)
        cmd = remote.Command(
            self.child("grafana-admin-password"),
            connection=node.connection,
            create=bash_command(grafana_password_store_script(), sudo=node.sudo),
            delete=delete,
            stdin=secret,
            # A new password replaces the command (new id), which replaces the Grafana container.
            # Delete first: the old command's delete removes the very file the new one would write.
            triggers=[secret],
            logging=remote.Logging.STDERR,
            opts=self.opts(depends_on=list(node.ready), delete_before_replace=True),
        )
        self.grafana_admin_password = secret
        return cmd

    def _config(
        self,
        node: GpuNode,
        service: str,
        script: str,
        *,
        after: list[pulumi.Resource] | None = None,
        stdin: pulumi.Input[str] | None = None,
    ) -> remote.Command:
        """The command that writes a service's config files on the host and reloads the running service."""
        # No triggers: a changed file is an update (the script runs again and reloads), never a
        # replace, whose delete would pull the files from under the running service.
        return remote.Command(
            self.child(f"{service}-config"),
            connection=node.connection,
            create=bash_command(script, sudo=node.sudo),
            delete=bash_command(config_files_delete_script(service), sudo=node.sudo),
            stdin=stdin,
            opts=self.opts(depends_on=[*node.ready, *(after or [])]),
        )

    def _container(
        self,
        node_name: str,
        role: str,
        image_ref: str,
        *,
        extra_deps: list[pulumi.Resource] | None = None,
        replace_with: list[pulumi.Resource] | None = None,
        **kwargs: object,
    ) -> docker.Container:
        """A monitoring container on a node: host network, fixed name, restart and replace policies."""
        node = self._nodes[node_name]
        image = node.images[image_ref]
        return docker.Container(
            self.child(f"{node_name}-{role}"),
            name=role,
            image=image.image_id,
            network_mode="host",
            restart="unless-stopped",
            labels=[
                docker.ContainerLabelArgs(label=k, value=v)
                for k, v in {"llm-cluster.role": role, "llm-cluster.image": image_ref}.items()
            ],
            **kwargs,  # type: ignore[arg-type]
            opts=self.opts(
                provider=node.provider,
                delete_before_replace=True,
                depends_on=[*node.ready, image, *(extra_deps or [])],
                replace_with=replace_with,
            ),
        )


def _config_volumes(service: str) -> list[docker.ContainerVolumeArgs]:
    return [
        docker.ContainerVolumeArgs(host_path=host, container_path=inside, read_only=True)
        for host, inside in config_mounts(service)
    ]
