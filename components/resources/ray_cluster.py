"""RayCluster: the Ray head (which becomes the multi-node vLLM server) and workers of one instance, and its GPU gate."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components import marks
from components.engines.base import container_name, supervised_argv
from components.engines.registry import engine_for
from components.planning.fabric import nccl
from components.planning.fabric import ray as plan
from components.planning.nodes.scripts import bash_command, script_hash
from components.resources.base import Component
from components.resources.gpu_containers import (
    gate_command_args,
    gpu_container_args,
    gpu_container_opts,
    rdma_preflight,
    server_healthcheck,
    server_uploads,
)
from components.resources.gpu_node import GpuNode
from components.spec import StackSpec
from components.spec.topology import Instance


@dataclass(frozen=True)
class RayClusterArgs:
    """One multi-node instance, the GpuNodes it spans, and per node the resource that puts its weights in place."""

    spec: StackSpec
    instance: Instance
    nodes: Mapping[str, GpuNode]
    weights_ready: Mapping[str, pulumi.Resource]
    # Per node, the qualification gate of the pool's image there (nothing starts before it passed).
    qualified: Mapping[str, pulumi.Resource] = field(default_factory=dict)


class RayCluster(Component):
    """Ray head and workers for one multi-node instance of an engine that spans nodes on Ray, and a gate
    that waits for all their GPUs.

    The head container runs `ray-head.sh` with the server's argv as its command: see
    components.planning.fabric.ray for why this makes restarts of the head, or of its node, need no manual step.
    """

    TYPE = marks.RAY_CLUSTER

    def __init__(self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        spec, inst = args.spec, args.instance
        pool = spec.pools[inst.pool]
        wanted = plan.want_gpus(spec, inst)
        super().__init__(
            name,
            {
                "pool": inst.pool,
                "instance": inst.name,
                "nodes": list(inst.nodes),
                "head": inst.head,
                "wantGpus": wanted,
                "image": pool.image,
                "rayPort": pool.ray_port,
            },
            opts,
        )
        head_node = args.nodes[inst.head]
        # ib_write_bw between every pair of the instance's nodes before any Ray container starts.
        self.rdma: remote.Command | None = rdma_preflight(self, spec, inst, args.nodes)
        before_head = [self.rdma] if self.rdma is not None else []
        script = plan.ray_head_script(spec, inst)
        head_name = container_name(inst, "ray-head")
        # ray-head.sh writes the cluster's size there for the node's node-exporter (see planning.ray).
        textfile_dir = docker.ContainerVolumeArgs(
            host_path=plan.NODE_TEXTFILE_DIR, container_path=plan.NODE_TEXTFILE_DIR
        )
        # With the NCCL check, ray-head.sh execs nccl-check.sh, which execs the server over NET/IB only.
        check = nccl.enabled(spec, inst)
        command = [*(["/bin/bash", nccl.WRAPPER] if check else []), *supervised_argv(engine_for(pool), spec, inst)]
        self.head: docker.Container = docker.Container(
            self.child("head"),
            entrypoints=["/bin/bash", plan.RAY_HEAD_SCRIPT],
            command=command,
            uploads=[
                docker.ContainerUploadArgs(file=plan.RAY_HEAD_SCRIPT, content=script, executable=True),
                *server_uploads(spec, inst),
                *(
                    docker.ContainerUploadArgs(file=path, content=text, executable=x)
                    for path, text, x in (nccl.uploads(spec, inst) if check else [])
                ),
            ],
            healthcheck=server_healthcheck(spec, inst),
            # Above the engine's own drain on SIGTERM: `docker stop` lets the requests in flight finish.
            stop_timeout=engine_for(pool).stop_timeout_seconds(spec, inst.pool),
            **gpu_container_args(spec, inst, head_node, inst.head, "ray-head", [textfile_dir]),
            opts=self.opts(
                **gpu_container_opts(head_node, inst.head, args.weights_ready, before_head, qualified=args.qualified)
            ),
        )
        self.workers: dict[str, docker.Container] = {}
        for n in inst.nodes[1:]:
            worker_argv = plan.ray_worker_argv(spec, inst, n)
            self.workers[n] = docker.Container(
                self.child(f"worker-{n}"),
                # The image's entrypoint is the API server; a worker only runs Ray.
                entrypoints=worker_argv[:1],
                command=worker_argv[1:],
                **gpu_container_args(spec, inst, args.nodes[n], n, "ray-worker"),
                opts=self.opts(
                    **gpu_container_opts(args.nodes[n], n, args.weights_ready, [self.head], qualified=args.qualified)
                ),
            )
        gate_script = plan.ray_gate_script(
            plan.ray_status_argv(spec, inst, head_name),
            wanted,
            pool.ray_gate_timeout_seconds,
            inst.name,
            want_nodes=len(inst.nodes),
            hints=plan.gate_hints(spec, inst),
        )
        command_args, timeouts = gate_command_args(
            gate_script, pool.ray_gate_timeout_seconds, [self.head.id, *(w.id for w in self.workers.values())]
        )
        self.gate: remote.Command = remote.Command(
            self.child("gate"),
            connection=head_node.connection,
            **command_args,
            opts=self.opts(depends_on=[self.head, *self.workers.values()], custom_timeouts=timeouts),
        )
        # What the server's health gate waits for: every GPU joined, and NCCL over the HCA.
        self.gates: list[pulumi.Resource] = [self.gate]
        self.nccl: remote.Command | None = None
        if check:
            nccl_gate = nccl.gate_script(inst, head_name)
            self.nccl = remote.Command(
                self.child("nccl"),
                connection=head_node.connection,
                create=bash_command(nccl_gate),
                triggers=[script_hash(nccl_gate), self.head.id],
                logging="stdoutAndStderr",
                opts=self.opts(depends_on=[self.gate]),
            )
            self.gates.append(self.nccl)
        self.register_outputs({"head": inst.head, "wantGpus": wanted, "pool": inst.pool, "instance": inst.name})
