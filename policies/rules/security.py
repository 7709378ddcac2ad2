"""Rule 9: the gateway requires API keys; no secret in plaintext among inputs; vLLM, Ray, metrics and
monitoring ports stay on the cluster network (published ports, and on the host network the address
each service binds: policies.rules.bindings).

What a pack can see of secrets: pulumi_policy's Analyze unwraps Pulumi secrets to plaintext, so a rule
cannot tell a secret-wrapped value from a literal. This rule therefore refuses secret-bearing *places*
that hold a literal value (env names like *_PASSWORD, `--api-key` in an argv, `X_TOKEN=…` in a remote
script): such values are readable by anyone with `docker inspect` or `ps` on the node whether or not
Pulumi encrypts them. `make plan` additionally checks every registration's wire form for the stack's
secret values outside secret envelopes (plan/, the lead's check).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

from components.engines.base import REDACTED, Engine, secret_positions
from components.engines.containers import container_argv, env_of
from components.engines.credentials import SCRIPT_ASSIGN, SCRIPT_FLAG, SECRET_ENV
from components.engines.judged import ServerCall
from components.engines.registry import ENGINES, SECRET_FLAG_NAMES, SECRET_FLAGS
from components.marks import GATEWAY, GPU_NODE
from policies.rules.bindings import binding_problems, every_interface, flag_values
from policies.rules.common import (
    CONTAINER,
    REMOTE_COMMAND,
    container_image,
    is_ray_container,
    role_of,
    words,
)
from policies.rules.grouped import Subject, pool_rule


def validate_gateway(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """The Gateway component must require API keys and know at least one."""
    if args.resource_type != GATEWAY:
        args.not_applicable("not a gateway")
        return
    props = args.props
    if not props.get("authRequired"):
        report(
            "gateway.auth is false: every model would be open to anyone who reaches the gateway's port. "
            "Set gateway.auth: true (keys in gateway.apiKeys, or none to have one generated on the host), or, "
            "for a lab only, lower this policy's enforcement level.",
            None,
        )
    elif not props.get("apiKeyIds"):
        report(
            "no API key: with auth required and no key, the gateway refuses every client. State "
            "gateway.apiKeys, or leave it empty to have a key generated on the host.",
            None,
        )


def validate_gateway_tls(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """API keys (and prompts) cross the network encrypted: HTTPS, and no plain port that takes them."""
    if args.resource_type != GATEWAY:
        args.not_applicable("not a gateway")
        return
    props = args.props
    keys = "API keys and prompts" if props.get("authRequired") else "prompts and answers"
    if not props.get("tls"):
        report(
            f"gateway.tls is false: {keys} cross the network in clear on port {int(props.get('port') or 0)}. "
            "Leave gateway.tls at true (a certificate from gatewayTlsCert/gatewayTlsKey, or one made on the "
            "gateway host with its CA as the output gatewayCaCert).",
            None,
        )
    elif props.get("httpRedirectPort") is not None:
        report(
            f"gateway.httpRedirectPort {int(props['httpRedirectPort'])} answers plain HTTP: a client that sends "
            f"its request there has sent its {keys} in clear before it is redirected. Unset it unless clients "
            "need the redirect.",
            None,
        )


def validate_host_firewall(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A node whose host firewall the stack leaves to the operator: say which ports must be closed."""
    if args.resource_type != GPU_NODE:
        args.not_applicable("not a GPU node")
        return
    if args.props.get("firewallManaged", True):
        return
    ports = ", ".join(str(p) for p in args.props.get("firewallClosedPorts") or [])
    report(
        f"firewall.managed is false: node {args.props.get('node')} relies on your own firewall. Ray's GCS, "
        "dashboard and client ports run code for anyone who reaches them; let only the cluster's nodes reach "
        f"TCP {ports} (keep SSH and the gateway open), or set firewall.managed: true.",
        None,
    )


SECRETS_CONFIG = PolicyConfigSchema(
    properties={
        "ignoreEnv": {
            "type": "array",
            "items": {"type": "string"},
            "default": [],
            "description": "Env names that look secret-bearing but carry no secret (or that you accept in env).",
        }
    }
)


def _literal(value: str) -> bool:
    return bool(value) and not value.startswith(("$", "/", REDACTED))


def argv_secret_flags(argv: list[str]) -> list[str]:
    """The credential flags of any engine given a literal value in an argv (--api-key k, --hf-token=t), by
    their long names (llama.cpp's -hft as --hf-token: the name the stack keys know)."""
    return [
        SECRET_FLAG_NAMES.get(flag, flag)
        for i, flag in secret_positions(argv, SECRET_FLAGS)
        if _literal(argv[i].split("=", 1)[1] if argv[i].startswith(f"{flag}=") else argv[i])
    ]


def container_server(props: Mapping[str, Any]) -> tuple[Engine, ServerCall] | None:
    """The engine server a container starts, read by that engine's own parser (the first engine that reads one)."""
    image = container_image(props)
    for engine in ENGINES.values():
        call = engine.container_server(props, image)
        if call is not None:
            return engine, call
    return None


