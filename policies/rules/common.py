"""What the rules read: resource types, roles, the image a container states, and the launch a resource
describes (an engine's own reading of its props: Engine.model_server_launch, Engine.container_launch)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from components.engines.base import Engine
from components.engines.containers import IMAGE_LABEL, container_argv, image_parts, labels
from components.engines.judged import Launch, LaunchRule
from components.engines.registry import ENGINES, engine_of, env_prefixes, flag_spellings, short_flags
from components.marks import COMPONENT_PREFIX, MODEL_SERVER, RAY_CLUSTER

CONTAINER = "docker:index/container:Container"
REMOTE_COMMAND = "command:remote:Command"

ROLE = "llm-cluster.role"
LINK_LAYER_LABEL = "llm-cluster.link-layer"
RAY_ROLES = frozenset({"ray-head", "ray-worker"})
# Roles of well-known images by repository name (the last path part), for containers without a role label.
ROLE_BY_IMAGE: dict[str, str] = {
    "node-exporter": "node-exporter",
    "prometheus": "prometheus",
    "alertmanager": "alertmanager",
    "dcgm-exporter": "dcgm-exporter",
    "grafana": "grafana",
    "grafana-oss": "grafana",
    "grafana-enterprise": "grafana",
}


def container_image(props: Mapping[str, Any]) -> str | None:
    """The image ref a container states: its llm-cluster.image label (`image` is an unknown id at preview)."""
    ref = labels(props).get(IMAGE_LABEL)
    if ref:
        return ref
    try:
        image = props.get("image")
    except UnknownValueError:
        # A RemoteImage's id, unknown at preview; at update it is a sha256 id, never a ref either.
        return None
    return image if isinstance(image, str) and image and not image.startswith("sha256:") else None


def words(argv: list[str]) -> list[str]:
    """An argv with `bash -c` scripts split into words too, so flags inside a script are seen."""
    out: list[str] = []
    for token in argv:
        out.append(token)
        if any(c.isspace() for c in token):
            try:
                out += shlex.split(token, comments=True)
            except ValueError:  # unbalanced quotes: the token stays as it is
                pass
    return out


def role_of(props: Mapping[str, Any]) -> str:
    """A container's role: its llm-cluster.role label, else recognised by image or script; '' if unknown."""
    role = labels(props).get(ROLE)
    if role:
        return role
    ref = container_image(props)
    return ROLE_BY_IMAGE.get(image_parts(ref)[0].rsplit("/", 1)[-1], "") if ref else ""


def is_ray_container(props: Mapping[str, Any]) -> bool:
    """A container that runs a Ray node: its role label, or `ray start` in what it runs."""
    argv = container_argv(props)
    return labels(props).get(ROLE) in RAY_ROLES or any(
        argv[i].rsplit("/", 1)[-1] == "ray" and argv[i + 1] == "start" for i in range(len(argv) - 1)
    )


def urn_types(urn: str) -> list[str]:
    """The type chain in a URN: [parent types…, own type]."""
    parts = urn.split("::")
    return parts[2].split("$") if len(parts) >= 4 else []


def under_component(urn: str) -> bool:
    """Whether a resource was registered by one of the product's components (its URN's parent chain)."""
    return any(t.startswith(COMPONENT_PREFIX) for t in urn_types(urn)[:-1])


def launch_of(engine: Engine, args: ResourceValidationArgs) -> Launch | None:
    """The launch of `engine` a resource describes: a ModelServer of the engine, or a raw container that runs
    its server (Engine.container_launch).

    Containers registered by the product's components are skipped: their ModelServer carries the same
    argv and env, so a fault is reported once, on the component. A container added outside the
    components is checked on its own (GPU from its llm-cluster.gpu-model label).
    """
    props = args.props
    if args.resource_type == MODEL_SERVER:
        return engine.model_server_launch(props) if engine_of(props) is engine else None
    if args.resource_type != CONTAINER or under_component(args.urn):
        return None
    return engine.container_launch(props, container_image(props))


def config_with_defaults(args: Any, schema: PolicyConfigSchema | None) -> dict[str, Any]:
    """The policy's config: schema defaults overlaid with what the user configured."""
    out = {k: v.get("default") for k, v in (schema.properties if schema else {}).items() if "default" in v}
    out.update(args.get_config() or {})
    return out


# Flags and environment variables a message names, to look up the stack key that sets them: long flags and
# the engines' short ones (`-tp`); variables of the engines (their env_prefixes) and of what they run on.
def _message_flag() -> re.Pattern[str]:
    short = "".join(f"|{re.escape(flag)}" for flag in short_flags())
    return re.compile(rf"(?<![\w-])(--[a-z0-9][a-z0-9-]*{short})(?![\w-])")


def _message_env() -> re.Pattern[str]:
    prefixes = "|".join([*env_prefixes(), "NCCL", "GLOO", "HF", "CUDA", "TORCH", "PYTORCH", "RAY"])
    return re.compile(rf"(?<![\w.])((?:{prefixes})_[A-Z0-9_]+)\b")


# A flag written without its dashes, as the capacity planner's reasons do ("lower max-model-len to 14384").
_MESSAGE_BARE_FLAG = re.compile(r"(?<![\w-])([a-z0-9]+(?:-[a-z0-9]+)+)(?![\w-])")
_MESSAGE_NAME = re.compile(r"(?<![\w.])([A-Z][A-Z0-9]*_[A-Z0-9_]+)\b")


