"""vLLM 0.9.2 planning: the `vllm serve` argv, the GPU containers' environment and labels, the /health gate."""
from __future__ import annotations

import shlex

from components.facts.hardware import engine_support, gpu
from components.planning.topology import Instance
from components.spec import StackSpec

LABEL_PREFIX = "llm-cluster."
# Roles of an instance's GPU containers: the `llm-cluster.role` label, and the prefix of the name.
GPU_CONTAINER_ROLES = ("vllm", "ray-head", "ray-worker")


def container_name(instance: Instance, role: str) -> str:
    """The fixed name of an instance's GPU container of `role` (gates, hints and operators use it)."""
    if role not in GPU_CONTAINER_ROLES:
        raise ValueError(f"unknown GPU container role {role!r}; roles are: {', '.join(GPU_CONTAINER_ROLES)}")
    return f"{role}-{instance.name}"


def server_container_name(instance: Instance) -> str:
    """The container that runs `vllm serve`: its own (one node), or the Ray head (multi-node)."""
    return container_name(instance, "ray-head" if instance.uses_ray else "vllm")


def vllm_argv(spec: StackSpec, instance: Instance) -> list[str]:
    """The full `vllm serve` command line of one instance: only flags vLLM 0.9.2 knows, valid values."""
    pool = spec.pools[instance.pool]
    model = spec.models[pool.model]
    v = pool.vllm
    world = instance.tensor_parallel * instance.pipeline_parallel
    # `vllm serve` takes the model as a positional; `--model` raises a ValueError in 0.9.2.
    argv = ["vllm", "serve", model.path,
            "--served-model-name", *spec.served_names(pool.model),
            # Bound to the cluster address, not 0.0.0.0: only the gateway and Prometheus reach it.
            "--host", spec.node(instance.head).address,
            "--port", str(instance.port),
            "--tensor-parallel-size", str(instance.tensor_parallel)]
    if instance.pipeline_parallel > 1:
        argv += ["--pipeline-parallel-size", str(instance.pipeline_parallel)]
    if instance.uses_ray:
        argv += ["--distributed-executor-backend", "ray"]
    elif world > 1:
        # Stated rather than left to vLLM's guess, so the plan shows how the engine will run.
        argv += ["--distributed-executor-backend", "mp"]
    argv += ["--dtype", model.dtype,
             "--max-model-len", str(v.max_model_len),
             "--max-num-seqs", str(v.max_num_seqs),
             "--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    if v.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", v.kv_cache_dtype]
    if model.quantization:
        argv += ["--quantization", model.quantization]
    if v.block_size != 16:
        argv += ["--block-size", str(v.block_size)]
    argv += ["--swap-space", str(v.swap_space_gib)]
    if v.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(v.max_num_batched_tokens)]
    argv += _tristate("--enable-prefix-caching", v.enable_prefix_caching)
    argv += _tristate("--enable-chunked-prefill", v.enable_chunked_prefill)
    if v.enforce_eager:
        argv.append("--enforce-eager")
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + list(v.extra_args)


def _tristate(flag: str, value: bool | None) -> list[str]:
    """A BooleanOptionalAction flag: on, `--no-` off, or absent to keep vLLM's default."""
    if value is None:
        return []
    return [flag] if value else ["--no-" + flag[2:]]


