"""The Gateway component under Pulumi's mocks: what it registers, with which inputs, secrets and dependencies."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from components.planning.gateway.image import GATEWAY_IMAGE
from components.planning.gateway.keys import key_digests, keys_delete_script, keys_script
from components.planning.gateway.nginx import (
    config_delete_script,
    config_script,
    gateway_files,
    healthcheck_probe,
    readiness_script,
    usage_dir_script,
)
from components.planning.gateway.tls import tls_delete_script, tls_from_stdin_script, tls_generate_script
from components.planning.nodes.scripts import bash_command, written_files
from components.spec import StackSpec
from plan.harness import SECRET_SIG, SIG, ProgramRun, Registration, unwrap
from tests.conftest import prod_config, run_stack

GATEWAY = "llm-cluster:gateway:Gateway"
CONTAINER = "docker:index/container:Container"
COMMAND = "command:remote:Command"
KEYS = {"default": "sk-live-4f1c2a9b7e"}


def with_secret_keys(keys: dict[str, str]) -> tuple[dict[str, Any], set[str]]:
    cfg = prod_config()
    cfg["llm-cluster:gatewayApiKeys"] = json.dumps(keys)
    return cfg, {"llm-cluster:gatewayApiKeys"}


@pytest.fixture(scope="module")
def generated(prod_run: ProgramRun) -> ProgramRun:
    """The reference stack: no key in config, so keys are generated on gpu-01."""
    return prod_run


@pytest.fixture(scope="module")
def from_secret() -> ProgramRun:
    cfg, secrets = with_secret_keys(KEYS)
    return run_stack(cfg, secrets)


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG) == SECRET_SIG


def test_component_props_are_what_the_policy_pack_reads(generated: ProgramRun) -> None:
    (gw,) = generated.by_type(GATEWAY)
    assert gw.name == "gateway" and gw.parent.endswith("pulumi:pulumi:Stack::llm-cluster-prod")
    assert gw.plain_inputs() == {
        "node": "gpu-01",
        "port": 443.0,
        "image": GATEWAY_IMAGE,
        "authRequired": True,
        "apiKeyIds": ["default"],
        "keySource": "generated",
        "tls": True,
        "tlsSource": "generated",
        "routes": {
            "deepseek-r1": "reasoning",
            "/data/models/DeepSeek-R1-GPTQ-Int4": "reasoning",
            "qwen3-30b-a3b": "chat",
            "/data/models/Qwen3-30B-A3B": "chat",
        },
        "split": {},
        "pathRoutes": {"/smart/v1/": "reasoning"},
        "exposedPaths": [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
            "/v1/models",
            "/smart/v1/chat/completions",
            "/smart/v1/completions",
            "/smart/v1/embeddings",
            "/smart/v1/models",
        ],
        "metricsPort": 9145.0,
    }


def test_children_are_parented_to_the_gateway(generated: ProgramRun) -> None:
    (gw,) = generated.by_type(GATEWAY)
    children = sorted((r.type, r.name) for r in generated.registrations if r.parent == gw.urn)
    assert children == [
        (COMMAND, "gateway-config"),
        (COMMAND, "gateway-keys"),
        (COMMAND, "gateway-ready"),
        (COMMAND, "gateway-tls"),
        (COMMAND, "gateway-usage-dir"),
        (CONTAINER, "gateway-nginx"),
        ("docker:index/remoteImage:RemoteImage", "gateway-image"),
    ]


def host_network_container(run: ProgramRun, resource: str, name: str, image: str) -> Registration:
    """A gateway container, checked for what every one shares: fixed name, host network, restart,
    delete-first replacement, the node's pulled image and Docker provider."""
    c = run.get(resource)
    inputs = c.plain_inputs()
    assert inputs["name"] == name and inputs["networkMode"] == "host"
    assert inputs["restart"] == "unless-stopped" and c.options["deleteBeforeReplace"] is True
    assert inputs["image"].startswith("sha256:") and run.get(image).urn in c.property_dependencies["image"]
    assert c.provider.startswith(run.get("gpu-01-docker").urn)
    return c


