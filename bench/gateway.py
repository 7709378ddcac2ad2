"""Gateway overhead on loopback, side by side with a peer: direct, plain nginx, the gateway, LiteLLM.

One run measures, against the same fast fake replica (nginx answering a fixed chat completion with
`usage`, so the replica is never the limit): direct; plain nginx `proxy_pass` with keepalive; the
gateway as deployed (the reference stack's generated config: njs key lookup, body routing, per-key
limit_req at a rate it never reaches, usage body filter, the daily usage file, and the real metrics
exporter following that file), over plain HTTP like the others; the gateway with last session's
metrics path as well (each usage line also sent as a syslog datagram to an exporter on `--syslog`),
the alternative this session measured and dropped; and LiteLLM's proxy
(`litellm --config`, the same model and replica, one worker), the peer users would otherwise pick.
LiteLLM is an optional dependency of the bench only: installed on first use into its own venv
under /var/cache/llm-cluster/litellm (never by `make test`); `--no-litellm` skips it.

Every nginx (replica, plain proxy, gateway) is the deployed one: the gateway image's nginx + njs,
unpacked from its pinned Debian packages by tests/deployed_nginx.py (what the real-nginx tests run);
`--host-nginx` runs the host's `nginx` and its njs module instead (Debian bookworm: nginx 1.22 +
njs 0.7.9), to compare builds.

`--lua` adds a measured alternative, not deployed: the same generated config with the routed
request path (key lookup, body routing to the pool's own location, usage filter) in Lua
(bench/gateway_lua.lua) on Debian's ngx_http_lua_module + LuaJIT for that nginx, whose packages it
fetches once into /var/cache/llm-cluster/gateway-lua. bench/gateway_instructions.py counts the
instructions per request of every alternative.

wrk drives each target at 32 and 256 connections for a few seconds; the targets are interleaved
and repeated, and each figure is the median over repetitions. Every nginx runs one worker. Prints
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.planning.gateway import (  # noqa: E402
    EXPORTER_SOURCE, GatewayLayout, key_digests, key_ids, render_gateway,
)
from components.spec import StackSpec, load_stack_config  # noqa: E402
from plan.stackfile import load_stack_file  # noqa: E402
from plan.cli import run as run_cli  # noqa: E402
from tests.deployed_nginx import CACHE, LIBDIRS, LOADER, deployed_nginx  # noqa: E402
from tests.deployed_nginx import _apt_env as apt_env, _run as run_tool  # noqa: E402
from tests.support import free_port, free_ports  # noqa: E402

HOST_NJS_MODULE = "/usr/lib/nginx/modules/ngx_http_js_module.so"
KEY = "sk-bench-0123456789abcdef"
SECONDS = 3
REPETITIONS = 3
CONNECTIONS = (32, 256)
LITELLM_VERSION = "1.108.7"
LITELLM_VENV = Path("/var/cache/llm-cluster/litellm/venv")
BODY = json.dumps({"model": "qwen3-30b-a3b", "messages": [{"role": "user", "content": "你好"}], "max_tokens": 8})
REPLY = json.dumps({"id": "cmpl-1", "object": "chat.completion", "created": 1700000000, "model": "qwen3-30b-a3b",
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 11, "total_tokens": 18, "completion_tokens": 7}})


@dataclass(frozen=True)
class Build:
    """The nginx every target runs, and its njs module."""

    nginx: str
    njs_module: str
    label: str


def build(host: bool) -> Build:
    """The deployed nginx + njs (fetched once per machine), or the host's with `--host-nginx`."""
    if host:
        if shutil.which("nginx") is None or not Path(HOST_NJS_MODULE).exists():
            raise SystemExit("--host-nginx needs the host's nginx and njs: apt-get install -y nginx-light libnginx-mod-http-js")
        return Build("nginx", HOST_NJS_MODULE, "the host's nginx")
    found = deployed_nginx()
    return Build(str(found.nginx), str(found.njs_module),
                 f"nginx {found.packages['nginx']} + njs {found.packages['libnginx-mod-http-js']} (deployed)")


