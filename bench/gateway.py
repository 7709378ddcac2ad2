"""Gateway overhead on loopback, side by side with a peer: direct, plain nginx, the gateway, LiteLLM.

One run measures, against the same fast fake replica (nginx answering a fixed chat completion with
`usage`, so the replica is never the limit): direct; plain nginx `proxy_pass` with keepalive; the
gateway as deployed (the reference stack's generated config, over plain HTTP like the others: key
lookup, routing by the body's `model`, the per-key limit_req at a rate it never reaches, the usage
filter, the daily usage files and the Prometheus counters, all inside nginx on its Lua module); the
same with a token budget on the key; and LiteLLM's proxy (`litellm --config`, the same model and
replica, one worker), the peer users would otherwise pick. LiteLLM is an optional dependency of the
bench only: installed on first use into its own venv under /var/cache/llm-cluster/litellm (never by
`make test`); `--no-litellm` skips it. `--repetitions N` (default 5) repeats the interleaved runs.

Every nginx (replica, plain proxy, gateway) is the deployed one: the gateway image's nginx and Lua
module, unpacked from its pinned Debian packages by tests/support/deployed_nginx.py (what the real-nginx
tests run). After the runs the bench reads the gateway's own /metrics and usage files, so a figure
that came from dropping the record would show.

wrk drives each target at 32 and 256 connections for a few seconds; the targets are interleaved
(in the reverse order every other repetition) and repeated, and each figure is the median over
repetitions; each ratio to plain nginx is also given per repetition (the two ran seconds apart,
next to each other) with their median, the figure least moved by the machine's own drift. Every nginx runs one worker. Prints
figures and ratios; asserts nothing. The machine is shared: run it briefly, say the conditions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from components.planning.gateway.keys import key_digests, key_ids
from components.planning.gateway.layout import GatewayLayout
from components.planning.gateway.nginx import render_gateway, temp_path_directives
from components.planning.load import load_stack_config
from components.spec import StackSpec
from plan.cli import run as run_cli
from plan.stackfile import load_stack_file
from tests.support import free_port, free_ports
from tests.support.deployed_nginx import DeployedNginx, deployed_nginx

ROOT = Path(__file__).resolve().parent.parent

KEY = "sk-bench-0123456789abcdef"
SECONDS = 3
REPETITIONS = 5
CONNECTIONS = (32, 256)
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = Path("/var/cache/llm-cluster/litellm/venv")
BODY = json.dumps({"model": "qwen3-30b-a3b", "messages": [{"role": "user", "content": "你好"}], "max_tokens": 8})
REPLY = json.dumps(
    {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "qwen3-30b-a3b",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "total_tokens": 18, "completion_tokens": 7},
    }
)
GATEWAY = "gateway (as deployed)"
BUDGETED = "gateway + token budget"


def label(nginx: DeployedNginx) -> str:
    p = nginx.packages
    return f"nginx {p['nginx']} + ngx_http_lua_module {p['libnginx-mod-http-lua']} (deployed)"


def bench_spec(budget: bool = False, policy: str | None = None) -> StackSpec:
    """The reference stack over plain HTTP like the other targets (the deployed gateway adds TLS on
    top), its key's rate limit never reached (20 r/s would make the bench a 429 test; the zone stays
    in the path); with `budget`, a token budget on the key it never exhausts; `policy`: the gateway's
    routing policy (gateway.routing.policy), else the stack's."""
    config = load_stack_file(ROOT / "Pulumi.prod.yaml", "prod").config
    key: dict[str, object] = {"id": "default", "rateLimit": {"requestsPerSecond": 1000000, "burst": 1000000}}
    if budget:
        key["tokenBudget"] = {"tokens": 10**12, "windowSeconds": 3600}
    config["llm-cluster:gateway"].update(tls=False, port=80, apiKeys=[key])
    if policy is not None:
        config["llm-cluster:gateway"]["routing"] = {
            **config["llm-cluster:gateway"].get("routing", {}),
            "policy": policy,
        }
    return load_stack_config(config, set())


def start_nginx(nginx: DeployedNginx, root: Path, conf: str, port: int) -> subprocess.Popen[bytes]:
    """nginx in the foreground with this config under `root`, once it listens on `port`."""
    (root / "nginx.conf").write_text(conf)
    proc = subprocess.Popen(
        [*nginx.argv, "-p", str(root), "-c", str(root / "nginx.conf"), "-g", "daemon off;"], stderr=subprocess.PIPE
    )
    for _ in range(200):
        if proc.poll() is not None:
            raise SystemExit(f"nginx failed: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nginx did not listen")


