"""Rule 6: the image's torch must have kernels for the GPU (its CUDA arch list, from the image's facts); images
of multi-node (Ray) containers must carry Ray. The checks are each engine's own (`LaunchRule`s of topic
"image", with `ray_node_image` for the Ray nodes)."""

from __future__ import annotations

from policies.rules.common import launch_policies

POLICIES = launch_policies("image")
