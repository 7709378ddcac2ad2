"""ModelServer: one engine instance (a single-node replica, TP×PP served from a RayCluster's head, or TP×PP on the
engine's own launcher: a container per node) and its readiness gate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import marks
from components.engines.base import (
    WATCHDOG_SCRIPT,
    container_name,
    endpoint,
    health_gate_script,
    native_worker_role,
    ready_url,
    server_container_name,
    startup_failure_advice,
    supervised_argv,
)
from components.engines.registry import engine_for, stack_keys
from components.resources.base import Component
from components.resources.gpu_containers import (
    gate_command_args,
    gpu_container_args,
    gpu_container_opts,
    rdma_preflight,
    server_healthcheck,
    server_uploads,
)
from components.resources.ray_cluster import RayCluster, RayClusterArgs
from components.spec import StackSpec
from components.spec.models import checkpoint_quantization, context_window_dict, model_architecture, quantization_config
from components.spec.topology import Instance, instances


@dataclass(frozen=True)
class ModelServerArgs(RayClusterArgs):
    """One instance, its GpuNodes, their weights-ready resources, and its RayCluster when it spans nodes."""

    ray: RayCluster | None = None


def host_memory(spec: StackSpec, pool: str) -> dict[str, dict[str, Any]]:
    """node -> {memoryGib, key, instances}: the host RAM the pool's servers share on each of its nodes."""
    out: dict[str, dict[str, Any]] = {}
    for node in spec.pools[pool].nodes:
        gib, key = spec.node_memory(node)
        out[node] = {
            "memoryGib": gib,
            "key": key,
            "instances": sum(node in inst.nodes for inst in instances(spec, pool)),
        }
    return out


def server_props(spec: StackSpec, instance: Instance) -> dict[str, Any]:
    """The component's props: what the policy pack reads of a server instance (keys are a contract)."""
    pool = spec.pools[instance.pool]
    engine = engine_for(pool)
    model = spec.models[pool.model]
    g = spec.node(instance.head).gpu
    assert g is not None  # the spec refuses nodes without GPUs
    return {
        "pool": instance.pool,
        "instance": instance.name,
        "model": pool.model,
        "modelPath": model.path,
        "arch": model.arch,
        "quantization": model.quantization,
        "dtype": model.dtype,
        "gpuModel": g.model,
        "gpuCount": g.count,  # per node, as GpuNode states it
        "nodes": list(instance.nodes),
        "tensorParallel": instance.tensor_parallel,
        "pipelineParallel": instance.pipeline_parallel,
        "image": pool.image,
        "engine": pool.engine,
        "qualificationGate": pool.qualification_gate,
        # A private build's declared facts, so the pack judges it by them (None: the table's, by image).
        "imageFacts": (
            {"like": pool.image_facts.like, **pool.image_facts.overrides()} if pool.image_facts is not None else None
        ),
        "argv": engine.serve_argv(spec, instance),
        "env": engine.serve_env(spec, instance, instance.head),
        # The air-gapped rule: whether the stack says so, and whether the pool keeps the hub off.
        "airGapped": spec.images.air_gapped,
        "offline": pool.offline,
        # So the pack reports once per pool, naming its instances and the stack keys to edit.
        "poolInstances": [i.name for i in instances(spec, instance.pool)],
        "stackKeys": stack_keys(spec, instance.pool, instance.head),
        # Every node of the pool (so each instance judges the whole pool): its RAM, the key setting it,
        # and how many of the pool's instances run there.
        "hostMemory": host_memory(spec, instance.pool),
        "contextWindow": context_window_dict(spec, pool.model),
        "checkpointQuantization": checkpoint_quantization(spec, pool.model),
        # What engine rules check a checkpoint by: its quantization group, config.json model_type, head size.
        "groupSize": model.group_size,
        "modelType": (arch := model_architecture(spec, pool.model)).model_type,
        "headDim": arch.head_dim,
        "quantizationConfig": quantization_config(spec, pool.model),
        "capacity": (capacity := engine.capacity(spec, instance.pool)),
        # What VLLM_MLA_DISABLE=1 would cost, so the MLA advice can give the figures with the fix.
        "capacityWithoutMla": (
            engine.capacity(spec, instance.pool, mla=False) if capacity.get("mla_enabled") else None
        ),
    }