def test_container_runs_nginx_on_the_host_files_it_mounts(generated: ProgramRun, prod_spec: StackSpec) -> None:
    c = host_network_container(generated, "gateway-nginx", "llm-gateway", "gateway-image")
    inputs = c.plain_inputs()
    assert {(label["label"], label["value"]) for label in inputs["labels"]} == {
        ("llm-cluster.role", "gateway"),
        ("llm-cluster.image", GATEWAY_IMAGE),
    }
    # No uploads: config, keys and certificate are host directories, so changing them never
    # changes the container (a reload, not a replace); the usage log outlives it.
    assert not inputs.get("uploads")
    assert inputs["command"] == ["nginx", "-c", "/etc/llm-gateway/nginx.conf", "-g", "daemon off;"]
    assert inputs["volumes"] == [
        {"hostPath": "/etc/llm-cluster/gateway/conf", "containerPath": "/etc/llm-gateway", "readOnly": True},
        {"hostPath": "/var/log/llm-gateway", "containerPath": "/var/log/llm-gateway"},
        {"hostPath": "/etc/llm-cluster/gateway/nginx", "containerPath": "/etc/llm-gateway-keys", "readOnly": True},
        {"hostPath": "/etc/llm-cluster/gateway/tls", "containerPath": "/etc/llm-gateway-tls", "readOnly": True},
    ]
    assert (
        inputs["healthcheck"]["tests"]
        == healthcheck_probe(prod_spec)
        == [
            "CMD-SHELL",
            "curl -sk -o /dev/null -w '%{http_code}' --max-time 3 https://127.0.0.1:443/v1/models | grep -qx 401",
        ]
    )
    assert not inputs.get("ports")


def test_config_command_writes_the_files_and_reloads_nginx(generated: ProgramRun, prod_spec: StackSpec) -> None:
    cmd = generated.get("gateway-config")
    inputs = cmd.plain_inputs()
    assert inputs["create"] == bash_command(config_script(prod_spec), sudo=False)
    assert inputs["delete"] == bash_command(config_delete_script())
    # No triggers: a changed file is an update of this command (it writes and reloads), never a replace.
    assert "triggers" not in inputs and "stdin" not in inputs
    script = config_script(prod_spec)
    assert written_files(script) == {
        f"/etc/llm-cluster/gateway/conf/{rel}": text for rel, text in gateway_files(prod_spec).items()
    }
    assert "  docker exec llm-gateway nginx -c /etc/llm-gateway/nginx.conf -s reload\n" in script
    by_urn = {r.urn: r for r in generated.registrations}
    assert cmd.urn in generated.get("gateway-nginx").dependencies
    assert {by_urn[u].name for u in cmd.dependencies} >= {"gateway-keys", "gateway-tls"}


def test_a_config_change_updates_the_command_and_leaves_the_container(generated: ProgramRun) -> None:
    cfg = prod_config()
    cfg["llm-cluster:gateway"]["apiKeys"].append({"id": "ops", "maxConcurrent": 4})
    cfg["llm-cluster:gateway"]["aliases"] = {"fast": "chat"}
    changed = run_stack(cfg)
    assert changed.get("gateway-nginx").plain_inputs() == generated.get("gateway-nginx").plain_inputs()
    before, after = (run.get("gateway-config").plain_inputs()["create"] for run in (generated, changed))
    assert before != after and "# key ids: default, ops; tls: on" in after


def test_gateway_depends_on_its_node_and_keys_never_on_the_models(generated: ProgramRun) -> None:
    c = generated.get("gateway-nginx")
    by_urn = {r.urn: r for r in generated.registrations}
    assert {by_urn[u].name for u in c.dependencies} == {
        "gpu-01-hosts",
        "gpu-01-preflight",
        "gpu-01-firewall",
        "gpu-01-clock",
        "gateway-image",
        "gateway-keys",
        "gateway-tls",
        "gateway-config",
        "gateway-usage-dir",
    }
    (gw,) = generated.by_type(GATEWAY)
    ours = [r for r in generated.registrations if r.parent == gw.urn]
    for r in ours:
        for dep in r.dependencies:
            assert by_urn[dep].name.startswith(("gpu-01-", "gateway-")), (r.name, by_urn[dep].name)


