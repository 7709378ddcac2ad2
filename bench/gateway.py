"""Gateway overhead on loopback: direct to a fake replica, through plain nginx proxy_pass, through the gateway.

The fake replica is nginx itself answering a fixed chat completion (with `usage`), so the replica is
never the bottleneck. Plain proxy and gateway both run one nginx worker with keepalive upstreams;
the gateway is the reference stack's generated config (njs key lookup, body routing, per-key
limit_req at a rate it never reaches, usage body filter, JSON access log), once without and once
with its metrics (a syslog datagram per request to the real exporter, as deployed). wrk drives each
target: one connection for latency (p50/p99), 32 connections for requests/s. Afterwards the
exporter's line count is compared with the requests wrk completed (UDP may drop under load).
Prints figures and ratios; asserts nothing.
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.planning.gateway import (  # noqa: E402
    EXPORTER_SOURCE, GatewayLayout, key_digests, key_ids, render_gateway,
)
from components.spec import StackSpec, load_stack_config  # noqa: E402
from plan.stackfile import load_stack_file  # noqa: E402
from tests.support import free_port, free_ports  # noqa: E402
from plan.cli import run as run_cli  # noqa: E402

NJS_MODULE = "/usr/lib/nginx/modules/ngx_http_js_module.so"
KEY = "sk-bench-0123456789abcdef"
SECONDS = 5
BODY = json.dumps({"model": "qwen3-30b-a3b", "messages": [{"role": "user", "content": "你好"}], "max_tokens": 8})
REPLY = json.dumps({"id": "cmpl-1", "object": "chat.completion", "model": "qwen3-30b-a3b",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                    "usage": {"prompt_tokens": 11, "total_tokens": 18, "completion_tokens": 7}})


def start_nginx(root: Path, conf: str, port: int) -> subprocess.Popen[bytes]:
    """nginx in the foreground with this config under `root`, once it listens on `port`."""
    (root / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(["nginx", "-p", str(root), "-c", str(root / "nginx.conf"), "-g", "daemon off;"],
                            stderr=subprocess.PIPE)
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit(f"nginx failed: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nginx did not listen")


def simple_conf(root: Path, port: int, location: str, upstream: str = "") -> str:
    """A one-worker nginx with a single location (the fake replica, or the plain proxy)."""
    return f"""pid {root}/pid; error_log {root}/error.log warn;
worker_processes 1;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {root}/body; proxy_temp_path {root}/proxy;
    {upstream}
    server {{ listen 127.0.0.1:{port}; location / {{ {location} }} }}
}}
"""


def wrk(url: str, connections: int, root: Path) -> dict[str, float]:
    """requests/s, p50 and p99 (ms) and non-2xx count of a POST of BODY with the key."""
    script = root / "post.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(BODY)}\n'
                      'wrk.headers["Content-Type"] = "application/json"\n'
                      f'wrk.headers["Authorization"] = "Bearer {KEY}"\n')
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{SECONDS}s", "--latency", "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        value, unit = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
            "p50": ms("50%"), "p99": ms("99%"), "non2xx": float(bad.group(1)) if bad else 0.0,
            "requests": float(re.search(r"(\d+) requests in", out).group(1))}  # type: ignore[union-attr]


def start_gateway(spec: StackSpec, root: Path, up: int, syslog_port: int | None) -> tuple[subprocess.Popen[bytes], int]:
    """The generated gateway (one worker) in front of the fake replica; its port."""
    (root / "tmp").mkdir(parents=True)
    port = free_port()
    (root / "digests.json").write_text(key_digests({"default": KEY}, key_ids(spec)))
    layout = GatewayLayout(
        port=port, listen_address="127.0.0.1", conf_dir=str(root), load_module=NJS_MODULE,
        digests_file=str(root / "digests.json"), pid_file=str(root / "pid"),
        error_log=str(root / "error.log"), access_log=str(root / "access.log"),
        temp_dir=str(root / "tmp"), user=None, worker_processes="1", syslog_port=syslog_port)
    files = render_gateway(spec, layout, {pool: [("127.0.0.1", up)] for pool in spec.pools})
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return start_nginx(root, files["nginx.conf"], port), port


def exporter_lines(port: int) -> float:
    """llm_gateway_log_lines_total once it stops growing (the exporter drains its socket)."""
    last = -1.0
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        lines = float(re.search(r"^llm_gateway_log_lines_total (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
        if lines == last:
            return lines
        last = lines
        time.sleep(0.5)


def record_rate(lines: int = 100_000) -> float:
    """Lines per second Metrics.record() takes in, in process: the exporter's ceiling on one core."""
    from components.planning.gateway_exporter import Metrics  # noqa: PLC0415
    line = {"time": "2025-01-01T00:00:00+00:00", "request_id": "0" * 32, "key_id": "default", "method": "POST",
            "path": "/v1/chat/completions", "model": "qwen3-30b-a3b", "pool": "chat", "upstream": "127.0.0.1:8000",
            "status": 200, "upstream_status": "200", "request_time": 0.012, "upstream_time": "0.011",
            "request_bytes": 312, "response_bytes": 420, "prompt_tokens": 11, "completion_tokens": 7,
            "total_tokens": 18}
    datagram = b"<190>Jan  1 00:00:00 llmgw: " + json.dumps(line, separators=(",", ":")).encode()
    metrics = Metrics()
    start = time.perf_counter()
    for _ in range(lines):
        metrics.record(datagram)
    return lines / (time.perf_counter() - start)