class ModelServer(Component):
    """A server: its own container (single node), the RayCluster's head (multi-node on Ray), or one container per
    node (multi-node on the engine's own launcher: rank 0 serves the API, the others join it headless), then a
    readiness gate on the API."""

    TYPE = marks.MODEL_SERVER

    def __init__(self, name: str, args: ModelServerArgs, opts: pulumi.ResourceOptions | None = None):
        spec, inst = args.spec, args.instance
        pool = spec.pools[inst.pool]
        engine = engine_for(pool)
        super().__init__(name, server_props(spec, inst), opts)
        head = args.nodes[inst.head]
        self.endpoint: str = endpoint(spec, inst)
        self.container: docker.Container | None = None
        # One node, or rank 0 of the engine's own launcher: this component's own container; on Ray: the head.
        server_name = server_container_name(engine, inst)
        self.workers: dict[str, docker.Container] = {}
        worker_names = {
            n: container_name(inst, native_worker_role(engine))
            for n in (inst.nodes[1:] if inst.native_launcher else ())
        }
        # Across nodes on the engine's own launcher: ib_write_bw between the instance's nodes before any of its
        # containers starts, as RayCluster runs it before its head.
        self.rdma: remote.Command | None = (
            rdma_preflight(self, spec, inst, args.nodes) if inst.native_launcher else None
        )
        before = [self.rdma] if self.rdma is not None else []
        if args.ray is None:
            # One node, or rank 0 of the engine's own launcher (the head's argv: it serves the API).
            argv = supervised_argv(engine, spec, inst)
            self.container = docker.Container(
                self.child(engine.server_role),
                # The runbook's `docker run … vllm/vllm-openai:v0.9.2 vllm serve …` hands `vllm serve`
                # to the image's ENTRYPOINT (python3 -m vllm.entrypoints.openai.api_server) as
                # arguments, which that parser refuses: the entrypoint is overridden (the watchdog,
                # which then runs `vllm serve`).
                entrypoints=argv[:2],
                command=argv[2:],
                uploads=server_uploads(spec, inst),
                healthcheck=server_healthcheck(spec, inst),
                # Above the engine's own drain on SIGTERM: `docker stop` lets the requests in flight finish.
                stop_timeout=engine.stop_timeout_seconds(spec, inst.pool),
                **gpu_container_args(spec, inst, head, inst.head, engine.server_role),
                opts=self.opts(
                    **gpu_container_opts(head, inst.head, args.weights_ready, before, qualified=args.qualified)
                ),
            )
            # The other nodes of an instance on the engine's own launcher: the same watchdog (on rank 0's
            # readiness URL) runs each node's headless argv, so a worker exits, and docker starts it again to
            # rejoin, when it dies, when rank 0 stops serving or when its connections with rank 0's node close
            # (components.engines.base.watchdog_script, WorldCheck; rank 0's watches the workers' the same way).
            for n in inst.nodes[1:] if inst.native_launcher else ():
                node_argv = ["/bin/bash", WATCHDOG_SCRIPT, *engine.node_argv(spec, inst, n)]
                self.workers[n] = docker.Container(
                    self.child(f"worker-{n}"),
                    entrypoints=node_argv[:2],
                    command=node_argv[2:],
                    uploads=server_uploads(spec, inst, n),
                    **gpu_container_args(spec, inst, args.nodes[n], n, native_worker_role(engine)),
                    opts=self.opts(
                        **gpu_container_opts(
                            args.nodes[n], n, args.weights_ready, [self.container], qualified=args.qualified
                        )
                    ),
                )
            waits_on: list[pulumi.Resource] = [self.container, *self.workers.values()]
            target_id = self.container.id
        else:
            # Multi-node: the Ray head container runs vLLM once every GPU has joined.
            waits_on = list(args.ray.gates)  # GPUs joined (and NCCL over the HCA, when checked)
            target_id = args.ray.head.id
        timeout_s = pool.load_timeout_minutes * 60
        script = health_gate_script(
            ready_url(engine, spec, inst),
            timeout_s,
            server_name,
            server=engine.name,
            memory_keys=f"pools.{inst.pool}.{engine.memory_keys}",
            failures=startup_failure_advice(engine, inst.pool, pool.model),
            # The engine answers once every node's workers joined: a worker that cannot start shows in its log.
            also_check=[f"docker logs {w_name} on {n}" for n, w_name in worker_names.items()],
        )
        command_args, timeouts = gate_command_args(
            script, timeout_s, [target_id, *(w.id for w in self.workers.values())]
        )
        self.gate: remote.Command = remote.Command(
            self.child("health"),
            connection=head.connection,
            **command_args,
            opts=self.opts(depends_on=waits_on, custom_timeouts=timeouts),
        )
        # What the pack's stack policies read of the server (they see outputs, not props): policies.rules.grouped.
        self.register_outputs(
            {
                "endpoint": self.endpoint,
                "pool": inst.pool,
                "instance": inst.name,
                "stackKeys": stack_keys(spec, inst.pool, inst.head),
            }
        )