def vllm_env(spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
    """Environment of every GPU container of an instance on `node` (vLLM, Ray head and workers)."""
    pool = spec.pools[instance.pool]
    n = spec.node(node)
    assert n.gpu is not None  # the spec refuses nodes without GPUs
    env: dict[str, str] = {}
    if not engine_support(gpu(n.gpu.model).capability).v1_engine:
        # Unset means V1, which refuses compute capability < 8.0 or falls back with a warning.
        env["VLLM_USE_V1"] = "0"
    # As in the runbook: fork after CUDA init breaks the TP workers.
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    env["NCCL_IB_DISABLE"] = "1" if spec.nccl.ib_disable else "0"
    if n.hca is not None:
        # NCCL takes `dev:port`; the bare device means every port, which is port 1 on these NICs.
        env["NCCL_IB_HCA"] = n.hca.device if n.hca.port == 1 else f"{n.hca.device}:{n.hca.port}"
        if n.hca.link_layer == "ethernet" and n.hca.gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(n.hca.gid_index)  # RoCEv2; IB needs none
    if n.interface is not None:
        # Ray copies only vLLM's own variables to its workers, so each container needs these itself.
        env["NCCL_SOCKET_IFNAME"] = n.interface
        env["GLOO_SOCKET_IFNAME"] = n.interface
    env["NCCL_DEBUG"] = spec.nccl.debug
    env.update(spec.nccl.extra_env)
    env.update(pool.env)
    # Per node by nature (vLLM refuses two Ray nodes with one IP): a pool-wide value cannot override it.
    env["VLLM_HOST_IP"] = n.address
    return env


def container_envs(env: dict[str, str]) -> list[str]:
    """Docker's `KEY=value` list, sorted: the provider stores a set, so order must not cause diffs."""
    return [f"{k}={v}" for k, v in sorted(env.items())]


def container_labels(spec: StackSpec, instance: Instance, node: str, role: str) -> dict[str, str]:
    """Labels of a GPU container: what it is, for people, monitoring and policies (known at preview)."""
    pool = spec.pools[instance.pool]
    n = spec.node(node)
    assert n.gpu is not None
    return {
        LABEL_PREFIX + "role": role,
        LABEL_PREFIX + "pool": instance.pool,
        LABEL_PREFIX + "instance": instance.name,
        LABEL_PREFIX + "node": node,
        LABEL_PREFIX + "gpu-model": n.gpu.model,
        # The container's `image` is an image id, unknown during preview; the reference is not.
        LABEL_PREFIX + "image": pool.image,
    }


def health_url(spec: StackSpec, instance: Instance) -> str:
    """The instance's /health endpoint on its cluster address."""
    return f"{endpoint(spec, instance)}/health"


def endpoint(spec: StackSpec, instance: Instance) -> str:
    """The instance's OpenAI-compatible base URL (what the gateway proxies to)."""
    return f"http://{spec.node(instance.head).address}:{instance.port}"


def health_gate_script(url: str, timeout_s: int, container_hint: str, *, interval_s: int = 5,
                       progress_every_s: int = 30) -> str:
    """Bash that polls a vLLM /health URL until 200, printing elapsed time; times out with what to check."""
    q_url, q_hint = shlex.quote(url), shlex.quote(container_hint)
    return f"""#!/usr/bin/env bash
# Readiness gate: wait until vLLM answers {url} (weights load for 5-15 minutes).
set -euo pipefail
url={q_url}
container={q_hint}
timeout={int(timeout_s)}
start=$SECONDS
next_report=0
# -s without -S: a refused connection every 5 s for 15 minutes is noise, the progress line says it.
until curl -fs -o /dev/null --max-time 5 "$url"; do
  elapsed=$((SECONDS - start))
  if (( elapsed >= timeout )); then
    echo "vllm: $url not healthy after ${{elapsed}}s (timeout ${{timeout}}s)." \\
      "Check \\`docker logs $container\\` (weights path mounted and complete, out of GPU memory:" \\
      "lower gpuMemoryUtilization or maxModelLen), \\`nvidia-smi\\` for GPU memory held by another process." >&2
    if command -v docker >/dev/null 2>&1; then
      docker logs --tail 30 "$container" >&2 2>&1 || true
    fi
    exit 1
  fi
  if (( elapsed >= next_report )); then
    echo "vllm: waiting for $url: ${{elapsed}}s elapsed (timeout ${{timeout}}s)"
    next_report=$((next_report + {int(progress_every_s)}))
  fi
  sleep {int(interval_s)}
done
echo "vllm: $url healthy after $((SECONDS - start))s"
"""


# Uploaded beside ray-head.sh into every vLLM container; ray-head.sh finds it next to itself.
WATCHDOG_SCRIPT = "/opt/llm-cluster/vllm-watchdog.sh"
# A probe that needs nothing the image might lack: python3 is what vLLM itself runs on.
_PROBE = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)"


