"""ImageQualification: the qualification gate of one serving image on one node (components.planning.qualification),
run as soon as the image is pulled, beside the weights copy; every server container of that image on the
node waits for it."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
from pulumi_command import remote

from components import marks
from components.planning.nodes.scripts import bash_command, script_hash
from components.planning.qualification import Qualification, qualification_script
from components.resources.base import Component
from components.resources.gpu_node import GpuNode

# docker pulls nothing here (the image is on the node); the check itself takes seconds, Triton's first
# compile up to a minute.
QUALIFICATION_TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class ImageQualificationArgs:
    """What to check (node, image, the engine's check, planned argvs) and the GpuNode that pulled the image."""

    qualification: Qualification
    node: GpuNode


class ImageQualification(Component):
    """`docker run --rm --gpus device=0` the serving image with its engine's check; fails the deploy naming the fix."""

    TYPE = marks.IMAGE_QUALIFICATION

    def __init__(self, name: str, args: ImageQualificationArgs, opts: pulumi.ResourceOptions | None = None):
        q = args.qualification
        super().__init__(
            name,
            {"node": q.node, "image": q.image, "engine": q.check.engine, "argvs": [list(a) for a in q.argvs]},
            opts,
        )
        script = qualification_script(q, timeout_s=QUALIFICATION_TIMEOUT_SECONDS)
        self.check: remote.Command = remote.Command(
            self.child("check"),
            connection=args.node.connection,
            create=bash_command(script),
            # Re-run when what it checks changes: the script (facts, argvs) or the pulled image.
            triggers=[script_hash(script), args.node.images[q.image].repo_digest],
            logging="stdoutAndStderr",
            opts=self.opts(
                depends_on=[*args.node.ready, args.node.images[q.image]],
                custom_timeouts=pulumi.CustomTimeouts(create=f"{QUALIFICATION_TIMEOUT_SECONDS + 120}s"),
            ),
        )
        self.register_outputs({})