def worker_of(master: int) -> int:
    """The pid of the one worker the nginx master `master` started."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a process that ended while the scan ran
        if int(fields[1]) == master:
            return int(stat.parent.name)
    raise SystemExit(f"nginx {master} has no worker")


def cpu_ns(pid: int) -> int:
    """The time `pid` has spent on a CPU (ns, /proc/<pid>/schedstat): the kernel's own clock for the task,
    without the time the hypervisor gave another guest (steal), so a per-request figure that the
    machine's neighbours move far less than req/s."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def simple_conf(root: Path, port: int, location: str, upstream: str = "") -> str:
    """A one-worker nginx with a single location (the fake replica, or the plain proxy)."""
    return f"""pid {root}/pid; error_log {root}/error.log warn;
worker_processes 1;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    {" ".join(temp_path_directives(root))}
    {upstream}
    server {{ listen 127.0.0.1:{port}; location / {{ {location} }} }}
}}
"""


def wrk(url: str, connections: int, root: Path, seconds: int = SECONDS, worker: int | None = None) -> dict[str, float]:
    """requests/s, p50 and p99 (ms) and non-2xx count of a POST of BODY with the key; with the pid of
    the target's nginx worker, also its CPU time per request (µs)."""
    script = root / "post.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(BODY)}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {KEY}"\n'
    )
    before = cpu_ns(worker) if worker else 0
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    busy = cpu_ns(worker) - before if worker else 0

    def ms(label: str) -> float:
        value, unit = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    late = re.search(r"Socket errors: .*timeout (\d+)", out)
    requests = float(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50": ms("50%"),
        "p99": ms("99%"),
        "non2xx": float(bad.group(1)) if bad else 0.0,
        "timeouts": float(late.group(1)) if late else 0.0,
        "requests": requests,
        # wrk leaves out the requests its stop cut off (at most one per connection): a few
        # more served than counted, alike for every nginx.
        "cpu_us": busy / 1000 / max(requests, 1),
    }


def write_gateway(
    nginx: DeployedNginx,
    spec: StackSpec,
    root: Path,
    up: int | Mapping[str, Sequence[int]],
    listen: tuple[int, int] | None = None,
) -> tuple[int, int]:
    """The generated gateway's files under `root` (one worker, in front of the replica on port `up` for every
    pool, or of each pool's replicas on loopback, its usage files in root/usage); the ports it will listen
    on and serve /metrics on (`listen`: those of the gateway already there, whose files are rewritten for a
    reload)."""
    (root / "tmp").mkdir(parents=True, exist_ok=listen is not None)
    (root / "tmp").chmod(0o777)  # nginx's workers run as nobody here
    port, metrics = listen or free_ports(2)
    (root / "digests.json").write_text(key_digests({"default": KEY}, key_ids(spec)))
    layout = GatewayLayout(
        port=port,
        listen_address="127.0.0.1",
        conf_dir=str(root),
        **nginx.layout_fields(),  # type: ignore[arg-type]
        digests_file=str(root / "digests.json"),
        pid_file=str(root / "pid"),
        error_log=str(root / "error.log"),
        usage_dir=str(root / "usage"),
        metrics_listen=f"127.0.0.1:{metrics}",
        temp_dir=str(root / "tmp"),
        user=None,
        worker_processes="1",
    )
    (root / "usage").mkdir(exist_ok=listen is not None)
    (root / "usage").chmod(0o777)  # nginx's workers run as nobody here
    root.chmod(0o755)
    ports = {pool: [up] for pool in spec.pools} if isinstance(up, int) else up
    files = render_gateway(spec, layout, {pool: [("127.0.0.1", p) for p in ps] for pool, ps in ports.items()})
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return port, metrics


def start_gateway(
    nginx: DeployedNginx, spec: StackSpec, root: Path, up: int
) -> tuple[subprocess.Popen[bytes], int, int]:
    """The generated gateway started; its port and its metrics port."""
    port, metrics = write_gateway(nginx, spec, root, up)
    return start_nginx(nginx, root, (root / "nginx.conf").read_text(), port), port, metrics


