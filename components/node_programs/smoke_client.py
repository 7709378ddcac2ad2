"""Smoke test through the gateway: one chat completion per served name, a non-empty answer with usage.

Standard library only, Python 3.8: the smoke script ships this file to the gateway node and runs
`python3 smoke_client.py '<plan json>'` with the gateway's keys ({"<id>": "<key>"}) on stdin. The
plan: {"url": "http://<gateway>:<port>", "retry_seconds": N, "timeout_seconds": N,
"checks": [{"model", "pool", "key_id" (null without auth), "hint", "skip" (why, when no key may)}]}. Exit 0 when every served
name answered, 1 naming each that did not (model, pool, status and what to check).
"""
from __future__ import annotations

import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Tuple

# Statuses a replica that just became healthy may still cause for a moment: nginx keeps a replica
# that failed during loading out for failTimeoutSeconds (502), vLLM queues (503), a slow first token (504).
RETRY_STATUSES = (502, 503, 504)


def ask(url: str, model: str, key: Optional[str], timeout: float) -> Tuple[int, str]:
    """POST one short chat completion; (HTTP status or 0 when unreachable, body or the error)."""
    body = json.dumps({"model": model, "max_tokens": 16, "temperature": 0,
                       "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers=headers, method="POST")
    # The gateway's own certificate, reached by address from its own node: nothing to verify against.
    context = ssl._create_unverified_context() if url.startswith("https:") else None  # noqa: S323
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:  # noqa: S310
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return 0, str(getattr(e, "reason", e))


def judge(status: int, body: str) -> Tuple[bool, str]:
    """(ok, what was seen): ok is 200 with a non-empty message (content or reasoning) and completion tokens."""
    if status != 200:
        return False, f"HTTP {status or 'unreachable'}: {body.strip()[:300]}"
    try:
        doc = json.loads(body)
        message = doc["choices"][0].get("message") or {}
        text = (message.get("content") or "") + (message.get("reasoning_content") or "")
        tokens = int((doc.get("usage") or {}).get("completion_tokens") or 0)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return False, f"HTTP 200 but not an OpenAI chat completion: {body.strip()[:300]}"
    if not text.strip():
        return False, "HTTP 200 with an empty completion"
    if tokens <= 0:
        return False, "HTTP 200 without usage.completion_tokens"
    return True, f"{tokens} completion token(s): {text.strip()[:60]!r}"


def run(plan: Dict[str, object], keys: Dict[str, str]) -> List[str]:
    """Every check of the plan; the failures' messages (empty when all passed)."""
    failures = []
    url = str(plan["url"])
    for check in plan["checks"]:  # type: ignore[attr-defined]
        model, pool, key_id = check["model"], check["pool"], check.get("key_id")
        if check.get("skip"):
            print(f"smoke {model} (pool {pool}): skipped, {check['skip']}", flush=True)
            continue
        key = keys.get(key_id) if key_id else None
        if key_id and not key:
            failures.append(f"model {model!r} (pool {pool}): the deploy-time key {key_id!r} is not in "
                            "the gateway's keys")
            continue
        deadline = time.monotonic() + float(plan.get("retry_seconds", 60))  # type: ignore[arg-type]
        while True:
            status, body = ask(url, model, key, float(plan.get("timeout_seconds", 120)))  # type: ignore[arg-type]
            ok, seen = judge(status, body)
            if ok or status not in RETRY_STATUSES + (0,) or time.monotonic() >= deadline:
                break
            time.sleep(2)
        if ok:
            print(f"smoke {model} (pool {pool}): {seen}", flush=True)
        else:
            failures.append(f"model {model!r} (pool {pool}) through {url}: {seen}; check: {check.get('hint', '')}")
    return failures


def main(argv: List[str]) -> int:
    """`python3 smoke_client.py '<plan json>'` with the keys JSON on stdin."""
    plan = json.loads(argv[0])
    text = sys.stdin.read().strip()
    keys = json.loads(text) if text else {}
    failures = run(plan, keys)
    for f in failures:
        print(f"ERROR: smoke test: {f}", file=sys.stderr)
    print(f"smoke test: {len(plan['checks']) - len(failures)}/{len(plan['checks'])} served name(s) answered")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
