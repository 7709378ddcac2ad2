"""The real vLLM 0.19.1 (CPU build) serving one instance of the reference reasoning pool across two hosts on
vLLM's own multi-node launcher: TP 2 x PP 2, the tiny DeepSeek-V3-shaped model, one `vllm serve` per host
(the head's serving the API, the other `--headless`), each host a network namespace whose only links are
`lo` and a veth named bond0 to the other. Pipeline parallelism across hosts needs lab/'s two declared
patches to the installed vLLM (PATCHES; lab/README.md writes them up).

Asserted: the hosts reach nothing beyond their link; each host runs exactly the launcher argv the lab
writes for the node (the engine's node_argv of the native-launcher example stack) but for
MULTI_NODE_DIFFERENCES; both patches applied; the
engine's ranks are laid out PP stage per host; a chat completion and a streamed one answer through the
head. Printed (never asserted): time to /health, resident memory per host, a request's time.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from lab import vllm_cpu

WHY_NOT = vllm_cpu.can_run()
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"the real vLLM does not run here: {WHY_NOT}")

KIND = "deepseek-v3-tiny"
PORT = 8000


def _value(argv: list[str], flag: str) -> str | None:
    """The flag's value; "" for a switch (--headless, --enforce-eager); None when absent."""
    if flag not in argv:
        return None
    i = argv.index(flag) + 1
    return argv[i] if i < len(argv) and not argv[i].startswith("--") else ""


@pytest.fixture(scope="module")
def across(figures: dict) -> Iterator[tuple[vllm_cpu.LinkedHosts, list[vllm_cpu.Server]]]:
    if WHY_NOT is not None:
        pytest.skip(f"the real vLLM does not run here: {WHY_NOT}")
    vllm_cpu.engine()
    hosts = vllm_cpu.LinkedHosts("test-mn", ("gpu-01", "gpu-02")).create()
    servers: list[vllm_cpu.Server] = []
    try:
        servers = vllm_cpu.serve_across(hosts, KIND, PORT)
        health = servers[0].wait_healthy(600)
        assert servers[1].proc is not None and servers[1].proc.poll() is None, servers[1].tail()
        figures["vllm-cpu TP2xPP2 across two hosts: time to /health (s)"] = round(health, 1)
        figures["vllm-cpu TP2xPP2 across two hosts: resident memory per host (GiB)"] = [
            round(s.rss_bytes() / 2**30, 2) for s in servers
        ]
        print(f"\nTP 2 x PP 2 across two hosts: /health after {health:.1f} s")
        yield hosts, servers
        for s in servers:
            s.stop()
        assert not any(s.pids() for s in servers)
    finally:
        for s in servers:
            s.stop()
        hosts.delete()


@needs_namespaces
def test_the_hosts_reach_only_each_other(across) -> None:  # type: ignore[no-untyped-def]
    hosts, servers = across
    for ns, server in zip(hosts.namespaces(), servers, strict=True):
        assert sorted(link.split("@")[0] for link in ns.links()) == ["bond0", "lo"]
        assert server.pids() and all(p in ns.pids() for p in server.pids())
    assert hosts.outside_routes() == []


