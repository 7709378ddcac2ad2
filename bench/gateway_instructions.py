"""Instructions per request of the gateway and of what its parts cost (valgrind callgrind).

Unlike req/s on a shared 2-core machine, the user-space instructions nginx's worker executes for one
request do not depend on the load. Each target is the bench's request (bench/gateway.py: a small chat
completion with the bench key, a fake replica answering with `usage`) against one nginx process
(`master_process off`) under callgrind: warm-up (3-s runs of wrk until 2,000 requests: LuaJIT's traces
compiled, whatever the machine's load), then instrumentation on for 4 s of wrk at 4 connections; the
figure is the worker's instructions over the requests wrk completed. Targets:

- plain nginx `proxy_pass` (keepalive), the floor of any nginx gateway;
- the gateway as deployed (the reference stack's generated config), and with a token budget on the key;
- the routing decision within a pool (issue 34): the chat pool over 4 and over 64 replicas (one fake replica
  nginx listening on that many ports), routed by least_conn and by prefix affinity (gateway_affinity.lua:
  the body's key hashed, the ring walked, the bound checked, the shared in-flight counts kept), side by side
  in one run; every request carries the same conversation, so affinity keeps it on one replica; and at 4
  replicas with a real-sized body (a 6-turn chat of bench/routing.py's workload, 11.8 KiB), whose key the
  decision decodes;
- what its parts cost, derived from the generated config (each substitution is checked): without the
  log phase's record (no usage line, no counters: the handler only forgets the request's entries);
  without the usage filter; its nginx config without Lua
  (the key from a map, proxying in the endpoint's location, no filters, no log phase): the floor of
  its nginx features.

Every nginx is the deployed one (tests/support/deployed_nginx.py). Needs valgrind and wrk. Prints figures,
asserts nothing. The figures of every run, the njs gateway this replaced among them: docs/perf/gateway.md.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from bench.gateway import (
    BODY,
    KEY,
    REPLY,
    bench_spec,
    label,
    simple_conf,
    write_gateway,
)
from bench.routing import workload as routing_workload
from plan.cli import run as run_cli
from tests.support import free_port, free_ports
from tests.support.deployed_nginx import DeployedNginx, deployed_nginx

ROOT = Path(__file__).resolve().parent.parent

WARMUP_SECONDS = 3  # LuaJIT compiles its traces in the first requests: warm-up runs of this length ...
WARMUP_REQUESTS = 2000  # ... until this many requests (under valgrind on a loaded machine 3 s may serve 30)
MEASURE_SECONDS = 4
CHAT = routing_workload(conversations=1)  # bench/routing.py's workload: a turn of a real-sized conversation
CHAT_TURN = 5
REPLICAS = (4, 64)  # the chat pool's replicas in the routing rows: the reference pool, and a large one
# The log phase: the record, then (an affinity pool in the stack) the affinity slot given back and counted.
RECORD = "    log_by_lua_block { package.loaded.gateway_metrics.record()"
AFFINITY_DONE = " package.loaded.gateway_affinity.done(package.loaded.gateway_metrics.count_route)"
AFFINITY_UPSTREAM = (
    r"        # Never used: gateway_affinity\.lua[^\n]*\n        server 0\.0\.0\.1 max_fails=0;\n"
    r'        balancer_by_lua_block \{ package\.loaded\.gateway_affinity\.balance\("llm_pool_chat"\) \}\n'
)
FILTER = "            body_filter_by_lua_block { package.loaded.gateway.usage() }\n"
HEAD = "            header_filter_by_lua_block { package.loaded.gateway.head() }\n"
KEY_ID = "        set_by_lua_block $llm_key_id { return package.loaded.gateway.key_id() }\n"


def sub(pattern: str, replacement: str, text: str) -> str:
    """re.sub once (the replacement taken literally), refusing a generated config whose shape no
    longer has the pattern."""
    out, n = re.subn(pattern, lambda _: replacement, text, count=1, flags=re.S)
    if not n:
        raise SystemExit(f"the generated gateway no longer has {pattern!r}: update bench/gateway_instructions.py")
    return out


# What the log phase must still do without the record: forget the request's entries (the router's
# state, the key id), which record() does; left behind, the next request at the same address would
# find them.
# The affinity slot is still given back (uncounted), or the pool's in-flight counts would only grow.
FORGET = (
    "    log_by_lua_block { local m = package.loaded.gateway_metrics local k = m.request_key() "
    "m.routed[k] = nil m.key_ids[k] = nil package.loaded.gateway_affinity.done() }\n"
)


def without_record(conf: str) -> str:
    return sub(re.escape(RECORD + AFFINITY_DONE + " }\n"), FORGET, conf)


def without_filter(conf: str) -> str:
    """Every pool location's usage filter gone."""
    if FILTER not in conf:
        raise SystemExit("the generated gateway no longer has the usage filter: update bench/gateway_instructions.py")
    return conf.replace(FILTER, "")


