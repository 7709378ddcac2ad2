"""The gateway on real nginx when replicas misbehave: idle connections closed by the engine's server,
replicas that fail fast, replicas killed under load. Loopback only, every loop bounded.

The keep-alive race is run against a real uvicorn (vLLM's HTTP server) with its default 5 s idle
timeout; the rest against the fake replicas of tests/support/gateway.py.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from components.planning.load import load_stack_config
from tests.support import free_port
from tests.support.gateway import (
    CHAT,
    WAIT,
    FakeReplica,
    NginxGateway,
    _post,
    gateway_config,
    own_gateway,
)

FIXTURES = Path(__file__).parent / "fixtures" / "asgi"


@dataclass
class Uvicorn:
    """A real uvicorn serving the OpenAI-shaped fixture app; `port` is all NginxGateway needs."""

    port: int
    proc: subprocess.Popen[bytes]

    def kill(self) -> None:
        """Stop it (own_gateway stops every upstream it was given)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(WAIT)


@pytest.fixture
def uvicorn_server() -> Iterator[Uvicorn]:
    port = free_port()
    # No --timeout-keep-alive: uvicorn's default (5 s), which is vLLM's (VLLM_HTTP_TIMEOUT_KEEP_ALIVE).
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "openai_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ],
        cwd=FIXTURES,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + WAIT
    while True:
        if proc.poll() is not None:
            pytest.fail(f"uvicorn exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail("uvicorn did not listen")
            time.sleep(0.05)
    server = Uvicorn(port, proc)
    yield server
    server.kill()


def test_idle_connections_closed_by_uvicorn_never_fail_a_request(uvicorn_server: Uvicorn, tmp_path: Path) -> None:
    # One replica, so every request rides the same pool of kept-alive connections.
    spec = load_stack_config(gateway_config(), set())
    pools: dict[str, list[Any]] = {"chat": [uvicorn_server], "reasoning": [FakeReplica("r")]}
    with own_gateway(spec, pools, tmp_path) as (gw, keys):
        key = keys["default"]

        def call(body: dict[str, Any]) -> int:
            return gw.call("POST", "/v1/chat/completions", {"model": CHAT, **body}, key)[0]

        statuses: list[int] = []
        with ThreadPoolExecutor(32) as pool:
            for _ in range(3):
                # 16 connections, then silence until uvicorn closes them (5 s after its answers).
                statuses += pool.map(lambda i: call({}), range(16))
                time.sleep(4.95)
                # A request that keeps uvicorn's loop busy across that moment, and 24 requests that
                # arrive meanwhile on the idle connections nginx still holds.
                busy = pool.submit(call, {"busy": 20})
                time.sleep(0.03)
                statuses += pool.map(lambda i: (time.sleep(i * 0.004), call({}))[1], range(24))
                statuses.append(busy.result())
        assert Counter(statuses) == {200: 3 * (16 + 24 + 1)}


def test_request_on_a_connection_the_replica_closed_is_retried_on_a_fresh_one(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    replica = FakeReplica("only")
    replica.close_reused = True
    with own_gateway(spec, {"chat": [replica], "reasoning": [FakeReplica("r")]}, tmp_path) as (gw, keys):
        results = [
            gw.call("POST", "/v1/chat/completions", {"model": CHAT, "rid": f"n{i}"}, keys["default"]) for i in range(10)
        ]
        assert [status for status, _, _ in results] == [200] * 10
        # Reused connections were reset before anything was read, and each request got through once.
        assert replica.resets >= 4
        assert replica.rids() == [f"n{i}" for i in range(10)]


@pytest.mark.parametrize("failing", [500, 503])
def test_a_fast_failing_replica_is_ejected_and_its_requests_served_elsewhere(failing: int, tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    chat = [FakeReplica("bad"), FakeReplica("good-1"), FakeReplica("good-2")]
    chat[0].fail_status = failing
    with own_gateway(spec, {"chat": chat, "reasoning": [FakeReplica("r")]}, tmp_path) as (gw, keys):
        results = [
            gw.call("POST", "/v1/chat/completions", {"model": CHAT, "rid": f"f{i}"}, keys["default"]) for i in range(30)
        ]
        assert [status for status, _, _ in results] == [200] * 30
        assert {out["served_by"] for _, _, out in results} == {"good-1", "good-2"}
        # maxFails (2) answers counted as failures take it out for failTimeoutSeconds (30 s).
        assert len(chat[0].requests) == 2
        log = gw.log(at_least=30)
        assert sum(line["upstream_status"].startswith(f"{failing}, ") for line in log) == 2


def test_a_pool_whose_only_replica_fails_passes_its_answer_on(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    only = FakeReplica("only")
    only.fail_status = 500
    with own_gateway(spec, {"chat": [only], "reasoning": [FakeReplica("r")]}, tmp_path) as (gw, keys):
        status, _, out = gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])
        # No other replica to try: the engine's own error reaches the client, tried at most MAX_TRIES times.
        assert (status, out["served_by"]) == (500, "only")
        assert 1 <= len(only.requests) <= 3


def _kill_under_load(gw: NginxGateway, key: str, chat: list[FakeReplica], run: int, n: int) -> list[tuple[int, Any]]:
    """n concurrent requests; the first replica killed once n/4 of them have reached a replica."""
    victim = chat[0]

    def kill_when_loaded() -> None:
        deadline = time.monotonic() + WAIT
        while sum(len(r.requests) for r in chat) < n // 4 and time.monotonic() < deadline:
            time.sleep(0.002)
        victim.kill()

    killer = threading.Thread(target=kill_when_loaded)
    killer.start()

    async def load() -> list[tuple[int, Any]]:
        return list(await asyncio.gather(*(_post(gw.port, key, f"{run}-{i}") for i in range(n))))

    results = asyncio.run(load())
    killer.join(WAIT)
    return results


def test_no_request_is_lost_when_a_replica_is_killed_under_load_20_runs(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    n, lost, retried_read = 200, 0, 0
    for run in range(20):
        chat = [FakeReplica(f"victim-{run}"), *(FakeReplica(f"c{i}-{run}") for i in range(3))]
        root = tmp_path / f"run{run}"
        root.mkdir()
        with own_gateway(spec, {"chat": chat, "reasoning": [FakeReplica("r")]}, root) as (gw, keys):
            results = _kill_under_load(gw, keys["default"], chat, run, n)
            assert chat[0].killed
            failed = [(status, out) for status, out in results if status != 200]
            lost += len(failed)
            assert not failed, (run, failed[:3])
            # One complete answer per request.
            assert sorted(out["rid"] for _, out in results) == sorted(f"{run}-{i}" for i in range(n))
            read_by_victim = set(chat[0].rids())
            served_elsewhere = {out["rid"] for _, out in results if out["served_by"] != chat[0].name}
            retried_read += len(read_by_victim & served_elsewhere)
    assert lost == 0
    # Requests the victim had read but never answered were re-run elsewhere (README: "Failover").
    assert retried_read > 0
