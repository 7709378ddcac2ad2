"""Instructions per request of the gateway and of the designs it was measured against (valgrind callgrind).

Unlike req/s on a shared 2-core machine, the user-space instructions nginx's worker executes for one
request do not depend on the load. Each target is the bench's request (bench/gateway.py: a small chat
completion with the bench key, a fake replica answering with `usage`) against one nginx process
(`master_process off`) under callgrind: 3 s of warm-up, then instrumentation on for 4 s of wrk at 4
connections; the figure is the worker's instructions over the requests wrk completed. Targets:

- plain nginx `proxy_pass` (keepalive), the floor of any nginx gateway;
- the gateway as deployed (the reference stack's generated config), and with a token budget on the key;
- what the design costs before it does any work, derived from the generated config (each substitution
  is checked): without njs (key from a map, proxying in the endpoint's location, no usage filter);
  two njs passes that do nothing (a js_content that only redirects to the pool, a filter that only
  passes chunks on): the floor of routing by body to per-pool locations on njs;
- one njs pass: the body read by `mirror_request_body`, the upstream from a js_set in `proxy_pass`,
  the real usage filter, in the endpoint's location (every pool's timeouts would merge into one, and
  refusals are not handled: an upper bound of what one pass could save);
- with `--lua`: the routed request path in Lua (bench/gateway_lua.lua) on Debian's
  ngx_http_lua_module for the deployed nginx, fetched once into /var/cache/llm-cluster/gateway-lua.

Every nginx is the deployed one (tests/deployed_nginx.py), `--host-nginx` the host's (bookworm: 1.22 +
njs 0.7.9; with `--lua`, bookworm's module for it). Needs valgrind and wrk. Prints figures, asserts nothing.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway import (  # noqa: E402
    BODY, KEY, LIBDIRS, REPLY, Build, bench_spec, build, in_lua, lua_tree, nginx_argv, nginx_env, simple_conf,
    sub, write_gateway,
)
from components.spec import StackSpec  # noqa: E402
from plan.cli import run as run_cli  # noqa: E402
from tests.support import free_port  # noqa: E402

WARMUP_SECONDS = 3  # LuaJIT compiles its traces in the first requests
MEASURE_SECONDS = 4


def gateway_dir(nginx: Build, spec: StackSpec, root: Path, up: int) -> Path:
    """The generated gateway's files under `root`, as bench/gateway.py lays them out."""
    write_gateway(nginx, spec, root, up)
    return root


def pool_block(conf: str) -> str:
    return re.search(r"        location @llm_pool_chat \{\n(.*?)        \}", conf, re.S).group(1)  # type: ignore[union-attr]


def endpoint_body(conf: str, body: str) -> str:
    """/v1/chat/completions with `body` in place of its js_content."""
    return sub(r"            js_content gateway\.route;\n        \}\n        location = /v1/completions",
               body + "        }\n        location = /v1/completions", conf)


def native_key(conf: str) -> str:
    return sub(r"    js_set \$llm_key_id gateway\.keyId;\n",
               f'    map $http_authorization $llm_key_id {{\n        default "";\n        "Bearer {KEY}" default;\n    }}\n',
               conf)


def without_njs(conf: str, js: str) -> tuple[str, str]:
    conf = endpoint_body(native_key(conf), pool_block(conf))
    return sub(r"            js_body_filter gateway\.usage buffer_type=buffer;\n", "", conf), js


def two_idle_passes(conf: str, js: str) -> tuple[str, str]:
    js = sub(r"function route\(r\) \{\n", "function route(r) {\n    r.variables.llm_model = 'qwen3-30b-a3b';\n"
             "    r.variables.llm_pool = 'chat';\n    return r.internalRedirect('@llm_pool_chat');\n", js)
    js = sub(r"function usage\(r, data, flags\) \{\n    r\.sendBuffer\(data, flags\);\n",
             "function usage(r, data, flags) {\n    r.sendBuffer(data, flags);\n    return;\n", js)
    return native_key(conf), js


def one_pass(conf: str, js: str) -> tuple[str, str]:
    block = pool_block(conf).replace("proxy_pass http://llm_pool_chat$llm_upstream_uri",
                                     "proxy_pass http://$llm_target$llm_upstream_uri")
    conf = endpoint_body(conf, "            mirror /_llm_body;\n            mirror_request_body on;\n" + block)
    conf = sub(r"    js_set \$llm_key_id gateway\.keyId;\n",
               "    js_set $llm_key_id gateway.keyId;\n    js_set $llm_target gateway.target;\n", conf)
    conf = sub(r"        location / \{\n", "        location = /_llm_body {\n            internal;\n"
               "            return 204;\n        }\n        location / {\n", conf)
    js = sub(r"export default \{", """function target(r) {
    var body = JSON.parse(r.requestText);
    var model = body.model;
    r.variables.llm_model = model.length > LOG_FIELD_MAX ? model.slice(0, LOG_FIELD_MAX) : model;
    var entry = llm_routes.models[model];
    var allow = llm_routes.allow[r.variables.llm_key_id];
    r.variables.llm_pool = entry[0];
    return 'llm_pool_' + entry[0];
}
export default {target: target, """, js)
    return conf, js


def wrk(url: str, seconds: int, script: Path) -> tuple[int, int]:
    out = subprocess.run(["wrk", "-t1", "-c4", f"-d{seconds}s", "-s", str(script), url],
                         capture_output=True, text=True, check=True).stdout
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return int(re.search(r"(\d+) requests in", out).group(1)), int(bad.group(1)) if bad else 0  # type: ignore[union-attr]


