"""Prefix affinity with bounded load on the deployed nginx (gateway_affinity.lua): a conversation stays on its
replica turn after turn, a session key comes first, the load bound spills to the ring's next replica, and a
dead replica's conversations move to their ring successors only, with no request lost."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.routing import Ring, affinity_key
from components.planning.gateway.layout import container_layout
from components.planning.gateway.nginx import AFFINITY_SOURCE, nginx_conf
from components.planning.load import load_stack_config
from components.spec import SpecError
from tests.support.gateway import (
    CHAT,
    WAIT,
    FakeReplica,
    NginxGateway,
    gateway_config,
    host_keys,
    lua_reports,
    own_gateway,
)

SYSTEM = "You are a careful assistant. " * 20


def chat(conversation: int, turns: int, user: str | None = None) -> dict[str, Any]:
    """Turn `turns` of a conversation: the shared system prompt, its own first question, the turns since."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"conversation {conversation}, question {t}"})
        if t < turns - 1:
            messages.append({"role": "assistant", "content": f"answer {t}"})
    body: dict[str, Any] = {"model": CHAT, "messages": messages}
    if user is not None:
        body["user"] = user
    return body


def affinity_gateway(
    tmp_path_factory: pytest.TempPathFactory, **routing: Any
) -> Iterator[tuple[NginxGateway, dict[str, str], list[FakeReplica]]]:
    """The reference gateway over four fake chat replicas (gateway.routing as given), its keys and the replicas."""
    chat_replicas = [FakeReplica(f"chat-{i}") for i in range(4)]
    replicas = {"chat": chat_replicas, "reasoning": [FakeReplica("reasoning-0")]}
    spec = load_stack_config(gateway_config(**({"routing": routing} if routing else {})), set())
    keys, digests = host_keys(spec, tmp_path_factory.mktemp("keys"))
    gw = NginxGateway(spec, replicas, tmp_path_factory.mktemp("gateway"), digests)
    yield gw, keys, chat_replicas
    gw.stop()
    for rs in replicas.values():
        for r in rs:
            r.kill()


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NginxGateway, dict[str, str], list[FakeReplica]]]:
    yield from affinity_gateway(tmp_path_factory)


