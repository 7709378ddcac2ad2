"""The real-nginx gateway harness: the generated gateway on the deployed nginx + Lua (the gateway image's
own pinned packages, tests/support/deployed_nginx.py, never the machine's), on loopback, in front of
fake OpenAI replicas.

Fake replicas are Python HTTP/1.1 servers in threads that record every request and answer like vLLM's
OpenAI server (JSON with `usage`, or SSE chunks ending with a usage chunk and `[DONE]`). API keys
come from the real host script (keys_script), so the digests gateway.lua looks up are the ones bash wrote.
The module fixture `replicas` (four chat replicas, one reasoning) is in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import json
import shutil
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from components.planning.gateway.keys import key_ids, keys_script
from components.planning.gateway.layout import DIGESTS_FILE, GatewayLayout
from components.planning.gateway.nginx import render_gateway, temp_path_directives
from components.spec import StackSpec
from tests.conftest import prod_config
from tests.support import free_port
from tests.support.deployed_nginx import DeployedNginx, deployed_nginx

CHAT = "qwen3-30b-a3b"
R1 = "deepseek-r1"
USAGE = {"prompt_tokens": 11, "total_tokens": 18, "completion_tokens": 7}
STREAM_USAGE = {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}
WAIT = 20.0  # upper bound for anything the tests wait on; reaching it is a failure, never a pass


@functools.cache
def deployed() -> DeployedNginx:
    """The nginx + Lua the gateway image deploys (fetched once per machine), never the machine's own."""
    try:
        return deployed_nginx()
    except (OSError, RuntimeError) as e:
        pytest.fail(
            f"the gateway image's nginx and Lua module could not be fetched (tests/support/deployed_nginx.py): {e}"
        )


def nginx_binary() -> str:
    return str(deployed().nginx)


