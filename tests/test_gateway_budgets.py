"""Per-key token budgets and concurrency caps on the real nginx + Lua the image deploys, two workers.

Budgets count the usage the gateway reads from responses (prompt + completion tokens) in a
lua_shared_dict (gateway_budget.lua), so every worker sees one count per key and window. Which
worker holds a connection is read from the kernel (`ss -p`), so the tests show the counts and caps
hold across workers rather than assume it. A request's tokens are charged in the log phase, before
its usage line is written: a test waits for that line before the next request reads the count.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.planning.gateway import nginx as gateway
from components.planning.gateway.limits import BUDGET_ZONE
from components.planning.gateway.nginx import gateway_files, render_gateway, temp_path_directives
from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from tests.conftest import prod_config
from tests.support import free_port, tool
from tests.support.gateway import (
    CHAT,
    USAGE,
    WAIT,
    FakeReplica,
    NginxGateway,
    error_code,
    gateway_config,
    log_line,
    lua_layout,
    nginx_binary,
    own_gateway,
)

LONG = 31 * 86400  # a window no test run crosses (its end is at most once a month)
SHORT = 3  # seconds: the window the reset test waits out


def budget_config() -> dict[str, Any]:
    return gateway_config(
        apiKeys=[
            {"id": "default"},
            {"id": "metered", "tokenBudget": {"tokens": 40, "windowSeconds": LONG}},
            {"id": "streamer", "tokenBudget": {"tokens": 1000, "windowSeconds": LONG}},
            {"id": "cutter", "tokenBudget": {"tokens": 1000, "windowSeconds": LONG}},
            {"id": "across", "tokenBudget": {"tokens": 30, "windowSeconds": LONG}},
            {"id": "short", "tokenBudget": {"tokens": 1, "windowSeconds": SHORT}},
            {"id": "capped", "maxConcurrent": 2},
            {"id": "reloaded", "tokenBudget": {"tokens": 20, "windowSeconds": LONG}},
            {"id": "spanner", "tokenBudget": {"tokens": 1000, "windowSeconds": SHORT}},
            {
                "id": "reader",
                "tokenBudget": {"tokens": 100, "windowSeconds": LONG},
                "rateLimit": {"requestsPerSecond": 1 / 60, "burst": 1},
            },
        ]
    )


@pytest.fixture(scope="module")
def gw_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NginxGateway, dict[str, str]]]:
    spec = load_stack_config(budget_config(), set())
    pools = {"chat": [FakeReplica(f"chat-{i}") for i in range(2)], "reasoning": [FakeReplica("reasoning-0")]}
    with own_gateway(spec, pools, tmp_path_factory.mktemp("budgets")) as (gw, keys):
        gw.pools = pools  # type: ignore[attr-defined]
        yield gw, keys


def chat(
    gw: NginxGateway,
    key: str,
    marker: str,
    conn: http.client.HTTPConnection | None = None,
    logged: bool = True,
    **body: Any,
) -> tuple[int, dict[str, str], Any]:
    """One chat completion (on `conn` when given, kept alive), and its log line waited for unless not
    `logged` (nginx ends a request's log phase, its charge, before it reads the connection's next)."""
    payload = json.dumps({"model": CHAT, **body}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
    try:
        c.request("POST", f"/v1/chat/completions?t={marker}", payload, headers)
        resp = c.getresponse()
        text = resp.read().decode()
    finally:
        if own:
            c.close()
    try:
        out: Any = json.loads(text)
    except ValueError:
        out = text
    if logged:
        log_line(gw, marker)
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, out


def window_end(seconds: int, at: float) -> float:
    return (math.floor(at / seconds) + 1) * seconds


# --- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"apiKeys": [{"id": "a", "tokenBudget": {"tokens": 0}}]},
            "gateway.apiKeys[0].tokenBudget.tokens: 0 is not allowed: must be at least 1",
        ),
        (
            {"apiKeys": [{"id": "a", "tokenBudget": {"tokens": 10, "windowSeconds": 0}}]},
            "gateway.apiKeys[0].tokenBudget.windowSeconds: 0 is not allowed: must be at least 1",
        ),
        (
            {"apiKeys": [{"id": "a", "tokenBudget": {"tokens": 10, "windowSeconds": 31 * 86400 + 1}}]},
            "gateway.apiKeys[0].tokenBudget.windowSeconds: 2678401 is not allowed: must be at most 2678400",
        ),
        (
            {"defaultTokenBudget": {"tokens": "many"}},
            "gateway.defaultTokenBudget.tokens: 'many' is not allowed: expected a whole number",
        ),
        (
            {"defaultTokenBudget": {"tokens": 10, "window": 60}},
            "gateway.defaultTokenBudget.window: unknown key 'window'; allowed keys here: tokens, windowSeconds",
        ),
        (
            {"defaultTokenBudget": {"tokens": 10}, "auth": False, "apiKeys": []},
            "gateway.defaultTokenBudget: keys and limits are not checked when auth is false; remove them or set auth: true",
        ),
    ],
)
def test_budget_keys_are_validated_naming_the_key(change: dict[str, Any], message: str) -> None:
    config = prod_config()
    config["llm-cluster:gateway"].update(change)
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    assert str(err.value) == message


LONGEST_ID = "k" * 58  # + 5 digits: the longest key id (NAME_PATTERN: 63 characters)


@pytest.mark.parametrize("keys", [1950, 3900])  # the most keys 1 MiB and 2 MiB are given for
def test_the_zone_holds_two_of_the_longest_counts_of_every_key(keys: int, tmp_path: Path) -> None:
    """The size the gateway gives the zone, on the deployed nginx: every key's count and a second one
    (a reload changed its window) fit, each of the longest shape, without evicting any."""
    config = prod_config()
    config["llm-cluster:gateway"].update(
        apiKeys=[
            {"id": f"{LONGEST_ID}{i:05d}", "tokenBudget": {"tokens": 1, "windowSeconds": LONG}} for i in range(keys)
        ]
    )
    zone = next(
        line
        for line in gateway_files(load_stack_config(config, set()))["nginx.conf"].splitlines()
        if line.startswith(f"    lua_shared_dict {BUDGET_ZONE} ")
    )
    lua = lua_layout()
    for _ in range(5):  # a free port another process takes before nginx binds it: try another
        port = free_port()
        (tmp_path / "nginx.conf").write_text(
            "\n".join(
                [
                    *(f"load_module {m};" for m in lua["load_modules"]),
                    f"pid {tmp_path}/nginx.pid;",
                    f"error_log {tmp_path}/error.log warn;",
                    "events {}",
                    "http {",
                    *(f"    {line}" for line in temp_path_directives(tmp_path)),
                    f'    lua_package_path "{lua["lua_path"]};;";',
                    zone,
                    "    access_log off;",
                    f"    server {{ listen 127.0.0.1:{port}; location = /fill {{ content_by_lua_block {{",
                    f"        local dict = ngx.shared.{BUDGET_ZONE}",
                    f"        for i = 0, {2 * keys - 1} do",
                    # the shape of gateway_budget's counts, "<id>/<window seconds>"; the second a shorter window
                    f'            local key = "{LONGEST_ID}" .. string.format("%05d", i % {keys}) .. (i < {keys} and "/{LONG}" or "/2678399")',
                    "            local ok, err = dict:safe_add(key, 1, 60)",
                    '            if not ok then return ngx.say("count ", i, " did not fit: ", err) end',
                    "        end",
                    '        ngx.say("all fit")',
                    "    } } }",
                    "}",
                    "",
                ]
            )
        )
        proc = subprocess.Popen(
            [nginx_binary(), "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + WAIT
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/fill", timeout=WAIT) as resp:
                        assert resp.read().decode() == "all fit\n"
                    return
                except OSError:
                    if proc.poll() is not None:
                        said = proc.stderr.read().decode() if proc.stderr else ""
                        if "Address already in use" in said:
                            break
                        pytest.fail(f"nginx exited: {said}")
                    if time.monotonic() > deadline:
                        pytest.fail("nginx did not serve /fill")
                    time.sleep(0.05)
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(WAIT)
    pytest.fail("nginx found no free port in five tries")


# --- budgets on real nginx ---------------------------------------------------------------------------


def test_a_used_up_budget_is_a_429_with_the_headers_clients_read(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    pools: dict[str, list[FakeReplica]] = gw.pools  # type: ignore[attr-defined]
    total = USAGE["total_tokens"]  # 18 a completion: admitted at 0, 18 and 36 of 40
    seen = []
    for i in range(3):
        status, headers, _ = chat(gw, keys["metered"], f"m{i}", rid=f"m{i}")
        seen.append((status, headers["x-ratelimit-limit-tokens"], headers["x-ratelimit-remaining-tokens"]))
    assert seen == [(200, "40", "40"), (200, "40", "22"), (200, "40", "4")]
    before = time.time()
    status, headers, out = chat(gw, keys["metered"], "m3", rid="m3")
    after = time.time()
    assert status == 429 and error_code(out) == "rate_limit_exceeded" and out["error"]["type"] == "tokens"
    assert out["error"]["message"] == (
        "Token budget reached for this API key (40 tokens in this window); retry after the seconds in Retry-After."
    )
    assert (headers["x-ratelimit-limit-tokens"], headers["x-ratelimit-remaining-tokens"]) == ("40", "0")
    # Retry-After: the seconds until the window ends, as seen between sending and the answer.
    retry = int(headers["retry-after"])
    assert math.ceil(window_end(LONG, after) - after) <= retry <= math.ceil(window_end(LONG, before) - before)
    m, s = re.fullmatch(r"(\d+)m(\d+)s", headers["x-ratelimit-reset-tokens"]).groups()  # type: ignore[union-attr]
    assert int(m) * 60 + int(s) == retry
    # Charged what each answer's usage said; the refused request reached no replica and costs nothing.
    assert [log_line(gw, f"m{i}")["budget_tokens"] for i in range(4)] == [total, total, total, None]
    assert "m3" not in [rid for rs in pools.values() for r in rs for rid in r.rids()]
    # Other keys are not held by it, and a key without a budget gets no token headers.
    status, headers, _ = chat(gw, keys["default"], "d0")
    assert status == 200 and not [h for h in headers if h.endswith("-tokens")]
    assert log_line(gw, "d0")["budget_tokens"] is None


def test_every_answer_to_a_key_with_a_budget_says_what_is_left(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    tokens = ("x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens")
    # The router's own refusal; an answer; then nginx's own (the key's rate limit: 1 a minute, burst 1).
    status, headers, out = gw.call("POST", "/v1/chat/completions?t=rd0", {"model": "nope"}, keys["reader"])
    assert (status, error_code(out), tuple(headers[h] for h in tokens)) == (404, "model_not_found", ("100", "100"))
    status, headers, _ = chat(gw, keys["reader"], "rd1")
    assert (status, tuple(headers[h] for h in tokens)) == (200, ("100", "100"))
    status, headers, out = gw.call("POST", "/v1/chat/completions?t=rd2", {"model": CHAT}, keys["reader"])
    assert (status, error_code(out), headers["x-ratelimit-remaining-requests"], tuple(headers[h] for h in tokens)) == (
        429,
        "rate_limit_exceeded",
        "0",
        ("100", "82"),
    )
    # Refusals cost nothing.
    assert [log_line(gw, m)["budget_tokens"] for m in ("rd0", "rd1", "rd2")] == [None, USAGE["total_tokens"], None]
    # What nginx refuses before the budget is read carries none: no key (401), a body over
    # maxBodyMib by its Content-Length (413).
    status, headers, _ = gw.call("POST", "/v1/chat/completions", {"model": CHAT})
    assert status == 401 and not [h for h in headers if h.endswith("-tokens")]
    status, headers, _ = gw.call("POST", "/v1/chat/completions", raw=b"x" * (2 * 2**20 + 1), key=keys["reader"])
    assert status == 413 and not [h for h in headers if h.endswith("-tokens")]


def test_streamed_answers_are_charged_from_their_usage_or_their_events(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    gw, keys = gw_keys
    status, _, text = chat(gw, keys["streamer"], "s0", stream=True, stream_options={"include_usage": True})
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    assert log_line(gw, "s0")["budget_tokens"] == 8  # the usage chunk's total_tokens
    # Without include_usage no count comes back: one token per event sent (3 deltas and [DONE]).
    status, _, text = chat(gw, keys["streamer"], "s1", stream=True)
    line = log_line(gw, "s1")
    assert status == 200 and (line["total_tokens"], line["events"], line["budget_tokens"]) == (None, 4, 4)
    status, headers, _ = chat(gw, keys["streamer"], "s2")
    assert status == 200 and headers["x-ratelimit-remaining-tokens"] == str(1000 - 8 - 4)


def test_a_stream_the_client_cut_off_is_charged_the_events_it_was_sent(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    gw, keys = gw_keys
    pools: dict[str, list[FakeReplica]] = gw.pools  # type: ignore[attr-defined]
    before = chat(gw, keys["cutter"], "c0")[1]["x-ratelimit-remaining-tokens"]
    charged0 = log_line(gw, "c0")["budget_tokens"]
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
    body = {"model": CHAT, "stream": True, "stream_options": {"include_usage": True}, "gate": "cut-budget"}
    conn.request(
        "POST",
        "/v1/chat/completions?t=c1",
        json.dumps(body),
        {"Authorization": f"Bearer {keys['cutter']}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert b'"t0"' in resp.read1(65536)  # the first event, then the client goes away
    assert conn.sock is not None
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    for r in pools["chat"]:
        r.gates["cut-budget"].set()  # the replica goes on; nginx finds the client gone
    cut = log_line(gw, "c1")
    assert (cut["completed"], cut["total_tokens"]) == ("", None) and cut["events"] >= 1
    assert cut["budget_tokens"] == cut["events"]
    after = chat(gw, keys["cutter"], "c2")[1]["x-ratelimit-remaining-tokens"]
    assert int(before) - int(after) == charged0 + cut["events"]


def test_a_budget_counts_again_from_zero_when_its_window_ends(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    for attempt in range(3):
        # Start just after a window begins, so the first two requests land in one window.
        while time.time() % SHORT > 0.2:
            time.sleep(0.02)
        t0 = time.time()
        status, _, _ = chat(gw, keys["short"], f"w{attempt}-0")
        assert status == 200  # 18 tokens against a budget of 1: the window is used up
        end = window_end(SHORT, t0)
        answers = []
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            sent = time.time()
            status, headers, _ = chat(gw, keys["short"], f"w{attempt}-{len(answers) + 1}")
            answers.append((sent, time.time(), status, headers))
            if status == 200:
                break
        assert answers and answers[-1][2] == 200, "the budget never came back"
        if time.time() < end or answers[0][0] >= end or time.time() - t0 > 2 * SHORT:
            continue  # the machine stalled past the window before the second request: start again
        refused = answers[:-1]
        assert refused, "the window was used up, yet the next request was admitted"
        # Refused only while the window lasted; admitted again once it had ended.
        assert all(sent < end and status == 429 for sent, _, status, _ in refused)
        assert answers[-1][1] >= end
        assert all(int(h["retry-after"]) <= SHORT for _, _, _, h in refused)
        assert answers[-1][3]["x-ratelimit-remaining-tokens"] == "1"
        return
    pytest.fail("no attempt kept two requests in one window (machine too loaded?)")


def test_a_stream_that_outlasts_its_window_is_charged_in_the_window_it_ends_in(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    """Its tokens count where they are reported: a stream longer than its window is not free."""
    gw, keys = gw_keys
    pools: dict[str, list[FakeReplica]] = gw.pools  # type: ignore[attr-defined]
    for attempt in range(3):
        start = window_end(SHORT, time.time())  # a window no earlier attempt charged
        while time.time() < start:
            time.sleep(0.01)
        gate = f"span-{attempt}"
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
        body = {"model": CHAT, "stream": True, "stream_options": {"include_usage": True}, "gate": gate}
        conn.request(
            "POST",
            f"/v1/chat/completions?t=span{attempt}",
            json.dumps(body),
            {"Authorization": f"Bearer {keys['spanner']}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        admitted = time.time()
        assert resp.status == 200 and b'"t0"' in resp.read1(65536)
        end = window_end(SHORT, start)
        while time.time() < end + 0.05:
            time.sleep(0.01)
        for r in pools["chat"]:
            r.gates[gate].set()  # the stream ends in the next window
        assert resp.read().endswith(b"data: [DONE]\n\n")
        conn.close()
        assert log_line(gw, f"span{attempt}")["budget_tokens"] == 8  # the usage chunk's total_tokens
        status, headers, _ = chat(gw, keys["spanner"], f"span{attempt}-after", logged=False)
        if admitted >= end or time.time() >= end + SHORT:
            continue  # the machine stalled: the stream began after its window, or the check came too late
        # Charged in the window it ended in (the one it began in has no count left to matter).
        assert (status, headers["x-ratelimit-remaining-tokens"]) == (200, str(1000 - 8))
        return
    pytest.fail("no attempt kept the stream's start and the check each in its own window (machine too loaded?)")


def test_a_full_zone_fails_open_keeps_every_count_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zone too small for its keys' counts (the gateway sizes it for two of every key; 12k is the
    least lua_shared_dict takes): a count that does not fit is not kept, and no other is evicted."""
    monkeypatch.setattr(gateway, "budget_zone_kib", lambda spec: 12)
    ids = [f"f{i}" for i in range(40)]
    spec = load_stack_config(
        gateway_config(apiKeys=[{"id": i, "tokenBudget": {"tokens": 10, "windowSeconds": LONG}} for i in ids]), set()
    )
    pools = {"chat": [FakeReplica("chat-0")], "reasoning": [FakeReplica("reasoning-0")]}
    with own_gateway(spec, pools, tmp_path) as (gw, keys):
        assert f"    lua_shared_dict {BUDGET_ZONE} 12k;\n" in gw.files["nginx.conf"]
        # One kept-alive connection: one worker, whose log says each uncounted key once per window.
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
        assert [chat(gw, keys[i], f"z-{i}", conn, logged=False)[0] for i in ids] == [200] * len(ids)
        charged = {i: log_line(gw, f"z-{i}")["budget_tokens"] for i in ids}
        fit = len([i for i in ids if charged[i] == USAGE["total_tokens"]])
        assert 0 < fit < len(ids) and [charged[i] for i in ids[fit:]] == [None] * (len(ids) - fit), charged
        first_out = ids[fit]
        # Fails open: the key without a count is served again (counted, its 18 of 10 would refuse it).
        status, headers, _ = chat(gw, keys[first_out], "z-again", conn, logged=False)
        assert (status, headers["x-ratelimit-remaining-tokens"]) == (200, "10")
        # Every count that fit is kept: the least recently charged one (the first an evicting
        # incr would drop) still refuses its key.
        status, _, out = chat(gw, keys[ids[0]], "z-first", conn, logged=False)
        assert status == 429 and error_code(out) == "rate_limit_exceeded"
        conn.close()
        log_line(gw, "z-first")
        said = re.findall(
            r"\[error\] .*?(token budget: .*?) while logging request, client: ", (gw.root / "error.log").read_text()
        )
    assert said == [
        f"token budget: 18 tokens of key '{i}' not counted (no memory): the lua_shared_dict "
        f"{BUDGET_ZONE} (12288 bytes, sized from the keys with gateway.apiKeys[].tokenBudget or "
        "gateway.defaultTokenBudget) has no room for its count; the key's requests are admitted "
        "without one until it has"
        for i in ids[fit:]
    ]


