#!/usr/bin/python3
"""llm-cluster lab stand-in for dcgm-exporter (not DCGM): serves the default counters' names for each GPU
the container was given (NVIDIA_VISIBLE_DEVICES, set by docker's --gpus), on DCGM_EXPORTER_LISTEN."""

import os
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "dcgm-counters.txt")) as f:
    COUNTERS = [line.split() for line in f if line.strip() and not line.startswith("#")]


def gpus():
    visible = os.environ.get("NVIDIA_VISIBLE_DEVICES", "")
    if visible in ("", "void", "none"):
        return []
    return [str(i) for i in range(8)] if visible == "all" else visible.split(",")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        if self.path != "/metrics":
            self.send_response(404)
            self.end_headers()
            return
        lines = []
        for name, kind in COUNTERS:
            lines.append("# TYPE %s %s" % (name, kind))
            for g in gpus():
                lines.append(
                    '%s{gpu="%s",UUID="GPU-lab-%s",device="nvidia%s",modelName="Tesla V100-SXM2-32GB",'
                    'Hostname="%s"} 0' % (name, g, g, g, socket.gethostname())
                )
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    host, _, port = os.environ.get("DCGM_EXPORTER_LISTEN", ":9400").rpartition(":")
    ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler).serve_forever()