def lua_reports(tmp_path: Path, code: str, modules: Path | None = None, init: str = "") -> str:
    """What a content_by_lua_block running `code` prints, from the deployed nginx loading the deployed
    modules (and Lua modules from `modules`, e.g. the gateway's own source) after an init_by_lua_block
    running `init`; its error log must stay empty."""
    found = deployed()
    port = free_port()
    path = f"{modules}/?.lua;" if modules else ""
    (tmp_path / "nginx.conf").write_text(f"""load_module {found.ndk_module};
load_module {found.lua_module};
pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log; daemon off; events {{}}
http {{ access_log off; {" ".join(temp_path_directives(tmp_path))}
  lua_package_path "{path}{found.lua_package_path};;"; lua_package_cpath "{found.lua_package_cpath};;";
  {f"init_by_lua_block {{ {init} }}" if init else ""}
  server {{ listen 127.0.0.1:{port}; location / {{ content_by_lua_block {{ {code} }} }} }} }}
""")
    proc = subprocess.Popen(
        [nginx_binary(), "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")], stderr=subprocess.PIPE
    )
    try:
        out = subprocess.run(
            [
                "curl",
                "-sS",
                "--retry",
                "50",
                "--retry-connrefused",
                "--retry-delay",
                "0",
                "--max-time",
                str(WAIT),
                f"http://127.0.0.1:{port}/",
            ],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout
    finally:
        proc.terminate()
        proc.wait(WAIT)
        assert (tmp_path / "error.log").read_text() == ""  # not even a warning from loading the modules


def lua_layout() -> dict[str, Any]:
    """GatewayLayout's fields for the deployed tree's modules and Lua libraries."""
    return deployed().layout_fields()


# --- fake vLLM replicas -----------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # hundreds of connections from nginx at once under load


def _drop(conn: socket.socket) -> None:
    """Close a connection as a crashed process does: both ways at once."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
        conn.close()
    except OSError:
        pass


class FakeReplica:
    """A fake vLLM OpenAI server on 127.0.0.1 that records what reaches it and can be killed."""

    def __init__(self, name: str):
        self.name = name
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.gates: dict[str, threading.Event] = defaultdict(threading.Event)
        self.conns: set[socket.socket] = set()
        self.killed = False
        self.fail_status: int | None = None
        """Answer every request with this status at once (a fast-failing or not-ready replica)."""
        self.close_reused = False
        """Reset a kept-alive connection when the next request arrives on it, before reading it (an
        engine server closing an idle connection at the moment nginx reuses it)."""
        self.resets = 0
        self.streaming = 0
        """Streams this replica is sending now (a stopped container cuts them)."""
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.port = int(self.server.server_address[1])
        self.addr = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rids(self) -> list[str]:
        """The `rid` field of every request body received, in order."""
        return [r["body"].get("rid") for r in self.requests if isinstance(r["body"], dict)]

    def kill(self) -> None:
        """Stop like a crashed server: no listener, every connection closed."""
        with self.lock:
            self.killed = True
            conns = list(self.conns)
        self.server.shutdown()
        self.server.server_close()
        for conn in conns:
            _drop(conn)
        for gate in self.gates.values():
            gate.set()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        replica = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                # Under the lock with kill(): a connection accepted just before it is either closed by it or
                # sees `killed` here; one left open would keep nginx waiting on a crashed replica.
                with replica.lock:
                    replica.conns.add(self.connection)
                    killed = replica.killed
                if killed:
                    _drop(self.connection)

            def finish(self) -> None:
                replica.conns.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def do_POST(self) -> None:  # noqa: N802
                self.served = getattr(self, "served", 0) + 1
                if replica.close_reused and self.served > 1:
                    with replica.lock:
                        replica.resets += 1
                    # Unread data in the socket and SO_LINGER 0: the kernel answers with a reset.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                with replica.lock:
                    replica.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body, "raw": raw}
                    )
                if replica.fail_status is not None:
                    self._reply(
                        replica.fail_status, {"object": "error", "message": "engine failure", "served_by": replica.name}
                    )
                    return
                if isinstance(body, dict) and body.get("delay"):
                    time.sleep(float(body["delay"]))
                    if replica.killed:
                        _drop(self.connection)  # crashed meanwhile: nothing is sent back
                        return
                if isinstance(body, dict) and body.get("hold"):
                    replica.gates[body["hold"]].wait(WAIT)
                    if replica.killed:
                        _drop(self.connection)  # crashed meanwhile: nothing is sent back
                        return
                if isinstance(body, dict) and body.get("answer"):
                    # This status, Content-Type and body (a replica's own error page, JSON or not).
                    status, ctype, text = body["answer"]
                    out = text.encode()
                    self.wfile.write(
                        f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(out)}\r\n\r\n".encode()
                        + out
                    )
                    return
                if isinstance(body, dict) and body.get("raw_answer"):
                    # Not HTTP at all (a port some other service answers on): these bytes, then the close.
                    self.wfile.write(body["raw_answer"].encode())
                    self.close_connection = True
                    return
                if isinstance(body, dict) and body.get("stream"):
                    self._stream(body)
                    return
                answer: dict[str, Any] = {
                    "id": "cmpl-1",
                    "object": "chat.completion",
                    "served_by": replica.name,
                    "path": self.path,
                    "model": body.get("model") if isinstance(body, dict) else None,
                    "rid": body.get("rid") if isinstance(body, dict) else None,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                    "usage": USAGE,
                }
                if isinstance(body, dict) and "answer_fields" in body:
                    # An engine's own answer shape: these top-level fields in place of the usage above.
                    answer.pop("usage")
                    answer.update(body["answer_fields"])
                self._reply(
                    200,
                    answer,
                    int(body.get("fragment") or 0) if isinstance(body, dict) else 0,
                    body.get("indent") if isinstance(body, dict) else None,
                )

            def _reply(
                self, status: int, payload: dict[str, Any], fragment: int = 0, indent: int | None = None
            ) -> None:
                out = json.dumps(payload, indent=indent).encode()
                head = (
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(out)}\r\n\r\n"
                ).encode()
                if not fragment:
                    # One write: a replica killed meanwhile sends all of an answer or none of it.
                    self.wfile.write(head + out)
                    return
                self.wfile.write(head)
                for at in range(0, len(out), fragment):
                    self._pause()
                    self.wfile.write(out[at : at + fragment])
                    self.wfile.flush()

            @staticmethod
            def _pause() -> None:
                # Long enough that nginx reads each fragment on its own (its filter sees them apart).
                time.sleep(0.003)

            def _chunk(self, data: bytes, fragment: int = 0) -> None:
                for at in range(0, len(data), fragment or len(data)):
                    if fragment:
                        self._pause()
                    piece = data[at : at + fragment] if fragment else data
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.flush()

            def _stream(self, body: dict[str, Any]) -> None:
                with replica.lock:
                    replica.streaming += 1
                try:
                    self._events(body)
                finally:
                    with replica.lock:
                        replica.streaming -= 1

            def _events(self, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                if "events" in body:
                    # An engine's own stream: these events as they are, then [DONE].
                    for event in body["events"]:
                        self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self._chunk(b"data: [DONE]\n\n")
                    self.wfile.write(b"0\r\n\r\n")
                    return
                with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                # `fragment`: every event sent in pieces of that many bytes (a TCP stream cut anywhere).
                fragment = int(body.get("fragment") or 0)
                for i in range(3):
                    event = {"choices": [{"index": 0, "delta": {"content": f"t{i}"}}]}
                    if with_usage:
                        event["usage"] = None
                    data = b"data: " + json.dumps(event).encode() + b"\n\n"
                    if body.get("cut") == i:
                        # The replica dies mid-event: half of it in a chunk that promises all of it, then the close.
                        self.wfile.write(b"%x\r\n%s" % (len(data), data[: len(data) // 2]))
                        self.wfile.flush()
                        self.close_connection = True
                        return
                    self._chunk(data, fragment)
                    if body.get("pace"):
                        # A generation's time between tokens: the stream stays open that long per event.
                        time.sleep(float(body["pace"]))
                    if i == 0 and body.get("gate"):
                        # Nothing more until the client has shown it holds the first chunk.
                        replica.gates[body["gate"]].wait(WAIT)
                if with_usage:
                    self._chunk(
                        b"data: " + json.dumps({"choices": [], "usage": STREAM_USAGE}).encode() + b"\n\n", fragment
                    )
                self._chunk(b"data: [DONE]\n\n", fragment)
                self.wfile.write(b"0\r\n\r\n")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


# --- the gateway under test -------------------------------------------------------------------


def metric_samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value of every sample line of a Prometheus exposition (gateway_metrics.lua serve())."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out


class NginxGateway:
    """The generated config on the real nginx, bound to 127.0.0.1, its files under `root`."""

    def __init__(
        self,
        spec: StackSpec,
        upstreams: dict[str, list[FakeReplica]],
        root: Path,
        digests: Path,
        tls_dir: Path | None = None,
        usage_dir: Path | None = None,
    ):
        self.root = root
        # Responses call() got: each is a request the gateway records (a usage line, its counts).
        self.answered = 0
        self._answered_lock = threading.Lock()
        # The daily usage files, as deployed: nginx's workers (nobody here) write them, so in a
        # directory of their own outside pytest's private tree unless the test gives one.
        self.own_usage = usage_dir is None
        self.usage_dir = usage_dir or Path(tempfile.mkdtemp(prefix="llm-usage-"))
        self.usage_dir.chmod(0o777)
        # The config in a directory of its own, as on the host (its script owns everything in it).
        self.conf_dir = root / "conf"
        # nginx's temp files (a request body that outgrows its buffer), likewise written by the workers.
        self.temp_dir = Path(tempfile.mkdtemp(prefix="llm-tmp-"))
        self.temp_dir.chmod(0o777)
        # A free port can be taken by another process before nginx binds it (five suites share this
        # machine): nginx then exits with "Address already in use", and the gateway starts on another.
        for _ in range(5):
            self.port = free_port()
            self.metrics_port = next(p for p in iter(free_port, None) if p != self.port)
            self.layout = GatewayLayout(
                port=self.port,
                listen_address="127.0.0.1",
                conf_dir=str(self.conf_dir),
                **lua_layout(),
                digests_file=str(digests),
                tls_dir=str(tls_dir or root / "tls"),
                pid_file=str(root / "nginx.pid"),
                error_log=str(root / "error.log"),
                temp_dir=str(self.temp_dir),
                user=None,
                worker_processes="2",
                metrics_listen=f"127.0.0.1:{self.metrics_port}",
                usage_dir=str(self.usage_dir),
            )
            self.files = render_gateway(
                spec, self.layout, {p: [("127.0.0.1", r.port) for r in rs] for p, rs in upstreams.items()}
            )
            for rel, text in self.files.items():
                (self.conf_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.conf_dir / rel).write_text(text)
            if self._started(root):
                return
        pytest.fail("nginx found no free port in five tries")

    def _started(self, root: Path) -> bool:
        """Start nginx on self.port; True once it listens there, False when another process had the port."""
        nginx = nginx_binary()
        conf = str(self.conf_dir / "nginx.conf")
        check = subprocess.run([nginx, "-t", "-q", "-p", str(root), "-c", conf], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
        pid_file = root / "nginx.pid"
        pid_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [nginx, "-p", str(root), "-c", conf, "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + WAIT
        while True:
            if self.proc.poll() is not None:
                said = (self.proc.stderr.read().decode() if self.proc.stderr else "") + (
                    (root / "error.log").read_text() if (root / "error.log").exists() else ""
                )
                if "Address already in use" in said:
                    return False
                pytest.fail(f"nginx exited: {said}")
            # nginx writes its pid file once its listening sockets are bound: the port is its own.
            if pid_file.exists() and pid_file.read_text().strip() == str(self.proc.pid):
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return True
                except OSError:
                    pass
            if time.monotonic() > deadline:
                pytest.fail("nginx did not listen")
            time.sleep(0.05)

    def workers(self) -> set[int]:
        """The pids of nginx's worker processes (its master's children)."""
        master = (self.root / "nginx.pid").read_text().strip()
        found = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if fields[1] == master:  # the field after the state is the parent's pid
                found.add(int(stat.parent.name))
        return found

    def reload(self) -> None:
        """`nginx -s reload`, returning once every worker is a new one."""
        old = self.workers()
        subprocess.run(
            [nginx_binary(), "-p", str(self.root), "-c", str(self.conf_dir / "nginx.conf"), "-s", "reload"],
            check=True,
            capture_output=True,
        )
        deadline = time.monotonic() + WAIT
        while True:
            now = self.workers()
            if now and not now & old:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"nginx's workers {old} were not replaced after the reload")
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(WAIT)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self.own_usage:
            shutil.rmtree(self.usage_dir, ignore_errors=True)

    def log(self, at_least: int = 0) -> list[dict[str, Any]]:
        """The usage log, one JSON object per request, once it has `at_least` lines.

        nginx writes a request's line after the client has its response, so a test that just got
        its answer waits for the line.
        """
        deadline = time.monotonic() + WAIT
        while True:
            lines = [line for f in sorted(self.usage_dir.glob("usage-*.log")) for line in f.read_text().splitlines()]
            if len(lines) >= at_least or time.monotonic() > deadline:
                return [json.loads(line) for line in lines]
            time.sleep(0.01)

    def scrape(self) -> dict[str, float]:
        """/metrics as {series: value}, as it reads now."""
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=WAIT)
        try:
            conn.request("GET", "/metrics")
            return metric_samples(conn.getresponse().read().decode())
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        """/metrics as {series: value} once the workers have flushed every request call() got an
        answer to (they flush once a second): its lines' total has reached them, and a flush counts
        its lines after their counts, which /metrics reads after that total (gateway_metrics.lua)."""
        deadline = time.monotonic() + WAIT
        while True:
            got = self.scrape()
            lines, answered = got["llm_gateway_log_lines_total"], self.answered
            if lines >= answered:
                return got
            assert time.monotonic() < deadline, f"the gateway wrote {lines} usage lines of {answered} requests"
            time.sleep(0.05)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        key: str | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        context: ssl.SSLContext | None = None,
    ) -> tuple[int, dict[str, str], Any]:
        """One request on a fresh connection: status, headers, JSON body (or text)."""
        if context is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=WAIT, context=context
            )
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT)
        hdrs = dict(headers or {})
        if key is not None:
            hdrs["Authorization"] = f"Bearer {key}"
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            text = resp.read().decode()
            with self._answered_lock:
                self.answered += 1
            try:
                payload: Any = json.loads(text)
            except ValueError:
                payload = text
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
        finally:
            conn.close()


def log_line(gw: NginxGateway, marker: str) -> dict[str, Any]:
    """The access-log line of the request whose path carries this marker (?t=...)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for line in gw.log():
            if line["path"].endswith(f"?t={marker}"):
                return line
        time.sleep(0.05)
    pytest.fail(f"no log line for {marker}")