def test_nginx_itself_writes_the_usage_files_and_serves_metrics_on_the_cluster_address(generated: ProgramRun) -> None:
    # No exporter container: nginx's workers write the daily files into the host volume and count
    # the metrics; its /metrics listener is the node's cluster address, where Prometheus scrapes.
    (gw,) = generated.by_type(GATEWAY)
    assert [r.name for r in generated.registrations if r.parent == gw.urn and r.type == CONTAINER] == ["gateway-nginx"]
    conf = written_files(generated.get("gateway-config").plain_inputs()["create"])[
        "/etc/llm-cluster/gateway/conf/nginx.conf"
    ].splitlines()
    assert "        listen 192.168.10.11:9145;" in conf
    assert [line for line in conf if "usage_dir" in line][0].endswith(
        'usage_dir = "/var/log/llm-gateway", prune_seconds = 3600, retention_days = 30, max_bytes = 21474836480}) }'
    )
    assert "syslog" not in "\n".join(conf)


def test_usage_log_directory_is_made_once_and_kept(generated: ProgramRun) -> None:
    cmd = generated.get("gateway-usage-dir")
    assert cmd.plain_inputs()["create"] == bash_command(usage_dir_script("/var/log/llm-gateway"))
    assert "delete" not in cmd.plain_inputs()  # the usage log is the operator's record: a destroy keeps it


def test_keys_are_generated_on_the_host_and_kept_secret(generated: ProgramRun) -> None:
    cmd = generated.get("gateway-keys")
    inputs = cmd.plain_inputs()
    assert inputs["create"] == bash_command(keys_script(["default"]))
    assert inputs["delete"] == bash_command(keys_delete_script())
    assert inputs["logging"] == "stderr"
    # No triggers: a replace would run `delete` and drop every key; an edit re-runs the script in place.
    assert "triggers" not in inputs
    assert "stdout" in cmd.options["additionalSecretOutputs"]
    (gw,) = generated.by_type(GATEWAY)
    assert is_secret(gw.outputs["apiKeys"])
    assert generated.stack_outputs.keys() >= {"gatewayUrl", "gatewayApiKeys", "gatewayCaCert"}


def test_tls_certificate_is_made_on_the_host_and_its_ca_is_an_output(
    generated: ProgramRun, prod_spec: StackSpec
) -> None:
    cmd = generated.get("gateway-tls")
    inputs = cmd.plain_inputs()
    assert inputs["create"] == bash_command(tls_generate_script(prod_spec))
    assert inputs["delete"] == bash_command(tls_delete_script())
    assert "san=DNS:gpu-01,IP:192.168.10.11\n" in inputs["create"]
    (gw,) = generated.by_type(GATEWAY)
    assert "caCert" in gw.outputs and not is_secret(generated.stack_outputs["gatewayCaCert"])


def test_readiness_check_follows_the_container(generated: ProgramRun) -> None:
    ready = generated.get("gateway-ready")
    c = generated.get("gateway-nginx")
    # Wrapped for bash: the SSH user's login shell may be dash.
    assert ready.plain_inputs()["create"] == bash_command(readiness_script(443, True, 120, "gpu-01"))
    assert ready.plain_inputs()["triggers"] == [c.resource_id] and c.resource_id
    assert c.urn in ready.dependencies


def test_url_output_is_the_gateway_nodes_address(generated: ProgramRun) -> None:
    (gw,) = generated.by_type(GATEWAY)
    assert gw.outputs["url"] == "https://192.168.10.11:443"


def test_keys_from_the_secret_reach_the_host_only_as_digests(from_secret: ProgramRun) -> None:
    assert not [r for r in from_secret.registrations if r.name == "gateway-keys"]
    (gw,) = from_secret.by_type(GATEWAY)
    assert gw.plain_inputs()["keySource"] == "secret"
    cmd = from_secret.get("gateway-config")
    assert is_secret(cmd.inputs["stdin"])
    assert cmd.plain_inputs()["stdin"] == key_digests(KEYS, ["default"])
    assert cmd.display_inputs()["stdin"] == "[secret]"
    assert "put /etc/llm-cluster/gateway/nginx/key-hashes.json\n" in cmd.plain_inputs()["create"]
    # A changed key runs the script again: its hash is a (secret) trigger.
    assert is_secret(cmd.inputs["triggers"][0])
    assert is_secret(gw.outputs["apiKeys"])
    # The key itself appears nowhere outside a secret envelope.
    for r in from_secret.registrations:
        assert KEYS["default"] not in json.dumps(r.display_inputs())
        assert KEYS["default"] not in json.dumps(unwrap(r.outputs, reveal=False))


