"""The gateway on real nginx at its edges: every status nginx answers by itself is OpenAI JSON, 405
says Allow, 429 says when to retry, per-key concurrency caps, cut streams in the usage log, usage
lines kept short (a huge model name cut), and the routed endpoint (never the raw path) sent to replicas.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.planning.gateway.nginx import ERRORS
from components.planning.load import load_stack_config
from tests.support.gateway import (
    CHAT,
    R1,
    WAIT,
    FakeReplica,
    NginxGateway,
    by_name,
    error_code,
    gateway_config,
    host_keys,
    log_line,
    own_gateway,
    self_signed,
    send_held,
)


def edge_config(**gateway: Any) -> dict[str, Any]:
    """The test stack plus a key capped at one request in flight; silent clients dropped after 1 s."""
    config = gateway_config(**{"clientTimeoutSeconds": 1, **gateway})
    config["llm-cluster:gateway"]["apiKeys"].append({"id": "capped", "maxConcurrent": 1})
    return config


@pytest.fixture(scope="module")
def pools(replicas: dict[str, list[FakeReplica]]) -> dict[str, list[FakeReplica]]:
    """The fake replicas of the module fixture in tests/conftest.py (four chat, one reasoning)."""
    return replicas


@pytest.fixture(scope="module")
def gw_keys(
    tmp_path_factory: pytest.TempPathFactory, pools: dict[str, list[FakeReplica]]
) -> Iterator[tuple[NginxGateway, dict[str, str]]]:
    spec = load_stack_config(edge_config(), set())
    keys, digests = host_keys(spec, tmp_path_factory.mktemp("keys"))
    gw = NginxGateway(spec, pools, tmp_path_factory.mktemp("gateway"), digests)
    yield gw, keys
    gw.stop()


def raw_answer(port: int, request: bytes, context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are (no client library would send them) and read the whole answer: status,
    headers, body (the final answer's, after any 100 Continue; de-chunked)."""
    sock: socket.socket = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    if context is not None:
        sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
    sock.sendall(request)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 100"):
        head, _, body = body.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    if headers.get("transfer-encoding") == "chunked":
        whole, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size, 16)
            if n == 0:
                break
            whole, rest = whole + rest[:n], rest[n + 2 :]
        body = whole
    return int(lines[0].split(" ")[1]), headers, body


def raw(port: int, request: bytes, context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], Any]:
    """raw_answer() with its body as JSON (or text when it is not JSON)."""
    status, headers, body = raw_answer(port, request, context)
    try:
        payload: Any = json.loads(body)
    except ValueError:
        payload = body.decode(errors="replace")
    return status, headers, payload


NGINX_OWN_ERRORS = [
    ("malformed-request-line", b"GARBAGE\r\n\r\n", 400, "bad_request"),
    ("nul-in-path", b"GET /v1/%00models HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),
    ("uri-too-long", b"GET /v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long"),
    (
        "header-too-large",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
        431,
        "headers_too_large",
    ),
    (
        "unknown-transfer-encoding",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        501,
        "not_implemented",
    ),
    ("http-version", b"GET /v1/models HTTP/2.7\r\nHost: x\r\n\r\n", 505, "http_version_not_supported"),
    ("bad-header-name", b"GET /v1/models HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n", 400, "bad_request"),
    ("missing-host", b"GET /v1/models HTTP/1.1\r\n\r\n", 400, "bad_request"),
]


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [case[1:] for case in NGINX_OWN_ERRORS],
    ids=[case[0] for case in NGINX_OWN_ERRORS],
)
def test_errors_nginx_answers_itself_are_openai_json(
    gw_keys: tuple[NginxGateway, dict[str, str]], request_bytes: bytes, status: int, code: str
) -> None:
    gw, _ = gw_keys
    got, headers, out = raw(gw.port, request_bytes)
    assert (got, headers.get("content-type")) == (status, "application/json")
    assert error_code(out) == code
    assert out["error"]["message"] == ERRORS[{431: 494}.get(status, status)].message


