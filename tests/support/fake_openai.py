"""A small OpenAI-compatible server on loopback for the smoke and load tests: chat completions
(plain and streamed, with usage), GET /v1/models, bearer keys, and per-model misbehaviour."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Behaviour:
    """What the server does for one model: `fail_first` requests answer `fail_status`, then `reply`."""

    reply: str = "Hello! How can I help?"
    usage: bool = True
    fail_first: int = 0
    fail_status: int = 502
    fail_every: int = 0  # also every n-th request (after the first ones) answers fail_status
    token_delay_s: float = 0.0
    seen: int = 0


@dataclass
class FakeOpenAI:
    """The server's state: accepted keys (empty: none needed), behaviour per model, requests seen."""

    keys: set[str] = field(default_factory=set)
    models: dict[str, Behaviour] = field(default_factory=dict)
    requests: list[dict[str, object]] = field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(state: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _json(self, status: int, doc: object) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorised(self) -> bool:
            if not state.keys:
                return True
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Bearer ") and auth[7:] in state.keys:
                return True
            self._json(401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}})
            return False

        def do_GET(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            if self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in state.models]})
            else:
                self._json(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            if not self._authorised():
                return
            if self.headers.get("Content-Type", "").split(";")[0] != "application/json":
                self._json(415, {"error": {"message": "Content-Type must be application/json"}})
                return
            doc = json.loads(raw)
            with lock:
                state.requests.append(
                    {"path": self.path, "body": doc, "authorization": self.headers.get("Authorization")}
                )
            b = state.models.get(doc.get("model", ""))
            if b is None:
                self._json(404, {"error": {"message": f"model {doc.get('model')!r} not found"}})
                return
            with lock:
                b.seen += 1
                failing = b.seen <= b.fail_first or bool(b.fail_every and b.seen % b.fail_every == 0)
            if failing:
                self._json(b.fail_status, {"error": {"message": "upstream failed"}})
                return
            words = b.reply.split(" ") if b.reply else []
            usage = {"prompt_tokens": 12, "completion_tokens": len(words), "total_tokens": 12 + len(words)}
            if doc.get("stream"):
                self._stream(doc, words, usage if b.usage else None, b.token_delay_s)
                return
            out: dict[str, object] = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": doc["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": b.reply}, "finish_reason": "stop"}
                ],
            }
            if b.usage:
                out["usage"] = usage
            self._json(200, out)

        def _stream(self, doc: dict[str, object], words: list[str], usage: dict[str, int] | None, delay: float) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(obj: object) -> None:
                data = f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            base = {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": doc["model"],
            }
            for i, w in enumerate(words):
                time.sleep(delay)
                send(
                    {
                        **base,
                        "choices": [{"index": 0, "delta": {"content": (" " if i else "") + w}, "finish_reason": None}],
                    }
                )
            send({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            if usage is not None:
                send({**base, "choices": [], "usage": usage})
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    return Handler


@contextmanager
def serving(state: FakeOpenAI, tls: tuple[str, str] | None = None) -> Iterator[FakeOpenAI]:
    """Run the fake server on a free loopback port for the duration of the block (HTTPS with (cert, key))."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    if tls is not None:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
