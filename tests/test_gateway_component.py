"""The Gateway component under Pulumi's mocks: what it registers, with which inputs, secrets and dependencies."""
from __future__ import annotations

import json
from typing import Any

import pulumi
import pytest

from components.planning.gateway import (
    exporter_source, gateway_files, healthcheck_probe, key_digests, keys_delete_script, keys_script,
    readiness_script,
)
from components.planning.node_scripts import bash_command
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


def uploads(reg: Registration, reveal: bool = False) -> dict[str, Any]:
    inputs = reg.plain_inputs() if reveal else reg.display_inputs()
    return {u["file"]: u["content"] for u in inputs["uploads"]}


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG) == SECRET_SIG


def test_component_props_are_what_the_policy_pack_reads(generated: ProgramRun) -> None:
    (gw,) = generated.by_type(GATEWAY)
    assert gw.name == "gateway" and gw.parent.endswith("pulumi:pulumi:Stack::llm-cluster-prod")
    assert gw.plain_inputs() == {
        "node": "gpu-01", "port": 80.0, "image": "nginx:1.27.5", "authRequired": True, "apiKeyIds": ["default"],
        "keySource": "generated", "tls": False,
        "routes": {"deepseek-r1": "reasoning", "/data/models/DeepSeek-R1-GPTQ-Int4": "reasoning",
                   "qwen3-30b-a3b": "chat", "/data/models/Qwen3-30B-A3B": "chat"},
        "pathRoutes": {"/smart/v1/": "reasoning"},
        "exposedPaths": ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models",
                         "/smart/v1/chat/completions", "/smart/v1/completions", "/smart/v1/embeddings",
                         "/smart/v1/models"],
        "metricsPort": 9145.0, "exporterImage": "python:3.12-slim"}


def test_children_are_parented_to_the_gateway(generated: ProgramRun) -> None:
    (gw,) = generated.by_type(GATEWAY)
    children = sorted((r.type, r.name) for r in generated.registrations if r.parent == gw.urn)
    assert children == [(COMMAND, "gateway-keys"), (COMMAND, "gateway-ready"), (CONTAINER, "gateway-exporter"),
                        (CONTAINER, "gateway-nginx")]


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


def test_container_runs_the_generated_config_on_host_network(generated: ProgramRun, prod_spec: StackSpec) -> None:
    c = host_network_container(generated, "gateway-nginx", "llm-gateway", "gpu-01-image-nginx-1-27-5")
    inputs = c.plain_inputs()
    assert {(label["label"], label["value"]) for label in inputs["labels"]} == {
        ("llm-cluster.role", "gateway"), ("llm-cluster.image", "nginx:1.27.5"), ("llm-cluster.key-ids", "default")}
    files = gateway_files(prod_spec)
    assert uploads(c) == {f"/etc/nginx/{rel}": text for rel, text in files.items()}
    assert inputs["volumes"] == [{"hostPath": "/etc/llm-cluster/gateway/nginx", "containerPath": "/etc/nginx/llm-keys",
                                  "readOnly": True}]
    assert inputs["healthcheck"]["tests"] == healthcheck_probe(prod_spec) == [
        "CMD-SHELL",
        "curl -sk -o /dev/null -w '%{http_code}' --max-time 3 http://127.0.0.1:80/v1/models | grep -qx 401"]
    assert not inputs.get("ports")


def test_gateway_depends_on_its_node_and_keys_never_on_the_models(generated: ProgramRun) -> None:
    c = generated.get("gateway-nginx")
    by_urn = {r.urn: r for r in generated.registrations}
    # The exporter first: nginx's first log lines find it listening.
    assert {by_urn[u].name for u in c.dependencies} == {
        "gpu-01-hosts", "gpu-01-preflight", "gpu-01-firewall", "gpu-01-clock", "gpu-01-image-nginx-1-27-5", "gateway-keys", "gateway-exporter"}
    (gw,) = generated.by_type(GATEWAY)
    ours = [r for r in generated.registrations if r.parent == gw.urn]
    for r in ours:
        for dep in r.dependencies:
            assert by_urn[dep].name.startswith(("gpu-01-", "gateway-")), (r.name, by_urn[dep].name)


def test_exporter_runs_the_uploaded_program_unprivileged_on_host_network(generated: ProgramRun) -> None:
    c = host_network_container(generated, "gateway-exporter", "llm-gateway-exporter", "gpu-01-image-python-3-12-slim")
    inputs = c.plain_inputs()
    assert inputs["command"] == ["python3", "/opt/llm-cluster/gateway_exporter.py", "--syslog", "127.0.0.1:5514",
                                 "--listen", "192.168.10.11:9145"]
    assert uploads(c) == {"/opt/llm-cluster/gateway_exporter.py": exporter_source()}
    assert inputs["user"] == "65534:65534"
    assert {(label["label"], label["value"]) for label in inputs["labels"]} == {
        ("llm-cluster.role", "gateway-exporter"), ("llm-cluster.image", "python:3.12-slim")}
    assert inputs["healthcheck"]["tests"] == [
        "CMD", "python3", "-c",
        "import urllib.request; urllib.request.urlopen('http://192.168.10.11:9145/metrics', timeout=3)"]
    assert not inputs.get("ports") and not inputs.get("envs")
    by_urn = {r.urn: r for r in generated.registrations}
    assert {by_urn[u].name for u in c.dependencies} == {
        "gpu-01-hosts", "gpu-01-preflight", "gpu-01-firewall", "gpu-01-clock", "gpu-01-image-python-3-12-slim"}
    # nginx sends it the usage log on the port it listens on.
    conf = uploads(generated.get("gateway-nginx"))["/etc/nginx/nginx.conf"]
    assert "    access_log syslog:server=127.0.0.1:5514,tag=llmgw,nohostname llm_usage;" in conf.splitlines()


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
    assert generated.stack_outputs.keys() >= {"gatewayUrl", "gatewayApiKeys"}


