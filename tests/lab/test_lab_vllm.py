"""The lab stack on the REAL vLLM 0.19.1 (Pulumi.lab-vllm.yaml) on real test hosts: a reasoning pool of one
instance TP 2 x PP 2 across gpu-01 and gpu-02 on vLLM's own multi-node launcher (a tiny DeepSeek-V3-shaped
model) and a chat replica on gpu-03 (a tiny Qwen3-MoE), behind the gateway, with monitoring; rehearsed from
nothing, asked through the gateway, destroyed, taken down.

The engines are vLLM 0.19.1 itself (its CPU build, lab/vllm_cpu.py) in the lab's real-engine image
(lab/images.py kind vllm-real; lab/vllm_cpu.py IMAGE_DIFFERENCES), started by the containers the plan
registers, with the argv and env the plan writes. One lab at a time: the module holds /tmp/lab.lock from
bringing the hosts up to taking them down. Figures (up, the first token through the gateway, each server's
/health after up) go to build/lab/figures.json with a `vllm_` prefix; none is asserted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import hosts, vllm_cpu
from lab.config import REPO
from lab.rehearse import CONTAINER
from tests.support.lab_tier import Lab, _lab, client, destroy_checked, docker, http_json, wait_until

WHY_NOT = hosts.can_create_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"the lab does not run: {WHY_NOT}")

STACK = REPO / "Pulumi.lab-vllm.yaml"
GATEWAY = "https://198.18.0.11:443"
PROMETHEUS = "http://198.18.0.11:9090"
# Each served name, the gateway path that reaches its pool, and the engine that answers it (its /metrics).
SERVED = {
    "qwen3-30b-a3b": ("/v1/chat/completions", "http://198.18.0.13:8000"),
    "deepseek-r1": ("/smart/v1/chat/completions", "http://198.18.0.11:8000"),
}
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def lab(figures: dict[str, Any]) -> Iterator[Lab]:
    with hosts.lab_lock():
        yield from _lab(figures, STACK, "vllm_", _destroy_and_check)


def _destroy_and_check(lab: Lab, figures: dict[str, Any]) -> None:
    destroy_checked(lab, figures, "vllm_")
    # Destroy keeps the weights: the tiny models on every node of their pools.
    for node, model in (("gpu-01", "deepseek-v3-tiny"), ("gpu-02", "deepseek-v3-tiny"), ("gpu-03", "qwen3-moe-tiny")):
        assert (lab.host(node).dir / "data" / "models" / model / "model.safetensors").is_file(), (node, model)


# The engines' containers the plan registers, and the host each runs on.
ENGINES = {"vllm-reasoning-gpu-01": "gpu-01", "vllm-worker-reasoning-gpu-01": "gpu-02", "vllm-chat-gpu-03": "gpu-03"}


def planned(lab: Lab, name: str) -> dict[str, Any]:
    """The inputs of the plan's container `name` (the rehearsal's resource)."""
    return next(r.inputs for r in lab.rehearsal.resources.values() if r.type == CONTAINER and r.inputs["name"] == name)


def ask(lab: Lab, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request through the gateway from the client namespace, with the stack's generated key; the raw answer."""
    # A real engine's first answer on two busy cores can take longer than the client's default 30 s.
    answer = client(
        "request",
        f"{GATEWAY}{path}",
        "--key",
        lab.key(),
        "--json",
        json.dumps(body),
        "--cacert",
        lab.cacert(),
        "--timeout",
        "300",
        timeout=330,
    )
    assert answer["status"] == 200, answer
    return answer


