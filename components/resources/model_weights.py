"""ModelWeights: one model's weights in place on every node that serves it, verified.

- source.node: a manifest (size + sha256 of every file, cached) is built on the source, then the
  weights fan out: each node that has them serves one new node per round (rsync over SSH between
  nodes, as the runbook's `rsync -aP /data/models/ gpu-02:/data/models/`), so N nodes take
  ⌈log2 N⌉ rounds. Each target verifies its copy against the source's manifest; a target that
  already verified this manifest is skipped. The source's own server does not wait for the
  manifest (its weights are on its disk already), only for a check that they are readable there:
  only the copies wait for the hashing.
- source.sharedMount: each node mounts the NFS share read-only at the model path (fstab entry).
- source.present: each node checks the weights are there and readable.
Every step triggers on its script (which holds the model's path) and the model's revision: bump
`revision` to re-sync and re-verify.
Destroying forgets the bookkeeping but keeps the weights on the disks (hours to copy back).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components import marks
from components.planning.nodes.scripts import (
    bash_command,
    copy_delete_script,
    copy_script,
    fanout_rounds,
    manifest_build_script,
    manifest_delete_script,
    manifest_verify_script,
    mount_script,
    present_check_script,
    script_hash,
    ssh_argv,
    unmount_script,
)
from components.resources.base import Component
from components.resources.gpu_node import GpuNode
from components.spec import StackSpec

# Copying a few hundred GB at disk speed and hashing it take hours, not the provider's default.
COPY_TIMEOUT = "6h"
HASH_TIMEOUT = "3h"


@dataclass(frozen=True)
class ModelWeightsArgs:
    """The stack, which model, and every node that must hold its weights (the source node included)."""

    spec: StackSpec
    model: str
    nodes: dict[str, GpuNode]


class ModelWeights(Component):
    """A model's weights on its nodes; `.ready[node]` is the resource after which that node's weights are in place.

    For a copy's source that is the check that its weights are readable; for its targets, their verified copy.
    """

    TYPE = marks.MODEL_WEIGHTS

    def __init__(self, name: str, args: ModelWeightsArgs, opts: pulumi.ResourceOptions | None = None):
        m = args.spec.models[args.model]
        src = m.source
        method = "copy" if src.node else "sharedMount" if src.shared_mount else "present"
        super().__init__(
            name,
            {
                "model": args.model,
                "path": m.path,
                "revision": m.revision,
                "method": method,
                "sourceNode": src.node,
                "nodes": list(args.nodes),
            },
            opts,
        )
        self._args = args
        self.ready: dict[str, pulumi.Resource] = {}
        if src.node is not None:
            self._fan_out(src.node)
        elif src.shared_mount is not None:
            for node in args.nodes:
                self.ready[node] = self._command(
                    f"mount-{node}",
                    node,
                    mount_script(src.shared_mount, m.path),
                    unmount_script(src.shared_mount, m.path),
                    sudo=args.nodes[node].sudo,
                )
        else:
            for node in args.nodes:
                self.ready[node] = self._command(f"check-{node}", node, present_check_script(m.path), None)
        self.register_outputs({"ready": sorted(self.ready)})

    def _fan_out(self, source: str) -> None:
        spec, path, nodes = self._args.spec, self._args.spec.models[self._args.model].path, self._args.nodes
        if source not in nodes:
            raise ValueError(
                f"ModelWeights {self._args.model}: the source node {source!r} must be among "
                f"the nodes ({', '.join(nodes)})"
            )
        manifest = self._command(
            f"manifest-{source}",
            source,
            manifest_build_script(path),
            manifest_delete_script(path, ("manifest", "cache")),
            timeout=HASH_TIMEOUT,
        )
        # The source already holds its weights: its server waits for a quick look at them, not for the hashing.
        self.ready[source] = self._command(f"check-{source}", source, present_check_script(path), None)
        served_by: dict[str, pulumi.Resource] = {source: manifest}  # what a serving node's copies wait on
        ssh = ssh_argv(spec.ssh.port, spec.ssh.host_key_checking)
        for round_pairs in fanout_rounds(source, list(nodes)):
            for serving, target in round_pairs:
                login = f"{spec.ssh.user}@{spec.nodes[target].address}"
                copy_name = self.child(f"copy-{serving}-to-{target}")
                copy = self._command(
                    f"copy-{serving}-to-{target}",
                    serving,
                    copy_script(
                        path,
                        serving=serving,
                        target=target,
                        target_login=login,
                        ssh=ssh,
                        manifest="manifest" if serving == source else "expected",
                    ),
                    copy_delete_script(path, target_login=login, ssh=ssh),
                    after=[served_by[serving], *nodes[target].ready],
                    timeout=COPY_TIMEOUT,
                )
                self.ready[target] = served_by[target] = self._command(
                    f"verify-{target}",
                    target,
                    manifest_verify_script(path, copy_name),
                    manifest_delete_script(path, ("verified",)),
                    after=[copy],
                    timeout=HASH_TIMEOUT,
                )

    def _command(
        self,
        suffix: str,
        node: str,
        create: str,
        delete: str | None,
        *,
        after: list[pulumi.Resource] | None = None,
        timeout: str | None = None,
        sudo: bool = False,
    ) -> remote.Command:
        """A script on `node`, re-run when it (the model's path included) or the model's revision changes."""
        gpu_node = self._args.nodes[node]
        m = self._args.spec.models[self._args.model]
        return remote.Command(
            self.child(suffix),
            connection=gpu_node.connection,
            create=bash_command(create, sudo=sudo),
            delete=bash_command(delete, sudo=sudo) if delete else None,
            triggers=[m.revision, script_hash(create)],
            opts=self.opts(
                depends_on=after if after is not None else gpu_node.ready,
                # The old delete must not run after the new create (it would drop its marks).
                delete_before_replace=True,
                custom_timeouts=pulumi.CustomTimeouts(create=timeout) if timeout else None,
            ),
        )