def without_lua(conf: str, up: int) -> str:
    """The key from a map, the chat pool's proxying in /v1/chat/completions itself (least_conn to its
    replica on `up`, no Lua balancer), no filters, no log phase."""
    if HEAD not in conf:
        raise SystemExit(
            "the generated gateway no longer has the error header filter: update bench/gateway_instructions.py"
        )
    pool = re.search(r"        location @llm_pool_chat \{\n(.*?)        \}", conf, re.S)
    if pool is None:
        raise SystemExit("the generated gateway no longer has location @llm_pool_chat: update the bench")
    conf = sub(
        r'            content_by_lua_block \{ package\.loaded\.gateway\.route\("/v1/chat/completions"\) \}\n        \}\n'
        r"        location = /v1/completions",
        pool.group(1).replace(FILTER, "").replace(HEAD, "") + "        }\n        location = /v1/completions",
        conf,
    )
    conf = sub(re.escape(KEY_ID), "", conf)
    conf = sub(
        r"    map \"\" \$llm_key_id \{ default ''; \}\n",
        f'    map $http_authorization $llm_key_id {{\n        default "";\n        "Bearer {KEY}" default;\n    }}\n',
        conf,
    )
    conf = sub(AFFINITY_UPSTREAM, f"        least_conn;\n        server 127.0.0.1:{up};\n", conf)
    return sub(re.escape(RECORD + AFFINITY_DONE + " }\n"), "", conf)  # no log phase at all: nothing to forget


def post_script(path: Path, body: str) -> Path:
    """wrk's script: POST this body with the bench key."""
    path.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {KEY}"\n'
    )
    return path


def wrk(url: str, seconds: int, script: Path) -> tuple[int, int]:
    out = subprocess.run(
        ["wrk", "-t1", "-c4", f"-d{seconds}s", "-s", str(script), url], capture_output=True, text=True, check=True
    ).stdout
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return int(re.search(r"(\d+) requests in", out).group(1)), int(bad.group(1)) if bad else 0  # type: ignore[union-attr]


