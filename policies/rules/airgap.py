"""Air-gapped stacks (`images.airGapped: true`): no image from a public registry, no server fetching from a hub.

The nodes of such a cluster reach nothing beyond it: an image still pulled from Docker Hub or nvcr.io, the
gateway image built from Docker Hub's Debian and the Debian archive, or a server that downloads a tokenizer
or a model from a hub fails at `pulumi up`, after other steps ran. Both are refused at preview instead.
"""

from __future__ import annotations

from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from components.engines.registry import ENGINES
from components.marks import GPU_NODE, MODEL_SERVER
from components.planning.image_supply import public_registry
from policies.rules.common import per_pool

WAY_OUT = (
    "Set images.registry to the private registry that holds them (every image is then pulled as "
    "<registry>/<repository>:<tag>; `python -m ops.images` lists each one and the commands that mirror it), "
    "or images.tarballs to a directory of `docker save` tarballs on every node (loaded with docker load); "
    "or, if the nodes do reach these registries, set images.airGapped: false."
)


def _public_source(s: dict[str, Any]) -> str | None:
    """Why an image's supply needs the internet, or None."""
    via, source = s.get("via"), str(s.get("source") or "")
    if via == "build":
        return f"built on its node from {source} (Docker Hub) and the Debian archive"
    if via in ("origin", "registry"):
        name = public_registry(source.split("/")[0])
        if name is not None:
            return f"from {name} ({source})" + (", the registry images.registry names" if via == "registry" else "")
    return None


def _nodes_text(nodes: list[str], every: list[str]) -> str:
    return "every node" if nodes == every else ", ".join(nodes)


def validate_images(args: StackValidationArgs, report: ReportViolation) -> None:
    """An air-gapped stack pulls no image from a public registry and builds none from one."""
    nodes = [r for r in args.resources if r.resource_type == GPU_NODE]
    if not any(r.props.get("airGapped") for r in nodes):
        return
    every = [r.name for r in nodes]
    found: dict[tuple[str, str], list[str]] = {}
    for r in nodes:
        for s in r.props.get("imageSupply") or []:
            why = _public_source(s)
            if why is not None:
                found.setdefault((str(s.get("image")), why), []).append(r.name)
    if not found:
        return
    listed = "; ".join(f"{image} {why} on {_nodes_text(on, every)}" for (image, why), on in found.items())
    count = len({image for image, _ in found})
    report(
        f"images.airGapped is true, but {count} image{'s' if count > 1 else ''} would still come from a public "
        f"registry the nodes cannot reach: {listed}. {WAY_OUT}",
        None,
    )


def validate_hub(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """An air-gapped stack's servers keep the hub off and ask for nothing to be downloaded from it."""
    props = args.props
    if args.resource_type != MODEL_SERVER:
        args.not_applicable("not a model server")
        return
    if not props.get("airGapped"):
        args.not_applicable("images.airGapped is false")
        return
    engine = ENGINES.get(str(props.get("engine")))
    if engine is None:
        args.not_applicable(f"engine {props.get('engine')!r} has no planning module")
        return
    argv = [str(a) for a in props.get("argv") or []]
    for flag, name in engine.hub_downloads(argv):
        report(
            f"images.airGapped is true, but {flag} {name} would make {engine.title} download {name!r} from a hub "
            "the nodes cannot reach: copy it to the nodes (beside the weights) and give its absolute path, or "
            "remove the flag.",
            None,
        )
    pool = props.get("pool")
    if not props.get("offline"):
        report(
            f"images.airGapped is true, but pools.{pool}.offline is false: {engine.title} would try the model hub "
            f"and send usage statistics to hosts the nodes cannot reach. Remove pools.{pool}.offline (it defaults "
            "to true).",
            None,
        )
        return
    env = {str(k): str(v) for k, v in (props.get("env") or {}).items()}
    for name, value in engine.offline_vars.items():
        if name in env and env[name] != value:
            report(
                f"images.airGapped is true, but {name}={env[name]} turns back on what pools.{pool}.offline "
                f"turns off ({name}={value}): remove pools.{pool}.env.{name}.",
                None,
            )


POLICIES = [
    StackValidationPolicy(
        name="air-gapped-images",
        description="An air-gapped stack pulls no image from a public registry.",
        validate=validate_images,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
    ResourceValidationPolicy(
        name="air-gapped-hub",
        description="An air-gapped stack's servers download nothing from a model hub.",
        validate=per_pool(validate_hub),
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
]