def counters(url: str) -> dict[str, float]:
    """The engine's own token counters (summed over its label sets), from its /metrics (this machine is a
    trusted source of the hosts' firewall)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(vllm:(?:prompt|generation)_tokens_total)(?:\{[^}]*\})? (\S+)$", line)
        if m:
            out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def moved(engine: str, before: dict[str, float], usage: dict[str, int]) -> dict[str, float]:
    """How far the engine's token counters moved since `before`, once they count `usage` (its stat loggers
    record an iteration after its outputs go out, so the last tokens may show a moment after the answer)."""

    def delta() -> dict[str, float]:
        now = counters(engine)
        return {k: now[k] - before[k] for k in before}

    wait_until(
        lambda: (
            delta()["vllm:generation_tokens_total"] >= usage["completion_tokens"]
            and delta()["vllm:prompt_tokens_total"] >= usage.get("prompt_tokens", 0)
        ),
        30,
        f"{engine}'s token counters counting {usage}",
    )
    return delta()


def chat(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": name,
        "messages": [{"role": "user", "content": f"Say something about {name}."}],
        "max_tokens": MAX_TOKENS,
        **extra,
    }


# --- up ---------------------------------------------------------------------------------------------


def test_up_creates_every_resource_without_a_gate(lab: Lab, figures: dict[str, Any]) -> None:
    created = {s.name for s in lab.steps if s.action == "create"}
    assert created == {r.name for r in lab.rehearsal.resources.values() if r.custom}
    # qualificationGate: false on both pools (a CPU cannot pass the GPU gate): no gate step at all.
    assert [s.name for s in lab.steps if "-qualify-" in s.name] == []
    # The first token through the gateway after `up` returned (up itself: vllm_time_to_up_s).
    t0 = time.monotonic()
    ask(lab, SERVED["deepseek-r1"][0], chat("deepseek-r1", max_tokens=1))
    figures["vllm_first_token_after_up_s"] = round(time.monotonic() - t0, 1)
    figures["vllm_up_to_first_token_s"] = round(
        figures["vllm_time_to_up_s"] + figures["vllm_first_token_after_up_s"], 1
    )
    # Each server's readiness gate: from its container's start to /health (the gate's own wait).
    for s in lab.steps:
        if s.name in ("reasoning-gpu-01-health", "chat-gpu-03-health"):
            figures[f"vllm_{s.name}_s"] = round(s.seconds, 1)


def test_the_tiny_models_are_where_the_stack_says_fanned_out_byte_equal(lab: Lab) -> None:
    for node, model in (("gpu-01", "deepseek-v3-tiny"), ("gpu-02", "deepseek-v3-tiny"), ("gpu-03", "qwen3-moe-tiny")):
        made = vllm_cpu.CACHE / "models" / model
        copy = lab.host(node).dir / "data" / "models" / model
        for name in ("model.safetensors", "config.json", "tokenizer.json"):
            assert (
                hashlib.sha256((copy / name).read_bytes()).digest()
                == hashlib.sha256((made / name).read_bytes()).digest()
            ), (node, model, name)


def test_each_engine_container_runs_the_plans_argv_in_the_real_engine_image(lab: Lab) -> None:
    for name, node in ENGINES.items():
        host, inputs = lab.host(node), planned(lab, name)
        info = json.loads(docker(host, "inspect", name))[0]
        # The container is what the plan registered: entrypoint (the watchdog), command (`vllm serve …`), env.
        assert info["Config"]["Entrypoint"] == inputs["entrypoints"], name
        assert info["Config"]["Cmd"] == inputs["command"] and inputs["command"][:2] == ["vllm", "serve"], name
        assert set(inputs["envs"]) <= set(info["Config"]["Env"]), name
        # ... of the real-engine image, with the one bind the lab adds (IMAGE_DIFFERENCES: site-packages).
        image = json.loads(docker(host, "image", "inspect", info["Image"]))[0]["Config"]
        assert vllm_cpu.REAL_ENGINE_LABEL in image["Labels"], name
        assert (image["Entrypoint"], image["WorkingDir"]) == (["vllm", "serve"], "/vllm-workspace"), name
        planned_binds = [
            f"{v['hostPath']}:{v['containerPath']}" for v in inputs.get("volumes") or [] if "hostPath" in v
        ]
        added = [b for b in info["HostConfig"]["Binds"] if not any(b.startswith(p) for p in planned_binds)]
        assert added == vllm_cpu.image_binds(), name
        # The engine process inside runs exactly the plan's `vllm serve …` words (the watchdog execs them).
        # (/proc of the container's processes: docker top cuts long command lines; the hosts share this PID space)
        pids = [int(line.split()[0]) for line in docker(host, "top", name, "-eo", "pid").splitlines()[1:]]
        argvs = []
        for pid in pids:
            with contextlib.suppress(OSError):
                argvs.append([a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]])
        assert ["/usr/bin/python3", "/usr/local/bin/vllm", *inputs["command"][1:]] in argvs, (name, argvs)
        version = docker(host, "exec", name, "python3", "-c", "import vllm; print(vllm.__version__)")
        assert version.strip() == "0.19.1", name


# --- the gateway, answered by vLLM ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SERVED))
def test_a_chat_completion_through_the_gateway_is_generated_by_vllm(lab: Lab, name: str) -> None:
    path, engine = SERVED[name]
    before = counters(engine)
    answer = ask(lab, path, chat(name))
    body = json.loads(answer["body"])
    # The engine's own counters moved by exactly the usage the answer carries: vLLM generated these tokens.
    usage = body["usage"]
    assert moved(engine, before, usage) == {
        "vllm:prompt_tokens_total": usage["prompt_tokens"],
        "vllm:generation_tokens_total": usage["completion_tokens"],
    }
    assert (
        0 < usage["completion_tokens"] <= MAX_TOKENS
        and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    )
    assert body["model"] == name and body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.parametrize("name", list(SERVED))
def test_a_streamed_chat_through_the_gateway_ends_with_vllms_usage(lab: Lab, name: str) -> None:
    path, engine = SERVED[name]
    before = counters(engine)
    answer = ask(lab, path, chat(name, stream=True, stream_options={"include_usage": True}))
    events = [line[6:] for line in answer["body"].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["model"] for c in chunks} == {name}
    usage = chunks[-1]["usage"]
    assert moved(engine, before, usage) == {
        "vllm:prompt_tokens_total": usage["prompt_tokens"],
        "vllm:generation_tokens_total": usage["completion_tokens"],
    }
    assert 0 < usage["completion_tokens"] <= MAX_TOKENS


def test_the_gateways_usage_log_counts_what_vllm_reported(lab: Lab) -> None:
    answers = {name: json.loads(ask(lab, SERVED[name][0], chat(name))["body"])["usage"] for name in SERVED}

    def logged() -> list[dict[str, Any]]:
        out = docker(lab.host("gpu-01"), "exec", "llm-gateway", "sh", "-c", "cat /var/log/llm-gateway/usage-*.log")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    wait_until(lambda: len(logged()) >= 2, 30, "the gateway's usage lines")
    last = {}
    for line in logged():
        last[line["model"]] = line
    for name, usage in answers.items():
        line = last[name]
        assert (line["prompt_tokens"], line["completion_tokens"], line["total_tokens"]) == (
            usage["prompt_tokens"],
            usage["completion_tokens"],
            usage["total_tokens"],
        ), (name, line)
        assert line["status"] == 200 and line["key_id"] == "default"


def test_the_gateway_refuses_a_request_without_a_key(lab: Lab) -> None:
    body = json.dumps(chat("qwen3-30b-a3b"))
    assert (
        client("request", f"{GATEWAY}/v1/chat/completions", "--json", body, "--cacert", lab.cacert())["status"] == 401
    )


# --- monitoring ---------------------------------------------------------------------------------------


def test_prometheus_scrapes_vllms_own_series_from_both_pools(lab: Lab) -> None:
    def all_up() -> bool:
        targets = http_json(f"{PROMETHEUS}/api/v1/targets")["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    wait_until(all_up, 120, "every Prometheus target up")
    up = http_json(f"{PROMETHEUS}/api/v1/query?query=up")["data"]["result"]
    pools = sorted(r["metric"].get("pool", "") for r in up if r["metric"]["job"] == "vllm")
    assert pools == ["chat", "reasoning"], up
    # A series only the real engine exports at run time (the stand-in served a fixture list of names).
    wait_until(
        lambda: len(http_json(f"{PROMETHEUS}/api/v1/query?query=vllm:generation_tokens_total")["data"]["result"]) >= 2,
        60,
        "vllm:generation_tokens_total from both pools",
    )


def test_a_second_up_runs_nothing(lab: Lab) -> None:
    from lab.rehearse import Rehearsal

    again = Rehearsal(lab.stack.path, lab.stack.name, lab.agent, log=lambda line: None)
    assert [s.name for s in again.up() if s.action != "same"] == []