def health_probe_argv(url: str) -> list[str]:
    """A command that exits 0 when vLLM's /health answers 200 (docker healthcheck and watchdog)."""
    return ["python3", "-c", _PROBE, url]


def watchdog_script(url: str, *, load_timeout_s: int, unhealthy_after_s: int, interval_s: int = 15) -> str:
    """vllm-watchdog.sh: run vLLM; exit, so docker restarts the container, when it hangs.

    docker restarts a container whose process exits, not one that is merely unhealthy: a vLLM that
    never finishes loading, or whose engine hangs (an NCCL peer gone), would stay down until a person
    notices. The watchdog turns both into an exit. `unhealthy_after_s` 0 turns it off (plain exec).
    """
    if unhealthy_after_s <= 0:
        return '#!/usr/bin/env bash\n# vLLM watchdog disabled (restartUnhealthyAfterSeconds: 0).\nexec "$@"\n'
    probe = " ".join(shlex.quote(a) for a in health_probe_argv(url)[:-1])
    return f"""#!/usr/bin/env bash
# vLLM watchdog: run the server; exit when it is not healthy {load_timeout_s}s after start, or stays
# unhealthy for {unhealthy_after_s}s after having served, so that docker (restart unless-stopped) starts
# it again. docker itself never restarts a container that is only unhealthy.
set -euo pipefail
url={shlex.quote(url)}
if (( $# == 0 )); then
  echo "usage: vllm-watchdog.sh <vllm command>..." >&2
  exit 2
fi
healthy() {{ {probe} "$url" >/dev/null 2>&1; }}
"$@" &
child=$!
stop() {{
  kill -TERM "$child" 2>/dev/null || true
  wait "$child" 2>/dev/null || true
}}
trap 'stop; exit 143' TERM INT
started=$SECONDS
last_ok=""
while kill -0 "$child" 2>/dev/null; do
  sleep {int(interval_s)} &
  wait $!
  if healthy; then
    last_ok=$SECONDS
  elif [[ -z "$last_ok" ]] && (( SECONDS - started >= {int(load_timeout_s)} )); then
    echo "watchdog: $url not healthy {load_timeout_s}s after start; stopping vLLM so docker restarts it" \\
      "(check this container's log above: weights, GPU memory; or raise loadTimeoutMinutes)" >&2
    stop
    exit 70
  elif [[ -n "$last_ok" ]] && (( SECONDS - last_ok >= {int(unhealthy_after_s)} )); then
    echo "watchdog: $url unhealthy for $((SECONDS - last_ok))s after serving; stopping vLLM so docker" \\
      "restarts it (look for NCCL errors and Xid events: dmesg, nvidia-smi)" >&2
    stop
    exit 70
  fi
done
# vLLM exited by itself: pass its status on.
wait "$child"
"""


def instance_watchdog_script(spec: StackSpec, instance: Instance) -> str:
    """The watchdog for one instance, with its pool's load timeout and unhealthy limit."""
    pool = spec.pools[instance.pool]
    return watchdog_script(health_url(spec, instance), load_timeout_s=pool.load_timeout_minutes * 60,
                           unhealthy_after_s=pool.restart_unhealthy_after_seconds)


def supervised_argv(spec: StackSpec, instance: Instance) -> list[str]:
    """What a vLLM container runs: the watchdog, then the `vllm serve` argv it supervises."""
    return ["/bin/bash", WATCHDOG_SCRIPT, *vllm_argv(spec, instance)]