def main() -> None:
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install -y {'nginx-light libnginx-mod-http-js' if tool == 'nginx' else 'wrk'}")
    config = load_stack_file(ROOT / "Pulumi.prod.yaml", "prod").config
    # The reference key's 20 r/s would turn the benchmark into a 429 test; the zone stays in the path.
    config["llm-cluster:gateway"]["apiKeys"] = [{"id": "default",
                                                 "rateLimit": {"requestsPerSecond": 1000000, "burst": 1000000}}]
    spec = load_stack_config(config, set())
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        base = Path(tmp)
        try:
            up_root, proxy_root = base / "replica", base / "proxy"
            for d in (up_root, proxy_root):
                d.mkdir(parents=True)
            up, proxy, syslog, metrics = free_ports(4)
            reply = REPLY.replace("'", "")
            procs.append(start_nginx(up_root, simple_conf(
                up_root, up, f"default_type application/json; return 200 '{reply}';"), up))
            procs.append(start_nginx(proxy_root, simple_conf(
                proxy_root, proxy,
                'proxy_pass http://replica; proxy_http_version 1.1; proxy_set_header Connection "";',
                f"upstream replica {{ server 127.0.0.1:{up}; keepalive 32; }}"), proxy))
            # (free_port's TCP port is free for UDP too in practice; the exporter fails loudly if not.)
            procs.append(subprocess.Popen([sys.executable, str(EXPORTER_SOURCE), "--syslog", f"127.0.0.1:{syslog}",
                                           "--listen", f"127.0.0.1:{metrics}"], stderr=subprocess.DEVNULL))
            proc, gw = start_gateway(spec, base / "gateway", up, None)
            procs.append(proc)
            proc, gw_metrics = start_gateway(spec, base / "gateway-metrics", up, syslog)
            procs.append(proc)

            targets = {"direct": f"http://127.0.0.1:{up}/v1/chat/completions",
                       "nginx proxy_pass": f"http://127.0.0.1:{proxy}/v1/chat/completions",
                       "gateway": f"http://127.0.0.1:{gw}/v1/chat/completions",
                       "gateway+metrics": f"http://127.0.0.1:{gw_metrics}/v1/chat/completions"}
            results = {name: (wrk(url, 1, base), wrk(url, 32, base)) for name, url in targets.items()}
            counted = exporter_lines(metrics)
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)

    print(f"gateway benchmark: loopback, wrk 1 thread, {SECONDS}s per run, one nginx worker each")
    print(f"{'target':<18}{'p50 ms (c=1)':>14}{'p99 ms (c=1)':>14}{'req/s (c=32)':>14}{'p99 ms (c=32)':>15}{'non-2xx':>9}")
    for name, (single, many) in results.items():
        print(f"{name:<18}{single['p50']:>14.3f}{single['p99']:>14.3f}{many['rps']:>14.0f}{many['p99']:>15.3f}"
              f"{int(single['non2xx'] + many['non2xx']):>9}")
    direct, plain, gate, metered = (results[n] for n in targets)
    print(f"added p50 vs plain nginx: {gate[0]['p50'] - plain[0]['p50']:+.3f} ms "
          f"(vs direct: {gate[0]['p50'] - direct[0]['p50']:+.3f} ms); target < 1 ms")
    print(f"added p99 vs plain nginx: {gate[0]['p99'] - plain[0]['p99']:+.3f} ms")
    print(f"throughput gateway / plain nginx: {gate[1]['rps'] / plain[1]['rps']:.2f}x; target >= 0.80x "
          f"(gateway / direct: {gate[1]['rps'] / direct[1]['rps']:.2f}x)")
    print(f"metrics (syslog datagram per request): p50 {metered[0]['p50'] - gate[0]['p50']:+.3f} ms, "
          f"throughput {metered[1]['rps'] / gate[1]['rps']:.2f}x of the gateway without them")
    print(f"exporter alone: {record_rate():.0f} log lines/s parsed and counted on one core")
    completed = metered[0]["requests"] + metered[1]["requests"]
    print(f"exporter counted {counted:.0f} log lines for {completed:.0f} completed requests "
          f"({max(0.0, completed - counted) / completed:.2%} lost; lines of requests cut off by wrk's stop count too)")


if __name__ == "__main__":
    run_cli(main)
