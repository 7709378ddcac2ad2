"""GpuNode under Pulumi's mocks: SSH auth modes, Docker provider options, hosts block, preflight, images, secrets."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components.planning.nodes.scripts import bash_command, hosts_create_script, hosts_entries
from components.spec import StackSpec
from plan.harness import SECRET_SIG, SIG, ProgramRun
from tests.support import content_trigger, host_key, script_of

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA-test-only\n-----END OPENSSH PRIVATE KEY-----\n"
NODES = [f"gpu-0{i}" for i in range(1, 7)]


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG) == SECRET_SIG


def everything_shown(run: ProgramRun) -> str:
    return json.dumps([r.display_inputs() for r in run.registrations] + [r.outputs for r in run.registrations])


def test_each_node_has_provider_hosts_preflight_and_its_images(prod_run: ProgramRun) -> None:
    for node in NODES:
        children = {r.name: r for r in prod_run.registrations if r.parent.endswith(f"GpuNode::{node}")}
        assert {n for n in children if not n.startswith(f"{node}-image-")} == {
            f"{node}-docker",
            f"{node}-hosts",
            f"{node}-preflight",
            f"{node}-firewall",
            f"{node}-clock",
        }
        assert children[f"{node}-hosts"].dependencies == []
        assert children[f"{node}-preflight"].dependencies == []
    images = [r for r in prod_run.by_type("docker:index/remoteImage:RemoteImage") if r.name.startswith("gpu-03-")]
    assert {r.plain_inputs()["name"] for r in images} == {
        "vllm/vllm-openai:v0.19.1",
        "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04",
        "prom/node-exporter:v1.8.2",
    }
    provider = prod_run.get("gpu-03-docker").urn
    for r in images:
        assert r.plain_inputs()["keepLocally"] is True
        assert r.dependencies == [prod_run.get("gpu-03-preflight").urn]
        assert r.provider.startswith(provider + "::")


def test_the_clock_is_compared_from_the_operators_machine_with_dockers_ssh_options(prod_run: ProgramRun) -> None:
    clock = prod_run.get("gpu-02-clock").plain_inputs()
    assert (
        "remote=$(ssh -o BatchMode=yes -o Port=22 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "root@192.168.10.12 'date +%s.%N' </dev/null)"
    ) in clock["create"]
    assert "-v bound=1.0 -v node=gpu-02" in clock["create"]
    assert prod_run.get("gpu-02-clock").dependencies == []


def test_docker_provider_over_ssh_with_each_option_its_own_element(prod_run: ProgramRun) -> None:
    inputs = prod_run.get("gpu-02-docker").plain_inputs()
    assert inputs["host"] == "ssh://root@192.168.10.12"
    assert json.loads(inputs["sshOpts"]) == [
        "-o",
        "Port=22",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
    ]
    assert prod_run.get("gpu-02-docker").dependencies == []


def test_agent_connection_is_secret_and_leaves_the_socket_to_ssh_auth_sock(prod_run: ProgramRun) -> None:
    hosts = prod_run.get("gpu-01-hosts")
    assert is_secret(hosts.inputs["connection"])
    conn = hosts.plain_inputs()["connection"]
    assert conn["host"] == "192.168.10.11" and conn["user"] == "root" and conn["port"] == 22
    assert "privateKey" not in conn and "agentSocketPath" not in conn and "hostKey" not in conn
    assert sorted(r.name for r in prod_run.by_type("command:local:Command")) == [f"{n}-clock" for n in NODES]


def test_hosts_block_command(prod_run: ProgramRun, prod_spec: StackSpec) -> None:
    hosts = prod_run.get("gpu-04-hosts")
    inputs = hosts.plain_inputs()
    assert inputs["create"] == bash_command(hosts_create_script(hosts_entries(prod_spec)))
    assert "'192.168.10.16 gpu-06' '# END llm-cluster'" in inputs["create"]
    assert "# BEGIN llm-cluster" in inputs["delete"] and "printf" not in inputs["delete"]
    assert inputs["triggers"] == [content_trigger(script_of(inputs["create"]))]
    assert hosts.options["deleteBeforeReplace"] is True
    assert hosts.options["replaceOnChanges"] == ["triggers[*]"]


def test_preflight_runs_the_node_checks_and_has_nothing_to_undo(prod_run: ProgramRun) -> None:
    inputs = prod_run.get("gpu-02-preflight").plain_inputs()
    assert "python3 - " in inputs["create"] and '"gpu_model": "Tesla V100-SXM2-32GB"' in inputs["create"]
    assert '"driver_min": "560.28.03"' in inputs["create"] and '"node": "gpu-02"' in inputs["create"]
    assert "delete" not in inputs
    # Each node's preflight states its own expectations, so the scripts (and their triggers) differ.
    assert inputs["triggers"] == [content_trigger(script_of(inputs["create"]))]
    assert inputs["triggers"] != prod_run.get("gpu-01-preflight").plain_inputs()["triggers"]


def test_key_path_is_read_into_a_secret_and_given_to_docker_ssh(
    tmp_path: Path, config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text(KEY)
    config["llm-cluster:ssh"] = {"user": "deploy", "agent": False, "keyPath": str(key)}
    run = stack_runner(config)
    conn = run.get("gpu-01-preflight").plain_inputs()["connection"]
    assert conn["privateKey"] == KEY and conn["user"] == "deploy"
    assert json.loads(run.get("gpu-01-docker").plain_inputs()["sshOpts"])[-2:] == ["-i", str(key)]
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in everything_shown(run)


def test_a_missing_key_file_names_ssh_key_path(
    tmp_path: Path, config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    config["llm-cluster:ssh"] = {"agent": False, "keyPath": str(tmp_path / "nope")}
    with pytest.raises(pulumi.RunError, match=r"ssh.keyPath: cannot read the private key .*nope"):
        stack_runner(config)


def test_secret_key_goes_to_commands_and_a_0600_file_for_docker(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    config["llm-cluster:ssh"] = {"agent": False}
    config["llm-cluster:sshPrivateKey"] = KEY
    run = stack_runner(config, {"llm-cluster:sshPrivateKey"})
    assert run.get("gpu-05-hosts").plain_inputs()["connection"]["privateKey"] == KEY
    key_file = run.get("gpu-05-ssh-key")
    assert key_file.type == "command:local:Command" and key_file.parent.endswith("GpuNode::gpu-05")
    assert is_secret(key_file.inputs["stdin"]) and key_file.plain_inputs()["stdin"] == KEY
    assert "umask 077" in key_file.plain_inputs()["create"]
    assert 'rm -f -- "$HOME"/.ssh/llm-cluster/prod/gpu-05.key' in key_file.plain_inputs()["delete"]
    docker = run.get("gpu-05-docker")
    assert json.loads(docker.plain_inputs()["sshOpts"])[-2:] == ["-i", "~/.ssh/llm-cluster/prod/gpu-05.key"]
    assert docker.dependencies == [key_file.urn]
    assert "b3BlbnNzaC1rZXktdjEAAAAA" not in everything_shown(run)


def test_pinned_host_keys_for_commands_and_docker(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    config["llm-cluster:ssh"] = {"hostKeyChecking": True, "port": 2222}
    for node in NODES:
        config["llm-cluster:nodes"][node]["hostKey"] = host_key(node)
    run = stack_runner(config)
    assert run.get("gpu-03-preflight").plain_inputs()["connection"]["hostKey"] == host_key("gpu-03")
    known = run.get("gpu-03-known-hosts").plain_inputs()
    assert known["stdin"] == f"[192.168.10.13]:2222 {host_key('gpu-03')}\n"
    docker = run.get("gpu-03-docker")
    assert json.loads(docker.plain_inputs()["sshOpts"]) == [
        "-o",
        "Port=2222",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UserKnownHostsFile=~/.ssh/llm-cluster/prod/gpu-03.known_hosts",
    ]
    assert docker.dependencies == [run.get("gpu-03-known-hosts").urn]


def test_host_keys_without_checking_pin_nothing(
    config: dict[str, Any], stack_runner: Callable[..., ProgramRun]
) -> None:
    config["llm-cluster:nodes"]["gpu-03"]["hostKey"] = host_key("gpu-03")
    run = stack_runner(config)
    assert "hostKey" not in run.get("gpu-03-preflight").plain_inputs()["connection"]
    assert "hostKey" not in run.get("gpu-03-hosts").plain_inputs()["connection"]
    assert not [r for r in run.by_type("command:local:Command") if not r.name.endswith("-clock")]
    assert "StrictHostKeyChecking=no" in json.loads(run.get("gpu-03-docker").plain_inputs()["sshOpts"])