def test_trace_is_405_with_allow_per_path(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    for path, allow in (("/v1/models", "GET, HEAD"), ("/v1/chat/completions", "POST")):
        status, headers, out = raw(gw.port, f"TRACE {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (status, headers["allow"], error_code(out)) == (405, allow, "method_not_allowed")
    # The 405s the router answers carry it too.
    status, headers, out = gw.call("GET", "/v1/chat/completions", key=keys["default"])
    assert (status, headers["allow"], error_code(out)) == (405, "POST", "method_not_allowed")
    status, headers, out = gw.call("DELETE", "/v1/models", key=keys["default"])
    assert (status, headers["allow"], error_code(out)) == (405, "GET, HEAD", "method_not_allowed")


def test_429_says_when_to_retry_with_the_headers_openai_clients_read(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    gw, keys = gw_keys
    # `limited`: 1 request/minute, burst 1: the third in a row is refused.
    answers = [gw.call("GET", "/v1/models", key=keys["limited"]) for _ in range(3)]
    assert [status for status, _, _ in answers] == [200, 200, 429]
    _, headers, out = answers[2]
    assert error_code(out) == "rate_limit_exceeded" and out["error"]["type"] == "requests"
    assert (
        headers["retry-after"],
        headers["x-ratelimit-limit-requests"],
        headers["x-ratelimit-remaining-requests"],
        headers["x-ratelimit-reset-requests"],
    ) == ("60", "1", "0", "1m0s")


def test_concurrency_cap_per_key_is_a_429_of_its_own(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]]
) -> None:
    gw, keys = gw_keys
    replica, client, held = send_held(gw, keys["capped"], pools["chat"], "cap")
    try:
        status, headers, out = gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["capped"])
        assert (status, headers["retry-after"], error_code(out)) == (429, "1", "concurrency_limit_exceeded")
        # Other keys are not capped by it.
        assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["default"])[0] == 200
    finally:
        replica.gates["cap"].set()
        client.join(WAIT)
    assert held["result"][0] == 200
    # nginx frees the slot as it finishes the request, just after the client has the last byte, and
    # another worker can take the next request first. The request's usage line says the slot is
    # free: its worker writes it at its next flush, after it finished the request (this module never
    # holds the 512 lines that would have it written during the request's log phase).
    deadline = time.monotonic() + WAIT
    while not any(line["key_id"] == "capped" and line["status"] == 200 for line in gw.log()):
        assert time.monotonic() < deadline, "no usage line for the capped key's held request"
        time.sleep(0.05)
    # The request done, the key may send again.
    assert gw.call("POST", "/v1/chat/completions", {"model": CHAT}, keys["capped"])[0] == 200


def test_replicas_get_the_routed_endpoint_never_the_raw_path(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]]
) -> None:
    gw, keys = gw_keys
    for path, sent in (
        ("/metrics/../v1/chat/completions", "/v1/chat/completions"),
        ("/v1//completions", "/v1/completions"),
        ("/v1//completions?x=%2F", "/v1/completions?x=%2F"),  # the query string as sent
        ("/v1/chat/completions?", "/v1/chat/completions?"),
        ("/smart/v1/./chat/completions", "/v1/chat/completions"),
        ("/v1/%65mbeddings", "/v1/embeddings"),
    ):
        model = R1 if path.startswith("/smart") else CHAT
        status, _, out = gw.call("POST", path, {"model": model}, keys["default"])
        assert (status, out["path"]) == (200, sent), path


def test_a_stream_the_client_cut_off_is_logged_as_cut_with_what_it_was_served(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]]
) -> None:
    gw, keys = gw_keys
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
    body = {"model": R1, "stream": True, "stream_options": {"include_usage": True}, "gate": "cut"}
    conn.request(
        "POST",
        "/v1/chat/completions?t=cut",
        json.dumps(body),
        {"Authorization": f"Bearer {keys['default']}", "Content-Type": "application/json"},
    )
    resp = conn.getresponse()
    assert b'"t0"' in resp.read1(65536)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    by_name(pools)["reasoning-0"].gates["cut"].set()  # the replica goes on; nginx finds the client gone
    cut = log_line(gw, "cut")
    assert (cut["status"], cut["completed"], cut["completion_tokens"]) == (200, "", None)
    assert cut["events"] >= 1

    status, _, text = gw.call(
        "POST",
        "/v1/chat/completions?t=whole",
        {"model": R1, "stream": True, "stream_options": {"include_usage": True}},
        keys["default"],
    )
    assert status == 200 and text.endswith("data: [DONE]\n\n")
    whole = log_line(gw, "whole")
    # 3 content events, the usage event, [DONE].
    assert (whole["completed"], whole["events"], whole["completion_tokens"]) == ("OK", 5, 3)


