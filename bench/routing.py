"""Prefix affinity against least_conn on real engines: the same multi-turn requests through the real gateway
in front of real vLLM replicas, once per policy, with the engines' own prefix-cache counters (issue 34).

Run (root: network namespaces): `.venv/bin/python -m bench.routing` (also `make bench`); `--no-kill` skips the
kill run, `--replicas N`, `--conversations N`, `--systems N`, `--clients N`, `--blocks N` resize it. It prints figures and
asserts nothing; its last line, for scripts: `routing: hit-rate X.XXx, ttft-p50 Y.YYx, max/mean Z.ZZ`
(prefix affinity against least_conn: the ratios of prefix's to least_conn's engine hit rate and client
TTFT p50, and the prefix run's max/mean requests per replica).

- **Only loopback.** The bench makes the namespace `vx-routing` (lab/vllm_cpu.Namespace: `lo` only, no route
  off it) and re-executes itself inside it (`ip netns exec`): the replicas, nginx and the load generator all
  run there, so vLLM's start-up probes and every request stay on loopback.
- **The engines.** N (default 4) real vLLM 0.19.1 CPU replicas of `qwen3-moe-tiny` (lab/vllm_cpu.py: the
  plan's chat-pool launch with its declared CPU differences), prefix caching on, each with a KV cache of
  BLOCKS blocks of 128 tokens (the CPU backend's block) — 12,288 tokens, against a workload whose
  conversations and system prompts total several times that, so eviction matters — and one core each
  (VLLM_CPU_OMP_THREADS_BIND: two replicas per core on this 2-core machine, not every replica's OpenMP
  threads spinning on both). Prefilling ~2k tokens takes hundreds of ms here (docs/perf/lab.md), far above
  the HTTP overhead. The replicas are started afresh for each policy, so each run starts with cold caches.
- **The gateway.** The deployed nginx + Lua (tests/support/deployed_nginx.py) with the config the plan
  generates (render_gateway) for the reference stack reduced to its chat pool, whose upstreams are the N
  replicas, over plain HTTP, one worker, with `gateway.routing.policy` least_conn or prefix (the defaults
  otherwise: loadFactor 1.25, minInFlight 4, prefixChars 2,048).
- **The workload** (seed SEED, no download): SYSTEMS (32) system prompts of ~1,000 words (~1.2k tokens; tenants or
  agents, each with its own: together ~39k tokens, three replicas' caches, as the tenants' prefixes outweigh a pod's
  cache in the issue's llm-d figure; with 16, the first setting, least_conn's luck decided the ratio: below) and CONVERSATIONS conversations, each with one of them and 4-10 turns (user 20-60
  words, assistant 100-250 words: the history a chat client sends back; the words drawn from the tiny
  tokenizer's own training text). Every request carries the whole history, streams, and asks 16 tokens
  (`ignore_eos`, temperature 0). ACTIVE conversations are open at once; CLIENTS clients each send the next
  turn of the conversation at the head of one queue, which goes to the back once answered (the next
  conversation opens when one ends): a conversation's think time is the other conversations' turns, and
  its turns reach the gateway among theirs. Each policy gets the same requests (their order across clients
  is the run's own timing).
- **Per policy**: the engines' prefix-cache hit rate (vllm:prefix_cache_hits_total / queries_total, each
  replica's /metrics before and after), TTFT p50/p90 as the clients see it (the first chunk with content),
  requests/s and tokens/s over the run, and the load spread (max/mean requests per replica, from the
  engines' vllm:request_success_total).
- **The oracle** and the simulations: `simulate()` replays the same requests through the same queue, the
  clients as events whose service time is (1 + uncached tokens / 1,000) x a seeded +-25 % jitter (only the
  order matters), on per-replica LRU caches of whole blocks (a block's identity: the prompt up to its end; a
  request hits its longest run of cached leading blocks, at most all but its last token; then its blocks are
  touched, its tail least recently, as vLLM frees them; least recently used blocks are evicted beyond the
  capacity; decoded tokens and the blocks running requests pin are left out). Token counts: each message
  counted by a replica's /tokenize in its ChatML frame, the template's remaining tokens calibrated on the
  engines' usage (the error is printed). Policies: least_conn (fewest in flight, ties in turn), prefix (the
  same key, ring and bound as gateway_affinity.lua: 160 points per replica at crc32(`addr#i`), the key's
  crc32, the first replica within max(ceil(1.25 x (in flight + 1) / n), 4), a key the bound moved tried
  first where it went: stickySeconds, which outlasts the run) and the oracle (the replica
  holding the request's longest cached prefix, load ignored; ties to the one with the fewest requests so
  far). At the bench's scale it stands beside the measured rates; at the reference cluster's scale it uses
  the KV-token capacity the capacity planner computes for Pulumi.prod.yaml's chat pool on V100 (plan.json's
  `capacity`), 4-64 replicas, the same workload shape with the pool's maxNumSeqs clients per replica.
- **The kill run** (after the prefix run, same replicas, a fresh gateway): the first half of the
  conversations again under prefix affinity, replica 0 killed (SIGKILL to its process group: a crash) once
  half its requests are answered; counted: requests answered whole, cut mid-stream (a crash cuts what it was
  streaming: nginx cannot retry a response already begun), failed; and each turn against its conversation's
  previous turn (the gateway's usage log): before the kill, the killed replica's conversations after it (all
  must move, each to one successor), the others' (moved only by the load bound).
- **The drain run** (the other half of the conversations, on the three replicas left, a fresh gateway):
  replica 1 stopped the way a rolling restart should stop it, gateway first: the gateway's config rewritten
  without it and reloaded (nginx's new worker never sends to it; the old one finishes the streams it holds,
  then exits), then, the engine idle, SIGTERM. vLLM 0.19.1 on SIGTERM (entrypoints/launcher.py, v1/engine/
  core.py `_handle_shutdown`): `--shutdown-timeout` 0, its default, aborts every request in flight; above 0
  it drains them, but a request that arrives meanwhile is aborted (`_reject_add_in_shutdown`) inside a 200
  stream the gateway cannot retry: the gateway must stop sending first. Counted as the kill run.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.gateway import KEY, write_gateway

ROOT = Path(__file__).resolve().parent.parent

SEED = 34
MODEL = "qwen3-moe-tiny"
SERVED = "qwen3-30b-a3b"  # the chat pool's served name (the planned --served-model-name)
REPLICAS = 4
CLIENTS = 8
ACTIVE = 16  # conversations open at once: each waits for the others' turns between its own
# 32 tenants, not 16: with 16 the simulation's expected ratio of prefix to least_conn is 2.0-2.1 (over 20 timing
# seeds and 3 workload seeds), and least_conn's rate moves by +-3 points with the share of turns that land on their
# previous replica by chance (22-28 %, a binomial draw of ~600 turns): the 2x was a coin flip. docs/perf/gateway.md.
SYSTEMS = 32
CONVERSATIONS = 96
TURNS = (4, 10)
SYSTEM_WORDS = 1000
USER_WORDS = (20, 60)
ASSISTANT_WORDS = (100, 250)
MAX_TOKENS = 16
CPU_BLOCK = 128  # tokens per KV block of vLLM's CPU backend
BLOCKS = 96  # per replica: 12,288 tokens
MAX_MODEL_LEN = 8192
MAX_NUM_SEQS = 8
GPU_BLOCK = 16  # vLLM's default block size on CUDA
SIM_UNIT = 128  # the cluster simulation's block (for its speed): hits rounded down to 128 tokens, not 16
NS_NAME = "routing"
VNODES = 160  # gateway_affinity.lua's points per replica
POLICIES = ("least_conn", "prefix")


# --- the workload -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversation:
    """One conversation: its system prompt (an index) and its turns (user, assistant) in order."""

    cid: int
    system: int
    turns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Workload:
    systems: tuple[str, ...]
    conversations: tuple[Conversation, ...]

    def body(self, cid: int, turn: int) -> dict[str, Any]:
        """The request of turn `turn` (0-based) of conversation `cid`: the whole history, streamed."""
        return {
            "model": SERVED,
            "messages": self.messages(cid, turn),
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def conversation(self, cid: int) -> Conversation:
        """Conversation `cid` (a part of a workload keeps its conversations' ids)."""
        if cid < len(self.conversations) and self.conversations[cid].cid == cid:
            return self.conversations[cid]
        return next(c for c in self.conversations if c.cid == cid)

    def messages(self, cid: int, turn: int) -> list[dict[str, str]]:
        c = self.conversation(cid)
        out = [{"role": "system", "content": self.systems[c.system]}]
        for t in range(turn + 1):
            user, assistant = c.turns[t]
            out.append({"role": "user", "content": user})
            if t < turn:
                out.append({"role": "assistant", "content": assistant})
        return out

    def requests(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


def _words() -> list[str]:
    from lab.vllm_cpu_models import TEXT  # the tiny tokenizer's training text: its words are single tokens

    return TEXT.split()


def workload(
    seed: int = SEED,
    systems: int = SYSTEMS,
    conversations: int = CONVERSATIONS,
    turns: tuple[int, int] = TURNS,
    system_words: int = SYSTEM_WORDS,
) -> Workload:
    """The bench's multi-turn workload: deterministic for a seed, nothing downloaded."""
    rnd = random.Random(seed)
    words = _words()

    def text(n: int) -> str:
        return " ".join(rnd.choices(words, k=n))

    prompts = tuple(f"System prompt {s}: you are agent {s}. " + text(system_words) for s in range(systems))
    convs = []
    for cid in range(conversations):
        system = rnd.randrange(systems)
        n = rnd.randint(*turns)
        convs.append(
            Conversation(
                cid,
                system,
                tuple(
                    (
                        f"Conversation {cid}, question {t}: " + text(rnd.randint(*USER_WORDS)),
                        text(rnd.randint(*ASSISTANT_WORDS)),
                    )
                    for t in range(n)
                ),
            )
        )
    return Workload(prompts, tuple(convs))


# --- the gateway's choice, in Python (gateway_affinity.lua) ---------------------------------------------


def affinity_key(body: dict[str, Any], chars: int = 2048) -> bytes | None:
    """gateway_affinity.lua head_of() for a chat body without `user` (no session header)."""
    parts: list[bytes] = []
    size = 0
    for m in body.get("messages") or []:
        text = str(m["role"]).encode() + b"\0" + str(m["content"]).encode()
        if m["role"] == "user":
            return b"m\0" + b"\0".join(parts)[:chars] + b"\0" + text[:chars]
        if size < chars:
            parts.append(text)
            size += len(text)
    return b"m\0" + b"\0".join(parts)[:chars] if parts else None


class Ring:
    """gateway_affinity.lua's ring: VNODES points per replica at crc32(`addr#i`), sorted by (hash, replica)."""

    def __init__(self, addrs: Sequence[str]):
        self.addrs = list(addrs)
        pts = sorted(
            (zlib.crc32(f"{a}#{v}".encode()), i) for i, a in enumerate(self.addrs) for v in range(1, VNODES + 1)
        )
        self.points = [p for p, _ in pts]
        self.owner = [o for _, o in pts]

    def order(self, h: int) -> list[int]:
        """The replicas in ring order from the first point at or after h (wrapping), each once."""
        i = bisect.bisect_left(self.points, h)
        if i == len(self.points):
            i = 0
        out: list[int] = []
        seen: set[int] = set()
        n = len(self.addrs)
        while len(out) < n:
            o = self.owner[i]
            if o not in seen:
                seen.add(o)
                out.append(o)
            i = (i + 1) % len(self.points)
        return out

    def pick(
        self, h: int, load: Sequence[int], factor: float = 1.25, floor: int = 4, moved_to: int | None = None
    ) -> int:
        """The replica gateway_affinity.lua's balance() picks for hash h with these in-flight counts (all healthy);
        `moved_to`: the replica an earlier turn of the key was moved to by the bound (tried first)."""
        bound = max(math.ceil(factor * (sum(load) + 1) / len(load)), floor)
        order = self.order(h)
        if moved_to is not None:
            order = [moved_to, *(o for o in order if o != moved_to)]
        return next((o for o in order if load[o] + 1 <= bound), order[0])


# --- the cache simulation --------------------------------------------------------------------------------


@dataclass
class Segments:
    """A request's prompt as token runs: (identity of the prefix that ends with this run, its tokens)."""

    runs: list[tuple[tuple[int, ...], int]]
    key: int  # the gateway's affinity hash

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.runs)


def prompt_segments(w: Workload, cid: int, turn: int, tokens: dict[str, int], overhead: int = 0) -> Segments:
    """The runs of a request's prompt: its system prompt (shared by the conversations that use it), then each
    message of its own history; `tokens` gives each message's token count (template included)."""
    c = w.conversation(cid)
    msgs = w.messages(cid, turn)
    runs: list[tuple[tuple[int, ...], int]] = [((0, c.system), tokens[msgs[0]["content"]])]
    for m, msg in enumerate(msgs[1:], start=1):
        runs.append(((1, cid, m), tokens[msg["role"] + "\0" + msg["content"]]))
    if overhead:
        runs.append(((2, cid, turn), overhead))  # the generation prompt: never a full block of its own
    h = affinity_key(w.body(cid, turn))
    return Segments(runs, zlib.crc32(h) if h is not None else 0)


def blocks_of(seg: Segments, block: int) -> list[tuple[tuple[int, ...], int]]:
    """The identities of a prompt's full blocks: (the run its last token falls in, the offset of its end)."""
    out = []
    total = seg.tokens
    ends = []
    acc = 0
    for ident, n in seg.runs:
        acc += n
        ends.append((acc, ident))
    j = 0
    for end in range(block, total + 1, block):
        while ends[j][0] < end:
            j += 1
        out.append((ends[j][1], end))
    return out


@dataclass
class SimResult:
    hit: float
    per_replica: list[int]
    moved: int = 0

    @property
    def spread(self) -> float:
        return max(self.per_replica) / statistics.mean(self.per_replica)


@dataclass
class _Cache:
    capacity: int
    lru: OrderedDict = field(default_factory=OrderedDict)


def simulate(
    w: Workload,
    segs: dict[tuple[int, int], Segments],
    replicas: int,
    capacity_blocks: int,
    block: int,
    policy: str,
    clients: int,
    active: int,
    factor: float = 1.25,
    floor: int = 4,
    warmup: float = 0.0,
    seed: int = SEED,
    sticky: bool = True,
) -> SimResult:
    """Hit rate (hit tokens / prompt tokens, after the first `warmup` fraction of requests) and requests per
    replica of one policy, the clients taking turns of the open conversations as drive() does; a request's
    service time is (1 + its uncached tokens / 1,000) x a seeded jitter of +-25 % (only the order matters)."""
    import heapq

    rnd = random.Random(seed)
    ring = Ring([f"127.0.0.1:{8000 + i}" for i in range(replicas)])
    caches = [_Cache(capacity_blocks) for _ in range(replicas)]
    holders: dict[Any, set[int]] = defaultdict(set)  # block -> the replicas caching it (the oracle's index)
    in_flight = [0] * replicas
    per = [0] * replicas
    rr = 0
    hits = queries = 0
    total = sum(len(c.turns) for c in w.conversations)
    skip = int(total * warmup)
    sched = Schedule(w, active)
    events: list[tuple[float, int, int, int]] = []  # (finish time, client, replica, conversation)
    now = 0.0
    dispatched = 0
    moved_to: dict[int, int] = {}  # key -> the replica the bound moved it to (sticky)
    moved = 0

    def dispatch(client: int) -> None:
        nonlocal rr, hits, queries, dispatched, moved
        got_req = sched.next()
        if got_req is None:
            return
        cid, turn = got_req
        s = segs[(cid, turn)]
        blocks = blocks_of(s, block)
        limit = (s.tokens - 1) // block  # vLLM computes at least the prompt's last token
        if policy == "least_conn":
            least = min(in_flight)
            pick = next(i for i in [(rr + j) % replicas for j in range(replicas)] if in_flight[i] == least)
            rr = (pick + 1) % replicas
        elif policy == "prefix":
            first = moved_to.get(s.key) if sticky else None
            pick = ring.pick(s.key, in_flight, factor, floor, first)
            home = ring.order(s.key)[0] if first is None else first
            if pick != home:
                moved += 1
                if sticky:
                    moved_to[s.key] = pick
        else:  # oracle
            cands = set(range(replicas))
            for b in blocks[:limit]:
                nxt = cands & holders.get(b, set())
                if not nxt:
                    break
                cands = nxt
            pick = min(cands, key=lambda i: (per[i], i))
        cache = caches[pick]
        got = 0
        for b in blocks[:limit]:
            if b not in cache.lru:
                break
            got += 1
        if dispatched >= skip:
            hits += got * block
            queries += s.tokens
        dispatched += 1
        # Touch the request's blocks, its tail least recently (vLLM frees a request's blocks tail first).
        for b in reversed(blocks):
            if b in cache.lru:
                cache.lru.move_to_end(b)
            else:
                cache.lru[b] = True
                holders[b].add(pick)
        while len(cache.lru) > cache.capacity:
            old, _ = cache.lru.popitem(last=False)
            holders[old].discard(pick)
        in_flight[pick] += 1
        per[pick] += 1
        service = (1 + (s.tokens - got * block) / 1000) * rnd.uniform(0.75, 1.25)
        heapq.heappush(events, (now + service, client, pick, cid))

    for k in range(clients):
        dispatch(k)
    while events:
        now, client, replica, cid = heapq.heappop(events)
        in_flight[replica] -= 1
        sched.done(cid)
        dispatch(client)
        # A conversation back in the queue may now serve a client that found it empty.
        while sched.ready and len(events) < clients:
            dispatch(next(k for k in range(clients) if k not in {e[1] for e in events}))
    return SimResult(hits / max(queries, 1), per, moved)


class Schedule:
    """The open conversations' next turns in order: `active` conversations open at once, each back at the end of
    the queue once its turn is answered, the next conversation opened when one ends (the clients' think time is
    the others' turns in between)."""

    def __init__(self, w: Workload, active: int):
        from collections import deque

        self.w = w
        self.pending = deque(c.cid for c in w.conversations)
        self.ready: deque[int] = deque()
        self.turn: dict[int, int] = {}
        for _ in range(min(active, len(self.pending))):
            self._open()

    def _open(self) -> None:
        if self.pending:
            c = self.pending.popleft()
            self.turn[c] = 0
            self.ready.append(c)

    def next(self) -> tuple[int, int] | None:
        """The next request (conversation, turn), or None while no conversation is ready."""
        if not self.ready:
            return None
        c = self.ready.popleft()
        return c, self.turn[c]

    def done(self, cid: int) -> None:
        """Turn answered: the conversation's next turn queued, or the next conversation opened."""
        self.turn[cid] += 1
        if self.turn[cid] < len(self.w.conversation(cid).turns):
            self.ready.append(cid)
        else:
            self._open()


def chat_pool_kv_tokens() -> tuple[int, dict[str, Any]]:
    """The KV-token capacity per replica the capacity planner computes for Pulumi.prod.yaml's chat pool."""
    from components.planning.capacity import capacity_report
    from components.planning.load import load_stack_config
    from plan.stackfile import load_stack_file

    stack = load_stack_file(ROOT / "Pulumi.prod.yaml", "prod")
    spec = load_stack_config(stack.config, stack.secret_keys)
    est = capacity_report(spec)["chat"]["asDeployed"]
    return int(est["kv_tokens"]), est  # type: ignore[call-overload]


def estimated_tokens(w: Workload) -> dict[str, int]:
    """Token counts without a tokenizer (the cluster simulation's shape): 1.16 tokens a word, as the tiny
    tokenizer gives this text, plus the ChatML frame (5 tokens a message)."""
    out: dict[str, int] = {}
    for s in w.systems:
        out[s] = round(len(s.split()) * 1.16) + 5
    for c in w.conversations:
        for user, assistant in c.turns:
            out["user\0" + user] = round(len(user.split()) * 1.16) + 5
            out["assistant\0" + assistant] = round(len(assistant.split()) * 1.16) + 5
    return out


def cluster_table(w_shape: dict[str, Any], replicas_list: Sequence[int], seed: int = SEED) -> list[str]:
    """The simulation at the reference cluster's scale, as printed lines."""
    kv, est = chat_pool_kv_tokens()
    clients_per = int(est["max_num_seqs"])
    lines = [
        f"simulation at the reference cluster's scale: each replica {kv:,} KV tokens (the capacity planner's "
        f"estimate for Pulumi.prod.yaml's chat pool: {est['model']}, TP {est['tp']} on V100, {est['gpu_blocks']:,} "
        f"blocks of {GPU_BLOCK}), {clients_per} clients per replica (the pool's maxNumSeqs: a replica kept full)",
        f"  the same workload shape: {w_shape['systems']} system prompts of ~{SYSTEM_WORDS} words (~1.2k tokens), "
        f"{TURNS[0]}-{TURNS[1]} turns, 3 conversations per client and {ACTIVE // CLIENTS} open per client; 1.16 "
        f"tokens a word + 5 a message; blocks of {SIM_UNIT} tokens (hits rounded down to them); hit rates over the "
        "last two thirds of the requests (the first third fills the caches)",
        "  replicas  requests  least_conn  prefix (max/mean)  oracle (max/mean)  prefix/least_conn",
    ]
    for n in replicas_list:
        clients = clients_per * n
        w = workload(seed, systems=w_shape["systems"], conversations=3 * clients)
        tokens = estimated_tokens(w)
        segs = {
            (c.cid, t): prompt_segments(w, c.cid, t, tokens, 3) for c in w.conversations for t in range(len(c.turns))
        }
        res = {
            p: simulate(w, segs, n, kv // SIM_UNIT, SIM_UNIT, p, clients, clients * ACTIVE // CLIENTS, warmup=1 / 3)
            for p in ("least_conn", "prefix", "oracle")
        }
        lines.append(
            f"  {n:8d}  {len(segs):8d}  {res['least_conn'].hit:10.1%}  {res['prefix'].hit:6.1%} ({res['prefix'].spread:4.2f})"
            f"     {res['oracle'].hit:6.1%} ({res['oracle'].spread:4.2f})   {res['prefix'].hit / max(res['least_conn'].hit, 1e-9):5.2f}x"
        )
    return lines


# --- the real run (inside the namespace) -----------------------------------------------------------------


def _http(port: int, method: str, path: str, body: Any = None, timeout: float = 60) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def engine_counters(port: int) -> dict[str, float]:
    """A replica's prefix-cache queries and hits and its finished requests, from its own /metrics."""
    _, text = _http(port, "GET", "/metrics")
    out = {"queries": 0.0, "hits": 0.0, "requests": 0.0, "running": 0.0, "waiting": 0.0}
    names = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:request_success_total": "requests",
        "vllm:num_requests_running": "running",
        "vllm:num_requests_waiting": "waiting",
    }
    for line in text.decode().splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


def message_tokens(w: Workload, port: int) -> dict[str, int]:
    """Each distinct message's tokens as the replica's tokenizer counts it in its ChatML frame
    (`<|im_start|>role\\n…<|im_end|>\\n`: special tokens, so the counts add up message by message)."""
    out: dict[str, int] = {}

    def count(role: str, content: str) -> int:
        frame = f"<|im_start|>{role}\n{content}<|im_end|>\n"
        status, raw = _http(port, "POST", "/tokenize", {"model": SERVED, "prompt": frame, "add_special_tokens": False})
        if status != 200:
            raise SystemExit(f"/tokenize answered {status}: {raw[:300]!r}")
        return int(json.loads(raw)["count"])

    for s in w.systems:
        out[s] = count("system", s)
    for c in w.conversations:
        for user, assistant in c.turns:
            out["user\0" + user] = count("user", user)
            out["assistant\0" + assistant] = count("assistant", assistant)
    return out


@dataclass
class Outcome:
    cid: int
    turn: int
    status: int = 0
    ttft: float | None = None
    done: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0
    error: str = ""


def send(port: int, w: Workload, cid: int, turn: int) -> Outcome:
    """One streamed chat request through the gateway: TTFT to the first chunk with content."""
    out = Outcome(cid, turn)
    body = json.dumps(w.body(cid, turn)).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = out.started_at = time.monotonic()
    try:
        conn.request(
            "POST",
            f"/v1/chat/completions?r={cid}-{turn}",
            body=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"},
        )
        r = conn.getresponse()
        out.status = r.status
        if r.status != 200:
            out.error = r.read()[:200].decode(errors="replace")
            return out
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                out.done = True
                break
            event = json.loads(data)
            if out.ttft is None and any((c.get("delta") or {}).get("content") for c in event.get("choices") or []):
                out.ttft = time.monotonic() - t0
            if event.get("usage"):
                out.prompt_tokens = int(event["usage"]["prompt_tokens"])
                out.completion_tokens = int(event["usage"]["completion_tokens"])
    except (OSError, http.client.HTTPException, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        out.finished_at = time.monotonic()
    return out


def drive(port: int, w: Workload, clients: int, active: int, on_answer: Any = None) -> tuple[list[Outcome], float]:
    """The clients: each sends the next turn of the open conversation at the head of one queue (Schedule), so
    a conversation's turns come back among the others' (its think time) and interleave at the replicas."""
    sched = Schedule(w, active)
    cond = threading.Condition()
    busy = [0]
    results: list[Outcome] = []

    def client() -> None:
        while True:
            with cond:
                while True:
                    req = sched.next()
                    if req is not None:
                        busy[0] += 1
                        break
                    if busy[0] == 0:
                        return
                    cond.wait()
            o = send(port, w, *req)
            with cond:
                results.append(o)
                n = len(results)
                busy[0] -= 1
                sched.done(o.cid)
                cond.notify_all()
            if on_answer:
                on_answer(n)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.monotonic() - t0


class Gateway:
    """The generated gateway config of a one-pool stack (the chat pool on the replicas) on the deployed nginx."""

    def __init__(self, policy: str, ports: Sequence[int], root: Path):
        from components.planning.load import load_stack_config
        from plan.stackfile import load_stack_file
        from tests.support.deployed_nginx import deployed_nginx

        config = load_stack_file(ROOT / "Pulumi.prod.yaml", "prod").config
        config["llm-cluster:pools"].pop("reasoning")
        config["llm-cluster:models"].pop("deepseek-r1")
        config["llm-cluster:gateway"].update(
            tls=False,
            port=80,
            pathRoutes={},
            routing={"policy": policy},
            apiKeys=[{"id": "default", "rateLimit": {"requestsPerSecond": 100000, "burst": 100000}}],
        )
        spec = load_stack_config(config, set())
        nginx = deployed_nginx()
        self.root, self.spec, self.nginx = root, spec, nginx
        self.port, self.metrics_port = write_gateway(nginx, spec, root, {"chat": list(ports)})
        self.proc = subprocess.Popen(
            [*nginx.argv, "-p", str(root), "-c", str(root / "nginx.conf"), "-g", "daemon off;"],
            stderr=subprocess.PIPE,
        )
        for _ in range(200):
            if self.proc.poll() is not None:
                raise SystemExit(f"nginx failed: {self.proc.stderr.read().decode() if self.proc.stderr else ''}")
            try:
                _http(self.port, "GET", "/health", timeout=2)
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit("nginx did not listen")

    def served_by(self) -> dict[tuple[int, int], str]:
        """(conversation, turn) -> the replica that answered (the last address of the usage line's upstream)."""
        out = {}
        for f in sorted((self.root / "usage").glob("usage-*.log")):
            for line in f.read_text().splitlines():
                rec = json.loads(line)
                path = rec.get("path", "")
                if "?r=" in path and rec.get("upstream"):
                    cid, turn = path.split("?r=", 1)[1].split("-")
                    out[(int(cid), int(turn))] = rec["upstream"].split(",")[-1].strip()
        return out

    def routing(self) -> dict[str, float]:
        """llm_gateway_routing_total by outcome (read after the workers merged their counts: once a second)."""
        time.sleep(1.5)
        _, text = _http(self.metrics_port, "GET", "/metrics")
        out = {}
        for line in text.decode().splitlines():
            if line.startswith("llm_gateway_routing_total"):
                outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
                out[outcome] = float(line.rsplit(" ", 1)[1])
        return out

    def workers(self) -> set[int]:
        """The master's worker processes."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return {int(c) for c in children}

    def reload(self, ports: Sequence[int]) -> None:
        """The config rewritten for these replicas and reloaded (SIGHUP): new workers route to them only, the
        old ones finish the requests they hold and exit; returns once they have (the shared zones, in-flight
        counts and moved conversations, carry over)."""
        old = self.workers()
        write_gateway(self.nginx, self.spec, self.root, {"chat": list(ports)}, (self.port, self.metrics_port))
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 600
        while old & self.workers():
            if time.monotonic() > deadline:
                raise SystemExit(f"nginx's old workers {sorted(old & self.workers())} did not exit")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def start_replicas(n: int, blocks: int, log_dir: Path) -> list[Any]:
    from lab import vllm_cpu
    from tests.support import free_ports

    ns = vllm_cpu.Namespace(NS_NAME)  # already made by the outer process; serve() only names it
    ports = free_ports(n)
    cores = os.cpu_count() or 1
    servers = [
        vllm_cpu.serve(
            ns,
            MODEL,
            p,
            log_dir=log_dir,
            prefix_caching=True,
            num_blocks=blocks,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=MAX_NUM_SEQS,
            extra_env={"VLLM_CPU_OMP_THREADS_BIND": str(i % cores)},
        )
        for i, p in enumerate(ports)
    ]
    try:
        for s in servers:
            s.wait_healthy(600)
    except BaseException:
        stop_replicas(servers)
        raise
    return servers


def stop_replicas(servers: list[Any]) -> None:
    for s in servers:
        s.stop()


def _load() -> str:
    return "/".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def measure(policy: str, w: Workload, args: argparse.Namespace, work: Path, log: Any) -> dict[str, Any]:
    """One policy on freshly started replicas: the engines' counters around the run, the clients' figures."""
    t0 = time.monotonic()
    servers = start_replicas(args.replicas, args.blocks, work / f"logs-{policy}")
    started = time.monotonic() - t0
    ports = [s.port for s in servers]
    try:
        tokens = message_tokens(w, ports[0]) if policy == POLICIES[0] else None
        gw = Gateway(policy, ports, work / f"gw-{policy}")
        before = [engine_counters(p) for p in ports]
        load0 = _load()
        results, wall = drive(gw.port, w, args.clients, args.active)
        load1 = _load()
        after = [engine_counters(p) for p in ports]
        served = gw.served_by()
        routing = gw.routing()
        gw.stop()
        kill = drain = None
        if policy == "prefix" and args.kill:
            kill = kill_run(w, args, servers, work)
            try:
                drain = drain_run(w, args, [s for s in servers if s is not servers[0]], work)
            except Exception as e:  # the figures above stand without it
                log(f"drain run failed: {type(e).__name__}: {e}")
    finally:
        stop_replicas(servers)
    delta = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    hits = sum(d["hits"] for d in delta)
    queries = sum(d["queries"] for d in delta)
    per = [d["requests"] for d in delta]
    ok = [r for r in results if r.status == 200 and r.done]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    return {
        "policy": policy,
        "started_s": started,
        "wall_s": wall,
        "requests": len(results),
        "ok": len(ok),
        "hit": hits / max(queries, 1),
        "hits": hits,
        "queries": queries,
        "ttft_p50": pct(ttfts, 0.5),
        "ttft_p90": pct(ttfts, 0.9),
        "rps": len(ok) / wall,
        "prompt_tps": sum(r.prompt_tokens for r in ok) / wall,
        "output_tps": sum(r.completion_tokens for r in ok) / wall,
        "per_replica": per,
        "spread": max(per) / statistics.mean(per),
        "routing": routing,
        "load": (load0, load1),
        "tokens": tokens,
        "prompt_tokens": {(r.cid, r.turn): r.prompt_tokens for r in ok},
        "served": served,
        "kill": kill,
        "drain": drain,
    }


def stop_run(
    w: Workload,
    args: argparse.Namespace,
    servers: list[Any],
    victim: Any,
    gw: Gateway,
    stop: Any,
) -> dict[str, Any]:
    """The workload `w` under prefix affinity through `gw` over `servers`; once half its requests are answered,
    `stop(victim)` runs in a thread of its own (the clients go on). Counted: requests answered whole, cut
    mid-stream, failed; and each conversation's replica turn by turn (the gateway's usage log)."""
    addr = f"127.0.0.1:{victim.port}"
    half = w.requests() // 2
    event: list[float] = []
    threads: list[threading.Thread] = []

    def on_answer(n: int) -> None:
        if n == half and not event:
            event.append(time.monotonic())
            t = threading.Thread(target=stop, args=(victim,))
            t.start()
            threads.append(t)

    results, wall = drive(gw.port, w, args.clients, args.active, on_answer)
    for t in threads:
        t.join()
    served = gw.served_by()
    routing = gw.routing()
    gw.stop()
    out = {
        "requests": len(results),
        "whole": sum(r.status == 200 and r.done for r in results),
        "cut": sum(r.status == 200 and not r.done for r in results),
        "failed": sum(r.status != 200 for r in results),
        "routing": routing,
        "wall_s": wall,
        **turn_moves(results, served, event[0] if event else math.inf, addr),
    }
    return out


def turn_moves(
    results: list[Outcome], served: dict[tuple[int, int], str], t_event: float, victim: str
) -> dict[str, int]:
    """Each turn against its conversation's previous turn: did it change replica? Counted for the turns sent
    before the event, and after it for the conversations whose previous turn was on the victim and the others'."""
    started = {(r.cid, r.turn): r.started_at for r in results}
    out = dict.fromkeys(
        ("before", "before_moved", "victim", "victim_moved", "victim_on_it", "others", "others_moved"), 0
    )
    successors: dict[int, set[str]] = defaultdict(set)
    for (cid, turn), rep in sorted(served.items()):
        prev = served.get((cid, turn - 1))
        if prev is None or (cid, turn) not in started:
            continue
        if started[(cid, turn)] < t_event:
            out["before"] += 1
            out["before_moved"] += rep != prev
        elif prev == victim:
            out["victim"] += 1
            out["victim_moved"] += rep != prev
            out["victim_on_it"] += rep == victim
            successors[cid].add(rep)
        else:
            out["others"] += 1
            out["others_moved"] += rep != prev
            if cid in successors:
                successors[cid].add(rep)
    # The victim's conversations after the event: on how many replicas each (one: its successor kept it).
    out["victim_convs"] = len(successors)
    out["victim_convs_one_replica"] = sum(len(v) == 1 for v in successors.values())
    return out


def kill_run(w: Workload, args: argparse.Namespace, servers: list[Any], work: Path) -> dict[str, Any]:
    """The first half of the conversations again on the prefix run's replicas through a fresh gateway;
    replica 0 SIGKILLed halfway: a crash (what it was streaming is cut: nginx cannot resend a begun answer)."""
    gw = Gateway("prefix", [s.port for s in servers], work / "gw-kill")
    half = Workload(w.systems, w.conversations[: len(w.conversations) // 2])
    return stop_run(half, args, servers, servers[0], gw, lambda v: os.killpg(v.proc.pid, signal.SIGKILL))


def drain_run(w: Workload, args: argparse.Namespace, servers: list[Any], work: Path) -> dict[str, Any]:
    """The other half of the conversations on the replicas still up, replica 1 stopped the way a rolling
    restart should: the gateway first (its config rewritten without the replica and reloaded: the new worker
    never sends to it, the old one finishes what it started), then, once the old worker has exited and the
    engine runs and queues nothing, SIGTERM to the replica (vLLM 0.19.1 aborts what it still runs on SIGTERM
    unless --shutdown-timeout is set, and answers a request that arrives while it drains with an aborted
    stream: the gateway must stop sending first)."""
    ports = [s.port for s in servers]
    gw = Gateway("prefix", ports, work / "gw-drain")
    rest = Workload(w.systems, w.conversations[len(w.conversations) // 2 :])
    timings: dict[str, float] = {}

    def drain(victim: Any) -> None:
        t0 = time.monotonic()
        gw.reload([p for p in ports if p != victim.port])
        timings["old_worker_s"] = time.monotonic() - t0
        while True:
            c = engine_counters(victim.port)
            if c["running"] + c["waiting"] == 0:
                break
            time.sleep(0.1)
        timings["idle_s"] = time.monotonic() - t0
        victim.stop()
        timings["stopped_s"] = time.monotonic() - t0

    out = stop_run(rest, args, servers, servers[1], gw, drain)
    return {**out, **timings}


def timing_range(
    w: Workload, segs: dict[tuple[int, int], Segments], args: argparse.Namespace, seeds: int = 20
) -> tuple[dict[str, float], dict[str, float]]:
    """The lowest and highest simulated hit rates of least_conn and prefix, and their ratio, over `seeds` jitters."""
    runs = []
    for d in range(SEED, SEED + seeds):
        lc, pf = (
            simulate(w, segs, args.replicas, args.blocks, CPU_BLOCK, p, args.clients, args.active, seed=d).hit
            for p in ("least_conn", "prefix")
        )
        runs.append({"least_conn": lc, "prefix": pf, "ratio": pf / max(lc, 1e-9)})
    return {k: min(r[k] for r in runs) for k in runs[0]}, {k: max(r[k] for r in runs) for k in runs[0]}


def inside(args: argparse.Namespace) -> None:
    """The bench inside the loopback-only namespace: both policies, the oracle, the simulations."""

    def log(msg: str) -> None:
        print(msg, flush=True)

    w = workload(conversations=args.conversations, systems=args.systems)
    work = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    work.chmod(0o755)
    log(
        f"workload: seed {SEED}, {len(w.systems)} system prompts of ~{SYSTEM_WORDS} words, {len(w.conversations)} "
        f"conversations of {TURNS[0]}-{TURNS[1]} turns ({w.requests()} requests, each the whole history, streamed, "
        f"{MAX_TOKENS} tokens out), {args.clients} clients"
    )
    log(
        f"engines: {args.replicas} x vLLM 0.19.1 CPU, {MODEL}, prefix caching on, KV cache {args.blocks} blocks x "
        f"{CPU_BLOCK} = {args.blocks * CPU_BLOCK:,} tokens per replica, max-model-len {MAX_MODEL_LEN}, "
        f"max-num-seqs {MAX_NUM_SEQS}, one core each; gateway: deployed nginx + Lua, the generated config"
    )
    runs = {}
    for policy in POLICIES:
        runs[policy] = measure(policy, w, args, work, log)
        r = runs[policy]
        log(
            f"{policy:10s} hit rate {r['hit']:6.1%} ({r['hits']:,.0f}/{r['queries']:,.0f} tokens)  TTFT p50 "
            f"{r['ttft_p50'] * 1000:6.0f} ms p90 {r['ttft_p90'] * 1000:6.0f} ms  {r['rps']:.2f} req/s "
            f"{r['prompt_tps']:,.0f} prompt tok/s {r['output_tps']:.0f} output tok/s  max/mean {r['spread']:.2f} "
            f"{[int(x) for x in r['per_replica']]}  answered {r['ok']}/{r['requests']} in {r['wall_s']:.0f} s  "
            f"(replicas up in {r['started_s']:.0f} s; load {r['load'][0]} -> {r['load'][1]}; gateway "
            f"{ {k: int(v) for k, v in r['routing'].items()} })"
        )
    tokens = runs[POLICIES[0]]["tokens"]
    measured = runs["prefix"]["prompt_tokens"]
    bare = {k: prompt_segments(w, k[0], k[1], tokens).tokens for k in measured}
    # The template's tokens beyond the messages' own (the generation prompt), from the engines' usage.
    overhead = int(statistics.median(v - bare[k] for k, v in measured.items()))
    segs = {
        (c.cid, t): prompt_segments(w, c.cid, t, tokens, overhead) for c in w.conversations for t in range(len(c.turns))
    }
    diffs = [abs(segs[k].tokens - v) for k, v in measured.items()]
    log(
        f"simulated prompts (messages counted by the replica's /tokenize, + {overhead} template tokens) against the "
        f"engines' usage: mean |error| {statistics.mean(diffs):.1f} tokens, max {max(diffs)} (of "
        f"{statistics.mean(measured.values()):.0f} a prompt on average)"
    )
    sim = {
        p: simulate(w, segs, args.replicas, args.blocks, CPU_BLOCK, p, args.clients, args.active)
        for p in ("least_conn", "prefix", "oracle")
    }
    one = (w, segs, args.replicas, args.blocks, CPU_BLOCK, "prefix", args.clients, args.active)
    unbounded = simulate(*one, floor=10**6)
    unsticky = simulate(*one, sticky=False)
    batch_floor = simulate(*one, floor=MAX_NUM_SEQS, sticky=False)
    log(
        f"simulated at the bench's scale ({args.replicas} replicas x {args.blocks} blocks of {CPU_BLOCK}): least_conn "
        f"{sim['least_conn'].hit:.1%}, prefix {sim['prefix'].hit:.1%} (max/mean {sim['prefix'].spread:.2f}, "
        f"{sim['prefix'].moved} turns moved), oracle {sim['oracle'].hit:.1%} (the limit: longest cached prefix, load "
        f"ignored; max/mean {sim['oracle'].spread:.2f}); prefix without the load bound {unbounded.hit:.1%} (max/mean "
        f"{unbounded.spread:.2f}); moved turns sent back (stickySeconds 0) {unsticky.hit:.1%} (max/mean "
        f"{unsticky.spread:.2f}, {unsticky.moved} moved); the floor at max-num-seqs ({MAX_NUM_SEQS}) instead "
        f"{batch_floor.hit:.1%} (max/mean {batch_floor.spread:.2f}, {batch_floor.moved} moved)"
    )
    # The run's timing decides which replica least_conn picks: the same requests under 20 service-time jitters.
    lo, hi = timing_range(w, segs, args)
    log(
        f"simulated over 20 timings (jitter seeds {SEED}-{SEED + 19}): least_conn {lo['least_conn']:.1%}-"
        f"{hi['least_conn']:.1%}, prefix {lo['prefix']:.1%}-{hi['prefix']:.1%}, prefix/least_conn {lo['ratio']:.2f}-"
        f"{hi['ratio']:.2f}x (least_conn's hits follow the share of turns that land on their previous replica by chance)"
    )
    for name, what, r in (
        ("kill run", "replica 0 SIGKILLed (a crash)", runs["prefix"]["kill"]),
        ("drain run", "replica 1 stopped gateway first (a rolling restart)", runs["prefix"]["drain"]),
    ):
        if r:
            log(
                f"{name} (prefix, {'the first' if name == 'kill run' else 'the other'} {len(w.conversations) // 2} "
                f"conversations, {what} after {r['requests'] // 2} answers): {r['whole']}/{r['requests']} answered "
                f"whole, {r['cut']} cut mid-stream, {r['failed']} failed; turns that changed replica from their "
                f"conversation's previous turn: before the stop {r['before_moved']}/{r['before']} (the load bound), "
                f"after it {r['victim_moved']}/{r['victim']} of the stopped replica's conversations ({r['victim_on_it']} "
                f"still sent to it; {r['victim_convs_one_replica']} of {r['victim_convs']} kept on one successor) and "
                f"{r['others_moved']}/{r['others']} of the others'; gateway {dict((k, int(v)) for k, v in r['routing'].items())}"
                + (
                    f"; reload to the old worker's exit {r['old_worker_s']:.1f} s, engine idle at {r['idle_s']:.1f} s, "
                    f"stopped at {r['stopped_s']:.1f} s"
                    if "old_worker_s" in r
                    else ""
                )
            )
    log(f"logs (each replica's output, the gateways' configs and usage files): {work}")
    if not args.no_cluster:
        for line in cluster_table({"systems": len(w.systems)}, args.cluster):
            log(line)
    log(summary_line(runs["least_conn"], runs["prefix"]))


def summary_line(lc: dict[str, Any], pf: dict[str, Any]) -> str:
    """The bench's last line, for scripts: prefix's engine hit rate and client TTFT p50 over least_conn's, and
    the prefix run's max/mean requests per replica."""
    return (
        f"routing: hit-rate {pf['hit'] / max(lc['hit'], 1e-9):.2f}x, ttft-p50 {pf['ttft_p50'] / lc['ttft_p50']:.2f}x, "
        f"max/mean {pf['spread']:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing", description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=REPLICAS)
    ap.add_argument("--clients", type=int, default=CLIENTS)
    ap.add_argument("--conversations", type=int, default=CONVERSATIONS)
    ap.add_argument("--systems", type=int, default=SYSTEMS, help="system prompts (tenants)")
    ap.add_argument("--active", type=int, default=ACTIVE, help="conversations open at once")
    ap.add_argument("--blocks", type=int, default=BLOCKS, help="KV blocks of 128 tokens per replica")
    ap.add_argument("--no-kill", dest="kill", action="store_false", help="skip the kill run")
    ap.add_argument("--no-cluster", action="store_true", help="skip the cluster-scale simulation")
    ap.add_argument("--cluster", type=int, nargs="*", default=[4, 16, 64], help="replica counts simulated")
    ap.add_argument("--sim-only", action="store_true", help="only the cluster-scale simulation (no engine)")
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sim_only:
        for line in cluster_table({"systems": args.systems}, args.cluster):
            print(line, flush=True)
        return 0
    if args.inside:
        inside(args)
        return 0
    from lab import vllm_cpu

    why = vllm_cpu.can_run()
    if why:
        print(f"bench.routing: skipped: {why}", file=sys.stderr)
        return 0
    vllm_cpu.model(MODEL)  # the engine and the tiny model, cached (installed once per machine)
    from tests.support.deployed_nginx import deployed_nginx

    deployed_nginx()  # fetched once per machine, before the namespace (which reaches nothing)
    with vllm_cpu.Namespace(NS_NAME) as ns:
        assert ns.links() == ["lo"] and not ns.outside_routes(), "the bench's namespace must have only loopback"
        cmd = ["ip", "netns", "exec", ns.ns, sys.executable, "-m", "bench.routing", "--inside", *(argv or sys.argv[1:])]
        return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