def test_secret_keys_must_match_the_stacks_ids() -> None:
    cfg, secrets = with_secret_keys({"ops": "sk-1"})
    with pytest.raises(ValueError, match=r"missing: default, not in the stack: ops"):
        run_stack(cfg, secrets)


def test_tls_from_the_stacks_secrets_goes_in_on_stdin() -> None:
    cfg = prod_config()
    cfg["llm-cluster:gatewayTlsCert"] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    cfg["llm-cluster:gatewayTlsKey"] = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
    result = run_stack(cfg, {"llm-cluster:gatewayTlsCert", "llm-cluster:gatewayTlsKey"})
    cmd = result.get("gateway-tls")
    assert cmd.plain_inputs()["create"] == bash_command(tls_from_stdin_script())
    assert is_secret(cmd.inputs["stdin"]) and cmd.display_inputs()["stdin"] == "[secret]"
    assert cmd.plain_inputs()["stdin"] == cfg["llm-cluster:gatewayTlsCert"] + "\n" + cfg["llm-cluster:gatewayTlsKey"]
    (gw,) = result.by_type(GATEWAY)
    assert gw.plain_inputs()["tlsSource"] == "secret" and gw.outputs["url"] == "https://192.168.10.11:443"
    assert result.stack_outputs.get("gatewayCaCert") is None
    assert "https://127.0.0.1:443/v1/models" in result.get("gateway-ready").plain_inputs()["create"]


def test_preview_knows_what_the_policies_read(prod_preview_run: ProgramRun) -> None:
    result = prod_preview_run
    (gw,) = result.by_type(GATEWAY)
    assert gw.plain_inputs()["authRequired"] is True and gw.plain_inputs()["apiKeyIds"] == ["default"]
    assert gw.plain_inputs()["tls"] is True
    labels = {label["label"]: label["value"] for label in result.get("gateway-nginx").plain_inputs()["labels"]}
    assert labels["llm-cluster.image"] == GATEWAY_IMAGE


def test_without_auth_no_key_is_made_written_mounted_or_exported() -> None:
    cfg = prod_config()
    cfg["llm-cluster:gateway"].update(auth=False, apiKeys=[], tls=False, port=80)
    result = run_stack(cfg)
    (gw,) = result.by_type(GATEWAY)
    props = gw.plain_inputs()
    assert (props["authRequired"], props["apiKeyIds"], props["keySource"]) == (False, [], "none")
    assert sorted(r.name for r in result.registrations if r.parent == gw.urn) == [
        "gateway-config",
        "gateway-image",
        "gateway-nginx",
        "gateway-ready",
        "gateway-usage-dir",
    ]
    c = result.get("gateway-nginx")
    inputs = c.plain_inputs()
    assert [v["containerPath"] for v in inputs["volumes"]] == ["/etc/llm-gateway", "/var/log/llm-gateway"]
    files = written_files(result.get("gateway-config").plain_inputs()["create"])
    assert sorted(files) == [
        "/etc/llm-cluster/gateway/conf/llm/gateway.lua",
        "/etc/llm-cluster/gateway/conf/llm/gateway_affinity.lua",
        "/etc/llm-cluster/gateway/conf/llm/gateway_metrics.lua",
        "/etc/llm-cluster/gateway/conf/llm/routes.json",
        "/etc/llm-cluster/gateway/conf/nginx.conf",
    ]
    assert "key-hashes" not in files["/etc/llm-cluster/gateway/conf/nginx.conf"]
    assert inputs["healthcheck"]["tests"][1].endswith("| grep -qx 200")
    assert result.get("gateway-ready").plain_inputs()["create"] == bash_command(
        readiness_script(80, False, 120, "gpu-01", auth=False)
    )
    assert gw.outputs.get("apiKeys") is None and result.stack_outputs.get("gatewayApiKeys") is None


def test_without_auth_a_key_secret_is_refused_by_the_spec() -> None:
    cfg, secrets = with_secret_keys(KEYS)
    cfg["llm-cluster:gateway"].update(auth=False, apiKeys=[])
    with pytest.raises(pulumi.RunError, match=r"gateway.auth: is false but the secret gatewayApiKeys is set"):
        run_stack(cfg, secrets)