def test_counts_outlive_a_reload(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    assert chat(gw, keys["reloaded"], "r0")[0] == 200  # 18 of 20
    gw.reload()
    # New workers, the same shared dict: admitted at 18, refused at 36 (a fresh count would admit both).
    assert [chat(gw, keys["reloaded"], f"r{i}")[0] for i in (1, 2)] == [200, 429]


def test_a_changed_budget_keeps_its_count_and_a_changed_window_starts_a_new_one(tmp_path: Path) -> None:
    """A deployment that changes budgets reloads nginx (config_script): a key's count carries over to
    its new number of tokens, while a new window length is a new window, counted from 0."""

    def budgets(raised: int, window: int) -> StackSpec:
        return load_stack_config(
            gateway_config(
                apiKeys=[
                    {"id": "raised", "tokenBudget": {"tokens": raised, "windowSeconds": LONG}},
                    {"id": "rewindowed", "tokenBudget": {"tokens": 20, "windowSeconds": window}},
                ]
            ),
            set(),
        )

    pools = {"chat": [FakeReplica("chat-0")], "reasoning": [FakeReplica("reasoning-0")]}
    with own_gateway(budgets(20, LONG), pools, tmp_path) as (gw, keys):
        assert [chat(gw, keys[k], f"c-{k}")[0] for k in ("raised", "rewindowed")] == [200, 200]  # 18 of 20 each
        files = render_gateway(
            budgets(100, 86400), gw.layout, {p: [("127.0.0.1", r.port) for r in rs] for p, rs in pools.items()}
        )
        (gw.conf_dir / "nginx.conf").write_text(files["nginx.conf"])
        gw.reload()
        answers = [chat(gw, keys[k], f"d-{k}") for k in ("raised", "rewindowed")]
    assert [
        (status, headers["x-ratelimit-limit-tokens"], headers["x-ratelimit-remaining-tokens"])
        for status, headers, _ in answers
    ] == [(200, "100", "82"), (200, "20", "20")]


# --- across workers --------------------------------------------------------------------------------


def worker_of(gw: NginxGateway, conn: http.client.HTTPConnection) -> int:
    """The pid of the nginx worker holding this client connection, as the kernel reports it."""
    assert conn.sock is not None
    client_port = conn.sock.getsockname()[1]
    out = subprocess.run(
        [tool("ss"), "-Htnp", "state", "established", f"( sport = :{gw.port} and dport = :{client_port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pids = set(re.findall(r"pid=(\d+)", out))
    assert len(pids) == 1, out
    return int(pids.pop())


def connections_on_both_workers(gw: NginxGateway, key: str) -> dict[int, list[http.client.HTTPConnection]]:
    """Kept-alive connections until each of nginx's two workers holds at least two."""
    by_worker: dict[int, list[http.client.HTTPConnection]] = {}
    for _ in range(64):
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {key}"})
        conn.getresponse().read()  # answered: a worker has accepted it
        by_worker.setdefault(worker_of(gw, conn), []).append(conn)
        if len(by_worker) == 2 and all(len(c) >= 2 for c in by_worker.values()):
            return by_worker
    pytest.fail(f"nginx's two workers did not both take connections: {by_worker}")


def test_one_count_per_key_for_every_worker(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    (a, a_conns), (b, b_conns) = connections_on_both_workers(gw, keys["default"]).items()
    # 18 tokens a request against 30: worker a admits at 0, worker b at 18, and a refuses at 36 —
    # each worker alone would have seen 18 at most.
    first = chat(gw, keys["across"], "x0", a_conns[0])
    second = chat(gw, keys["across"], "x1", b_conns[0])
    third = chat(gw, keys["across"], "x2", a_conns[1])
    fourth = chat(gw, keys["across"], "x3", b_conns[1])
    assert [(s, h["x-ratelimit-remaining-tokens"]) for s, h, _ in (first, second, third, fourth)] == [
        (200, "30"),
        (200, "12"),
        (429, "0"),
        (429, "0"),
    ]
    assert {worker_of(gw, c) for c in (a_conns[0], a_conns[1])} == {a} and {worker_of(gw, c) for c in b_conns[:2]} == {
        b
    }
    for conns in (a_conns, b_conns):
        for c in conns:
            c.close()


def test_the_concurrency_cap_holds_across_workers(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    pools: dict[str, list[FakeReplica]] = gw.pools  # type: ignore[attr-defined]
    (a, a_conns), (b, b_conns) = connections_on_both_workers(gw, keys["capped"]).items()
    held: dict[str, tuple[int, dict[str, str], Any]] = {}

    def hold(conn: http.client.HTTPConnection, rid: str) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: held.update({rid: chat(gw, keys["capped"], rid, conn, rid=rid, hold=rid)})
        )
        thread.start()
        deadline = time.monotonic() + WAIT
        while not any(rid in r.rids() for r in pools["chat"]):
            if time.monotonic() > deadline:
                pytest.fail(f"no replica received {rid}")
            time.sleep(0.01)
        return thread

    # The key's two requests in flight, one on each worker: a third is refused on either worker.
    threads = [hold(a_conns[0], "cap-a"), hold(b_conns[0], "cap-b")]
    try:
        for conn, marker in ((a_conns[1], "cap-a2"), (b_conns[1], "cap-b2")):
            status, headers, out = chat(gw, keys["capped"], marker, conn)
            assert (status, headers["retry-after"], error_code(out)) == (429, "1", "concurrency_limit_exceeded")
    finally:
        for r in pools["chat"]:
            for rid in ("cap-a", "cap-b"):
                r.gates[rid].set()
        for t in threads:
            t.join(WAIT)
    assert [held[rid][0] for rid in ("cap-a", "cap-b")] == [200, 200]
    assert {worker_of(gw, a_conns[0]), worker_of(gw, b_conns[0])} == {a, b}
    assert chat(gw, keys["capped"], "cap-after", b_conns[1])[0] == 200
    for conns in (a_conns, b_conns):
        for c in conns:
            c.close()
