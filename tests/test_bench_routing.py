"""bench/routing.py's pure parts: the seeded workload, the Python mirror of gateway_affinity.lua's key and
ring (checked against the deployed nginx in tests/test_gateway_affinity.py), and the cache simulation."""

from __future__ import annotations

import zlib

from bench import routing


def test_the_workload_is_the_same_for_a_seed_and_another_for_another_seed() -> None:
    a, b = routing.workload(), routing.workload()
    assert a == b
    assert routing.workload(seed=routing.SEED + 1) != a
    assert len(a.systems) == routing.SYSTEMS and len(a.conversations) == routing.CONVERSATIONS
    assert all(routing.TURNS[0] <= len(c.turns) <= routing.TURNS[1] for c in a.conversations)
    # Each turn carries the whole history: system, then user and assistant in turn, ending with the question.
    c = a.conversations[0]
    body = a.body(0, 2)
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert body["messages"][0]["content"] == a.systems[c.system]
    assert body["messages"][-1]["content"] == c.turns[2][0] and body["stream"] is True


def test_the_affinity_key_is_the_system_part_and_the_first_question_each_cut_to_prefix_chars() -> None:
    long_system = "s" * 5000
    body = {"messages": [{"role": "system", "content": long_system}, {"role": "user", "content": "q" * 3000}]}
    key = routing.affinity_key(body)
    assert key == b"m\0" + (b"system\0" + b"s" * 5000)[:2048] + b"\0" + (b"user\0" + b"q" * 3000)[:2048]
    other = {"messages": [body["messages"][0], {"role": "user", "content": "another question"}]}
    assert routing.affinity_key(other) != key
    # Later turns repeat the head: the same key.
    later = {"messages": [*body["messages"], {"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}
    assert routing.affinity_key(later) == key


def test_the_ring_walks_every_replica_once_and_the_bound_spills_to_the_next() -> None:
    ring = routing.Ring([f"127.0.0.1:{8000 + i}" for i in range(4)])
    assert len(ring.points) == 4 * routing.VNODES and ring.points == sorted(ring.points)
    h = zlib.crc32(b"some key")
    order = ring.order(h)
    assert sorted(order) == [0, 1, 2, 3]
    assert ring.pick(h, [0, 0, 0, 0]) == order[0]
    # Its replica at the floor (4 in flight: a fifth would exceed max(ceil(1.25 x 5 / 4), 4)): the next on the ring.
    load = [0, 0, 0, 0]
    load[order[0]] = 4
    assert ring.pick(h, load) == order[1]
    # Keys spread over the ring within a few percent of a quarter each.
    owners = [ring.order(zlib.crc32(str(k).encode()))[0] for k in range(4000)]
    assert all(800 <= owners.count(i) <= 1200 for i in range(4)), [owners.count(i) for i in range(4)]


def test_the_simulation_keeps_a_conversation_on_its_replica_and_counts_its_history_as_hits() -> None:
    w = routing.workload(conversations=8, systems=2)
    tokens = routing.estimated_tokens(w)
    segs = {
        (c.cid, t): routing.prompt_segments(w, c.cid, t, tokens, 3)
        for c in w.conversations
        for t in range(len(c.turns))
    }
    blocks = routing.blocks_of(segs[(0, 1)], 128)
    assert len(blocks) == segs[(0, 1)].tokens // 128
    # A cache that holds everything: prefix and the oracle hit alike; least_conn moves turns and hits less.
    big = {p: routing.simulate(w, segs, 4, 10**6, 128, p, 4, 8) for p in ("least_conn", "prefix", "oracle")}
    assert big["least_conn"].hit < big["prefix"].hit <= big["oracle"].hit + 1e-9
    assert sum(big["prefix"].per_replica) == len(segs)
    # One replica: every policy is the same.
    one = {p: routing.simulate(w, segs, 1, 10**6, 128, p, 4, 8).hit for p in ("least_conn", "prefix", "oracle")}
    assert len(set(one.values())) == 1


def test_a_moved_key_is_tried_first_on_the_replica_it_moved_to() -> None:
    ring = routing.Ring([f"127.0.0.1:{8000 + i}" for i in range(4)])
    h = zlib.crc32(b"some key")
    order = ring.order(h)
    assert ring.pick(h, [0, 0, 0, 0], moved_to=order[2]) == order[2]
    # The replica it moved to at the floor: the ring's own order after it, from the start.
    load = [0, 0, 0, 0]
    load[order[2]] = 4
    assert ring.pick(h, load, moved_to=order[2]) == order[0]


def test_the_simulation_counts_the_turns_the_bound_moves_and_stickiness_keeps_them_where_they_went() -> None:
    w = routing.workload(conversations=24, systems=4)
    tokens = routing.estimated_tokens(w)
    segs = {
        (c.cid, t): routing.prompt_segments(w, c.cid, t, tokens, 3)
        for c in w.conversations
        for t in range(len(c.turns))
    }
    # Without a floor (1) eight clients on four replicas keep moving turns; sent back, a conversation moves
    # again each time its replica is full, while a sticky one stays where it went.
    back = routing.simulate(w, segs, 4, 10**6, 128, "prefix", 8, 16, floor=1, sticky=False)
    kept = routing.simulate(w, segs, 4, 10**6, 128, "prefix", 8, 16, floor=1, sticky=True)
    assert back.moved > 0 and kept.moved > 0
    assert kept.hit > back.hit
    # No bound at all: nothing moves.
    assert routing.simulate(w, segs, 4, 10**6, 128, "prefix", 8, 16, floor=10**6).moved == 0


def test_turn_moves_classifies_each_turn_against_its_conversations_previous_turn() -> None:
    def outcome(cid: int, turn: int, at: float) -> routing.Outcome:
        return routing.Outcome(cid, turn, status=200, done=True, started_at=at)

    a, b, c = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
    served = {
        (0, 0): a, (0, 1): a, (0, 2): b, (0, 3): b,  # on the victim a until the event, then on b
        (1, 0): b, (1, 1): c, (1, 2): c, (1, 3): b,  # moved before the event (load), and after it
        (2, 0): c, (2, 1): c, (2, 2): c,
    }  # fmt: skip
    results = [outcome(cid, t, 10.0 if t >= 2 else 1.0) for cid, t in served]
    out = routing.turn_moves(results, served, 5.0, a)
    assert out["before"] == 3 and out["before_moved"] == 1  # (1, 1)
    assert out["victim"] == 1 and out["victim_moved"] == 1 and out["victim_on_it"] == 0  # (0, 2)
    assert out["others"] == 4 and out["others_moved"] == 1  # (0, 3) stayed on b; (1, 3) moved
    assert out["victim_convs"] == 1 and out["victim_convs_one_replica"] == 1


def test_a_part_of_the_workload_keeps_its_conversations_ids() -> None:
    w = routing.workload(conversations=6)
    rest = routing.Workload(w.systems, w.conversations[3:])
    assert rest.body(4, 1) == w.body(4, 1)
    sched = routing.Schedule(rest, 2)
    assert sched.next() == (3, 0) and sched.next() == (4, 0)


def test_the_last_line_is_the_issues_format_prefix_over_least_conn() -> None:
    lc = {"hit": 0.32, "ttft_p50": 1.6, "spread": 1.02}
    pf = {"hit": 0.752, "ttft_p50": 0.52, "spread": 1.087}
    assert routing.summary_line(lc, pf) == "routing: hit-rate 2.35x, ttft-p50 0.33x, max/mean 1.09"