def name_stack_keys(message: str, keys: Mapping[str, str]) -> str:
    """The message with the stack keys to edit appended, for every flag and env name it mentions.

    `keys` is a ModelServer's `stackKeys` (components.spec.stack_keys): flag or env name -> key, with
    "*env" the pool's env map for variables the pool does not set yet. A key the message already
    names is not repeated."""
    edits: dict[str, str] = {}
    # (A bare word no key knows as a flag finds no key below; one right after dashes is the flag itself.)
    bare = list(_MESSAGE_BARE_FLAG.finditer(message))
    # Any other variable the pool sets (OPENAI_API_KEY, named by no-plaintext-secrets), by its exact name.
    named = [m for m in _MESSAGE_NAME.finditer(message) if m.group(1) in keys]
    found: list[tuple[int, str, str | None]] = []
    for match in [*_message_flag().finditer(message), *_message_env().finditer(message), *bare, *named]:
        token = match.group(1)
        if match.re is _MESSAGE_BARE_FLAG:
            key = keys.get(f"--{token}")
        elif token.startswith("-"):
            key = next((keys[flag] for flag in flag_spellings(token) if flag in keys), None)
        else:
            key = keys.get(token) or (f"{keys['*env']}.{token}" if "*env" in keys else None)
        found.append((match.start(), token, key))
    # Phrases a key stands for as written ("image vllm/vllm-openai:latest": pools.chat.image).
    found += [
        (message.find(phrase), phrase.split(" ", 1)[0], key)
        for phrase, key in keys.items()
        if " " in phrase and phrase in message
    ]
    for _, token, key in sorted(found, key=lambda f: f[0]):
        if key and key.split(" ")[0] not in message and key not in edits:
            edits[key] = token
    if not edits:
        return message
    listed = ", ".join(
        f"{key} ({token})" if not key.endswith(")") else f"{key[:-1]}: {token})" for key, token in edits.items()
    )
    text = message.rstrip()
    text += "" if text.endswith((".", ")", "!", "?")) else "."
    return f"{text} Stack key{'s' if len(edits) > 1 else ''} to edit: {listed}."


def pool_where(pool: str, members: list[str]) -> str:
    """'pools.chat, 4 instances (chat-gpu-03, …)': the subject of a pool's one violation."""
    if len(members) == 1:
        return f"pools.{pool}, instance {members[0]}"
    return f"pools.{pool}, {len(members)} instances ({', '.join(members)})"


def per_pool(
    validate: Callable[[ResourceValidationArgs, ReportViolation], None],
) -> Callable[[ResourceValidationArgs, ReportViolation], None]:
    """One violation per pool and rule: a ModelServer of the product reports for its whole pool on the
    pool's first instance, its message led by the pool's key and instances and followed by the stack
    keys to edit; the other instances are not applicable. The instances of a pool are built from one
    pool spec, so they share every verdict (their host, port and node differ, and no ModelServer rule
    judges those). Raw containers and ModelServers without `poolInstances` report as they are."""

    def validate_pool(args: ResourceValidationArgs, report: ReportViolation) -> None:
        props = args.props
        if args.resource_type != MODEL_SERVER or not props.get("poolInstances") or not props.get("pool"):
            validate(args, report)
            return
        members = [str(m) for m in props.get("poolInstances")]
        if props.get("instance") != members[0]:
            args.not_applicable(f"reported once for pools.{props.get('pool')}, on its first instance {members[0]}")
        where = pool_where(str(props.get("pool")), members)
        keys = {str(k): str(v) for k, v in (props.get("stackKeys") or {}).items()}

        def report_pool(message: str, urn: str | None = None) -> None:
            report(f"{where}: {name_stack_keys(message, keys)}", urn)

        validate(args, report_pool)

    return validate_pool


def launch_policy(engine: Engine, rule: LaunchRule) -> ResourceValidationPolicy:
    """A policy over every launch of `engine` (its ModelServers, raw containers running its server), and
    with `rule.ray_node_image` over every Ray node's image; one violation per message."""
    config = PolicyConfigSchema(properties=dict(rule.config)) if rule.config else None

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        settings = config_with_defaults(args, config)
        launch = launch_of(engine, args)
        ray_node = rule.ray_node_image is not None and (
            args.resource_type == RAY_CLUSTER
            or (args.resource_type == CONTAINER and not under_component(args.urn) and is_ray_container(args.props))
        )
        if launch is None and not ray_node:
            args.not_applicable(f"not a {engine.title} server")
            return
        messages: list[str | None] = []
        if launch is not None:
            if rule.needs_gpu and launch.gpu is None:
                args.not_applicable(f"GPU model {launch.gpu_name!r} is not in the facts table")
                return
            messages += rule.check(launch, settings)
        if ray_node and rule.ray_node_image is not None:
            image = args.props.get("image") if args.resource_type == RAY_CLUSTER else container_image(args.props)
            messages.append(rule.ray_node_image(image, settings))
        for message in messages:
            if message:
                report(message, None)

    level = EnforcementLevel.ADVISORY if rule.advisory else EnforcementLevel.MANDATORY
    return ResourceValidationPolicy(
        name=rule.name,
        description=rule.description,
        validate=per_pool(validate),
        enforcement_level=level,
        config_schema=config,
    )


def launch_policies(topic: str) -> list[ResourceValidationPolicy]:
    """Every registered engine's launch rules of a topic, as policies, in registry order."""
    return [
        launch_policy(engine, rule)
        for engine in ENGINES.values()
        for rule in engine.launch_rules
        if rule.topic == topic
    ]
