"""Smoke test in `up`: the plan (served names, keys), the script against a real loopback OpenAI server
(good answers, retried 502s, empty answers, missing usage, a wrong key), and its wiring under mocks."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.planning.smoke import key_for, smoke_plan, smoke_script
from components.spec import StackSpec
from plan.harness import ProgramRun
from tests.support import tool
from tests.support.fake_openai import Behaviour, FakeOpenAI, serving

NS = "llm-cluster:"
NAMES = ["deepseek-r1", "/data/models/DeepSeek-R1-GPTQ-Int4", "qwen3-30b-a3b", "/data/models/Qwen3-30B-A3B"]


def test_one_check_per_served_name_with_the_generated_key(prod_spec: StackSpec) -> None:
    plan = smoke_plan(prod_spec, "http://192.168.10.11:80")
    assert [(c["model"], c["pool"], c["key_id"]) for c in plan["checks"]] == [  # type: ignore[attr-defined]
        ("deepseek-r1", "reasoning", "default"),
        ("/data/models/DeepSeek-R1-GPTQ-Int4", "reasoning", "default"),
        ("qwen3-30b-a3b", "chat", "default"),
        ("/data/models/Qwen3-30B-A3B", "chat", "default"),
    ]
    assert plan["retry_seconds"] == 60 and plan["timeout_seconds"] == 120
    assert plan["checks"][2]["hint"] == (  # type: ignore[index]
        "docker logs llm-gateway on gpu-01 (the usage line names the upstream); docker logs vllm-chat-gpu-03 on "
        "gpu-03; docker logs vllm-chat-gpu-04 on gpu-04; docker logs vllm-chat-gpu-05 on gpu-05; docker logs "
        "vllm-chat-gpu-06 on gpu-06"
    )


def test_each_name_gets_a_key_allowed_to_use_it(config: dict[str, Any]) -> None:
    config[NS + "gateway"]["apiKeys"] = [
        {"id": "chat-only", "models": ["qwen3-30b-a3b"]},
        {"id": "smart", "models": ["reasoning"]},
    ]
    spec = load_stack_config(config, set())
    assert key_for(spec, "qwen3-30b-a3b", "chat") == "chat-only"
    assert key_for(spec, "deepseek-r1", "reasoning") == "smart"
    plan = smoke_plan(spec, "http://x")
    skipped = {c["model"]: c.get("skip") for c in plan["checks"]}  # type: ignore[attr-defined]
    assert skipped["/data/models/Qwen3-30B-A3B"] == "no key in gateway.apiKeys may use it"
    assert skipped["qwen3-30b-a3b"] is None
    config[NS + "gateway"].update(auth=False, apiKeys=[])
    config[NS + "gateway"].pop("defaultRateLimit", None)
    assert key_for(load_stack_config(config, set()), "qwen3-30b-a3b", "chat") is None


def run_smoke(
    spec: StackSpec, url: str, keys: dict[str, str], retry: int | None = None
) -> subprocess.CompletedProcess[str]:
    script = smoke_script(spec, url)
    if retry is not None:
        script = script.replace('"retry_seconds": 60', f'"retry_seconds": {retry}')
    return subprocess.run(
        [tool("bash"), "-c", script], input=json.dumps(keys), capture_output=True, text=True, timeout=120
    )


def test_every_served_name_answers_through_a_real_server_with_the_key(prod_spec: StackSpec) -> None:
    state = FakeOpenAI(keys={"sk-deploy"}, models={n: Behaviour() for n in NAMES})
    with serving(state):
        done = run_smoke(prod_spec, state.url, {"default": "sk-deploy"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"smoke {n} (pool {p}): 5 completion token(s): 'Hello! How can I help?'"
        for n, p in zip(NAMES, ["reasoning", "reasoning", "chat", "chat"])
    ] + ["smoke test: 4/4 served name(s) answered"]
    # What went over the wire: the README's curl, in Python (JSON body, Content-Type, bearer key).
    first = state.requests[0]
    assert first["path"] == "/v1/chat/completions" and first["authorization"] == "Bearer sk-deploy"
    assert first["body"] == {
        "model": "deepseek-r1",
        "max_tokens": 16,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Say hello."}],
    }
    # The key came on stdin: the script itself holds none.
    assert "sk-deploy" not in smoke_script(prod_spec, state.url)


def test_over_https_with_the_gateways_own_certificate(prod_spec: StackSpec, tmp_path: Any) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            tool("openssl"),
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=gateway",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    state = FakeOpenAI(keys={"sk-deploy"}, models={n: Behaviour() for n in NAMES})
    with serving(state, tls=(str(cert), str(key))):
        done = run_smoke(prod_spec, state.url.replace("http:", "https:"), {"default": "sk-deploy"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "smoke test: 4/4 served name(s) answered"


def test_a_replica_still_held_out_by_nginx_is_retried(prod_spec: StackSpec) -> None:
    state = FakeOpenAI(models={n: Behaviour() for n in NAMES})
    state.models["qwen3-30b-a3b"] = Behaviour(fail_first=2, fail_status=502)
    with serving(state):
        done = run_smoke(prod_spec, state.url, {"default": "k"})
    assert done.returncode == 0, done.stderr
    assert state.models["qwen3-30b-a3b"].seen == 3


@pytest.mark.parametrize(
    ("behaviour", "seen"),
    [
        (Behaviour(reply=""), "HTTP 200 with an empty completion"),
        (Behaviour(usage=False), "HTTP 200 without usage.completion_tokens"),
        (Behaviour(fail_first=99, fail_status=500), 'HTTP 500: {"error": {"message": "upstream failed"}}'),
        (Behaviour(fail_first=99, fail_status=502), 'HTTP 502: {"error": {"message": "upstream failed"}}'),
    ],
)
def test_a_bad_answer_fails_the_deploy_naming_model_pool_and_status(
    prod_spec: StackSpec, behaviour: Behaviour, seen: str
) -> None:
    state = FakeOpenAI(models={n: Behaviour() for n in NAMES})
    state.models["/data/models/Qwen3-30B-A3B"] = behaviour
    with serving(state):
        done = run_smoke(prod_spec, state.url, {"default": "k"}, retry=3)
    assert done.returncode == 1
    [error] = done.stderr.splitlines()
    assert error.startswith(
        f"ERROR: smoke test: model '/data/models/Qwen3-30B-A3B' (pool chat) through "
        f"{state.url}: {seen}; check: docker logs llm-gateway on gpu-01"
    )
    assert done.stdout.splitlines()[-1] == "smoke test: 3/4 served name(s) answered"


def test_a_wrong_key_and_no_gateway_are_reported(prod_spec: StackSpec) -> None:
    state = FakeOpenAI(keys={"sk-right"}, models={n: Behaviour() for n in NAMES})
    with serving(state):
        wrong = run_smoke(prod_spec, state.url, {"default": "sk-wrong"})
        url = state.url
    assert wrong.returncode == 1 and "HTTP 401: " in wrong.stderr
    missing = run_smoke(prod_spec, state.url, {})
    assert "the deploy-time key 'default' is not in the gateway's keys" in missing.stderr
    gone = run_smoke(prod_spec, url, {"default": "sk-right"}, retry=2)
    assert gone.returncode == 1 and "HTTP unreachable: " in gone.stderr


def test_the_script_is_shellcheck_clean(prod_spec: StackSpec, tmp_path: Any) -> None:
    (tmp_path / "s.sh").write_text(smoke_script(prod_spec, "http://192.168.10.11:80"))
    subprocess.run([tool("shellcheck"), "-s", "bash", str(tmp_path / "s.sh")], check=True)


def test_smoke_runs_last_on_the_gateway_node_with_the_keys_as_secret_stdin(prod_run: ProgramRun) -> None:
    smoke = prod_run.get("smoke-run")
    gates = {r.urn for r in prod_run.registrations if r.name.endswith("-health")}
    assert len(gates) == 5
    # Plus what its inputs come from (the keys command, the gateway container).
    assert gates | {prod_run.get("gateway-ready").urn} <= set(smoke.dependencies)
    inputs = smoke.plain_inputs()
    assert inputs["connection"]["host"] == "192.168.10.11"
    # TLS by default: HTTPS on 443 (the client trusts the gateway's own certificate, reached by address).
    assert "through the gateway at https://192.168.10.11:443" in inputs["create"]
    assert smoke.inputs["stdin"] != inputs["stdin"]  # wrapped as a secret
    assert prod_run.get("smoke").parent.endswith("pulumi:pulumi:Stack::llm-cluster-prod")


def test_smoke_test_can_be_switched_off(config: dict[str, Any], stack_runner: Any) -> None:
    config[NS + "gateway"]["smokeTest"] = False
    assert not [r for r in stack_runner(config).registrations if r.name.startswith("smoke")]
