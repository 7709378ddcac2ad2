#!/usr/bin/env python3
"""A client outside the cluster (run in the lab-client namespace): one request, or a bounded load.

  client.py request URL [--key KEY] [--json BODY]       -> {"status": …, "body": …}
  client.py load URL --key KEY --model M --seconds S --concurrency C [--stop-after S2]
      -> {"ok": n, "failed": n, "errors": [...], "p50_s": …, "max_s": …}
Stdlib only: it runs with the machine's python3 inside a namespace that reaches only the lab.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request


def request(url: str, key: str | None, body: dict | None, timeout: float = 30) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def load(url: str, key: str, model: str, seconds: float, concurrency: int) -> dict:
    """Chat completions from `concurrency` clients for `seconds`; every answer counted."""
    ok, failed, errors, latencies = 0, 0, [], []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}

    def worker() -> None:
        nonlocal ok, failed
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                status, text = request(url, key, body)
                good = status == 200 and json.loads(text)["choices"][0]["message"]["content"]
            except Exception as e:  # noqa: BLE001 (every failure is counted, whatever it is)
                status, text, good = 0, repr(e), False
            with lock:
                if good:
                    ok += 1
                    latencies.append(time.monotonic() - t0)
                else:
                    failed += 1
                    errors.append(f"{status}: {text[:200]}")

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    return {"ok": ok, "failed": failed, "errors": errors[:20],
            "p50_s": latencies[len(latencies) // 2] if latencies else None,
            "max_s": latencies[-1] if latencies else None}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["request", "load"])
    p.add_argument("url")
    p.add_argument("--key")
    p.add_argument("--json")
    p.add_argument("--model")
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--concurrency", type=int, default=4)
    a = p.parse_args()
    if a.mode == "request":
        status, body = request(a.url, a.key, json.loads(a.json) if a.json else None)
        print(json.dumps({"status": status, "body": body}))
    else:
        print(json.dumps(load(a.url, a.key, a.model, a.seconds, a.concurrency)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