def gateway_config(**gateway: Any) -> dict[str, Any]:
    """The reference stack with test keys: one for most tests, one tightly limited, one restricted."""
    config = prod_config()
    config["llm-cluster:gateway"].update(
        {
            # Plain HTTP on loopback keeps these tests about routing; TLS has tests of its own.
            "tls": False,
            "maxBodyMib": 1,
            "aliases": {"fast": "chat"},
            "apiKeys": [
                {"id": "default", "rateLimit": {"requestsPerSecond": 1000, "burst": 1000}},
                {"id": "limited", "rateLimit": {"requestsPerSecond": 1 / 60, "burst": 1}},
                {"id": "analyst", "models": ["reasoning"]},
            ],
            **gateway,
        }
    )
    return config


def host_keys(spec: StackSpec, root: Path) -> tuple[dict[str, str], Path]:
    """Keys made by the real host script into `root`; the digest file nginx preloads."""
    out = subprocess.run(
        ["bash", "-c", keys_script(key_ids(spec), str(root))], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout), root / "nginx" / DIGESTS_FILE


def send_held(
    gw: NginxGateway,
    key: str,
    replicas: list[FakeReplica],
    rid: str,
) -> tuple[FakeReplica, threading.Thread, dict[str, Any]]:
    """Send a request its replica holds unanswered (until its gate opens); return that replica."""
    held: dict[str, Any] = {}
    client = threading.Thread(
        target=lambda: held.update(
            result=gw.call("POST", "/v1/chat/completions", {"model": CHAT, "rid": rid, "hold": rid}, key)
        )
    )
    client.start()
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = next((r for r in replicas if rid in r.rids()), None)
        if got is not None:
            return got, client, held
        time.sleep(0.01)
    pytest.fail(f"no replica received the held request {rid!r}")