def usage_line_with(gw: NginxGateway, text: str) -> str:
    """The usage line, as written, that holds this text (for a line whose path log_line cannot match:
    cut, or with bytes the line escapes), once the workers have flushed it."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for f in gw.usage_dir.glob("usage-*.log"):
            for line in f.read_text().splitlines():
                if text in line:
                    return line
        time.sleep(0.05)
    pytest.fail(f"no usage line holds {text!r}")


def test_a_huge_model_name_is_cut_in_the_log_and_its_line_still_written(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    gw, keys = gw_keys
    huge = "m" * 200_000
    status, _, out = gw.call("POST", "/v1/chat/completions?t=huge", {"model": huge}, keys["default"])
    assert status == 404 and error_code(out) == "model_not_found"
    line = usage_line_with(gw, '?t=huge"')
    assert json.loads(line)["model"] == "m" * 256 and len(line) < 2048


def test_a_long_path_is_cut_in_the_log_and_escaped_there(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    """The path goes into the line as the client sent it, last; Lua cuts it to 256 bytes and escapes
    what JSON must (here a quote and a backslash inside the kept part; the tail past 256 bytes cut off)."""
    gw, keys = gw_keys
    for marker, tail in (("long", "p" * 400), ("longodd", 'a"b\\c' + "q" * 400)):
        path = f"/v1/chat/completions?t={marker}&q={tail}"
        assert gw.call("POST", path, {"model": CHAT}, keys["default"])[0] == 200
        logged = json.loads(usage_line_with(gw, f"?t={marker}&"))
        assert logged["path"] == path[:256] and logged["model"] == CHAT and logged["status"] == 200
        assert logged["completion_tokens"] is not None


def test_tls_port_answers_plain_http_with_openai_json(tmp_path: Path) -> None:
    config = gateway_config(tls=True, port=443)
    config["llm-cluster:gatewayTlsCert"] = config["llm-cluster:gatewayTlsKey"] = "[secret]"
    spec = load_stack_config(config, {"llm-cluster:gatewayTlsCert", "llm-cluster:gatewayTlsKey"})
    tls = self_signed(tmp_path / "tls")
    with own_gateway(spec, {"chat": [FakeReplica("c")], "reasoning": [FakeReplica("r")]}, tmp_path, tls_dir=tls) as (
        gw,
        _,
    ):
        status, headers, out = raw(gw.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, headers["content-type"], error_code(out)) == (400, "application/json", "https_required")
        context = ssl.create_default_context(cafile=str(tls / "cert.pem"))
        status, _, out = raw(gw.port, b"GARBAGE\r\n\r\n", context=context)
        assert (status, error_code(out)) == (400, "bad_request")


def test_every_error_page_is_wired(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    conf = gw_keys[0].files["nginx.conf"]
    assert [line.strip() for line in conf.splitlines() if line.strip().startswith("error_page")] == [
        f"error_page {raised} {'' if page.status == raised else f'={page.status} '}/_llm_error/{raised};"
        for raised, page in ERRORS.items()
    ]
    assert "error_page 503 =429 /_llm_error/503;" in conf and "error_page 494 =431 /_llm_error/494;" in conf


# --- a demanding client -------------------------------------------------------------------------


def exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send one request on a kept-alive connection and read exactly its answer (Content-Length or chunked)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    status = int(lines[0].split(" ")[1])
    if request.startswith(b"HEAD ") or status in (204, 304):
        return status, headers, b""
    if headers.get("transfer-encoding") == "chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            rest += sock.recv(65536)
        body, text = b"", rest
        while True:
            size, _, text = text.partition(b"\r\n")
            if int(size, 16) == 0:
                return status, headers, body
            body, text = body + text[: int(size, 16)], text[int(size, 16) + 2 :]
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        rest += sock.recv(65536)
    return status, headers, rest


def post(path: str, key: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


@pytest.mark.parametrize(
    "sent",
    [
        b"POST /v1/chat/completions?t=silent-headers HTTP/1.1\r\nHost: x\r\n",  # headers never finished
        b"POST /v1/chat/completions?t=silent-body HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer KEY\r\n"
        b'Content-Length: 100\r\n\r\n{"model"',  # a body that stops coming
    ],
    ids=["headers", "body"],
)
def test_a_silent_client_is_dropped_without_an_answer_and_logged_as_408(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]], sent: bytes
) -> None:
    gw, keys = gw_keys
    before = sum(len(r.requests) for rs in pools.values() for r in rs)
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT)
    sock.sendall(sent.replace(b"KEY", keys["default"].encode()))
    # nginx closes after clientTimeoutSeconds (1 s here) of silence, sending nothing: no HTML page, and
    # no connection held open (a recv that never returned would fail the test at WAIT).
    assert sock.recv(65536) == b""
    sock.close()
    marker = sent.split(b"?t=")[1].split(b" ")[0].decode()
    line = log_line(gw, marker)
    assert (line["status"], line["response_bytes"], line["pool"]) == (408, 0, "")
    # One that never reached the rewrite phase (its headers never ended) still has every request
    # variable's default (a valid line, events 0), and nginx says nothing of variables it made up.
    assert (line["key_id"], line["model"], line["events"]) == ("default" if b"KEY" in sent else "", "", 0)
    assert "uninitialized" not in (gw.root / "error.log").read_text()
    assert sum(len(r.requests) for rs in pools.values() for r in rs) == before


def test_one_kept_alive_connection_carries_answers_errors_and_heads_in_turn(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    # Each answer is read by its own length: a HEAD that sent a body, or an error page that closed the
    # connection, would break the next exchange.
    gw, keys = gw_keys
    key = keys["default"]
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT)
    try:
        steps = [
            (post("/v1/chat/completions", key, json.dumps({"model": CHAT}).encode()), 200, None),
            (post("/v1/chat/completions", key, b"{not json"), 400, "invalid_json"),
            (post("/v1/chat/completions", key, json.dumps({"model": "nope"}).encode()), 404, "model_not_found"),
            (f"HEAD /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode(), 200, None),
            (
                f"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\r\n".encode(),
                405,
                "method_not_allowed",
            ),
            (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 401, "invalid_api_key"),
            (post("/v1/chat/completions", key, json.dumps({"model": CHAT, "stream": True}).encode()), 200, None),
            (post("/v1/embeddings", key, json.dumps({"model": CHAT}).encode()), 200, None),
        ]
        for request, status, code in steps:
            got, headers, body = exchange(sock, request)
            assert got == status, (request[:40], got, body[:200])
            assert headers.get("connection", "keep-alive") != "close"
            if code is not None:
                assert headers["content-type"] == "application/json" and error_code(json.loads(body)) == code
    finally:
        sock.close()


def test_a_chunked_request_body_and_expect_100_continue_are_routed_by_their_model(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]]
) -> None:
    gw, keys = gw_keys
    body = json.dumps({"model": R1, "rid": "chunked-body"}).encode()
    pieces = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 5]), body[i : i + 5]) for i in range(0, len(body), 5))
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT)
    try:
        status, _, answer = exchange(
            sock,
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys['default']}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            ).encode()
            + pieces
            + b"0\r\n\r\n",
        )
        assert status == 200 and json.loads(answer)["served_by"] == "reasoning-0"
        # Expect: 100-continue: nginx says continue, the client then sends its body.
        sock.sendall(
            post("/v1/chat/completions", keys["default"], b"", "Expect: 100-continue\r\n").replace(
                b"Content-Length: 0", b"Content-Length: %d" % len(body)
            )
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
        status, _, answer = exchange(sock, body)
        assert status == 200 and json.loads(answer)["served_by"] == "reasoning-0"
    finally:
        sock.close()
    reasoning = by_name(pools)["reasoning-0"]
    got = [r for r in reasoning.requests if isinstance(r["body"], dict) and r["body"].get("rid") == "chunked-body"]
    # The replica gets each body whole, with a length (nginx reads chunked bodies before proxying).
    assert [r["body"] for r in got] == [json.loads(body)] * 2
    assert all(r["headers"].get("Content-Length") == str(len(body)) for r in got)


# --- what a replica does wrong ------------------------------------------------------------------


def test_a_stream_the_replica_cut_mid_event_is_logged_as_cut(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]]
) -> None:
    """nginx ends a response whose replica died mid-way without the last chunk (the client can tell)
    but still calls the request complete ($request_completion "OK"): the line says it was cut."""
    gw, keys = gw_keys
    body = {"model": R1, "stream": True, "stream_options": {"include_usage": True}, "cut": 1}
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT)
    sock.sendall(
        post("/v1/chat/completions?t=replica-cut", keys["default"], json.dumps(body).encode(), "Connection: close\r\n")
    )
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, text = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b'"t0"' in text and b'"t1"' not in text
    assert not text.endswith(b"0\r\n\r\n")  # no last chunk: the client sees the answer is incomplete
    cut = log_line(gw, "replica-cut")
    assert (cut["status"], cut["upstream_status"], cut["completed"], cut["events"], cut["total_tokens"]) == (
        200,
        "200",
        "",
        2,
        None,
    )
    # Whole answers, streamed, plain or in one-byte pieces, are still complete.
    for marker, extra in (
        ("whole-stream", {"stream": True}),
        ("whole-json", {}),
        ("whole-bytes", {"fragment": 1}),
        ("whole-bytes-stream", {"stream": True, "fragment": 1}),
    ):
        assert gw.call("POST", f"/v1/chat/completions?t={marker}", {"model": R1, **extra}, keys["default"])[0] == 200
        assert log_line(gw, marker)["completed"] == "OK", marker


def test_a_replica_that_answers_without_http_is_a_502_in_json_and_its_line_is_json(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    """nginx takes an answer without a status line for HTTP/0.9 and would pass its bytes on raw (no
    status line, no headers) and log status 009, which is not a JSON number: the client gets a 502."""
    gw, keys = gw_keys
    body = json.dumps({"model": R1, "raw_answer": "SSH-2.0-OpenSSH_9.2\r\n"}).encode()
    status, headers, out = raw(
        gw.port, post("/v1/chat/completions?t=not-http", keys["default"], body, "Connection: close\r\n")
    )
    assert (status, headers["content-type"], headers["content-length"]) == (
        502,
        "application/json",
        str(len(json.dumps(out))),
    )
    assert out == {
        "error": {
            "message": "The replica's answer was not HTTP; retry later.",
            "type": "server_error",
            "param": None,
            "code": "upstream_invalid_response",
        }
    }
    line = log_line(gw, "not-http")
    assert (line["status"], line["pool"], line["model"], line["completed"]) == (502, "reasoning", R1, "OK")


def test_a_request_without_host_reaches_the_replica_with_one(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]]
) -> None:
    """HTTP/1.0 needs no Host; the gateway speaks HTTP/1.1 to replicas, which must send one (RFC 9112
    §3.2; uvicorn's h11 answers a request without it with a plain-text 400). $host, which the replica
    gets, falls back to the server's name: the gateway node's."""
    gw, keys = gw_keys
    node = load_stack_config(edge_config(), set()).gateway.node
    body = json.dumps({"model": R1, "rid": "no-host"}).encode()
    status, _, out = raw(
        gw.port,
        f"POST /v1/chat/completions HTTP/1.0\r\nAuthorization: Bearer {keys['default']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    assert (status, out["served_by"]) == (200, "reasoning-0")
    got = [r["headers"] for r in by_name(pools)["reasoning-0"].requests if r["body"].get("rid") == "no-host"]
    assert [h.get("Host") for h in got] == [node]
    # A client's own Host still goes through as sent.
    assert (
        gw.call(
            "POST",
            "/v1/chat/completions",
            {"model": R1, "rid": "with-host"},
            keys["default"],
            headers={"Host": "api.example"},
        )[0]
        == 200
    )
    got = [r["headers"] for r in by_name(pools)["reasoning-0"].requests if r["body"].get("rid") == "with-host"]
    assert [h.get("Host") for h in got] == ["api.example"]


def test_bytes_that_are_not_utf8_never_reach_an_error_body_or_a_usage_line_as_they_are(
    gw_keys: tuple[NginxGateway, dict[str, str]],
) -> None:
    """JSON text is UTF-8 (RFC 8259 §8.1; Python's json.loads of bytes refuses anything else): a model
    name or a path with bytes that are not UTF-8 is echoed and logged with U+FFFD in their place, and a
    path cut to 256 bytes is cut before a character, never inside one."""
    gw, keys = gw_keys
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT)
    try:
        status, headers, body = exchange(
            sock, post("/v1/chat/completions?t=not-utf8", keys["default"], b'{"model": "de\xffep\xe9-\xc3\xa9"}')
        )
    finally:
        sock.close()
    assert (status, headers["content-type"]) == (404, "application/json")
    assert json.loads(body.decode())["error"]["message"].startswith(
        "The model 'de\ufffdep\ufffd-\u00e9' does not exist under /v1/. Available models: "
    )
    # The request line's own bytes: one that is not UTF-8, and a character the 256-byte cut would split.
    target = b"/v1/chat/completions?t=not-utf8-path&q=\xfe"
    cut = b"/v1/chat/completions?t=utf8-cut&q=" + b"a" * (255 - 34) + "é".encode() + b"b"
    assert len(cut[:256]) == 256 and cut[255:257] == "é".encode()
    for path in (target, cut):
        request = post("/v1/chat/completions", keys["default"], b'{"model": "deepseek-r1"}')
        assert (
            raw(
                gw.port,
                request.replace(b"POST /v1/chat/completions ", b"POST " + path + b" ", 1).replace(
                    b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1
                ),
            )[0]
            == 200
        )
    deadline, lines = time.monotonic() + WAIT, {}
    while len(lines) < 3 and time.monotonic() < deadline:
        for f in gw.usage_dir.glob("usage-*.log"):
            for line in f.read_bytes().splitlines():
                for marker in (b'?t=not-utf8"', b"?t=not-utf8-path", b"?t=utf8-cut"):
                    if marker in line:
                        lines[marker] = json.loads(line.decode())  # strict UTF-8, or the test fails here
        time.sleep(0.05)
    assert lines[b'?t=not-utf8"']["model"] == "de\ufffdep\ufffd-\u00e9"
    assert lines[b"?t=not-utf8-path"]["path"] == "/v1/chat/completions?t=not-utf8-path&q=\ufffd"
    assert lines[b"?t=utf8-cut"]["path"] == cut[:255].decode()


@pytest.mark.parametrize(
    ("answer", "type_"),
    [
        ((500, "text/plain; charset=utf-8", "Internal Server Error"), "server_error"),  # Starlette's, for an exception
        ((400, "text/plain", "Invalid HTTP request received."), "invalid_request_error"),  # uvicorn's
        ((503, "text/html; charset=iso-8859-1", ""), "server_error"),
        ((502, "text/html", '<html><body>bad "gateway"\n\xe9</body></html>' + "x" * 600), "server_error"),
    ],
    ids=["500-text", "400-text", "503-empty", "502-html-long"],
)
def test_a_replicas_error_that_is_not_json_reaches_the_client_as_openai_json(
    gw_keys: tuple[NginxGateway, dict[str, str]], answer: tuple[int, str, str], type_: str
) -> None:
    """What the replica said is kept, in the message (cut to 256 bytes); its status too."""
    gw, keys = gw_keys
    marker = f"not-json-{answer[0]}-{len(answer[2])}"
    sock = socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT)
    try:
        status, headers, body = exchange(
            sock,
            post(
                f"/v1/chat/completions?t={marker}",
                keys["default"],
                json.dumps({"model": R1, "answer": answer}).encode(),
            ),
        )
        out = json.loads(body.decode())
        # The connection goes on: the answer's end was where its chunked encoding said.
        assert exchange(sock, post("/v1/chat/completions", keys["default"], b'{"model": "deepseek-r1"}'))[0] == 200
    finally:
        sock.close()
    line = log_line(gw, marker)
    assert (line["status"], line["upstream_status"], line["completed"]) == (answer[0], str(answer[0]), "OK")
    said = answer[2].encode()[:256].decode(errors="ignore") or "(no body)"  # cut before a character
    assert (status, headers["content-type"]) == (answer[0], "application/json; charset=utf-8")
    assert out == {
        "error": {
            "message": f"The model's replica answered {answer[0]} with this, not JSON: {said}",
            "type": type_,
            "param": None,
            "code": "upstream_error",
        }
    }


def test_a_replicas_json_error_reaches_the_client_as_it_sent_it(gw_keys: tuple[NginxGateway, dict[str, str]]) -> None:
    gw, keys = gw_keys
    sent = '{"object":"error","message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}'
    for ctype in ("application/json", "application/problem+json; charset=utf-8"):
        conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=WAIT)
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps({"model": R1, "answer": [400, ctype, sent]}),
            {"Authorization": f"Bearer {keys['default']}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        assert (resp.status, resp.getheader("Content-Type"), resp.read().decode()) == (400, ctype, sent)
        conn.close()


def test_a_chunked_body_near_the_limit_in_small_chunks_is_routed_whole(
    gw_keys: tuple[NginxGateway, dict[str, str]], pools: dict[str, list[FakeReplica]]
) -> None:
    """A chunked body's encoding (each chunk's size line and CRLFs) fills nginx's body buffer before
    its data does: a body under maxBodyMib sent in 1000-byte chunks is written to nginx's temp file,
    where the router still reads it (get_body_data() has nothing then); one over the limit is a 413."""
    gw, keys = gw_keys
    body = json.dumps({"model": R1, "rid": "chunked-near-limit", "p": "x" * (1024 * 1024 - 200)}).encode()
    assert 1024 * 1024 - 200 < len(body) < 1024 * 1024

    def chunked(data: bytes) -> bytes:
        pieces = b"".join(
            b"%x\r\n%s\r\n" % (len(data[i : i + 1000]), data[i : i + 1000]) for i in range(0, len(data), 1000)
        )
        return (
            (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {keys['default']}\r\n"
                "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            ).encode()
            + pieces
            + b"0\r\n\r\n"
        )

    status, _, out = raw(gw.port, chunked(body))
    assert (status, out["served_by"], out["rid"]) == (200, "reasoning-0", "chunked-near-limit")
    got = [
        r
        for r in by_name(pools)["reasoning-0"].requests
        if isinstance(r["body"], dict) and r["body"].get("rid") == "chunked-near-limit"
    ]
    assert [(r["raw"], r["headers"]["Content-Length"]) for r in got] == [(body, str(len(body)))]
    status, headers, out = raw(gw.port, chunked(body + b" " * 300))
    assert (status, headers["content-type"], error_code(out)) == (413, "application/json", "request_too_large")


# Seeded random requests (the same every run), each on its own connection: methods, paths (encoded,
# dotted, unknown, internal), keys (missing, wrong, other schemes, repeated), bodies (JSON of every
# kind of model, broken JSON, large prompts, replica errors in and out of JSON), chunked or not,
# Expect: 100-continue. Whatever the mix, every refusal is an OpenAI error in JSON, every request has
# one usage line and each line is JSON, and Lua never fails (nginx's error log says so if it did).
# 4,600 such requests (this mix and a first one) found no fault when this was written; these keep it so.
RANDOM_REQUESTS = 1000
RANDOM_METHODS = ["POST"] * 6 + ["GET", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "FOO", "post"]
RANDOM_PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
    "/smart/v1/chat/completions",
    "/smart/v1/models",
    "/",
    "/metrics",
    "/v1/",
    "/v1/chat/completions/",
    "//v1/models",
    "/v1/models?x=1",
    "/%2e%2e/v1/models",
    "/v1/chat/completions?stream=1",
    "/v1/../v1/completions",
    "/v1/chat%2Fcompletions",
    "/_llm_error/401",
    "*",
    "/v1/chat/completions;x",
    "/V1/models",
]
RANDOM_MODELS: list[Any] = [
    CHAT,
    R1,
    "fast",
    "nope",
    "",
    " ",
    None,
    1,
    [],
    {},
    CHAT + " ",
    "x" * 3000,
    "日本",
    "\ud800",
    CHAT.upper(),
]
REPLICA_JSON_ERROR = b'{"object": "error", "message": "bad", "code": 400}'  # an engine's own, not OpenAI's shape


def _random_body(rng: random.Random) -> bytes:
    if rng.random() < 0.1:
        return rng.choice(
            [b"", b"{", b"[]", b"null", b'{"model":', b"\xff\xfe", b"{}{}", f'{{"model":"{CHAT}"}}x'.encode()]
        )
    body: dict[str, Any] = {"model": rng.choice(RANDOM_MODELS)} if rng.random() < 0.9 else {}
    if rng.random() < 0.3:
        body["stream"] = rng.choice([True, False, "yes", None])
    if rng.random() < 0.2:
        body["messages"] = [{"role": "user", "content": "x" * rng.choice([1, 100, 70000])}]
    if rng.random() < 0.1:  # the fake replica answers this status, type and text
        body["answer"] = [
            rng.choice([400, 422, 500, 503]),
            rng.choice(["text/plain", "application/json", "text/html"]),
            rng.choice(["oops", REPLICA_JSON_ERROR.decode(), "<h1>x</h1>", ""]),
        ]
    return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")


def _random_request(rng: random.Random, key: str) -> tuple[str, bytes]:
    method, path, body = rng.choice(RANDOM_METHODS), rng.choice(RANDOM_PATHS), _random_body(rng)
    auth = (
        f"Authorization: Bearer {key}\r\n"
        if rng.random() < 0.7
        else rng.choice(
            [
                "",
                "Authorization: Bearer nope\r\n",
                f"Authorization: bearer {key}\r\n",
                f"Authorization: Basic {key}\r\n",
                f"Authorization: Bearer  {key} \r\n",
                "Authorization: Bearer\r\n",
                f"Authorization: Bearer {key}\r\nAuthorization: Bearer {key}\r\n",
            ]
        )
    )
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n"
    if rng.random() < 0.1:
        head += "Transfer-Encoding: chunked\r\n"
        data = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    else:
        head += f"Content-Length: {len(body)}\r\n" if body or method in ("POST", "PUT") else ""
        data = body
    head += "Content-Type: text/plain\r\n" if rng.random() < 0.2 else ""
    head += "Expect: 100-continue\r\n" if rng.random() < 0.05 else ""
    return method, head.encode() + b"\r\n" + data


def test_random_requests_get_openai_errors_and_one_json_usage_line_each(tmp_path: Path) -> None:
    spec = load_stack_config(gateway_config(), set())
    with own_gateway(
        spec, {"chat": [FakeReplica("c0"), FakeReplica("c1")], "reasoning": [FakeReplica("r")]}, tmp_path
    ) as (gw, keys):
        rng = random.Random(2026)
        statuses: Counter[int] = Counter()
        for _ in range(RANDOM_REQUESTS):
            method, request = _random_request(rng, keys["default"])
            status, headers, body = raw_answer(gw.port, request)
            statuses[status] += 1
            if status >= 400 and method != "HEAD":
                assert headers.get("content-type", "").startswith("application/json"), (request[:300], headers)
                if body == REPLICA_JSON_ERROR and b"application/json" in request:
                    continue  # a replica's own JSON error passes as it sent it
                error = json.loads(body)["error"]
                assert isinstance(error["message"], str) and error["message"], (request[:300], body[:300])
                assert error["type"] and error["code"], (request[:300], body[:300])
        lines = gw.log(at_least=RANDOM_REQUESTS)
        errors = (gw.root / "error.log").read_text()
    # The mix reached every kind of answer it was built for (a change to it that stops doing so shows).
    assert {200, 400, 401, 404, 405} <= set(statuses), statuses
    assert len(lines) == RANDOM_REQUESTS
    assert [line for line in errors.splitlines() if "lua" in line.lower() and "[warn]" not in line] == []
