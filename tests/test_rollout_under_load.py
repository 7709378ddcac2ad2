"""`make rollout`'s sequencing under client load, on the real nginx gateway: no request lost.

No Pulumi and no vLLM here: the stack the rollout drives is a stand-in whose `up` replaces the
targeted instance's fake replica (killed like a removed container, a new one listening on the same
port after a load delay), as `pulumi up --target` replaces its container. The gateway is the
generated config on real nginx; clients keep sending chat completions through it the whole time.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from components.planning.load import load_stack_config
from components.planning.smoke import retry_seconds
from ops import rollout
from plan.harness import ProgramRun
from tests.support.gateway import CHAT, WAIT, FakeReplica, NginxGateway, _Server, gateway_config, own_gateway

LOAD_DELAY_S = 0.5  # the new server's "weights loading": nothing listens meanwhile
CLIENTS = 8
CLIENT_PAUSE_S = 0.02  # 8 clients at most 400 requests/s: below the key's 1000/s limit
NAMES = ["chat-gpu-03", "chat-gpu-04", "chat-gpu-05", "chat-gpu-06"]


def restart(replica: FakeReplica) -> None:
    """A new server on the replica's port, as a replaced container comes back on its host port."""
    replica.killed = False
    replica.server = _Server(("127.0.0.1", replica.port), replica._handler())
    threading.Thread(target=replica.server.serve_forever, daemon=True).start()


class ReplacingStack:
    """Stands in for the Automation API stack: `up(target=…)` replaces the targeted instance's replica."""

    def __init__(
        self, replicas: dict[str, FakeReplica], gw: NginxGateway, keys: dict[str, str], mid_stream: bool = False
    ):
        self.replicas, self.ups = replicas, []
        self.mid_stream = mid_stream
        """Stop a replica only once it is sending a stream (what a container stop meets under streaming load)."""
        self.cut: dict[str, int] = {}
        """Instance -> the streams its replica was sending when it was stopped."""
        self.outputs = {"gatewayUrl": f"http://127.0.0.1:{gw.port}", "gatewayApiKeys": json.dumps(keys)}

    def up(self, target: list[str], **_: Any) -> ReplacingStack:
        names = [n for n in self.replicas if any(u.endswith(f"::{n}-vllm") for u in target)]
        self.ups.append(names)
        for name in names:
            replica = self.replicas[name]
            deadline = time.monotonic() + WAIT
            while self.mid_stream and not replica.streaming and time.monotonic() < deadline:
                time.sleep(0.005)
            self.cut[name] = replica.streaming
            replica.kill()
        time.sleep(LOAD_DELAY_S)
        for name in names:
            restart(self.replicas[name])
        return self


def roll_under_load(
    tmp_path: Path,
    run: ProgramRun,
    fail_timeout_s: int,
    wait_out: bool,
    routing: str = "prefix",
) -> tuple[int, list[str], Counter[int], ReplacingStack, dict[str, FakeReplica]]:
    """Roll the chat pool of a loopback gateway while clients send chat completions through it.

    `wait_out`: the rollout's own waits (settle after each step, the gateway check's retries), or none.
    A client whose request got no answer at all counts it as status 0 (lost).
    """
    spec = load_stack_config(gateway_config(failTimeoutSeconds=fail_timeout_s, routing={"policy": routing}), set())
    chat = {n: FakeReplica(n) for n in NAMES}
    steps = rollout.rollout_steps(run, spec, "chat", 1)
    statuses: Counter[int] = Counter()
    said: list[str] = []
    done = threading.Event()
    with own_gateway(spec, {"chat": list(chat.values()), "reasoning": [FakeReplica("r")]}, tmp_path) as (gw, keys):

        def client() -> None:
            while not done.is_set():
                try:
                    status, _, _ = gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])
                except OSError:  # the gateway closed or reset the connection without an answer
                    status = 0
                statuses[status] += 1
                time.sleep(CLIENT_PAUSE_S)

        clients = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for c in clients:
            c.start()
        stack = ReplacingStack(chat, gw, keys)
        try:
            code = rollout.rollout(
                stack,
                steps,
                CHAT,
                policy_pack=None,
                say=said.append,
                settle_s=rollout.settle_seconds(spec) if wait_out else 0,
                gateway_wait_s=retry_seconds(spec) if wait_out else 0,
            )
        finally:
            done.set()
            for c in clients:
                c.join(30)
    return code, said, statuses, stack, chat


def test_rolling_the_chat_pool_under_load_loses_no_request(tmp_path: Path, prod_preview_run: ProgramRun) -> None:
    # nginx shuns a replica that failed for failTimeoutSeconds: the rollout waits that long per step.
    code, said, statuses, stack, chat = roll_under_load(tmp_path, prod_preview_run, 1, True)
    assert code == rollout.EXIT_OK, "\n".join(said[-4:])
    assert stack.ups == [[n] for n in NAMES]  # one instance per step, in pool order
    assert sum(statuses.values()) > 50 and set(statuses) == {200}, statuses
    # Every replica served again after its replacement (the gateway check's requests included).
    assert all(r.requests for r in chat.values())
    assert (
        "    chat-gpu-03: healthy; 2 s for the gateway to take it back (failTimeoutSeconds, in nginx's "
        "whole seconds)" in said
    )