def recorded(metrics_port: int, usage_dir: Path) -> tuple[float, int]:
    """What the gateway recorded once its workers flushed: the sum of llm_gateway_requests_total and
    the usage files' lines."""
    last = (-1.0, -1)
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        counted = sum(float(v) for v in re.findall(r"^llm_gateway_requests_total\{[^}]*\} (\S+)$", text, re.M))
        lines = sum(f.read_bytes().count(b"\n") for f in usage_dir.glob("usage-*.log"))
        if (counted, lines) == last:
            return last
        last = (counted, lines)
        time.sleep(2.5)  # longer than the workers' flush interval


def litellm_python() -> Path:
    """The venv with LiteLLM's proxy, made on first use (an optional dependency of this bench only)."""
    python = LITELLM_VENV / "bin" / "python"
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        print(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
    return python


def start_litellm(root: Path, up: int) -> tuple[subprocess.Popen[bytes], int]:
    """LiteLLM's proxy, one worker, routing the bench's model to the fake replica; its port once it answers."""
    port = free_port()
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": "qwen3-30b-a3b",
                        "litellm_params": {
                            "model": "openai/qwen3-30b-a3b",
                            "api_base": f"http://127.0.0.1:{up}/v1",
                            "api_key": "none",
                        },
                    }
                ],
                "general_settings": {"master_key": KEY},
            }
        )
    )
    proc = subprocess.Popen(
        [
            str(LITELLM_VENV / "bin" / "litellm"),
            "--config",
            str(root / "config.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "litellm.log", "wb"),
    )
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=BODY.encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )
    for _ in range(240):  # its start takes tens of seconds on a busy machine
        if proc.poll() is not None:
            raise SystemExit(f"litellm exited: {(root / 'litellm.log').read_text()[-2000:]}")
        try:
            urllib.request.urlopen(request, timeout=5).read()
            return proc, port
        except OSError:
            time.sleep(0.5)
    raise SystemExit("litellm did not answer within 120 s")


def median(values: list[float]) -> float:
    return statistics.median(values)


def repetitions(argv: list[str]) -> int:
    """--repetitions N (default REPETITIONS)."""
    if "--repetitions" not in argv:
        return REPETITIONS
    at = argv.index("--repetitions") + 1
    if at >= len(argv) or not argv[at].isdigit() or int(argv[at]) < 1:
        raise SystemExit("--repetitions takes a whole number of at least 1")
    return int(argv[at])


def main() -> None:
    with_litellm = "--no-litellm" not in sys.argv
    reps = repetitions(sys.argv)
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install -y wrk")
    nginx = deployed_nginx()
    load_before = os.getloadavg()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        base = Path(tmp)
        # nginx's workers run as nobody here: they must reach the usage directories to write them.
        base.chmod(0o755)
        try:
            up_root, proxy_root = base / "replica", base / "proxy"
            for d in (up_root, proxy_root):
                d.mkdir(parents=True)
            up, proxy = free_ports(2)
            reply = REPLY.replace("'", "")
            procs.append(
                start_nginx(
                    nginx,
                    up_root,
                    simple_conf(up_root, up, f"default_type application/json; return 200 '{reply}';"),
                    up,
                )
            )
            procs.append(
                start_nginx(
                    nginx,
                    proxy_root,
                    simple_conf(
                        proxy_root,
                        proxy,
                        'proxy_pass http://replica; proxy_http_version 1.1; proxy_set_header Connection "";',
                        f"upstream replica {{ server 127.0.0.1:{up}; keepalive 32; }}",
                    ),
                    proxy,
                )
            )
            gateways: dict[str, tuple[int, int, Path]] = {}
            for name, spec in ((GATEWAY, bench_spec()), (BUDGETED, bench_spec(budget=True))):
                root = base / name.split()[-1]
                proc, port, metrics = start_gateway(nginx, spec, root, up)
                procs.append(proc)
                gateways[name] = (port, metrics, root / "usage")
            path = "/v1/chat/completions"
            # Each target's URL and its nginx worker (procs: replica, plain proxy, the gateways).
            workers = [worker_of(p.pid) for p in procs]
            targets: dict[str, tuple[str, int | None]] = {
                "direct": (f"http://127.0.0.1:{up}{path}", workers[0]),
                "nginx proxy_pass": (f"http://127.0.0.1:{proxy}{path}", workers[1]),
                **{
                    name: (f"http://127.0.0.1:{port}{path}", worker)
                    for (name, (port, _, _)), worker in zip(gateways.items(), workers[2:])
                },
            }
            if with_litellm:
                litellm_python()
                proc, lport = start_litellm(base / "litellm", up)
                procs.append(proc)
                targets["LiteLLM proxy"] = (f"http://127.0.0.1:{lport}{path}", None)
            runs: dict[tuple[str, int], list[dict[str, float]]] = {}
            order = list(targets.items())
            for rep in range(reps):
                for c in CONNECTIONS:
                    # Interleaved, drift on the shared machine hits all alike; the order reversed every
                    # other repetition, so a machine speeding up or slowing down favours no target.
                    for name, (url, worker) in order if rep % 2 == 0 else order[::-1]:
                        runs.setdefault((name, c), []).append(wrk(url, c, base, worker=worker))
            records = {name: recorded(metrics, usage) for name, (_, metrics, usage) in gateways.items()}
        finally:
            for p in procs:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()  # LiteLLM's proxy may ignore SIGTERM while it drains
                    p.wait(10)

    load = os.getloadavg()
    print(
        f"gateway benchmark: {label(nginx)}; loopback, wrk 1 thread, {SECONDS}s per run, {reps} "
        f"interleaved repetitions, medians; one nginx worker each; {os.cpu_count()} cores shared, load average "
        f"{load_before[0]:.1f} before, {load[0]:.1f} after (1-minute)"
    )
    print(
        f"{'target':<24}{'conns':>6}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'non-2xx':>9}{'timeouts':>10}"
        f"{'worker CPU µs/req':>19}"
    )
    fig: dict[tuple[str, int], dict[str, float]] = {}
    for (name, c), rs in runs.items():
        fig[(name, c)] = {k: median([r[k] for r in rs]) for k in ("rps", "p50", "p99", "cpu_us")}
        bad = int(sum(r["non2xx"] for r in rs))
        f = fig[(name, c)]
        timeouts = int(sum(r["timeouts"] for r in rs))
        cpu = f"{f['cpu_us']:.1f}" if targets[name][1] else "-"
        print(f"{name:<24}{c:>6}{f['rps']:>10.0f}{f['p50']:>9.3f}{f['p99']:>9.3f}{bad:>9}{timeouts:>10}{cpu:>19}")
    for c in CONNECTIONS:
        plain = fig[("nginx proxy_pass", c)]
        parts = []
        for name in gateways:
            # Also each repetition's own ratio: plain nginx and the gateway run seconds apart in a
            # repetition, so a machine that speeds up or slows down between repetitions moves both alike.
            paired = [g["rps"] / p["rps"] for g, p in zip(runs[(name, c)], runs[("nginx proxy_pass", c)])]
            # What one worker's core serves, as a share of plain nginx's: its CPU per request against
            # plain nginx's, per repetition (the req/s ratio when the worker is the bottleneck, less
            # the hypervisor's steal and the other processes' share of the two cores).
            capacity = [p["cpu_us"] / g["cpu_us"] for g, p in zip(runs[(name, c)], runs[("nginx proxy_pass", c)])]
            parts.append(
                f"{name} / plain nginx {fig[(name, c)]['rps'] / plain['rps']:.2f}x req/s (paired: "
                f"{', '.join(f'{r:.2f}' for r in paired)}; median {median(paired):.2f}x), "
                f"{median(capacity):.2f}x per worker CPU (paired: {', '.join(f'{r:.2f}' for r in capacity)}), "
                f"added p50 {fig[(name, c)]['p50'] - plain['p50']:+.3f} ms"
            )
        if ("LiteLLM proxy", c) in fig:
            lite = fig[("LiteLLM proxy", c)]
            parts.append(
                f"gateway / LiteLLM {fig[(GATEWAY, c)]['rps'] / lite['rps']:.0f}x req/s"
                if lite["rps"]
                else "LiteLLM completed no request within wrk's 10 s timeout"
            )
        print(f"c={c}: " + "; ".join(parts) + " (goals at 32: >= 0.6x, < 1 ms)")
    for name, (counted, lines) in records.items():
        completed = sum(r["requests"] for c in CONNECTIONS for r in runs[(name, c)])
        print(
            f"{name}: /metrics counted {counted:.0f} requests and the usage files hold {lines} lines, for "
            f"{completed:.0f} completed requests (wrk does not count the requests its stop cuts off, nginx does)"
        )


if __name__ == "__main__":
    run_cli(main)