def bench_spec(budget: bool = False) -> StackSpec:
    """The reference stack over plain HTTP like the other targets (the deployed gateway adds TLS on
    top), its key's rate limit never reached (20 r/s would make the bench a 429 test; the zone stays
    in the path); with `budget`, a token budget on the key it never exhausts."""
    config = load_stack_file(ROOT / "Pulumi.prod.yaml", "prod").config
    key: dict[str, object] = {"id": "default", "rateLimit": {"requestsPerSecond": 1000000, "burst": 1000000}}
    if budget:
        key["tokenBudget"] = {"tokens": 10**12, "windowSeconds": 3600}
    config["llm-cluster:gateway"].update(tls=False, port=80, apiKeys=[key])
    return load_stack_config(config, set())


def start_nginx(nginx: Build, root: Path, conf: str, port: int, libs: list[Path] | None = None) -> subprocess.Popen[bytes]:
    """nginx in the foreground with this config under `root` (and more library directories), once it
    listens on `port`."""
    (root / "nginx.conf").write_text(conf)
    proc = subprocess.Popen([*nginx_argv(nginx, libs), "-p", str(root), "-c", str(root / "nginx.conf"),
                             "-g", "daemon off;"], env=nginx_env(nginx, libs),
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


def wrk(url: str, connections: int, root: Path, seconds: int = SECONDS) -> dict[str, float]:
    """requests/s, p50 and p99 (ms) and non-2xx count of a POST of BODY with the key."""
    script = root / "post.lua"
    script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(BODY)}\n'
                      'wrk.headers["Content-Type"] = "application/json"\n'
                      f'wrk.headers["Authorization"] = "Bearer {KEY}"\n')
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s", "--latency",
                          "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        value, unit = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    late = re.search(r"Socket errors: .*timeout (\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
            "p50": ms("50%"), "p99": ms("99%"), "non2xx": float(bad.group(1)) if bad else 0.0,
            "timeouts": float(late.group(1)) if late else 0.0,
            "requests": float(re.search(r"(\d+) requests in", out).group(1))}  # type: ignore[union-attr]


def write_gateway(nginx: Build, spec: StackSpec, root: Path, up: int, syslog_port: int | None = None) -> int:
    """The generated gateway's files under `root` (one worker, in front of the fake replica on `up`,
    its usage log in daily files); the port it will listen on."""
    (root / "tmp").mkdir(parents=True)
    port = free_port()
    (root / "digests.json").write_text(key_digests({"default": KEY}, key_ids(spec)))
    layout = GatewayLayout(
        port=port, listen_address="127.0.0.1", conf_dir=str(root), load_module=nginx.njs_module,
        digests_file=str(root / "digests.json"), pid_file=str(root / "pid"),
        error_log=str(root / "error.log"), usage_dir=str(root / "usage"),
        temp_dir=str(root / "tmp"), user=None, worker_processes="1", syslog_port=syslog_port)
    (root / "usage").mkdir()
    (root / "usage").chmod(0o777)  # nginx's workers run as nobody here
    root.chmod(0o755)
    files = render_gateway(spec, layout, {pool: [("127.0.0.1", up)] for pool in spec.pools})
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return port


