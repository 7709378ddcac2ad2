"""The deploy-time smoke test: what to ask the gateway (one chat completion per served name) and the script.

The script runs on the gateway's node after the gateway and every model's health gate; the keys
reach it on stdin (a secret, never in the command line), and components/node_programs/smoke_client.py
does the requests.
"""

from __future__ import annotations

import json

from components.engines.base import server_container_name
from components.engines.registry import engine_for
from components.node_programs import NODE_PROGRAMS
from components.planning.nodes.scripts import run_shipped_python
from components.spec import StackSpec
from components.spec.topology import instances

CLIENT_SOURCE = NODE_PROGRAMS / "smoke_client.py"
_HEREDOC = "LLM_CLUSTER_SMOKE_PY"
# Requests are tiny (16 tokens): a minute covers a cold first request on the largest pool.
REQUEST_TIMEOUT_SECONDS = 120


def key_for(spec: StackSpec, name: str, pool: str) -> str | None:
    """The first key allowed to use this served name (its own allowlist: names or the pool); None without auth."""
    g = spec.gateway
    assert g is not None
    if not g.auth:
        return None
    if not g.api_keys:
        return "default"
    for k in g.api_keys:
        if not k.models or name in k.models or pool in k.models:
            return k.id
    return None


def retry_seconds(spec: StackSpec) -> int:
    """How long a check through the gateway retries a pool that just became healthy before it fails.

    nginx keeps a replica that failed while loading out for failTimeoutSeconds after its last failure,
    counted in whole seconds (least_conn: `now - checked <= fail_timeout`), so up to one second more;
    the margin covers a cold first request.
    """
    assert spec.gateway is not None
    return spec.gateway.fail_timeout_seconds + 30


def where_to_look(spec: StackSpec, pool: str) -> str:
    """What to read when a pool does not answer through the gateway: the gateway's log, each instance's."""
    assert spec.gateway is not None
    servers = "; ".join(
        f"docker logs {server_container_name(engine_for(spec.pools[i.pool]), i)} on {i.head}"
        for i in instances(spec, pool)
    )
    return f"docker logs llm-gateway on {spec.gateway.node} (the usage line names the upstream); {servers}"


def smoke_plan(spec: StackSpec, url: str) -> dict[str, object]:
    """Every served name of every pool with the key to use and what to check when it fails."""
    g = spec.gateway
    assert g is not None
    checks = []
    for pool, p in spec.pools.items():
        for name in spec.served_names(p.model):
            key = key_for(spec, name, pool)
            check: dict[str, object] = {"model": name, "pool": pool, "key_id": key, "hint": where_to_look(spec, pool)}
            if g.auth and key is None:
                check["skip"] = "no key in gateway.apiKeys may use it"
            checks.append(check)
    return {
        "url": url,
        "checks": checks,
        "timeout_seconds": REQUEST_TIMEOUT_SECONDS,
        "retry_seconds": retry_seconds(spec),
    }


def smoke_script(spec: StackSpec, url: str) -> str:
    """Bash for the gateway node: run the client with the plan; the keys JSON comes on stdin."""
    plan = json.dumps(smoke_plan(spec, url), sort_keys=True)
    return f"""#!/usr/bin/env bash
# llm-cluster: smoke test, one chat completion per served name through the gateway at {url}
set -euo pipefail
{run_shipped_python(CLIENT_SOURCE, _HEREDOC, plan)}"""