def instructions(nginx: DeployedNginx, root: Path, conf: str, script: Path) -> tuple[float, int, int]:
    """Instructions per request of one nginx process under callgrind, the requests measured, the non-2xx."""
    port = free_port()
    conf = re.sub(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{port};", conf, count=1)  # not the metrics listener
    (root / "cg.conf").write_text(conf)
    out = root / "callgrind.out"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--instr-atstart=no",
            *nginx.argv,
            "-p",
            str(root),
            "-c",
            str(root / "cg.conf"),
            "-g",
            "daemon off; master_process off;",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "valgrind.log", "wb"),
    )
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
        warmed = 0
        for _ in range(20):
            warmed += wrk(url, WARMUP_SECONDS, script)[0]
            if warmed >= WARMUP_REQUESTS:
                break
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
    for tool in ("valgrind", "callgrind_control", "wrk", "curl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is needed: apt-get install -y valgrind wrk curl")
    nginx = deployed_nginx()
    with tempfile.TemporaryDirectory(prefix="bench-gateway-instructions-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        script = post_script(base / "post.lua", BODY)
        chat = json.dumps({**CHAT.body(0, CHAT_TURN), "stream": False})
        chat_script = post_script(base / "chat.lua", chat)
        up, *more = free_ports(max(REPLICAS))
        (base / "replica").mkdir()
        reply = REPLY.replace("'", "")
        (base / "replica/nginx.conf").write_text(
            simple_conf(base / "replica", up, f"default_type application/json; return 200 '{reply}';").replace(
                f"listen 127.0.0.1:{up};", " ".join(f"listen 127.0.0.1:{p};" for p in (up, *more))
            )
        )
        replica = subprocess.Popen(
            [*nginx.argv, "-p", str(base / "replica"), "-c", str(base / "replica/nginx.conf"), "-g", "daemon off;"],
            stderr=subprocess.DEVNULL,
        )
        rows: list[tuple[str, float, int, int]] = []
        try:
            (base / "proxy").mkdir()
            rows.append(
                (
                    "plain nginx proxy_pass",
                    *instructions(
                        nginx,
                        base / "proxy",
                        simple_conf(
                            base / "proxy",
                            0,
                            'proxy_pass http://replica; proxy_http_version 1.1; proxy_set_header Connection "";',
                            f"upstream replica {{ server 127.0.0.1:{up}; keepalive 32; }}",
                        ),
                        script,
                    ),
                )
            )
            deployed = base / "gateway"
            write_gateway(nginx, bench_spec(False), deployed, up)
            conf = (deployed / "nginx.conf").read_text()
            rows.append(("the gateway as deployed", *instructions(nginx, deployed, conf, script)))
            budget = base / "budget"
            write_gateway(nginx, bench_spec(True), budget, up)
            rows.append(
                (
                    "… with a token budget on the key",
                    *instructions(nginx, budget, (budget / "nginx.conf").read_text(), script),
                )
            )
            for n, body, size in (
                *((n, script, "") for n in REPLICAS),
                (REPLICAS[0], chat_script, f", a {CHAT_TURN + 1}-turn chat of {len(chat) / 1024:.1f} KiB"),
            ):
                for policy in ("least_conn", "prefix"):
                    root = base / f"{policy}-{n}{'-chat' if size else ''}"
                    spec = bench_spec(False, policy)
                    write_gateway(nginx, spec, root, {pool: [up] for pool in spec.pools} | {"chat": [up, *more][:n]})
                    what = "prefix affinity" if policy == "prefix" else policy
                    rows.append(
                        (
                            f"the chat pool on {n} replicas{size}: {what}",
                            *instructions(nginx, root, (root / "nginx.conf").read_text(), body),
                        )
                    )
            for name, variant in (
                ("without the record (no usage line, no counters)", without_record),
                ("without the usage filter", without_filter),
                ("its nginx config without Lua (the floor of its nginx features)", lambda c: without_lua(c, up)),
            ):
                root = base / name.split(" (")[0].replace(" ", "-")
                shutil.copytree(deployed, root, ignore=shutil.ignore_patterns("callgrind.out*", "*.log", "cg.conf"))
                rows.append((name, *instructions(nginx, root, variant(conf.replace(str(deployed), str(root))), script)))
        finally:
            replica.terminate()
            replica.wait(10)
    print(
        f"gateway instructions per request: {label(nginx)}; valgrind callgrind, one nginx process, "
        f"{MEASURE_SECONDS}s of wrk at 4 connections after {WARMUP_REQUESTS:,} requests of warm-up"
    )
    print(f"{'target':<68}{'instructions':>14}{'requests':>10}{'non-2xx':>9}")
    for name, per, requests, bad in rows:
        print(f"{name:<68}{per / 1000:>13.1f}k{requests:>10}{bad:>9}")
    plain = rows[0][1]
    print(f"the gateway: {rows[1][1] / plain:.1f}x plain nginx's instructions per request")
    for lc, pf in zip(rows, rows[1:], strict=False):
        if lc[0].endswith(": least_conn") and pf[0] == lc[0].replace(": least_conn", ": prefix affinity"):
            print(
                f"prefix affinity, {lc[0].removeprefix('the ').removesuffix(': least_conn')}: "
                f"{(pf[1] - lc[1]) / 1000:+.1f}k instructions a request against least_conn"
            )


if __name__ == "__main__":
    run_cli(main)