@contextlib.contextmanager
def own_gateway(
    spec: StackSpec, pools: dict[str, list[FakeReplica]], root: Path, tls_dir: Path | None = None
) -> Iterator[tuple[NginxGateway, dict[str, str]]]:
    """A gateway of its own for a test that kills replicas or changes the listener; host-made keys."""
    keys, digests = host_keys(spec, root / "keys")
    (root / "gw").mkdir()
    gw = NginxGateway(spec, pools, root / "gw", digests, tls_dir=tls_dir)
    try:
        yield gw, keys
    finally:
        gw.stop()
        for rs in pools.values():
            for r in rs:
                r.kill()


def by_name(replicas: dict[str, list[FakeReplica]]) -> dict[str, FakeReplica]:
    return {r.name: r for rs in replicas.values() for r in rs}


def error_code(payload: Any) -> str:
    """The OpenAI error's code; fails unless the body has the OpenAI error shape."""
    assert isinstance(payload, dict) and set(payload) == {"error"}, payload
    assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
    return str(payload["error"]["code"])


def self_signed(dir_: Path) -> Path:
    dir_.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(dir_ / "key.pem"),
            "-out",
            str(dir_ / "cert.pem"),
        ],
        capture_output=True,
        check=True,
    )
    return dir_


# 200 requests at once, the client, nginx and the fake replicas sharing two cores with the rest of the suite:
# a hang detector with room for a loaded machine, not a measure; an answer that never comes still fails.
LOAD_WAIT = 3 * WAIT


async def _post(port: int, key: str, rid: str) -> tuple[int, dict[str, Any] | str]:
    """One POST on its own connection (asyncio: hundreds at once without a thread each)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"model": CHAT, "rid": rid, "delay": 0.05}).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), LOAD_WAIT)
    writer.close()
    head, _, payload = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode(errors="replace")
