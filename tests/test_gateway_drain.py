"""Draining a replica of a prefix-affinity pool on the deployed nginx (gateway_affinity.lua admin(), the metrics
listener's /admin/drain): a drained replica gets no new request, only its own conversations move to their ring
successors, the requests it holds finish, and undraining puts it back, all without a reload."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from components.planning.load import load_stack_config
from tests.support.gateway import CHAT, WAIT, FakeReplica, NginxGateway, gateway_config, own_gateway
from tests.test_gateway_affinity import affinity_gateway, chat, served, settled


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NginxGateway, dict[str, str], list[FakeReplica]]]:
    # stickySeconds 0: a conversation moved by the drain is back on its ring replica once undrained.
    yield from affinity_gateway(tmp_path_factory, stickySeconds=0)


def admin(gw: NginxGateway, method: str, query: str = "", port: int | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port or gw.metrics_port, timeout=WAIT)
    try:
        conn.request(method, "/admin/drain" + (f"?{query}" if query else ""))
        resp = conn.getresponse()
        text = resp.read().decode()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text
    finally:
        conn.close()


def outcomes(gw: NginxGateway) -> dict[str, float]:
    """llm_gateway_routing_total of the chat pool by outcome, once the workers have merged their counts."""
    prefix = 'llm_gateway_routing_total{pool="chat",outcome="'
    return {k[len(prefix) : -2]: v for k, v in gw.metrics().items() if k.startswith(prefix)}


def drain_query(r: FakeReplica) -> str:
    return f"pool=chat&replica={quote(r.addr)}"


def test_a_drained_replica_finishes_its_requests_gets_no_new_one_and_only_its_conversations_move(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = pool
    key = keys["default"]
    before = {c: served(gw, key, chat(c, 1)) for c in range(40)}
    victim = next(r for r in replicas if r.name in before.values())
    mine = [c for c in before if before[c] == victim.name]
    settled(gw)
    # A request in flight on the replica when it is drained: held there until released.
    held: dict[str, Any] = {}
    body = {**chat(mine[0], 1), "rid": "drain-held", "hold": "drain-held"}
    client = threading.Thread(target=lambda: held.update(r=gw.call("POST", "/v1/chat/completions", body, key)))
    client.start()
    try:
        while "drain-held" not in victim.rids():
            client.join(0.01)
        assert admin(gw, "POST", drain_query(victim)) == (
            200,
            {"chat": {victim.addr: {"in_flight": 1, "drained": True}}},
        )
        assert admin(gw, "POST", drain_query(victim))[0] == 200  # idempotent
        reached = len(victim.requests)
        counted = outcomes(gw)
        during = {c: served(gw, key, chat(c, 2)) for c in range(40)}
        assert len(victim.requests) == reached, "a drained replica got a new request"
        assert {c for c in before if before[c] != during[c]} == set(mine)
        # Moved by the drain, counted as such (not as a failure of the replica); the others kept.
        after = outcomes(gw)
        assert {k: after.get(k, 0) - counted.get(k, 0) for k in ("drain", "failure", "kept", "load")} == {
            "drain": len(mine),
            "failure": 0,
            "kept": 40 - len(mine),
            "load": 0,
        }
        metrics = gw.scrape()
        assert metrics[f'llm_gateway_upstream_drained{{pool="chat",upstream="{victim.addr}"}}'] == 1
        assert metrics[f'llm_gateway_upstream_in_flight{{pool="chat",upstream="{victim.addr}"}}'] == 1
        others = [r for r in replicas if r is not victim]
        assert all(metrics[f'llm_gateway_upstream_drained{{pool="chat",upstream="{r.addr}"}}'] == 0 for r in others)
    finally:
        victim.gates["drain-held"].set()
        client.join(WAIT)
    status, _, payload = held["r"]
    assert (status, payload["served_by"]) == (200, victim.name)
    settled(gw)
    assert admin(gw, "GET", "pool=chat")[1]["chat"][victim.addr] == {"in_flight": 0, "drained": True}
    assert admin(gw, "DELETE", drain_query(victim)) == (
        200,
        {"chat": {victim.addr: {"in_flight": 0, "drained": False}}},
    )
    assert admin(gw, "DELETE", drain_query(victim))[0] == 200  # idempotent
    assert {c: served(gw, key, chat(c, 3)) for c in range(40)} == before
    assert gw.scrape()[f'llm_gateway_upstream_drained{{pool="chat",upstream="{victim.addr}"}}'] == 0


def test_requests_without_a_key_skip_a_drained_replica(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = pool
    victim = replicas[1]
    assert admin(gw, "POST", drain_query(victim))[0] == 200
    try:
        reached = len(victim.requests)
        counted = outcomes(gw)
        # No messages, no prompt, no session: the least busy replica, never the drained one.
        for _ in range(12):
            status, _, payload = gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])
            assert status == 200 and payload["served_by"] != victim.name
        assert len(victim.requests) == reached
        after = outcomes(gw)
        assert {k: after.get(k, 0) - counted.get(k, 0) for k in ("unkeyed", "drain", "kept")} == {
            "unkeyed": 12,
            "drain": 0,
            "kept": 0,
        }
    finally:
        admin(gw, "DELETE", drain_query(victim))


def test_the_admin_endpoint_refuses_what_it_should_and_is_not_on_the_public_port(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = pool
    status, body = admin(gw, "POST", f"pool=nope&replica={quote(replicas[0].addr)}")
    assert (status, body) == (
        404,
        {"error": "no pool 'nope' routed by prefix affinity here (drain needs routing: prefix); these are: chat"},
    )
    status, body = admin(gw, "POST", "pool=chat&replica=10.0.0.9:8000")
    assert (status, body) == (
        404,
        {
            "error": "pool 'chat' has no replica '10.0.0.9:8000'; its replicas are: "
            + ", ".join(r.addr for r in replicas)
        },
    )
    assert admin(gw, "POST", "") == (
        400,
        {"error": "pool=<pool>&replica=<host:port> are required to drain or undrain"},
    )
    assert admin(gw, "PUT", drain_query(replicas[0]))[0] == 405
    # The public port: not served there, and nothing drained by trying.
    for method in ("POST", "GET", "DELETE"):
        assert admin(gw, method, drain_query(replicas[0]), port=gw.port)[0] == 404
    assert admin(gw, "GET")[1] == {"chat": {r.addr: {"in_flight": 0, "drained": False} for r in replicas}}


def test_a_pool_nginx_balances_itself_is_refused_with_the_reason(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, _, _ = pool
    # The reference stack's reasoning pool: one instance, least_conn (nothing to drain to).
    why = (
        "pool 'reasoning' cannot be drained at the gateway: it has one instance (no other replica could take its "
        "requests)"
    )
    for method in ("POST", "DELETE", "GET"):
        assert admin(gw, method, "pool=reasoning&replica=10.0.0.9:8000") == (409, {"error": why})
    assert admin(gw, "GET", "pool=reasoning") == (409, {"error": why})


def test_a_gateway_without_prefix_affinity_answers_why_nothing_can_be_drained(tmp_path: Path) -> None:
    chat_replicas = [FakeReplica(f"chat-{i}") for i in range(4)]
    replicas = {"chat": chat_replicas, "reasoning": [FakeReplica("reasoning-0")]}
    spec = load_stack_config(gateway_config(routing={"policy": "least_conn"}), set())
    with own_gateway(spec, replicas, tmp_path) as (gw, keys):
        status, body = admin(gw, "POST", drain_query(chat_replicas[0]))
        assert (status, body) == (
            409,
            {
                "error": "no pool of this gateway can be drained here: pool 'reasoning' cannot be drained at the "
                "gateway: it has one instance (no other replica could take its requests); pool 'chat' cannot be "
                "drained at the gateway: it is routed by least_conn (gateway.routing.policy), nginx's own balancer, "
                "which takes a replica out only by a reload; routing: prefix makes it drainable"
            },
        )
        # Nothing was taken out: least_conn still sends the replica its share.
        assert chat_replicas[0].name in {served(gw, keys["default"], chat(c, 1)) for c in range(8)}
