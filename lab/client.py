#!/usr/bin/env python3
"""A client outside the cluster (run in the lab-client namespace): one request, or a bounded load.

  client.py request URL [--key KEY] [--json BODY] [--cacert PEM]      -> {"status": …, "body": …}
  client.py load URL --key KEY --model M --seconds S --concurrency C --rate R [--cacert PEM] [--timeout T]
      -> {"ok": n, "failed": n, "errors": [...], "p50_s": …, "max_s": …, "t0": epoch, "requests": [[start, end, ok]…]}
Stdlib only: it runs with the machine's python3 inside a namespace that reaches only the lab.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request

CONTEXT: ssl.SSLContext | None = None  # https: verify the gateway against the stack's CA (--cacert)


def request(url: str, key: str | None, body: dict | None, timeout: float = 30) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=CONTEXT) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def load(url: str, key: str, model: str, seconds: float, concurrency: int, rate: float, timeout: float = 30) -> dict:
    """Chat completions from `concurrency` clients for `seconds`, started at most `rate` per second in all
    (below the key's rate limit: a refusal by the limiter would count as lost); every answer counted, each
    request's start and end (seconds after `t0`, the epoch time the load began) kept."""
    ok, failed, errors, latencies = 0, 0, [], []
    by_host: dict[str, int] = {}
    records: list[list] = []
    lock = threading.Lock()
    t0 = time.time()
    start = time.monotonic()
    stop_at = start + seconds
    started = 0

    def next_slot() -> bool:
        """Wait for this client's next start time on the shared schedule; False once the load is over."""
        nonlocal started
        with lock:
            at = start + started / rate
            started += 1
        if at >= stop_at:
            return False
        time.sleep(max(0.0, at - time.monotonic()))
        return True

    def body(n: int) -> dict:
        # Each request its own conversation (OpenAI's `user`): a pool routed by prefix affinity spreads them
        # over its replicas as it would many users', where one repeated prompt would stay on one replica.
        return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "user": f"u{n}"}

    def worker() -> None:
        nonlocal ok, failed
        while next_slot():
            began = time.monotonic()
            try:
                status, text = request(url, key, body(started), timeout)
                # An answer is a 200 with a choice (a real engine may end its text at once, on its end token).
                choices = json.loads(text)["choices"] if status == 200 else []
                good = bool(choices)
                # The stand-in says who served it: "lab stand-in <model> answers from <host>:<port>".
                served = re.search(r" answers from (\S+)$", (choices[0]["message"]["content"] or "") if good else "")
                if served:
                    with lock:
                        by_host[served[1]] = by_host.get(served[1], 0) + 1
            except Exception as e:  # noqa: BLE001 (every failure is counted, whatever it is)
                status, text, good = 0, repr(e), False
            with lock:
                records.append([round(began - start, 3), round(time.monotonic() - start, 3), good])
                if good:
                    ok += 1
                    latencies.append(time.monotonic() - began)
                else:
                    failed += 1
                    errors.append(f"{status}: {text[:200]}")

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    return {
        "ok": ok,
        "failed": failed,
        "errors": errors[:20],
        "rate_per_s": rate,
        "by_host": by_host,
        "p50_s": latencies[len(latencies) // 2] if latencies else None,
        "max_s": latencies[-1] if latencies else None,
        "t0": t0,
        "requests": sorted(records),
    }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["request", "load"])
    p.add_argument("url")
    p.add_argument("--key")
    p.add_argument("--json")
    p.add_argument("--model")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rate", type=float, default=10, help="requests started per second, in all")
    p.add_argument("--cacert", help="the CA certificate the gateway's is verified against (PEM file)")
    p.add_argument("--timeout", type=float, default=30, help="seconds to wait for one answer")
    a = p.parse_args()
    global CONTEXT
    if a.cacert:
        CONTEXT = ssl.create_default_context(cafile=a.cacert)
    if a.mode == "request":
        status, body = request(a.url, a.key, json.loads(a.json) if a.json else None, a.timeout)
        print(json.dumps({"status": status, "body": body}))
    else:
        print(json.dumps(load(a.url, a.key, a.model, a.seconds, a.concurrency, a.rate, a.timeout)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
