"""HTTP plumbing of the lab's Python engine stand-ins (vLLM, LMDeploy): JSON answers and SSE streams.

Copied into each such image beside its stand-in package (lab/images.py), as the module `openai_http`.
"""

import json
from http.server import BaseHTTPRequestHandler


class OpenAIHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive; JSON bodies with a length; streams as chunked `data: ...` events."""

    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def completion_request(self, invalid):
        """The JSON body of a POST to /v1/chat/completions or /v1/completions; None when already answered:
        404 for another path, 400 with the engine's `invalid` error body when it is not JSON."""
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self.send(400, invalid)
            return None
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self.send(404, {"detail": "Not Found"})
            return None
        return req

    def send(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self, ctype="text/event-stream"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, obj):
        """One server-sent event holding `obj`."""
        self.raw(("data: %s\n\n" % json.dumps(obj)).encode())

    def end_stream(self):
        self.raw(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def raw(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
