"""Where each node gets each image: its own registry, the stack's private registry, a tarball on the node
(`docker load`), or a build on the node; and the load script for tarballs.

One mapping for every image the stack runs (`images.registry` or `images.tarballs`), so a stack cannot
cover the serving images and forget the exporters. References are read as Docker reads them
(distribution/reference, and terraform-provider-docker's parseImageOptions): the first path component is
a registry host only when it holds a `.` or a `:` or is `localhost`; otherwise the image is on Docker Hub,
where a one-component name is under `library/`.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from typing import Literal

from components.facts.gateway_image import BASE_IMAGE, BUILD_CONTEXT, build_args, is_built
from components.spec import SpecIssue, StackSpec

DOCKER_HUB = "docker.io"
# Registries on the public internet (an air-gapped node reaches none of them), by host, and by the
# suffix of the cloud registries whose hosts are per account or region.
PUBLIC_REGISTRIES: dict[str, str] = {
    "docker.io": "Docker Hub",
    "registry-1.docker.io": "Docker Hub",
    "index.docker.io": "Docker Hub",
    "nvcr.io": "NVIDIA NGC",
    "ghcr.io": "GitHub Container Registry",
    "quay.io": "Quay",
    "gcr.io": "Google Container Registry",
    "registry.k8s.io": "Kubernetes registry",
    "k8s.gcr.io": "Kubernetes registry",
    "public.ecr.aws": "Amazon ECR Public",
    "mcr.microsoft.com": "Microsoft Container Registry",
    "registry.gitlab.com": "GitLab registry",
    "docker.elastic.co": "Elastic registry",
}
PUBLIC_SUFFIXES: dict[str, str] = {
    ".gcr.io": "Google Container Registry",
    ".pkg.dev": "Google Artifact Registry",
    ".amazonaws.com": "Amazon ECR",
    ".azurecr.io": "Azure Container Registry",
}
Via = Literal["origin", "registry", "tarball", "build"]


def split_reference(ref: str) -> tuple[str, str]:
    """`nvcr.io/nvidia/k8s/dcgm-exporter:t` -> ("nvcr.io", "nvidia/k8s/dcgm-exporter:t");
    `nginx:1.27.5` -> ("docker.io", "library/nginx:1.27.5")."""
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        host, remainder = first, rest
    else:
        host, remainder = DOCKER_HUB, ref
    if host in ("index.docker.io", "registry-1.docker.io"):
        host = DOCKER_HUB
    if host == DOCKER_HUB and "/" not in remainder.split("@")[0].split(":")[0]:
        remainder = "library/" + remainder
    return host, remainder


def public_registry(host: str) -> str | None:
    """What a public registry is called (`Docker Hub`), None for a host that is not one."""
    bare = host.lower().split(":")[0]
    if host.lower() in PUBLIC_REGISTRIES or bare in PUBLIC_REGISTRIES:
        return PUBLIC_REGISTRIES.get(host.lower()) or PUBLIC_REGISTRIES[bare]
    return next((name for suffix, name in PUBLIC_SUFFIXES.items() if bare.endswith(suffix)), None)


def mirrored(registry: str, ref: str) -> str:
    """The reference in the private registry: its registry host replaced, the repository path kept as
    the registry API names it (Docker Hub's official images under `library/`), so a pull-through cache
    of Docker Hub serves the same paths as a registry filled by the mirror script."""
    _, remainder = split_reference(ref)
    return f"{registry}/{remainder}"


def tarball_name(ref: str) -> str:
    """The file `docker save` writes the image to: `vllm/vllm-openai:v0.19.1` -> `vllm_vllm-openai_v0.19.1.tar`."""
    return "".join("_" if c in "/:@" else c for c in ref) + ".tar"


@dataclass(frozen=True)
class ImageSupply:
    """How one node gets one image."""

    image: str  # as the stack names it (facts, labels, qualification)
    ref: str  # as the node's engine holds it (what containers and `docker run` use)
    via: Via
    source: str  # the registry pulled from, the tarball loaded, or the base image a build pulls

    def as_dict(self) -> dict[str, str]:
        """The policy pack's view (GpuNode's `imageSupply`)."""
        return asdict(self)


def builds_gateway(spec: StackSpec) -> bool:
    """Whether the gateway node builds the default gateway image: only when no registry or tarballs
    supply it (the build needs Docker Hub's Debian base and the Debian archive)."""
    return (
        spec.gateway is not None
        and is_built(spec.gateway.image)
        and spec.images.registry is None
        and spec.images.tarballs is None
    )


def supply(spec: StackSpec, image: str) -> ImageSupply:
    """How every node gets `image` under this stack's images section."""
    imgs = spec.images
    if imgs.registry is not None:
        return ImageSupply(image, mirrored(imgs.registry, image), "registry", imgs.registry_host or imgs.registry)
    if imgs.tarballs is not None:
        return ImageSupply(image, image, "tarball", f"{imgs.tarballs.rstrip('/')}/{tarball_name(image)}")
    if spec.gateway is not None and image == spec.gateway.image and builds_gateway(spec):
        return ImageSupply(image, image, "build", BASE_IMAGE)
    return ImageSupply(image, image, "origin", split_reference(image)[0])


def node_ref(spec: StackSpec, image: str) -> str:
    """The reference a node's engine holds `image` under."""
    return supply(spec, image).ref


def node_supplies(spec: StackSpec, node: str) -> list[ImageSupply]:
    """How a node gets every image it runs, the gateway image it builds included."""

    built = (
        [spec.gateway.image] if spec.gateway is not None and spec.gateway.node == node and builds_gateway(spec) else []
    )
    return [supply(spec, ref) for ref in [*images_for_node(spec, node), *built]]


def stack_images(spec: StackSpec) -> list[str]:
    """Every image the stack runs on any node, in node order, once each."""
    return list(dict.fromkeys(s.image for n in spec.nodes for s in node_supplies(spec, n)))


def tarball_name_issues(spec: StackSpec) -> list[SpecIssue]:
    """Two images may not share one tarball file name."""
    if spec.images.tarballs is None:
        return []
    seen: dict[str, str] = {}
    issues: list[SpecIssue] = []
    for image in stack_images(spec):
        name = tarball_name(image)
        if name in seen:
            issues.append(
                SpecIssue(
                    "images.tarballs",
                    f"{image!r} and {seen[name]!r} would both load from {name}; "
                    "tag one of them differently or use images.registry",
                )
            )
        seen.setdefault(name, image)
    return issues


# Where the load step records which tarball an image came from (size and mtime), so a second run
# skips a multi-GB `docker load` while the same file is there and the image still exists.
LOAD_STATE_DIR = "/var/lib/llm-cluster/images"


def load_script(s: ImageSupply) -> str:
    """Bash: `docker load` the image's tarball unless the same file was loaded and the image is there;
    then check the engine holds the image under its name."""
    state = f"{LOAD_STATE_DIR}/{tarball_name(s.image)}.loaded"
    return f"""#!/usr/bin/env bash
# Load {s.image} from its tarball on this node (images.tarballs): the node pulls from no registry.
set -euo pipefail
image={shlex.quote(s.ref)}
tarball={shlex.quote(s.source)}
state={shlex.quote(state)}
if [[ ! -f "$tarball" ]]; then
  echo "image-load: $tarball is not on $(hostname): copy it there (\\`python -m ops.images\\` lists each image's" \\
    "file and the docker save command), or fix images.tarballs" >&2
  exit 1
fi
stamp="$(stat -c '%s %Y' -- "$tarball")"
if [[ -f "$state" ]] && [[ "$(cat -- "$state")" == "$stamp" ]] && docker image inspect "$image" >/dev/null 2>&1; then
  echo "image-load: $image already loaded from $tarball"
  exit 0
fi
echo "image-load: loading $tarball ($(du -h -- "$tarball" | cut -f1))"
start=$SECONDS
if ! loaded="$(docker load -i "$tarball" 2>&1)"; then
  echo "$loaded" >&2
  echo "image-load: docker load -i $tarball failed: is it a complete \\`docker save\\` tarball (not truncated," \\
    "not compressed twice), and is there free space under docker's data root?" >&2
  exit 1
fi
echo "$loaded"
if ! docker image inspect "$image" >/dev/null 2>&1; then
  echo "image-load: $tarball holds no image named $image (it loaded: $(echo "$loaded" | tr '\\n' ' '))." \\
    "Save it under that name: docker save -o $(basename -- "$tarball") $image" >&2
  exit 1
fi
mkdir -p -- "$(dirname -- "$state")"
printf '%s\\n' "$stamp" > "$state"
echo "image-load: $image loaded in $((SECONDS - start))s ($(docker image inspect --format '{{{{.Id}}}}' "$image"))"
"""


def unload_script(s: ImageSupply) -> str:
    """Bash undoing load_script: the image removed (left, and said, while a container still uses it)."""
    state = f"{LOAD_STATE_DIR}/{tarball_name(s.image)}.loaded"
    return f"""#!/usr/bin/env bash
# Undo the load of {s.image} from its tarball (the tarball itself stays).
set -euo pipefail
image={shlex.quote(s.ref)}
state={shlex.quote(state)}
if docker image inspect "$image" >/dev/null 2>&1; then
  if ! docker image rm "$image" >/dev/null; then
    echo "image-load: $image is still used by a container; left in place" >&2
  fi
fi
rm -f -- "$state"
"""


def build_flags(spec: StackSpec) -> str:
    """`docker build` flags for the gateway image's mirrors where gateway.imageBuild changes them."""
    if spec.gateway is None:
        return ""
    defaults = build_args()
    return "".join(
        f" --build-arg {shlex.quote(f'{k}={v}')}"
        for k, v in spec.gateway.image_build.args().items()
        if defaults[k] != v
    )


def mirror_script(spec: StackSpec) -> str:
    """Bash for a machine that reaches the public registries: fetch every image the stack runs and push it
    to images.registry, or `docker save` it into the tarball each node loads (images.tarballs)."""
    imgs = spec.images
    lines = [
        "#!/usr/bin/env bash",
        "# Every image the stack runs, made available to air-gapped nodes (python -m ops.images).",
        "# Run it from the project's directory on a machine with Docker that reaches the public registries.",
        "set -euo pipefail",
    ]
    if imgs.registry is None and imgs.tarballs is None:
        lines.append(
            "# images.registry and images.tarballs are unset: the nodes pull each image from its own registry."
        )
    if imgs.tarballs is not None:
        lines += ['out="${1:-.}"', 'mkdir -p -- "$out"']
    nodes_of: dict[str, list[str]] = {}
    for n in spec.nodes:
        for s in node_supplies(spec, n):
            nodes_of.setdefault(s.image, []).append(n)
    for image, nodes in nodes_of.items():
        q = shlex.quote(image)
        where = "every node" if nodes == list(spec.nodes) else ", ".join(nodes)
        lines.append(f"# {image} ({where})")
        # The default gateway image is built from the committed context, never pulled.
        lines.append(
            f"docker build -t {q}{build_flags(spec)} {shlex.quote(BUILD_CONTEXT)}"
            if is_built(image)
            else f"docker pull {q}"
        )
        s = supply(spec, image)
        if s.via == "registry":
            lines += [f"docker tag {q} {shlex.quote(s.ref)}", f"docker push {shlex.quote(s.ref)}"]
        elif s.via == "tarball":
            lines.append(f'docker save -o "$out"/{shlex.quote(tarball_name(image))} {q}')
    if imgs.tarballs is not None:
        lines.append(f'echo "copy every .tar in $out to {imgs.tarballs} on each node listed above"')
    return "\n".join(lines) + "\n"


def images_for_node(spec: StackSpec, node: str) -> list[str]:
    """Every image a node runs, so each node pulls exactly what its containers need."""
    images: list[str] = []
    for pool in spec.pools.values():
        if node in pool.nodes:
            images.append(pool.image)
    if spec.gateway is not None and spec.gateway.node == node:
        # The default gateway image is built on its node (components/facts/gateway_image.py) unless images.registry or
        # images.tarballs supply it like any other image.
        if not builds_gateway(spec):
            images.append(spec.gateway.image)
    m = spec.monitoring
    if m is not None:
        images += [m.dcgm_exporter.image, m.node_exporter.image]
        if m.node == node:
            images += [m.prometheus.image, m.grafana.image]
            if m.alertmanager is not None:
                images.append(m.alertmanager.image)
    return list(dict.fromkeys(images))