def secret_findings(
    server: tuple[Engine, ServerCall] | None,
    env: dict[str, str],
    scripts: list[str],
    ignore: set[str],
    argv: list[str] | None = None,
) -> list[str]:
    """Where a resource holds a credential as a literal: env names, the credential flags of the server a
    container starts (`server`: container_server, as its engine's parser reads them), any engine's credential
    flags in `argv`, script assignments."""
    found = [
        f"env {name}"
        for name, value in env.items()
        if SECRET_ENV.search(name) and name not in ignore and _literal(value)
    ]
    if server is not None:
        engine, call = server
        found += [
            flag for flag in engine.secret_flags if _literal(str(call.options.get(flag[2:].replace("-", "_")) or ""))
        ]
    found += argv_secret_flags(argv or [])
    for script in scripts:
        found += [
            f"script {m.group(1)}=…"
            for m in SCRIPT_ASSIGN.finditer(script)
            if SECRET_ENV.search(m.group(1)) and m.group(1) not in ignore
        ]
        # A flag the server's parse already reported is not reported again from its script.
        # No word after the flag: the plan's redaction would take it for the flag's value.
        found += [f"script {m.group(1)}" for m in SCRIPT_FLAG.finditer(script) if m.group(1) not in found]
    return list(dict.fromkeys(found))


def secrets_found(resource: Subject, config: dict[str, Any]) -> list[str]:
    """Containers (env, argv) and remote commands (environment, scripts): where a credential is a literal."""
    props = resource.props
    ignore = set(config["ignoreEnv"])
    if resource.resource_type == CONTAINER:
        # Argv tokens with whitespace are shell snippets (`bash -c 'HF_TOKEN=hf_… vllm serve …'`).
        snippets = [t for t in container_argv(props) if any(c.isspace() for c in t)]
        found = secret_findings(
            container_server(props), env_of(props.get("envs")), snippets, ignore, container_argv(props)
        )
    elif resource.resource_type == REMOTE_COMMAND:
        scripts = [str(props.get(k)) for k in ("create", "update", "delete") if props.get(k)]
        found = secret_findings(None, env_of(props.get("environment")), scripts, ignore)
    else:
        return []
    if not found:
        return []
    return [
        f"credential in plain text: {', '.join(found)}. Anyone with docker or shell access on the node "
        "reads it (docker inspect, ps, the command log). Read it from a file on the host "
        '(NAME__FILE, --api-key "$(cat /etc/llm-cluster/…)"), or list a harmless env name in this '
        "policy's ignoreEnv."
    ]


EXPOSURE_CONFIG = PolicyConfigSchema(
    properties={
        "publicRoles": {
            "type": "array",
            "items": {"type": "string"},
            "default": ["gateway"],
            "description": "llm-cluster.role values that may listen on every interface (published ports or host network).",
        }
    }
)


def ray_start_words(props: Mapping[str, Any]) -> list[str]:
    """The words of every `ray start` a container runs: its argv, and scripts uploaded into it (ray-head.sh)."""
    found = words(container_argv(props))
    for upload in props.get("uploads") or []:
        for line in str(upload.get("content") or "").splitlines():
            if "ray start" in line:
                found += words([line])
    return found


def exposure_found(resource: Subject, config: dict[str, Any]) -> list[str]:
    """Published ports only for public roles; host-network services bind a cluster address."""
    if resource.resource_type != CONTAINER:
        return []
    props = resource.props
    role = role_of(props)
    if role in config["publicRoles"]:
        return []
    if props.get("networkMode") != "host":
        # The container's own sockets sit in its network namespace; only `ports` reach the node's.
        return [
            f"port {int(float(port.get('internal')))} of a {role or 'unlabelled'} container is published "
            "on every interface: vLLM, Ray and metrics ports serve without authentication. Publish it "
            "on the node's cluster address (ports[].ip) or drop it and let the gateway/Prometheus reach "
            "it over the cluster network."
            for port in props.get("ports") or []
            if every_interface(str(port.get("ip") or ""))
        ]
    # On the host network Docker discards `ports` (with a warning): what the services bind is what is open.
    out = binding_problems(role, words(container_argv(props)), env_of(props.get("envs")))
    server = container_server(props)
    if server is not None:
        _, call = server
        host = call.options.get("host")
        if every_interface(str(host or "")):
            out.append(
                f"{call.program} --host {host or '(unset)'} on the host network listens on every interface of the "
                "node, and /v1, /metrics and /health answer without a key there (only the gateway checks keys). "
                "Pass --host <the node's cluster address>."
            )
    if is_ray_container(props):
        # Unset is fine: Ray's dashboard defaults to localhost.
        for _, value in flag_values(ray_start_words(props), ("--dashboard-host",)):
            if every_interface(value):
                out.append(
                    f"ray start --dashboard-host={value} opens Ray's dashboard (job submission = code execution) "
                    "on every interface. Bind it to the node's cluster address or leave it on 127.0.0.1."
                )
    return out


POLICIES = [
    ResourceValidationPolicy(
        name="gateway-auth",
        description="The gateway requires API keys.",
        validate=validate_gateway,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
    ResourceValidationPolicy(
        name="gateway-tls",
        description="API keys never cross the network in clear.",
        validate=validate_gateway_tls,
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
    pool_rule(
        "no-plaintext-secrets",
        "No credential as a literal value in env, argv or remote scripts.",
        secrets_found,
        config=SECRETS_CONFIG,
        level=EnforcementLevel.MANDATORY,
    ),
    ResourceValidationPolicy(
        name="host-firewall",
        description="Ray, NCCL, vLLM and exporter ports reach only the cluster's nodes.",
        validate=validate_host_firewall,
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
    pool_rule(
        "internal-ports",
        "vLLM, Ray, metrics and monitoring ports stay on the cluster network.",
        exposure_found,
        config=EXPOSURE_CONFIG,
        level=EnforcementLevel.MANDATORY,
    ),
]