def served(gw: NginxGateway, key: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> str:
    status, _, payload = gw.call("POST", "/v1/chat/completions", body, key, headers=headers)
    assert status == 200, payload
    return str(payload["served_by"])


def test_every_turn_of_a_conversation_reaches_the_replica_of_its_first(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = pool
    homes = {c: served(gw, keys["default"], chat(c, 1)) for c in range(24)}
    for turn in (2, 3, 5):
        assert {c: served(gw, keys["default"], chat(c, turn)) for c in range(24)} == homes
    # The conversations spread over the pool (its ring's own spread: test_the_ring_spreads_keys_evenly...).
    assert len(set(homes.values())) >= 3, homes


def test_a_system_prompt_longer_than_prefix_chars_still_keys_each_conversation_by_its_first_question(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = pool
    # 5 KB of shared system prompt, above prefixChars (2,048): the key must still tell conversations apart.
    long_system = "You follow the operator's runbook to the letter and cite it. " * 80

    def long_chat(conversation: int, turns: int) -> dict[str, Any]:
        body = chat(conversation, turns)
        body["messages"][0]["content"] = long_system
        return body

    homes = {c: served(gw, keys["default"], long_chat(c, 1)) for c in range(24)}
    assert {c: served(gw, keys["default"], long_chat(c, 4)) for c in range(24)} == homes
    # Spread over the pool (the ring depends on the replicas' ports), not pinned to the system prompt's replica.
    assert len(set(homes.values())) >= 3, homes


def test_the_benchs_python_ring_picks_the_replica_nginx_picks(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = pool
    # bench/routing.py simulates prefix affinity with its own key, crc32 and ring: they must be the Lua's.
    ring = Ring([r.addr for r in replicas])
    for c in range(200, 216):
        body = chat(c, 1)
        expected = replicas[ring.order(zlib.crc32(affinity_key(body) or b""))[0]].name
        assert served(gw, keys["default"], body) == expected, c


def test_a_session_header_then_the_user_field_come_before_the_prompt(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, _ = pool
    key = keys["default"]
    by_session = {s: served(gw, key, chat(s, 1), {"X-Session-Id": f"session-{s}"}) for s in range(12)}
    # Other prompts under the same session header: its replica all the same.
    for s in range(12):
        assert served(gw, key, chat(100 + s, 3), {"X-Session-Id": f"session-{s}"}) == by_session[s]
    by_user = {u: served(gw, key, chat(200 + u, 1, user=f"user-{u}")) for u in range(12)}
    for u in range(12):
        assert served(gw, key, chat(300 + u, 2, user=f"user-{u}")) == by_user[u]
    # Both sent: the header decides; `user` names another session's replica for some of them.
    both = {s: served(gw, key, chat(400 + s, 2, user=f"user-{s}"), {"X-Session-Id": f"session-{s}"}) for s in range(12)}
    assert both == by_session
    assert any(by_user[s] != by_session[s] for s in range(12)), "widen the sample: user and header agree everywhere"
    assert len(set(by_session.values())) >= 2 and len(set(by_user.values())) >= 2


def test_completions_are_keyed_by_their_prompt(pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]]) -> None:
    gw, keys, _ = pool
    prompts = {p: f"{SYSTEM} document {p}" for p in range(12)}
    first = {}
    for p, text in prompts.items():
        status, _, payload = gw.call("POST", "/v1/completions", {"model": CHAT, "prompt": text}, keys["default"])
        assert status == 200
        first[p] = payload["served_by"]
    for p, text in prompts.items():
        body = {"model": CHAT, "prompt": [text], "max_tokens": 3}
        assert gw.call("POST", "/v1/completions", body, keys["default"])[2]["served_by"] == first[p]


@pytest.fixture(scope="module")
def strict(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NginxGateway, dict[str, str], list[FakeReplica]]]:
    """A pool whose bound has no floor (minInFlight 1): the bare consistent hashing with bounded loads."""
    yield from affinity_gateway(tmp_path_factory, minInFlight=1)


def hold(gw: NginxGateway, key: str, replicas: list[FakeReplica], body: dict[str, Any], rids: list[str]) -> Any:
    """Send requests of `body` one after another, each held by the replica it reached; -> (replica names, release)."""
    results: list[dict[str, Any]] = []
    threads = []
    for rid in rids:
        result: dict[str, Any] = {}
        results.append(result)

        def send(rid: str = rid, result: dict[str, Any] = result) -> None:
            result["r"] = gw.call("POST", "/v1/chat/completions", {**body, "rid": rid, "hold": rid}, key)

        t = threading.Thread(target=send)
        t.start()
        threads.append(t)
        deadline = time.monotonic() + WAIT
        while not any(rid in r.rids() for r in replicas) and time.monotonic() < deadline:
            time.sleep(0.01)
    holders = [next(r.name for r in replicas if rid in r.rids()) for rid in rids]

    def release() -> list[int]:
        for r in replicas:
            for rid in rids:
                r.gates[rid].set()
        for t in threads:
            t.join(WAIT)
        return [res["r"][0] for res in results]

    return holders, release


def test_a_replica_under_its_floor_keeps_its_conversations(
    pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = pool
    body = chat(9, 1)
    home = served(gw, keys["default"], body)
    settled(gw)
    # minInFlight 4: four held requests stay home; the fifth, above max(ceil(1.25 x 5 / 4), 4), moves on.
    holders, release = hold(gw, keys["default"], replicas, body, [f"floor-{n}" for n in range(5)])
    try:
        assert holders[:4] == [home] * 4 and holders[4] != home, holders
    finally:
        assert release() == [200] * 5


def test_the_load_bound_sends_the_overflow_to_the_next_replica_on_the_ring(
    strict: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = strict
    body = chat(7, 1)
    home = served(gw, keys["default"], body)
    settled(gw)  # its log phase has given its slot back: the first held request is alone
    home_replica = next(r for r in replicas if r.name == home)
    # Hold requests of this conversation on its replica: with 1.25 x (in flight + 1) / 4 as the bound, the
    # second one in flight already exceeds it (ceil(1.25 x 2 / 4) = 1), so it goes to the ring's next.
    holders, release = hold(gw, keys["default"], replicas, body, [f"held-{n}" for n in range(3)])
    ring = Ring([r.addr for r in replicas])
    order = [replicas[o].name for o in ring.order(zlib.crc32(affinity_key(body) or b""))]
    try:
        # Each over the bound moved one step further on the ring: exactly the ring's next replicas.
        assert holders == [home, order[1], order[2]] == order[:3], (holders, order)
    finally:
        assert release() == [200] * 3
    # Released (nothing in flight): the conversation stays where the bound last moved it (stickySeconds), the
    # replica that prefilled its whole history, and that counts as kept.
    settled(gw)
    kept = gw.metrics().get('llm_gateway_routing_total{pool="chat",outcome="kept"}', 0)
    for _ in range(3):
        assert served(gw, keys["default"], body) == order[2] != home_replica.name
    assert gw.metrics()['llm_gateway_routing_total{pool="chat",outcome="kept"}'] == kept + 3


@pytest.fixture(scope="module")
def unsticky(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[NginxGateway, dict[str, str], list[FakeReplica]]]:
    """No floor and stickySeconds 1: a moved conversation is remembered for one second."""
    yield from affinity_gateway(tmp_path_factory, minInFlight=1, stickySeconds=1)


def test_a_moved_conversation_goes_back_to_its_ring_replica_once_sticky_seconds_pass(
    unsticky: tuple[NginxGateway, dict[str, str], list[FakeReplica]],
) -> None:
    gw, keys, replicas = unsticky
    body = chat(8, 1)
    home = served(gw, keys["default"], body)
    settled(gw)
    holders, release = hold(gw, keys["default"], replicas, body, ["one", "two"])
    try:
        assert holders[0] == home != holders[1], holders
    finally:
        assert release() == [200] * 2
    settled(gw)
    assert served(gw, keys["default"], body) == holders[1]  # within the second: where it moved
    time.sleep(1.5)  # the shared zone's entry expires after stickySeconds (1) since its last request
    assert served(gw, keys["default"], body) == home


def test_without_sticky_seconds_a_released_conversation_is_back_on_its_ring_replica(tmp_path: Path) -> None:
    chat_replicas = [FakeReplica(f"chat-{i}") for i in range(4)]
    replicas = {"chat": chat_replicas, "reasoning": [FakeReplica("reasoning-0")]}
    spec = load_stack_config(gateway_config(routing={"minInFlight": 1, "stickySeconds": 0}), set())
    with own_gateway(spec, replicas, tmp_path) as (gw, keys):
        body = chat(7, 1)
        home = served(gw, keys["default"], body)
        settled(gw)
        holders, release = hold(gw, keys["default"], chat_replicas, body, ["a", "b"])
        try:
            assert holders[0] == home != holders[1], holders
        finally:
            assert release() == [200] * 2
        settled(gw)
        assert served(gw, keys["default"], body) == home


def test_a_dead_replica_moves_only_its_own_conversations_and_loses_no_request(tmp_path: Path) -> None:
    chat_replicas = [FakeReplica(f"chat-{i}") for i in range(4)]
    replicas = {"chat": chat_replicas, "reasoning": [FakeReplica("reasoning-0")]}
    spec = load_stack_config(gateway_config(), set())
    with own_gateway(spec, replicas, tmp_path) as (gw, keys):
        key = keys["default"]
        before = {c: served(gw, key, chat(c, 1)) for c in range(40)}
        dead = chat_replicas[0]
        dead.kill()
        # Every request still answered (retried on the ring's next replica), while its failures eject it.
        after = {c: served(gw, key, chat(c, 2)) for c in range(40)}
        assert dead.name not in after.values()
        moved = {c for c in before if before[c] != after[c]}
        assert moved == {c for c in before if before[c] == dead.name}
        assert moved, "the dead replica held no conversation: widen the sample"
        # The moved ones stay on the replica they moved to (stickySeconds), the others on theirs.
        assert {c: served(gw, key, chat(c, 3)) for c in range(40)} == after
        metrics = gw.metrics()
        assert metrics.get('llm_gateway_routing_total{pool="chat",outcome="failure"}', 0) >= 1
        assert metrics.get('llm_gateway_routing_total{pool="chat",outcome="kept"}', 0) >= 40


def settled(gw: NginxGateway) -> None:
    """Wait until no request is in flight on any replica (the in-flight gauge reads the shared zone itself)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if not any(v for k, v in gw.scrape().items() if k.startswith("llm_gateway_upstream_in_flight")):
            return
        time.sleep(0.02)
    pytest.fail("requests still in flight")


def test_in_flight_per_replica_is_a_gauge(pool: tuple[NginxGateway, dict[str, str], list[FakeReplica]]) -> None:
    gw, _, replicas = pool
    metrics = gw.metrics()
    for r in replicas:
        assert metrics[f'llm_gateway_upstream_in_flight{{pool="chat",upstream="{r.addr}"}}'] == 0


def test_least_conn_stays_a_choice_per_pool_and_for_the_gateway() -> None:
    config = gateway_config(routing={"policy": "least_conn"})
    conf = nginx_conf(load_stack_config(config, set()), container_layout(load_stack_config(config, set())))
    assert "balancer_by_lua_block" not in conf and conf.count("least_conn;") == 2
    config = gateway_config()
    config["llm-cluster:pools"]["chat"]["routing"] = "least_conn"
    spec = load_stack_config(config, set())
    assert "gateway_affinity" not in nginx_conf(spec, container_layout(spec))
    # A pool of one instance has nothing to choose: least_conn whatever the policy.
    spec = load_stack_config(gateway_config(), set())
    conf = nginx_conf(spec, container_layout(spec))
    reasoning = conf[conf.index("upstream llm_pool_reasoning {") :]
    assert reasoning[: reasoning.index("}")].count("least_conn;") == 1
    chat_up = conf[conf.index("upstream llm_pool_chat {") :]
    assert 'balancer_by_lua_block { package.loaded.gateway_affinity.balance("llm_pool_chat") }' in chat_up


@pytest.mark.parametrize(
    ("routing", "message"),
    [
        ({"policy": "random"}, "gateway.routing.policy: 'random' is not allowed"),
        ({"loadFactor": 0.5}, "gateway.routing.loadFactor: 0.5 is not allowed"),
        ({"prefixChars": 10}, "gateway.routing.prefixChars: 10 is not allowed"),
        ({"sessionHeader": "X Session"}, "gateway.routing.sessionHeader: 'X Session' is not allowed"),
        ({"stickySeconds": -1}, "gateway.routing.stickySeconds: -1 is not allowed"),
    ],
)
def test_bad_routing_settings_name_their_key(routing: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as bad:
        load_stack_config(gateway_config(routing=routing), set())
    assert str(bad.value.issues[0]).startswith(message), json.dumps([str(i) for i in bad.value.issues])


def test_the_ring_spreads_keys_evenly_and_a_lost_replica_moves_only_its_own(tmp_path: Path) -> None:
    """The ring alone (gateway_affinity.ring/owner) on fixed addresses, over 20,000 evenly spaced hashes."""
    code = """
    local a = require("gateway_affinity")
    local four = {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}
    local three = {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.4:8000"}
    local p4, o4 = a.ring(four)
    local p3, o3 = a.ring(three)
    local counts, moved, wrong = {0, 0, 0, 0}, 0, 0
    for i = 0, 19999 do
        local h = math.floor(i * 4294967296 / 20000)
        local before = four[a.owner(p4, o4, h)]
        local after = three[a.owner(p3, o3, h)]
        counts[a.owner(p4, o4, h)] = counts[a.owner(p4, o4, h)] + 1
        if before ~= after then
            moved = moved + 1
            if before ~= "10.0.0.3:8000" then wrong = wrong + 1 end
        end
    end
    ngx.print(table.concat(counts, " "), " ", moved, " ", wrong)
    """
    *counts, moved, wrong = map(int, lua_reports(tmp_path, code, AFFINITY_SOURCE.parent).split(" "))
    shares = [c / 20000 for c in counts]
    assert all(0.2 <= share <= 0.3 for share in shares), shares
    # Only the lost replica's keys move (to their successors): exactly those it owned.
    assert wrong == 0 and moved == counts[2]


def test_a_pool_whose_name_holds_a_hyphen_is_routed_by_affinity(tmp_path: Path) -> None:
    # Pool names are DNS labels: "chat-a" must be a key of the Lua settings nginx loads, not a syntax error.
    config = json.loads(json.dumps(gateway_config()).replace('"chat"', '"chat-a"'))
    spec = load_stack_config(config, set())
    chat_replicas = [FakeReplica(f"chat-{i}") for i in range(4)]
    with own_gateway(spec, {"chat-a": chat_replicas, "reasoning": [FakeReplica("reasoning-0")]}, tmp_path) as (
        gw,
        keys,
    ):
        homes = {c: served(gw, keys["default"], chat(c, 1)) for c in range(12)}
        assert {c: served(gw, keys["default"], chat(c, 3)) for c in range(12)} == homes
        assert len(set(homes.values())) >= 2, homes
        assert 'llm_gateway_routing_total{pool="chat-a",outcome="kept"}' in gw.metrics()
