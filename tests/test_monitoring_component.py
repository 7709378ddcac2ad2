"""The Monitoring component under Pulumi's mocks: placement, container settings, dependencies, secrets."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from components.planning.monitoring.files import prometheus_files
from components.planning.monitoring.grafana import (
    grafana_password_delete_script,
    grafana_password_generate_script,
    grafana_password_store_script,
    grafana_provisioning,
)
from components.planning.monitoring.prometheus import (
    config_files_delete_script,
    config_files_script,
    grafana_reloads,
    lifecycle_reloads,
)
from components.planning.nodes.scripts import bash_command
from components.spec import StackSpec
from plan.harness import ProgramRun, Registration
from tests.conftest import prod_config, run_stack

NS = "llm-cluster:"
CONTAINER = "docker:index/container:Container"
NODES = [f"gpu-0{i}" for i in range(1, 7)]


def monitoring_containers(run: ProgramRun) -> list[Registration]:
    return [r for r in run.by_type(CONTAINER) if r.parent.endswith("::monitoring")]


def provider_node(reg: Registration) -> str:
    """The node whose Docker provider creates this resource (`…::gpu-03-docker::<id>`)."""
    return reg.provider.split("::")[-2].removesuffix("-docker")


def test_exporters_run_on_every_node_and_the_servers_on_the_monitoring_node(prod_run: ProgramRun) -> None:
    placed = sorted((provider_node(r), r.plain_inputs()["name"]) for r in monitoring_containers(prod_run))
    expected = sorted(
        [(n, k) for n in NODES for k in ("dcgm-exporter", "node-exporter")]
        + [("gpu-01", "prometheus"), ("gpu-01", "grafana")]
    )
    assert placed == expected
    assert sorted(r.name for r in monitoring_containers(prod_run)) == sorted(f"monitoring-{n}-{k}" for n, k in expected)


def test_every_monitoring_container_restarts_and_is_replaced_before_recreated(prod_run: ProgramRun) -> None:
    for r in monitoring_containers(prod_run):
        inputs = r.plain_inputs()
        assert inputs["restart"] == "unless-stopped", r.name
        assert inputs["networkMode"] == "host", r.name
        assert r.options["deleteBeforeReplace"] is True, r.name
        labels = {lbl["label"]: lbl["value"] for lbl in inputs["labels"]}
        assert labels["llm-cluster.role"] == inputs["name"]
        assert labels["llm-cluster.image"].split(":")[0] in {
            "nvcr.io/nvidia/k8s/dcgm-exporter",
            "prom/node-exporter",
            "prom/prometheus",
            "grafana/grafana",
        }


def test_containers_depend_on_their_node_and_image_but_never_on_a_model_server(prod_run: ProgramRun) -> None:
    serving = {
        r.urn
        for r in prod_run.registrations
        if "llm-cluster:vllm:" in r.urn or "llm-cluster:ray:" in r.urn or "llm-cluster:weights:" in r.urn
    }
    assert serving  # the pools are in the plan, so the check below means something
    images = {
        (provider_node(r), r.plain_inputs()["name"]): r.urn
        for r in prod_run.by_type("docker:index/remoteImage:RemoteImage")
    }
    for r in monitoring_containers(prod_run):
        node = provider_node(r)
        label = {lbl["label"]: lbl["value"] for lbl in r.plain_inputs()["labels"]}["llm-cluster.image"]
        assert images[(node, label)] in r.dependencies, r.name
        assert not serving & set(r.dependencies), r.name
        assert r.plain_inputs()["image"].startswith("sha256:")  # the node's pulled image id


def test_dcgm_exporter_gets_the_gpus_and_binds_the_cluster_address(prod_run: ProgramRun) -> None:
    inputs = prod_run.get("monitoring-gpu-04-dcgm-exporter").plain_inputs()
    assert inputs["gpus"] == "all"
    assert inputs["capabilities"] == {"adds": ["SYS_ADMIN"]}
    assert inputs["envs"] == ["DCGM_EXPORTER_LISTEN=192.168.10.14:9400", "DCGM_EXPORTER_KUBERNETES=false"]


def test_node_exporter_sees_the_host_and_the_ray_textfiles_read_only(prod_run: ProgramRun) -> None:
    # On every node, Ray head or not: docker creates the directory, so the collector never misses it.
    for n in ("gpu-01", "gpu-05"):
        inputs = prod_run.get(f"monitoring-{n}-node-exporter").plain_inputs()
        assert inputs["command"] == [
            "--path.rootfs=/host",
            "--collector.textfile.directory=/var/lib/llm-cluster/node-exporter",
            f"--web.listen-address=192.168.10.1{n[-1]}:9100",
        ]
        assert inputs["pidMode"] == "host"
        assert inputs["mounts"] == [
            {
                "target": "/host",
                "source": "/",
                "type": "bind",
                "readOnly": True,
                "bindOptions": {"propagation": "rslave"},
            }
        ]
        # The Ray head writes its textfile into the same host directory.
        assert inputs["volumes"] == [
            {
                "hostPath": "/var/lib/llm-cluster/node-exporter",
                "containerPath": "/var/lib/llm-cluster/node-exporter",
                "readOnly": True,
            }
        ]
    head = prod_run.get("reasoning-gpu-01-ray-head").plain_inputs()
    assert {
        "hostPath": "/var/lib/llm-cluster/node-exporter",
        "containerPath": "/var/lib/llm-cluster/node-exporter",
    } in head["volumes"]


def test_prometheus_runs_the_generated_config_and_rules(prod_run: ProgramRun, prod_spec: StackSpec) -> None:
    reg = prod_run.get("monitoring-gpu-01-prometheus")
    inputs = reg.plain_inputs()
    assert inputs["command"] == [
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.path=/prometheus",
        "--storage.tsdb.retention.time=15d",
        "--web.listen-address=192.168.10.11:9090",
        "--web.enable-lifecycle",
    ]
    # The config is a host directory the config command writes: a change reloads, never replaces.
    assert "uploads" not in inputs
    config = prod_run.get("monitoring-prometheus-config")
    assert config.plain_inputs()["create"] == bash_command(
        config_files_script(
            "prometheus", "prometheus", prometheus_files(prod_spec), ["http://192.168.10.11:9090/-/reload"]
        )
    )
    assert config.plain_inputs()["delete"] == bash_command(config_files_delete_script("prometheus"))
    assert "triggers" not in config.plain_inputs() and config.options["replaceOnChanges"] == ["triggers[*]"]
    assert config.urn in reg.dependencies and config.urn not in reg.property_dependencies.get("volumes", [])
    volume = prod_run.get("monitoring-prometheus-data")
    assert inputs["volumes"] == [
        {"volumeName": "llm-cluster-prometheus-data", "containerPath": "/prometheus"},
        {"hostPath": "/etc/llm-cluster/monitoring/prometheus", "containerPath": "/etc/prometheus", "readOnly": True},
    ]
    assert volume.urn in reg.dependencies
    assert provider_node(volume) == "gpu-01"


def test_grafana_is_provisioned_and_reads_its_password_from_a_file(prod_run: ProgramRun, prod_spec: StackSpec) -> None:
    reg = prod_run.get("monitoring-gpu-01-grafana")
    inputs = reg.plain_inputs()
    assert "uploads" not in inputs
    config = prod_run.get("monitoring-grafana-config")
    assert config.plain_inputs()["create"] == bash_command(
        config_files_script(
            "grafana", "grafana", grafana_provisioning(prod_spec), grafana_reloads("http://192.168.10.11:3000")
        )
    )
    # The reload authenticates with the admin password: its file comes first.
    assert prod_run.get("monitoring-grafana-admin-password").urn in config.dependencies
    assert config.urn in reg.dependencies
    assert "GF_SECURITY_ADMIN_PASSWORD__FILE=/run/secrets/grafana-admin-password" in inputs["envs"]
    assert not [e for e in inputs["envs"] if e.startswith("GF_SECURITY_ADMIN_PASSWORD=")]
    assert "GF_SERVER_HTTP_ADDR=192.168.10.11" in inputs["envs"]
    assert inputs["volumes"] == [
        {
            "hostPath": "/etc/llm-cluster/grafana/admin-password",
            "containerPath": "/run/secrets/grafana-admin-password",
            "readOnly": True,
        },
        {
            "hostPath": "/etc/llm-cluster/monitoring/grafana/provisioning",
            "containerPath": "/etc/grafana/provisioning",
            "readOnly": True,
        },
        {
            "hostPath": "/etc/llm-cluster/monitoring/grafana/dashboards",
            "containerPath": "/etc/grafana/dashboards",
            "readOnly": True,
        },
    ]
    assert prod_run.get("monitoring-grafana-admin-password").urn in reg.dependencies


def test_without_a_configured_password_one_is_generated_on_the_host_as_a_secret(prod_run: ProgramRun) -> None:
    cmd = prod_run.get("monitoring-grafana-admin-password")
    inputs = cmd.plain_inputs()
    # Under bash whatever the login shell is (dash has no pipefail).
    assert inputs["create"] == bash_command(grafana_password_generate_script())
    assert inputs["delete"] == bash_command(grafana_password_delete_script())
    assert inputs["logging"] == "stderr"  # stdout carries the password: never into the engine's log
    assert "stdout" in cmd.options["additionalSecretOutputs"]
    assert provider_node(prod_run.get("monitoring-gpu-01-grafana")) == "gpu-01"
    assert inputs["connection"]["host"] == "192.168.10.11"
    assert prod_run.stack_outputs["grafanaAdminPassword"] == "[secret]"
    assert prod_run.stack_outputs["grafanaUrl"] == "http://192.168.10.11:3000"
    assert prod_run.stack_outputs["prometheusUrl"] == "http://192.168.10.11:9090"


def test_component_props_name_node_ports_and_exporters(prod_run: ProgramRun) -> None:
    props = prod_run.get("monitoring").plain_inputs()
    assert prod_run.get("monitoring").type == "llm-cluster:monitoring:Monitoring"
    assert {k: v for k, v in props.items() if k != "exporters"} == {
        "node": "gpu-01",
        "prometheusPort": 9090,
        "grafanaPort": 3000,
        "alertmanager": False,
    }
    assert props["exporters"][:2] == [
        {"node": "gpu-01", "kind": "dcgm-exporter", "port": 9400},
        {"node": "gpu-01", "kind": "node-exporter", "port": 9100},
    ]
    assert len(props["exporters"]) == 12


PASSWORD = "correct-horse-battery-staple-42"
AM_CONFIG = (
    "route: {receiver: ops}\nreceivers:\n- name: ops\n  webhook_configs: [{url: 'https://hooks.example/T0KEN-xyz'}]\n"
)


def secret_config() -> dict[str, Any]:
    """The reference stack with a configured Grafana password and Alertmanager (secrets)."""
    config = prod_config()
    config[NS + "grafanaAdminPassword"] = PASSWORD
    config[NS + "alertmanagerConfig"] = AM_CONFIG
    config[NS + "monitoring"]["alertmanager"] = {"image": "prom/alertmanager:v0.27.0", "port": 9093}
    return config


@pytest.fixture(scope="module")
def secret_run() -> ProgramRun:
    """secret_config under the mocks."""
    return run_stack(secret_config(), {NS + "grafanaAdminPassword", NS + "alertmanagerConfig"})


def test_configured_secrets_never_appear_in_plaintext(secret_run: ProgramRun) -> None:
    shown = json.dumps([r.display_inputs() for r in secret_run.registrations]) + json.dumps(secret_run.stack_outputs)
    assert PASSWORD not in shown and "T0KEN-xyz" not in shown
    cmd = secret_run.get("monitoring-grafana-admin-password")
    assert cmd.display_inputs()["stdin"] == "[secret]"
    assert cmd.plain_inputs()["stdin"] == PASSWORD
    assert cmd.plain_inputs()["create"] == bash_command(grafana_password_store_script())
    assert cmd.plain_inputs()["delete"] == bash_command(grafana_password_delete_script())
    assert cmd.display_inputs()["triggers"] == ["[secret]"]  # a new password replaces the command…
    # …old one deleted first: its delete removes the file, which must not follow the new create.
    assert cmd.options["deleteBeforeReplace"] is True
    grafana = secret_run.get("monitoring-gpu-01-grafana")
    assert grafana.options["replaceWith"] == [cmd.urn]  # …and with it Grafana, which reads the file once
    assert secret_run.stack_outputs["grafanaAdminPassword"] == "[secret]"


def test_alertmanager_runs_with_its_secret_config(secret_run: ProgramRun) -> None:
    reg = secret_run.get("monitoring-gpu-01-alertmanager")
    inputs = reg.plain_inputs()
    assert inputs["command"] == [
        "--config.file=/etc/alertmanager/alertmanager.yml",
        "--storage.path=/alertmanager",
        "--web.listen-address=192.168.10.11:9093",
        "--cluster.listen-address=",
    ]
    assert "uploads" not in inputs
    assert inputs["volumes"] == [
        {"hostPath": "/etc/llm-cluster/monitoring/alertmanager", "containerPath": "/etc/alertmanager", "readOnly": True}
    ]
    # The receivers are a secret: on stdin into a 0600 file, reloaded in place.
    config = secret_run.get("monitoring-alertmanager-config")
    assert config.plain_inputs()["stdin"] == AM_CONFIG and config.display_inputs()["stdin"] == "[secret]"
    assert config.plain_inputs()["create"] == bash_command(
        config_files_script(
            "alertmanager",
            "alertmanager",
            {},
            lifecycle_reloads("http://192.168.10.11:9093"),
            stdin_file="alertmanager/alertmanager.yml",
            secret=True,
        )
    )
    assert config.urn in reg.dependencies
    assert inputs["restart"] == "unless-stopped" and reg.options["deleteBeforeReplace"] is True
    assert secret_run.get("monitoring").plain_inputs()["alertmanager"] is True


def test_no_monitoring_section_registers_nothing(
    stack_runner: Callable[..., ProgramRun], config: dict[str, Any]
) -> None:
    del config[NS + "monitoring"]
    run = stack_runner(config)
    assert not [r for r in run.registrations if "monitoring" in r.name]
    assert "grafanaUrl" not in run.stack_outputs


def test_preview_knows_the_image_reference_even_before_the_image_id(prod_preview_run: ProgramRun) -> None:
    for r in monitoring_containers(prod_preview_run):
        labels = {lbl["label"]: lbl["value"] for lbl in r.display_inputs()["labels"]}
        assert labels["llm-cluster.image"] and labels["llm-cluster.role"] == r.display_inputs()["name"]


def test_component_refuses_alertmanager_without_its_config(config: dict[str, Any]) -> None:
    from components.resources.monitoring import Monitoring, MonitoringArgs
    from components.spec import StackSpec

    config[NS + "monitoring"]["alertmanager"] = {"image": "prom/alertmanager:v0.27.0", "port": 9093}
    # The spec's own check refuses this first (tests/test_spec.py); the component must not rely on it.
    spec = StackSpec.model_validate({k.removeprefix(NS): v for k, v in config.items()}, by_alias=True)
    with pytest.raises(ValueError, match="monitoring.alertmanager needs the secret alertmanagerConfig"):
        Monitoring("monitoring", MonitoringArgs(spec, {}))
