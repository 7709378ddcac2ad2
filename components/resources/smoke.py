"""SmokeTest: after the gateway and every model's health gate, one chat completion per served name through the gateway."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components import marks
from components.planning.nodes.scripts import bash_command, script_hash
from components.planning.smoke import smoke_plan, smoke_script
from components.resources.base import Component
from components.resources.gateway import Gateway
from components.resources.gpu_node import GpuNode
from components.resources.model_server import ModelServer
from components.spec import StackSpec


@dataclass(frozen=True)
class SmokeTestArgs:
    """The stack, the gateway and its node, and the servers whose gates come first."""

    spec: StackSpec
    node: GpuNode
    gateway: Gateway
    servers: Sequence[ModelServer]


class SmokeTest(Component):
    """A remote command on the gateway's node: the deployment fails naming the model, pool and status."""

    TYPE = marks.SMOKE_TEST

    def __init__(self, name: str, args: SmokeTestArgs, opts: pulumi.ResourceOptions | None = None):
        spec, g = args.spec, args.spec.gateway
        assert g is not None
        url = f"{'https' if g.tls else 'http'}://{args.node.address}:{g.port}"
        plan = smoke_plan(spec, url)
        super().__init__(name, {"url": url, "models": [c["model"] for c in plan["checks"]]}, opts)  # type: ignore[attr-defined]
        script = smoke_script(spec, url)
        self.command: remote.Command = remote.Command(
            self.child("run"),
            connection=args.node.connection,
            create=bash_command(script),
            # The deploy-time keys ({"id": "key"}), never in the command line or the plan.
            stdin=args.gateway.api_keys if args.gateway.api_keys is not None else "{}",
            # Again whenever the gateway or a server was replaced, or the checks changed.
            triggers=[script_hash(script), args.gateway.container.id, *(s.gate.id for s in args.servers)],
            logging="stdoutAndStderr",
            opts=self.opts(depends_on=[args.gateway.ready, *(s.gate for s in args.servers)]),
        )
        self.register_outputs({"url": url})
