"""ModelServer: one vLLM instance (a single-node replica, or TP×PP served from a RayCluster's head) and its /health gate."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.base import Component
from components.gpu_containers import (
    gate_command_args, gpu_container_args, gpu_container_opts, vllm_healthcheck, watchdog_upload,
)
from components.planning.pool_capacity import capacity_dict, context_window_dict
from components.planning.topology import Instance, instances
from components.planning.vllm import (
    endpoint, health_gate_script, health_url, server_container_name, supervised_argv, vllm_argv, vllm_env,
)
from components.ray_cluster import RayCluster, RayClusterArgs
from components.spec import StackSpec, stack_keys


@dataclass(frozen=True)
class ModelServerArgs(RayClusterArgs):
    """One instance, its GpuNodes, their weights-ready resources, and its RayCluster when it spans nodes."""

    ray: RayCluster | None = None


def server_props(spec: StackSpec, instance: Instance) -> dict[str, Any]:
    """The component's props: what the policy pack reads of a vLLM instance (keys are a contract)."""
    pool = spec.pools[instance.pool]
    model = spec.models[pool.model]
    g = spec.node(instance.head).gpu
    assert g is not None  # the spec refuses nodes without GPUs
    return {
        "pool": instance.pool, "instance": instance.name, "model": pool.model, "modelPath": model.path,
        "arch": model.arch, "quantization": model.quantization, "dtype": model.dtype,
        "gpuModel": g.model, "gpuCount": g.count,  # per node, as GpuNode states it
        "nodes": list(instance.nodes), "tensorParallel": instance.tensor_parallel,
        "pipelineParallel": instance.pipeline_parallel, "image": pool.image,
        "argv": vllm_argv(spec, instance), "env": vllm_env(spec, instance, instance.head),
        # So the pack reports once per pool, naming its instances and the stack keys to edit.
        "poolInstances": [i.name for i in instances(spec, instance.pool)],
        "stackKeys": stack_keys(spec, instance.pool, instance.head),
        "contextWindow": context_window_dict(spec, pool.model),
        "capacity": (capacity := capacity_dict(spec, instance.pool)),
        # What VLLM_MLA_DISABLE=1 would cost, so the MLA advice can give the figures with the fix.
        "capacityWithoutMla": (capacity_dict(spec, instance.pool, mla=False)
                               if capacity.get("mla_enabled") else None),
    }


class ModelServer(Component):
    """A vLLM server: its own container (single node) or the RayCluster's head (multi-node), then a /health gate."""

    TYPE = "llm-cluster:vllm:ModelServer"

    def __init__(self, name: str, args: ModelServerArgs, opts: pulumi.ResourceOptions | None = None):
        spec, inst = args.spec, args.instance
        pool = spec.pools[inst.pool]
        super().__init__(name, server_props(spec, inst), opts)
        head = args.nodes[inst.head]
        self.endpoint: str = endpoint(spec, inst)
        self.container: docker.Container | None = None
        # Single node: this component's own container; multi-node: the Ray head, which runs vLLM.
        container_name = server_container_name(inst)
        if args.ray is None:
            argv = supervised_argv(spec, inst)
            self.container = docker.Container(
                self.child("vllm"),
                # The runbook's `docker run … vllm/vllm-openai:v0.9.2 vllm serve …` hands `vllm serve`
                # to the image's ENTRYPOINT (python3 -m vllm.entrypoints.openai.api_server) as
                # arguments, which that parser refuses: the entrypoint is overridden (the watchdog,
                # which then runs `vllm serve`).
                entrypoints=argv[:2], command=argv[2:], uploads=[watchdog_upload(spec, inst)],
                healthcheck=vllm_healthcheck(spec, inst),
                **gpu_container_args(spec, inst, head, inst.head, "vllm"),
                opts=self.opts(**gpu_container_opts(head, inst.head, args.weights_ready)))
            waits_on: list[pulumi.Resource] = [self.container]
            target_id = self.container.id
        else:
            # Multi-node: the Ray head container runs vLLM once every GPU has joined.
            waits_on = [args.ray.gate]
            target_id = args.ray.head.id
        timeout_s = pool.load_timeout_minutes * 60
        script = health_gate_script(health_url(spec, inst), timeout_s, container_name)
        command_args, timeouts = gate_command_args(script, timeout_s, [target_id])
        self.gate: remote.Command = remote.Command(
            self.child("health"), connection=head.connection, **command_args,
            opts=self.opts(depends_on=waits_on, custom_timeouts=timeouts))
        self.register_outputs({"endpoint": self.endpoint})