def test_readiness_check_follows_the_container(generated: ProgramRun) -> None:
    ready = generated.get("gateway-ready")
    c = generated.get("gateway-nginx")
    # Wrapped for bash: the SSH user's login shell may be dash.
    assert ready.plain_inputs()["create"] == bash_command(readiness_script(80, False, 120, "gpu-01"))
    assert ready.plain_inputs()["triggers"] == [c.resource_id] and c.resource_id
    assert c.urn in ready.dependencies


def test_url_output_is_the_gateway_nodes_address(generated: ProgramRun) -> None:
    (gw,) = generated.by_type(GATEWAY)
    assert gw.outputs["url"] == "http://192.168.10.11:80"


def test_keys_from_the_secret_reach_nginx_only_as_digests(from_secret: ProgramRun) -> None:
    assert not [r for r in from_secret.registrations if r.name == "gateway-keys"]
    (gw,) = from_secret.by_type(GATEWAY)
    assert gw.plain_inputs()["keySource"] == "secret"
    c = from_secret.get("gateway-nginx")
    wire = {u["file"]: u["content"] for u in c.inputs["uploads"]}
    assert is_secret(wire["/etc/nginx/llm-keys/key-hashes.json"])
    assert uploads(c, reveal=True)["/etc/nginx/llm-keys/key-hashes.json"] == key_digests(KEYS, ["default"])
    assert uploads(c)["/etc/nginx/llm-keys/key-hashes.json"] == "[secret]"
    assert c.plain_inputs()["volumes"] == []
    assert is_secret(gw.outputs["apiKeys"])
    # The key itself appears nowhere outside a secret envelope.
    for r in from_secret.registrations:
        assert KEYS["default"] not in json.dumps(r.display_inputs())
        assert KEYS["default"] not in json.dumps(unwrap(r.outputs, reveal=False))


def test_secret_keys_must_match_the_stacks_ids() -> None:
    cfg, secrets = with_secret_keys({"ops": "sk-1"})
    with pytest.raises(ValueError, match=r"missing: default, not in the stack: ops"):
        run_stack(cfg, secrets)


def test_tls_uploads_certificate_and_key_as_secrets() -> None:
    cfg = prod_config()
    cfg["llm-cluster:gateway"].update({"tls": True, "port": 443})
    cfg["llm-cluster:gatewayTlsCert"] = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    cfg["llm-cluster:gatewayTlsKey"] = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
    result = run_stack(cfg, {"llm-cluster:gatewayTlsCert", "llm-cluster:gatewayTlsKey"})
    c = result.get("gateway-nginx")
    wire = {u["file"]: u["content"] for u in c.inputs["uploads"]}
    assert is_secret(wire["/etc/nginx/llm-tls/cert.pem"]) and is_secret(wire["/etc/nginx/llm-tls/key.pem"])
    assert uploads(c, reveal=True)["/etc/nginx/llm-tls/key.pem"] == cfg["llm-cluster:gatewayTlsKey"]
    assert "listen 443 ssl;" in uploads(c)["/etc/nginx/nginx.conf"]
    (gw,) = result.by_type(GATEWAY)
    assert gw.plain_inputs()["tls"] is True and gw.outputs["url"] == "https://192.168.10.11:443"
    assert "https://127.0.0.1:443/v1/models" in result.get("gateway-ready").plain_inputs()["create"]


def test_preview_knows_what_the_policies_read(prod_preview_run: ProgramRun) -> None:
    result = prod_preview_run
    (gw,) = result.by_type(GATEWAY)
    assert gw.plain_inputs()["authRequired"] is True and gw.plain_inputs()["apiKeyIds"] == ["default"]
    labels = {label["label"]: label["value"] for label in result.get("gateway-nginx").plain_inputs()["labels"]}
    assert labels["llm-cluster.image"] == "nginx:1.27.5"


def test_without_auth_no_key_is_made_uploaded_mounted_or_exported() -> None:
    cfg = prod_config()
    cfg["llm-cluster:gateway"].update(auth=False, apiKeys=[])
    result = run_stack(cfg)
    (gw,) = result.by_type(GATEWAY)
    props = gw.plain_inputs()
    assert (props["authRequired"], props["apiKeyIds"], props["keySource"]) == (False, [], "none")
    assert sorted(r.name for r in result.registrations if r.parent == gw.urn) == [
        "gateway-exporter", "gateway-nginx", "gateway-ready"]
    c = result.get("gateway-nginx")
    inputs = c.plain_inputs()
    assert inputs["volumes"] == [] and sorted(uploads(c)) == [
        "/etc/nginx/llm/gateway.js", "/etc/nginx/llm/routes.json", "/etc/nginx/nginx.conf"]
    assert "llm_keys" not in uploads(c)["/etc/nginx/nginx.conf"]
    assert "llm-cluster.key-ids" in {label["label"] for label in inputs["labels"]}
    assert inputs["healthcheck"]["tests"][1].endswith("| grep -qx 200")
    assert result.get("gateway-ready").plain_inputs()["create"] == bash_command(
        readiness_script(80, False, 120, "gpu-01", auth=False))
    assert gw.outputs.get("apiKeys") is None and result.stack_outputs.get("gatewayApiKeys") is None


def test_without_auth_a_key_secret_is_refused_by_the_spec() -> None:
    cfg, secrets = with_secret_keys(KEYS)
    cfg["llm-cluster:gateway"].update(auth=False, apiKeys=[])
    with pytest.raises(pulumi.RunError, match=r"gateway.auth: is false but the secret gatewayApiKeys is set"):
        run_stack(cfg, secrets)