@needs_namespaces
def test_each_host_runs_the_plans_node_argv_but_for_the_declared_differences(across) -> None:  # type: ignore[no-untyped-def]
    from components.engines.registry import engine_for
    from components.spec.topology import instances

    _, servers = across
    spec = vllm_cpu.native_reference()
    inst = instances(spec, "reasoning")[0]
    engine = engine_for(spec.pools["reasoning"])
    declared = vllm_cpu.MULTI_NODE_DIFFERENCES
    for rank, server in enumerate(servers):
        planned = engine.node_argv(spec, inst, inst.nodes[rank])
        planned_env = engine.serve_env(spec, inst, inst.nodes[rank])
        assert ("--headless" in planned) == (rank > 0)
        cmdline = open(f"/proc/{server.proc.pid}/cmdline", "rb").read().split(b"\0")  # type: ignore[union-attr]
        assert [a.decode() for a in cmdline if a][-len(server.argv) + 1 :] == server.argv[1:]
        argv = server.argv
        assert {a for a in planned if a.startswith("--")} - {a for a in argv if a.startswith("--")} == {
            "--quantization"
        }
        # --host and --master-addr: the head's address as the plan writes them on every node (a headless node
        # serves no API); VLLM_HOST_IP: each node's own
        head = f"{vllm_cpu.LINK_NET}.11"
        assert (_value(argv, "--host"), _value(argv, "--master-addr")) == (head, head)
        assert server.env["VLLM_HOST_IP"] == f"{vllm_cpu.LINK_NET}.{11 + rank}"
        assert (_value(argv, "--tensor-parallel-size"), _value(argv, "--pipeline-parallel-size")) == ("2", "2")
        for flag in {a for a in planned if a.startswith("--")} & {a for a in argv if a.startswith("--")}:
            if _value(planned, flag) != _value(argv, flag) and flag not in ("--host", "--master-addr"):
                assert any(flag in k for k in declared), f"{flag} differs from the launcher argv undeclared"
        # The plan's env as written (bond0 exists on the lab hosts) but the declared additions and addresses.
        changed = {k for k in planned_env.keys() | server.env.keys() if planned_env.get(k) != server.env.get(k)}
        assert changed == {"VLLM_HOST_IP", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"}
        assert server.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1|0|1" and server.env["VLLM_MLA_DISABLE"] == "1"
    assert "--headless" in servers[1].argv and "--headless" not in servers[0].argv


@needs_namespaces
def test_the_declared_patches_are_applied(across) -> None:  # type: ignore[no-untyped-def]
    assert vllm_cpu.patches_applied() == {name: True for name in vllm_cpu.PATCHES}


@needs_namespaces
def test_a_pipeline_stage_per_host(across) -> None:  # type: ignore[no-untyped-def]
    _, (head, other) = across
    head_log, other_log = head.log.read_text(errors="replace"), other.log.read_text(errors="replace")
    # each host's first local rank logs its place; its workers log under their stage and TP rank
    assert "rank 0 in world size 4 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0" in head_log
    assert "rank 2 in world size 4 is assigned as DP rank 0, PP rank 1, PCP rank 0, TP rank 0" in other_log
    for tp in (0, 1):
        assert f"(Worker_PP0_TP{tp} pid=" in head_log and f"(Worker_PP0_TP{tp} pid=" not in other_log
        assert f"(Worker_PP1_TP{tp} pid=" in other_log and f"(Worker_PP1_TP{tp} pid=" not in head_log
    # the pipeline group spans the hosts: no shared memory between them, torch.distributed instead
    assert "CPU SHM communicator disabled for group pp" in other_log


@needs_namespaces
def test_a_chat_completion_through_both_stages(across, figures: dict) -> None:  # type: ignore[no-untyped-def]
    _, (head, _other) = across
    served = vllm_cpu.served_name("reasoning")
    body = {"model": served, "messages": [{"role": "user", "content": "Think."}], "max_tokens": 8, "ignore_eos": True}
    t = time.monotonic()
    status, data = vllm_cpu.request(head.ns, PORT, "POST", "/v1/chat/completions", body, host=head.host)
    figures["vllm-cpu TP2xPP2 across two hosts: first chat completion, 8 tokens (s)"] = round(time.monotonic() - t, 1)
    assert status == 200, data[:2000]
    r = json.loads(data)
    assert r["model"] == served and r["usage"]["completion_tokens"] == 8
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    status, data = vllm_cpu.request(head.ns, PORT, "POST", "/v1/chat/completions", stream, host=head.host)
    assert status == 200
    events = [line[len("data: ") :] for line in data.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 8
