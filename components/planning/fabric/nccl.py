"""The NCCL preflight of a multi-node instance: a short all-reduce in its serving image once the Ray gate
passes, before the server starts; refused on NET/Socket (components/node_programs/nccl_check.py runs it).

The Ray head's command becomes `nccl-check.sh <the server's command>`: ray-head.sh execs it once every
GPU has joined; it runs the check, keeps the verdict in the container (RESULT), and execs the server
only when NCCL ran over NET/IB. On a refusal it stays up without serving (docker would otherwise
restart it into the same refusal) until `pulumi up` replaces it; the deploy-time gate reads the
verdict and fails the deployment with NCCL's own words and the variables to check.
"""

from __future__ import annotations

import json
import shlex

from components.node_programs import NODE_PROGRAMS
from components.spec import StackSpec
from components.spec.topology import Instance

DIR = "/opt/llm-cluster/nccl"
WRAPPER = f"{DIR}/nccl-check.sh"
RESULT = "/tmp/llm-cluster-nccl.json"
CHECK_TIMEOUT_S = 300
_HERE = NODE_PROGRAMS


def enabled(spec: StackSpec, instance: Instance) -> bool:
    """Checked when the stack asks for it and NCCL may use the HCA at all."""
    return instance.uses_ray and spec.preflight.nccl_all_reduce and not spec.nccl.ib_disable


def check_plan(spec: StackSpec, instance: Instance) -> dict[str, object]:
    """What nccl_check.py needs: the node count and, for its messages, the head's NCCL settings.

    No NCCL variables are passed: each rank runs in its own node's container, which has its own."""
    head = spec.node(instance.head)
    hca = head.hca
    return {
        "instance": instance.name,
        "nodes": len(instance.nodes),
        "timeout_s": CHECK_TIMEOUT_S,
        "env": {},
        "hca": hca.device if hca else "?",
        "interface": head.interface or "?",
        "gid_index": hca.gid_index if hca and hca.link_layer == "ethernet" else None,
    }


def wrapper_script(spec: StackSpec, instance: Instance, *, directory: str = DIR, result: str = RESULT) -> str:
    """nccl-check.sh: run the check, keep the verdict, exec the server only over NET/IB."""
    plan = json.dumps(check_plan(spec, instance), sort_keys=True)
    return f"""#!/usr/bin/env bash
# llm-cluster: NCCL all-reduce across {instance.name} (NET/IB or refused), then exec the server's command
set -uo pipefail
result={shlex.quote(result)}
rm -f "$result"
echo "nccl: all-reduce across {len(instance.nodes)} nodes of {instance.name} (NCCL_DEBUG=INFO)"
verdict=$(cd {shlex.quote(directory)} && python3 nccl_check.py {shlex.quote(plan)})
status=$?
printf '%s\\n' "$verdict" > "$result.tmp" && mv -f "$result.tmp" "$result"
echo "nccl: $verdict"
if (( status != 0 )); then
  echo "ERROR: nccl {instance.name}: refusing to start the server (see the verdict above)" >&2
  # Up without serving: a restart would only repeat the refusal; pulumi up replaces the container.
  while :; do sleep 3600; done
fi
exec "$@"
"""


def uploads(spec: StackSpec, instance: Instance) -> list[tuple[str, str, bool]]:
    """(path, content, executable) the head container gets: the wrapper, the check and its parser."""
    return [
        (WRAPPER, wrapper_script(spec, instance), True),
        (f"{DIR}/nccl_check.py", (_HERE / "nccl_check.py").read_text(), False),
        (f"{DIR}/fabric.py", (_HERE / "fabric.py").read_text(), False),
    ]


def gate_script(instance: Instance, container: str, timeout_s: int = CHECK_TIMEOUT_S + 60) -> str:
    """On the head node after the Ray gate: wait for the verdict; fail the deployment on a refusal."""
    return f"""#!/usr/bin/env bash
# llm-cluster: NCCL gate of {instance.name}: the all-reduce's verdict (NET/IB, or the deployment fails)
set -euo pipefail
container={shlex.quote(container)}
deadline=$((SECONDS + {int(timeout_s)}))
verdict=""
while (( SECONDS < deadline )); do
  verdict=$(docker exec "$container" cat {shlex.quote(RESULT)} 2>/dev/null || true)
  if [ -n "$verdict" ]; then break; fi
  sleep 5
done
if [ -z "$verdict" ]; then
  echo "ERROR: nccl {instance.name}: no verdict within {int(timeout_s)}s; see docker logs $container" >&2
  exit 1
fi
case "$verdict" in
  *'"ok": true'*) echo "nccl {instance.name}: $verdict" ;;
  *) echo "ERROR: nccl {instance.name}: $verdict" >&2; exit 1 ;;
esac
"""
