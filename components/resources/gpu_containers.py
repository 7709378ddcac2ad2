"""What every server and Ray container of an instance shares: docker arguments, options, health, gates."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi
import pulumi_docker as docker
from pulumi_command import remote

from components.engines.base import (
    WATCHDOG_SCRIPT,
    container_envs,
    container_labels,
    container_name,
    instance_watchdog_script,
    ready_url,
)
from components.engines.registry import engine_for
from components.planning.fabric.rdma import rdma_script
from components.planning.nodes.scripts import bash_command, script_hash
from components.resources.base import Component
from components.resources.gpu_node import GpuNode
from components.spec import StackSpec
from components.spec.topology import Instance

# Seconds docker waits after SIGTERM before SIGKILL on stop/delete: vLLM frees GPU memory and
# NCCL communicators on a clean shutdown, which a SIGKILL skips.
STOP_GRACE_SECONDS = 60
# Margin over a gate's own deadline for SSH and the last poll, so the gate's message, not
# Pulumi's timeout, is what the operator sees.
GATE_TIMEOUT_MARGIN_SECONDS = 120


def gpu_container_args(
    spec: StackSpec,
    instance: Instance,
    node: GpuNode,
    node_name: str,
    role: str,
    extra_volumes: list[docker.ContainerVolumeArgs] | None = None,
) -> dict[str, object]:
    """docker.Container arguments every GPU container of an instance shares (server, Ray head, Ray worker)."""
    pool = spec.pools[instance.pool]
    engine = engine_for(pool)
    model = spec.models[pool.model]
    gpus: dict[str, object]
    if instance.gpu_ids is None:
        gpus = {"gpus": "all"}
    else:
        # `gpus="device=0,1"` is parsed by docker as CSV (one id plus a count): name the ids instead.
        gpus = {
            "device_requests": [
                docker.ContainerDeviceRequestArgs(
                    driver="nvidia", device_ids=[str(i) for i in instance.gpu_ids], capabilities=["gpu"]
                )
            ]
        }
    return dict(
        name=container_name(instance, role),
        image=node.images[pool.image].image_id,
        network_mode="host",  # NCCL, Ray and vLLM bind the node's addresses and many ports
        # vLLM's TP workers (PyTorch, NCCL) and Ray's object store share memory through /dev/shm,
        # all inside this one container: a private /dev/shm of shmSizeGib, as the runbook's
        # `--shm-size` (vLLM's Docker docs: `--ipc=host` or `--shm-size`). Not ipc_mode="host":
        # with it docker mounts the host's /dev/shm and ignores shm_size, so shmSizeGib did nothing.
        shm_size=pool.shm_size_gib * 1024,
        init=True,  # tini as PID 1 reaps Ray's and vLLM's orphaned processes and forwards SIGTERM
        restart="unless-stopped",
        destroy_grace_seconds=STOP_GRACE_SECONDS,
        envs=container_envs(engine.serve_env(spec, instance, node_name)),
        labels=[
            docker.ContainerLabelArgs(label=k, value=v)
            for k, v in container_labels(spec, instance, node_name, role).items()
        ],
        volumes=[
            docker.ContainerVolumeArgs(host_path=model.path, container_path=model.path, read_only=True),
            *(extra_volumes or []),
        ],
        **gpus,
    )


def gpu_container_opts(
    node: GpuNode,
    node_name: str,
    weights_ready: Mapping[str, pulumi.Resource],
    extra: list[pulumi.Resource] | None = None,
    qualified: Mapping[str, pulumi.Resource] | None = None,
) -> dict[str, object]:
    """Resource options of a GPU container: its node's provider; the node, its weights and the image's
    qualification gate on that node (components.resources.qualification) first."""
    gates = [r for r in [weights_ready.get(node_name), (qualified or {}).get(node_name)] if r is not None]
    after = [*node.ready, *gates, *(extra or [])]
    # Fixed names and the same GPUs: the old container must be gone before the new one starts.
    return dict(provider=node.provider, depends_on=after, delete_before_replace=True)


def server_healthcheck(spec: StackSpec, instance: Instance) -> docker.ContainerHealthcheckArgs:
    """docker's view of the server's health (`docker ps`), patient while the weights load."""
    engine = engine_for(spec.pools[instance.pool])
    return docker.ContainerHealthcheckArgs(
        tests=["CMD", *engine.probe_argv(ready_url(engine, spec, instance))],
        interval="30s",
        timeout="10s",
        retries=3,
        start_period=f"{spec.pools[instance.pool].load_timeout_minutes * 60}s",
    )


def server_uploads(spec: StackSpec, instance: Instance, node: str | None = None) -> list[docker.ContainerUploadArgs]:
    """What the container that runs the server on `node` (default: the instance's head) gets written into it:
    the watchdog, and the files its engine asks for (tuned kernel configs)."""
    engine = engine_for(spec.pools[instance.pool])
    return [
        docker.ContainerUploadArgs(
            file=WATCHDOG_SCRIPT, content=instance_watchdog_script(engine, spec, instance, node), executable=True
        ),
        *(
            docker.ContainerUploadArgs(file=u.path, content=u.content, executable=u.executable)
            for u in engine.uploads(spec, instance)
        ),
    ]


def gate_command_args(
    script: str, timeout_s: int, triggers: list[pulumi.Input[str]]
) -> tuple[dict[str, object], pulumi.CustomTimeouts]:
    """remote.Command arguments and timeouts for a gate script under bash; re-run when it or its targets change."""
    return dict(
        create=bash_command(script),  # bash whatever the login shell is (dash has no pipefail)
        triggers=[script_hash(script), *triggers],
        logging="stdoutAndStderr",
    ), pulumi.CustomTimeouts(create=f"{timeout_s + GATE_TIMEOUT_MARGIN_SECONDS}s")


def rdma_preflight(
    owner: Component, spec: StackSpec, instance: Instance, nodes: Mapping[str, GpuNode]
) -> remote.Command | None:
    """ib_write_bw between every pair of a multi-node instance's nodes, run from its head before any of its
    containers starts (on Ray or on the engine's own launcher); None when the stack checks no RDMA link."""
    if not spec.preflight.rdma_bandwidth or spec.nccl.ib_disable:
        return None
    rdma = rdma_script(spec, instance)
    return remote.Command(
        owner.child("rdma"),
        connection=nodes[instance.head].connection,
        create=bash_command(rdma),
        triggers=[script_hash(rdma)],
        logging="stdoutAndStderr",
        opts=owner.opts(depends_on=[r for n in instance.nodes for r in nodes[n].ready]),
    )