def start_gateway(nginx: Build, spec: StackSpec, root: Path, up: int,
                  syslog_port: int | None, lua: Path | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """The generated gateway started (with `lua`, its request path in Lua instead); its port."""
    port = write_gateway(nginx, spec, root, up, syslog_port)
    conf = (root / "nginx.conf").read_text()
    if lua is None:
        return start_nginx(nginx, root, conf, port), port
    return start_nginx(nginx, root, in_lua(conf, lua / "root", root), port, [lua / "root" / d for d in LIBDIRS]), port


# --- the measured alternative: the routed request path in Lua (bench/gateway_lua.lua) -------------

LUA_SOURCE = Path(__file__).with_name("gateway_lua.lua")
LUA_CACHE = CACHE.parent / "gateway-lua"
# Debian's Lua module and what it loads, for each nginx the bench can run (the module's nginx ABI).
LUA_PACKAGES = {
    "trixie": {"libnginx-mod-http-lua": "1:0.10.28-2", "libnginx-mod-http-ndk": "1:0.3.4-2",
               "lua-resty-core": "0.1.31-1", "lua-resty-lrucache": "0.15-2",
               "libluajit-5.1-2": "2.1.0+openresty20250117-2", "libluajit-5.1-common": "2.1.0+openresty20250117-2",
               "lua-cjson": "2.1.0+dfsg-2.2+b2"},
    "bookworm": {"libnginx-mod-http-lua": "1:0.10.23-1+deb12u1", "libnginx-mod-http-ndk": "1:0.3.2-3",
                 "lua-resty-core": "0.1.25-1", "lua-resty-lrucache": "0.13-10",
                 "libluajit2-5.1-2": "2.1-20230119-1", "libluajit2-5.1-common": "2.1-20230119-1",
                 "lua-cjson": "2.1.0+dfsg-2.2", "libpcre3": "2:8.39-15"},
}


def sub(pattern: str, replacement: str | Callable[[re.Match[str]], str], text: str) -> str:
    """re.sub once (a string replacement taken literally), refusing a generated config whose shape
    no longer has the pattern."""
    repl = replacement if callable(replacement) else (lambda _: replacement)  # type: ignore[misc]
    out, n = re.subn(pattern, repl, text, count=1, flags=re.S)
    if not n:
        raise SystemExit(f"the generated gateway no longer has {pattern!r}: update bench/gateway.py")
    return out


def in_lua(conf: str, lua_root: Path, root: Path) -> str:
    """The generated config with njs's directives replaced by the Lua module's (same maps, log, locations)."""
    modules = lua_root / "usr/lib/nginx/modules"
    conf = sub(r"load_module [^;]*ngx_http_js_module\.so;",
               f"load_module {modules}/ndk_http_module.so;\nload_module {modules}/ngx_http_lua_module.so;", conf)
    conf = sub(r"    js_preload_object llm_routes.*?    js_var \$llm_events 0;\n", f"""\
    lua_package_path "{LUA_SOURCE.parent}/?.lua;{lua_root}/usr/share/lua/5.1/?.lua;;";
    lua_package_cpath "{lua_root}/usr/lib/x86_64-linux-gnu/lua/5.1/?.so;;";
    init_by_lua_block {{ require("gateway_lua").init("{root}/llm/routes.json", "{root}/digests.json") }}
""", conf)
    conf = sub(r"    server \{\n        listen 127\.0\.0\.1:\d+;\n", lambda m: m.group(0) + """\
        set $llm_model "";
        set $llm_pool "";
        set $llm_body "";
        set $llm_usage "";
        set $llm_events 0;
        set_by_lua_block $llm_key_id { return require("gateway_lua").key_id() }
""", conf)
    conf = conf.replace("js_content gateway.route;", 'content_by_lua_block { require("gateway_lua").route() }')
    conf = conf.replace("js_content gateway.models;", 'return 200 "{}";')
    return conf.replace("js_body_filter gateway.usage buffer_type=buffer;",
                        'body_filter_by_lua_block { require("gateway_lua").usage() }')


def lua_tree(host: bool) -> Path:
    """Debian's Lua module for the nginx the bench runs, unpacked once into the cache."""
    release = "bookworm" if host else "trixie"
    packages = LUA_PACKAGES[release]
    target = LUA_CACHE / f"{release}-lua-{packages['libnginx-mod-http-lua'].replace(':', '-')}"
    if (target / "root/usr/lib/nginx/modules/ngx_http_lua_module.so").exists():
        return target
    print(f"gateway-lua: fetching {', '.join(packages)} ({release}) into {target} (once)", file=sys.stderr)
    LUA_CACHE.mkdir(parents=True, exist_ok=True)
    build_dir = Path(tempfile.mkdtemp(prefix=".lua.", dir=LUA_CACHE))
    try:
        env = None  # the host's own apt sources (bookworm)
        if not host:
            env = apt_env(build_dir / "apt")  # the gateway image's (trixie)
            run_tool(["apt-get", "update", "-q"], env)
        debs = build_dir / "debs"
        debs.mkdir()
        run_tool(["apt-get", "download", "-q", *(f"{p}={v}" for p, v in packages.items())], env, cwd=debs)
        for deb in debs.glob("*.deb"):
            run_tool(["dpkg-deb", "-x", str(deb), str(build_dir / "root")])
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        (build_dir / "root").rename(target / "root")
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
    return target


def nginx_argv(nginx: Build, extra_libs: list[Path] | None = None) -> list[str]:
    """The nginx binary itself, with more library directories for the deployed tree's own loader
    (valgrind, too, must start the binary: it stops instrumenting at the launcher script's exec).
    The host's nginx takes them from nginx_env()."""
    if nginx.nginx == "nginx":
        return ["nginx"]
    tree = Path(nginx.njs_module).parents[4]
    libs = [tree / d for d in LIBDIRS] + (extra_libs or [])
    return [str(tree / LOADER), "--library-path", ":".join(map(str, libs)), str(tree / "usr/sbin/nginx")]


def nginx_env(nginx: Build, extra_libs: list[Path] | None = None) -> dict[str, str]:
    """The environment nginx_argv's command runs in: the host's nginx finds extra libraries here."""
    if nginx.nginx == "nginx" and extra_libs:
        return {**os.environ, "LD_LIBRARY_PATH": ":".join(map(str, extra_libs))}
    return dict(os.environ)


def exporter_lines(port: int) -> float:
    """llm_gateway_log_lines_total once it stops growing (the exporter drains its socket or file)."""
    last = -1.0
    while True:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        lines = float(re.search(r"^llm_gateway_log_lines_total (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
        if lines == last:
            return lines
        last = lines
        time.sleep(1.5)  # longer than the file follower's poll


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
    (root / "config.yaml").write_text(json.dumps({
        "model_list": [{"model_name": "qwen3-30b-a3b", "litellm_params": {
            "model": "openai/qwen3-30b-a3b", "api_base": f"http://127.0.0.1:{up}/v1", "api_key": "none"}}],
        "general_settings": {"master_key": KEY}}))
    proc = subprocess.Popen([str(LITELLM_VENV / "bin" / "litellm"), "--config", str(root / "config.yaml"),
                             "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=open(root / "litellm.log", "wb"))
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=BODY.encode(),
                                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
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


def main() -> None:
    with_litellm = "--no-litellm" not in sys.argv
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install -y wrk")
    nginx = build("--host-nginx" in sys.argv)
    lua = lua_tree("--host-nginx" in sys.argv) if "--lua" in sys.argv else None
    load_before = os.getloadavg()
    spec = bench_spec()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        base = Path(tmp)
        # nginx's workers run as nobody here: they must reach the usage directories to write them.
        base.chmod(0o755)
        try:
            up_root, proxy_root = base / "replica", base / "proxy"
            for d in (up_root, proxy_root):
                d.mkdir(parents=True)
            up, proxy, syslog, metrics, follow_metrics = free_ports(5)
            reply = REPLY.replace("'", "")
            procs.append(start_nginx(nginx, up_root, simple_conf(
                up_root, up, f"default_type application/json; return 200 '{reply}';"), up))
            procs.append(start_nginx(nginx, proxy_root, simple_conf(
                proxy_root, proxy,
                'proxy_pass http://replica; proxy_http_version 1.1; proxy_set_header Connection "";',
                f"upstream replica {{ server 127.0.0.1:{up}; keepalive 32; }}"), proxy))
            # (free_port's TCP port is free for UDP too in practice; the exporter fails loudly if not.)
            proc, gw_file = start_gateway(nginx, spec, base / "gateway", up, None)
            procs.append(proc)
            # The exporter as deployed: it follows the gateway's usage files.
            procs.append(subprocess.Popen([sys.executable, str(EXPORTER_SOURCE), "--usage-dir",
                                           str(base / "gateway" / "usage"), "--listen", f"127.0.0.1:{follow_metrics}"],
                                          stderr=subprocess.DEVNULL))
            procs.append(subprocess.Popen([sys.executable, str(EXPORTER_SOURCE), "--syslog", f"127.0.0.1:{syslog}",
                                           "--listen", f"127.0.0.1:{metrics}"], stderr=subprocess.DEVNULL))
            proc, gw_datagram = start_gateway(nginx, spec, base / "gateway-datagram", up, syslog)
            procs.append(proc)
            if lua is not None:
                proc, gw_lua = start_gateway(nginx, spec, base / "gateway-lua", up, None, lua)
                procs.append(proc)
            path = "/v1/chat/completions"
            targets = {"direct": f"http://127.0.0.1:{up}{path}",
                       "nginx proxy_pass": f"http://127.0.0.1:{proxy}{path}",
                       "gateway (as deployed)": f"http://127.0.0.1:{gw_file}{path}",
                       "gateway + datagram": f"http://127.0.0.1:{gw_datagram}{path}"}
            if lua is not None:
                targets["alternative: Lua path"] = f"http://127.0.0.1:{gw_lua}{path}"
            if with_litellm:
                litellm_python()
                proc, lport = start_litellm(base / "litellm", up)
                procs.append(proc)
                targets["LiteLLM proxy"] = f"http://127.0.0.1:{lport}{path}"
            runs: dict[tuple[str, int], list[dict[str, float]]] = {}
            for _ in range(REPETITIONS):
                for c in CONNECTIONS:
                    for name, url in targets.items():  # interleaved: drift on the shared machine hits all alike
                        runs.setdefault((name, c), []).append(wrk(url, c, base))
            counted = exporter_lines(follow_metrics)
            counted_datagrams = exporter_lines(metrics)
        finally:
            for p in procs:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()  # LiteLLM's proxy may ignore SIGTERM while it drains
                    p.wait(10)

    load = os.getloadavg()
    print(f"gateway benchmark: {nginx.label}; loopback, wrk 1 thread, {SECONDS}s per run, {REPETITIONS} "
          f"interleaved repetitions, medians; one nginx worker each; {os.cpu_count()} cores shared, load average "
          f"{load_before[0]:.1f} before, {load[0]:.1f} after (1-minute)")
    print(f"{'target':<24}{'conns':>6}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'non-2xx':>9}{'timeouts':>10}")
    fig: dict[tuple[str, int], dict[str, float]] = {}
    for (name, c), rs in runs.items():
        fig[(name, c)] = {k: median([r[k] for r in rs]) for k in ("rps", "p50", "p99")}
        bad = int(sum(r["non2xx"] for r in rs))
        f = fig[(name, c)]
        timeouts = int(sum(r["timeouts"] for r in rs))
        print(f"{name:<24}{c:>6}{f['rps']:>10.0f}{f['p50']:>9.3f}{f['p99']:>9.3f}{bad:>9}{timeouts:>10}")
    for c in CONNECTIONS:
        plain, gate, datagram = (fig[(n, c)] for n in ("nginx proxy_pass", "gateway (as deployed)",
                                                        "gateway + datagram"))
        line = (f"c={c}: gateway / plain nginx {gate['rps'] / plain['rps']:.2f}x req/s (goal >= 0.6x at 32), "
                f"added p50 {gate['p50'] - plain['p50']:+.3f} ms (goal < 1 ms); with the datagram "
                f"{datagram['rps'] / plain['rps']:.2f}x")
        if ("alternative: Lua path", c) in fig:
            alt = fig[("alternative: Lua path", c)]
            line += (f"; the Lua path {alt['rps'] / plain['rps']:.2f}x, added p50 "
                     f"{alt['p50'] - plain['p50']:+.3f} ms")
        if ("LiteLLM proxy", c) in fig:
            lite = fig[("LiteLLM proxy", c)]
            line += (f"; gateway / LiteLLM {gate['rps'] / lite['rps']:.0f}x req/s" if lite["rps"]
                     else "; LiteLLM completed no request within wrk's 10 s timeout")
        print(line)
    print(f"exporter alone: {record_rate():.0f} log lines/s parsed and counted on one core")
    for name, lines in (("gateway (as deployed)", counted), ("gateway + datagram", counted_datagrams)):
        completed = sum(r["requests"] for c in CONNECTIONS for r in runs[(name, c)])
        print(f"{name}: the exporter counted {lines:.0f} log lines for {completed:.0f} completed requests "
              f"(wrk does not count the requests its stop cuts off, nginx logs them)")


if __name__ == "__main__":
    run_cli(main)
