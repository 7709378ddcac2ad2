"""Rule 6: the image's torch must have kernels for the GPU (its CUDA arch list, from the image's facts); images
of multi-node (Ray) containers must carry Ray. The checks are each engine's own (`LaunchRule`s of topic
"image", with `ray_node_image` for the Ray nodes). And no pool starts without its image's qualification gate,
the check in the image on the node itself, unless the stack's policy config lowers `qualification-gate`."""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from components.marks import MODEL_SERVER
from policies.rules.common import launch_policies, per_pool


def validate_gate(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A pool's servers wait for the qualification gate of their image on each of their nodes."""
    props = args.props
    if args.resource_type != MODEL_SERVER:
        args.not_applicable("not a model server")
        return
    if props.get("qualificationGate", True) is not False:
        return
    pool, gpu = props.get("pool"), props.get("gpuModel")
    report(
        f"pools.{pool}.qualificationGate is false: its servers start without the qualification gate, so an "
        f"image that cannot run on the {gpu} is found only when a server dies after loading its weights, "
        f"minutes later and in its log, instead of before anything loads. Remove pools.{pool}.qualificationGate "
        "(it defaults to true); only a rehearsal on hardware the gate cannot pass (CPU engines) lowers this "
        "rule, in its policy config.",
        None,
    )


POLICIES = [
    *launch_policies("image"),
    ResourceValidationPolicy(
        name="qualification-gate",
        description="Every pool's servers wait for their image's qualification gate on their nodes.",
        validate=per_pool(validate_gate),
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
]
