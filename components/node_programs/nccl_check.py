"""A short NCCL all-reduce across a multi-node instance, inside its serving image, before the server starts.

Runs in the Ray head container once every GPU has joined (ray-head.sh execs the container's command,
which starts with nccl-check.sh): one Ray actor per node (a STRICT_SPREAD placement group of one GPU
each) joins a torch.distributed NCCL group and all-reduces 64 MiB, with NCCL_DEBUG=INFO written to a
file per process. fabric.parse_nccl_net reads those lines: NET/Socket anywhere, a wrong sum, or no
answer within the timeout (the runbook's "stuck in NCCL init") is a refusal. The verdict is printed
as one JSON line. Needs the image's python3 with ray and torch (the vLLM images have both); it
frees its GPUs before the server starts.

Not executed in this repository's tests (no GPU, no NCCL, no torch here): its verdict logic
(`verdict`) is, on real NCCL INFO logs.
"""
from __future__ import annotations

import glob
import json
import os
import socket
import sys
import time
from typing import Dict, List

from fabric import nccl_fix, parse_nccl_net  # shipped beside this file

LOG_PATTERN = "/tmp/llm-cluster-nccl.%h.%p.log"
ELEMENTS = 16 << 20  # float32: 64 MiB


def verdict(plan: Dict[str, object], ranks: List[Dict[str, object]]) -> Dict[str, object]:
    """ok / refused from each rank's result (host, sum_ok, seconds, log)."""
    log = "".join(str(r.get("log", "")) for r in ranks)
    net = parse_nccl_net(log)
    fix = nccl_fix(str(plan["hca"]), plan.get("gid_index"), str(plan["interface"]))  # type: ignore[arg-type]
    transports = sorted(set(net.networks.values()))
    if net.fell_back:
        return {"ok": False, "transport": "Socket", "message":
                f"NCCL fell back to NET/Socket ({', '.join(net.socket_interfaces) or '?'})"
                + (f" after: {'; '.join(net.warnings)}" if net.warnings else "") + f"; check {fix}"}
    if not all(r.get("sum_ok") for r in ranks):
        return {"ok": False, "transport": ",".join(transports), "message": "the all-reduce returned a wrong sum"}
    if "IB" not in transports:
        return {"ok": False, "transport": "", "message": f"no NET/IB line in NCCL's INFO log; check {fix}"}
    slowest = max(float(r.get("seconds", 0.0)) for r in ranks)  # type: ignore[arg-type]
    return {"ok": True, "transport": "IB", "devices": net.ib_devices,
            "message": f"all-reduce of 64 MiB over NET/IB ({', '.join(net.ib_devices)}) on {len(ranks)} nodes "
                       f"in {slowest:.2f} s"}


def run(plan: Dict[str, object]) -> Dict[str, object]:
    """The all-reduce over Ray: one GPU per node."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    nodes = int(plan["nodes"])  # type: ignore[call-overload]
    timeout = float(plan["timeout_s"])  # type: ignore[arg-type]
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), log_to_driver=False)
    pg = placement_group([{"GPU": 1, "CPU": 1}] * nodes, strategy="STRICT_SPREAD")
    try:
        ray.get(pg.ready(), timeout=timeout)
        env = {**plan["env"], "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",  # type: ignore[dict-item]
               "NCCL_DEBUG_FILE": LOG_PATTERN}

        @ray.remote(num_gpus=1, num_cpus=1)
        class Rank:
            def address(self) -> tuple:
                s = socket.socket()
                s.bind(("", 0))
                port = s.getsockname()[1]
                s.close()
                return ray.util.get_node_ip_address(), port

            def all_reduce(self, rank: int, world: int, master: tuple) -> dict:
                from datetime import timedelta

                import torch
                import torch.distributed as dist
                dist.init_process_group("nccl", init_method=f"tcp://{master[0]}:{master[1]}", rank=rank,
                                        world_size=world, timeout=timedelta(seconds=timeout))
                t = torch.ones(ELEMENTS, device="cuda")
                start = time.time()
                dist.all_reduce(t)
                torch.cuda.synchronize()
                seconds = time.time() - start
                ok = float(t[0].item()) == float(world)
                dist.destroy_process_group()
                logs = "".join(open(f).read() for f in glob.glob(f"/tmp/llm-cluster-nccl.*.{os.getpid()}.log"))
                return {"host": socket.gethostname(), "sum_ok": ok, "seconds": seconds, "log": logs}

        ranks = [Rank.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                              runtime_env={"env_vars": env}).remote() for i in range(nodes)]
        master = ray.get(ranks[0].address.remote(), timeout=timeout)
        results = ray.get([r.all_reduce.remote(i, nodes, master) for i, r in enumerate(ranks)], timeout=timeout)
        for r in ranks:
            ray.kill(r)
        return verdict(plan, results)
    except ray.exceptions.GetTimeoutError:
        fix = nccl_fix(str(plan["hca"]), plan.get("gid_index"), str(plan["interface"]))  # type: ignore[arg-type]
        return {"ok": False, "transport": "", "message": f"the all-reduce did not finish within {timeout:g} s "
                f"(NCCL init hangs when the nodes cannot reach each other over the HCA); check {fix}"}
    finally:
        remove_placement_group(pg)
        ray.shutdown()


def main(argv: List[str]) -> int:
    """`python3 nccl_check.py '<plan>'`: the verdict as one JSON line; exit 1 when refused."""
    plan = json.loads(argv[0])
    try:
        result = run(plan)
    except Exception as e:  # noqa: BLE001 - any failure of the check is a refusal with its reason
        result = {"ok": False, "transport": "", "message": f"the NCCL check failed: {type(e).__name__}: {e}"}
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