def instructions(nginx: Build, libs: list[Path], root: Path, conf: str, script: Path) -> tuple[float, int, int]:
    """Instructions per request of one nginx process under callgrind, the requests measured, the non-2xx."""
    port = free_port()
    conf = re.sub(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{port};", conf)
    (root / "cg.conf").write_text(conf)
    out = root / "callgrind.out"
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--instr-atstart=no",
                             *nginx_argv(nginx, libs), "-p", str(root), "-c", str(root / "cg.conf"),
                             "-g", "daemon off; master_process off;"], env=nginx_env(nginx, libs),
                            stdout=subprocess.DEVNULL, stderr=open(root / "valgrind.log", "wb"))
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise SystemExit(f"nginx under valgrind exited: {(root / 'valgrind.log').read_text()[-2000:]}")
            try:
                subprocess.run(["curl", "-s", "-o", "/dev/null", url], check=True, timeout=5)
                break
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                time.sleep(0.2)
        wrk(url, WARMUP_SECONDS, script)
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], capture_output=True, check=True)
        requests, bad = wrk(url, MEASURE_SECONDS, script)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True, check=True)
    finally:
        proc.terminate()
        proc.wait(30)
    dumps = sorted(root.glob("callgrind.out.*"))
    if not dumps:
        raise SystemExit(f"callgrind wrote no dump: {(root / 'valgrind.log').read_text()[-2000:]}")
    total = 0
    for line in dumps[0].read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
            break
    return total / max(requests, 1), requests, bad


def main() -> None:
    host = "--host-nginx" in sys.argv
    for tool in ("valgrind", "callgrind_control", "wrk", "curl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install -y valgrind wrk curl")
    nginx = build(host)
    lua = lua_tree(host) if "--lua" in sys.argv else None
    with tempfile.TemporaryDirectory(prefix="bench-gateway-instructions-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        script = base / "post.lua"
        script.write_text(f'wrk.method = "POST"\nwrk.body = {json.dumps(BODY)}\n'
                          'wrk.headers["Content-Type"] = "application/json"\n'
                          f'wrk.headers["Authorization"] = "Bearer {KEY}"\n')
        up = free_port()
        (base / "replica").mkdir()
        reply = REPLY.replace("'", "")
        (base / "replica/nginx.conf").write_text(simple_conf(base / "replica", up,
                                                             f"default_type application/json; return 200 '{reply}';"))
        replica = subprocess.Popen([nginx.nginx, "-p", str(base / "replica"), "-c", str(base / "replica/nginx.conf"),
                                    "-g", "daemon off;"], stderr=subprocess.DEVNULL)
        rows: list[tuple[str, float, int, int]] = []
        try:
            (base / "proxy").mkdir()
            rows.append(("plain nginx proxy_pass", *instructions(nginx, [], base / "proxy", simple_conf(
                base / "proxy", 0,
                'proxy_pass http://replica; proxy_http_version 1.1; proxy_set_header Connection "";',
                f"upstream replica {{ server 127.0.0.1:{up}; keepalive 32; }}"), script)))
            deployed = gateway_dir(nginx, bench_spec(False), base / "gateway", up)
            conf = (deployed / "nginx.conf").read_text()
            js = (deployed / "llm/gateway.js").read_text()
            rows.append(("the gateway as deployed", *instructions(nginx, [], deployed, conf, script)))
            if not host:  # the host's njs 0.7.9 has no shared dict (js_shared_dict_zone: njs >= 0.8.0)
                budget = gateway_dir(nginx, bench_spec(True), base / "budget", up)
                rows.append(("… with a token budget on the key", *instructions(
                    nginx, [], budget, (budget / "nginx.conf").read_text(), script)))
            for label, variant in (("its nginx config without njs (the floor of its nginx features)", without_njs),
                                   ("two njs passes that do nothing (the floor of the njs design)", two_idle_passes),
                                   ("one njs pass (pools' timeouts merged, refusals not handled)", one_pass)):
                root = base / variant.__name__
                shutil.copytree(deployed, root, ignore=shutil.ignore_patterns("callgrind.out*", "*.log", "cg.conf"))
                v_conf, v_js = variant(conf.replace(str(deployed), str(root)), js)
                (root / "llm/gateway.js").write_text(v_js)
                rows.append((label, *instructions(nginx, [], root, v_conf, script)))
            if lua is not None:
                root = base / "lua"
                shutil.copytree(deployed, root, ignore=shutil.ignore_patterns("callgrind.out*", "*.log", "cg.conf"))
                libs = [lua / "root" / d for d in LIBDIRS]
                rows.append(("the request path in Lua (bench/gateway_lua.lua)", *instructions(
                    nginx, libs, root, in_lua(conf.replace(str(deployed), str(root)), lua / "root", root),
                    script)))
        finally:
            replica.terminate()
            replica.wait(10)
    print(f"gateway instructions per request: {nginx.label}; valgrind callgrind, one nginx process, "
          f"{MEASURE_SECONDS}s of wrk at 4 connections after {WARMUP_SECONDS}s of warm-up")
    print(f"{'target':<68}{'instructions':>14}{'requests':>10}{'non-2xx':>9}")
    for label, per, requests, bad in rows:
        print(f"{label:<68}{per / 1000:>13.1f}k{requests:>10}{bad:>9}")
    plain = rows[0][1]
    print(f"the gateway: {rows[1][1] / plain:.1f}x plain nginx's instructions per request")


if __name__ == "__main__":
    run_cli(main)