def test_without_waiting_out_the_gateway_the_pool_runs_out_of_replicas(
    tmp_path: Path, prod_preview_run: ProgramRun
) -> None:
    # Replaced faster than nginx forgives them (30 s), the replicas are all shunned by the last step: nginx's
    # own passive health (least_conn) answers 502 with every server down. (A pool routed by prefix affinity
    # skips an ejected replica only while another is left, so it keeps answering; the rollout waits all the
    # same, the capacity is gone either way.)
    code, said, statuses, _, _ = roll_under_load(tmp_path, prod_preview_run, 30, False, routing="least_conn")
    assert code == rollout.EXIT_FAILED
    assert any("the gateway check failed" in line and "answered 502" in line for line in said), said[-3:]
    assert statuses[502] > 0


def stream(gw: NginxGateway, key: str, body: dict[str, Any]) -> str:
    """One streamed chat completion read to its end: "whole" ([DONE] and the chunked end), "cut" (the answer
    began, then stopped), "lost" (no answer at all), or its status."""
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        try:
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException):
            return "lost"
        try:
            text = resp.read().decode()
        except (OSError, http.client.HTTPException):
            return "cut"
        if resp.status != 200:
            return str(resp.status)
        return "whole" if text.endswith("data: [DONE]\n\n") else "cut"
    finally:
        conn.close()


def roll_streaming(
    tmp_path: Path, run: ProgramRun, drained: bool
) -> tuple[int, list[str], Counter[str], ReplacingStack]:
    """Roll the chat pool (prefix affinity) while clients stream chat completions through the gateway, each a
    few events apart; with `drained`, the rollout drains each step at the gateway first."""
    spec = load_stack_config(gateway_config(failTimeoutSeconds=1), set())
    chat = {n: FakeReplica(n) for n in NAMES}
    steps = rollout.rollout_steps(run, spec, "chat", 1)
    outcomes: Counter[str] = Counter()
    said: list[str] = []
    done = threading.Event()
    with own_gateway(spec, {"chat": list(chat.values()), "reasoning": [FakeReplica("r")]}, tmp_path) as (gw, keys):

        def client(n: int) -> None:
            turn = 0
            while not done.is_set():
                turn += 1
                # Conversations keyed by their first question, and one client without a key (least busy).
                messages = [{"role": "user", "content": f"client {n} conversation {turn % 5}"}] if n else None
                body = {"model": CHAT, "stream": True, "pace": 0.05, **({"messages": messages} if messages else {})}
                outcomes[stream(gw, keys["default"], body)] += 1

        clients = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for c in clients:
            c.start()
        # Without a drain the stand-in stops each replica while it streams: what `docker stop` meets today.
        stack = ReplacingStack(chat, gw, keys, mid_stream=not drained)
        drain = rollout.Drain(
            f"http://127.0.0.1:{gw.metrics_port}/admin/drain",
            "chat",
            {n: r.addr for n, r in chat.items()},
            timeout_s=WAIT,
            poll_s=0.02,
        )
        try:
            code = rollout.rollout(
                stack,
                steps,
                CHAT,
                policy_pack=None,
                say=said.append,
                settle_s=rollout.settle_seconds(spec),
                gateway_wait_s=retry_seconds(spec),
                drain=drain if drained else None,
            )
        finally:
            done.set()
            for c in clients:
                c.join(30)
    return code, said, outcomes, stack


def test_a_drained_rollout_under_streaming_load_cuts_no_stream(tmp_path: Path, prod_preview_run: ProgramRun) -> None:
    code, said, outcomes, stack = roll_streaming(tmp_path, prod_preview_run, drained=True)
    assert code == rollout.EXIT_OK, "\n".join(said[-4:])
    assert stack.ups == [[n] for n in NAMES]
    # Each replica was sending nothing when it stopped: the drain waited for its streams to end.
    assert stack.cut == dict.fromkeys(NAMES, 0)
    assert outcomes["whole"] > 50 and set(outcomes) == {"whole"}, outcomes
    for name in NAMES:
        assert any(line.startswith(f"    {name}: drained at the gateway, nothing in flight after ") for line in said)
        assert f"    {name}: back in rotation at the gateway" in said


def test_without_a_drain_stopping_a_replica_cuts_the_streams_it_sends(
    tmp_path: Path, prod_preview_run: ProgramRun
) -> None:
    # Today's rollout on the same load: each replica is stopped while it streams, and those streams are cut
    # (nginx cannot retry an answer it has begun to send).
    code, said, outcomes, stack = roll_streaming(tmp_path, prod_preview_run, drained=False)
    assert code == rollout.EXIT_OK, "\n".join(said[-4:])
    assert all(stack.cut[n] >= 1 for n in NAMES), stack.cut
    assert outcomes["cut"] >= 1 and outcomes["whole"] > 50, outcomes
