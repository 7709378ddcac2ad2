"""Run the policy pack offline: what the program registered, through pulumi_policy's real analyzer servicer.

Each Registration becomes the AnalyzeRequest the engine would send (properties in wire form, so the
servicer unwraps secrets and turns unknowns into "can't run during preview" exactly as under the CLI),
then one AnalyzeStackRequest; the policy config is validated against each policy's schema (as the
CLI does) and sent with Configure, every policy's enforcement level resolved as the engine does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2
from pulumi.runtime import proto
from pulumi_policy import EnforcementLevel, Policy
from pulumi_policy.policy import _PolicyAnalyzerServicer

from plan.harness import Registration
from policies.pack import DEFAULT_LEVEL, PACK_NAME, PACK_VERSION, POLICIES

LEVELS = {
    "advisory": proto.ADVISORY,
    "mandatory": proto.MANDATORY,
    "remediate": proto.REMEDIATE,
    "disabled": proto.DISABLED,
}
LEVEL_NAMES = {v: k for k, v in LEVELS.items()}


class PolicyConfigError(ValueError):
    """The policy config names an unknown policy, an unknown level, or breaks a policy's schema."""


@dataclass(frozen=True)
class Violation:
    """One policy diagnostic about one resource."""

    policy_name: str
    enforcement_level: str  # mandatory | advisory | remediate | disabled
    urn: str
    message: str
    resource_type: str
    resource_name: str


def configured_servicer(
    policy_config: Mapping[str, Any] | None = None, policies: Sequence[Policy] = POLICIES
) -> _PolicyAnalyzerServicer:
    """The pack's analyzer servicer (what the CLI talks to; `policies`: the pack's, or some of them), configured as
    the engine would (Configure)."""
    servicer = _PolicyAnalyzerServicer(PACK_NAME, PACK_VERSION, list(policies), DEFAULT_LEVEL)
    servicer.Configure(configure_request(policy_config, policies), None)
    return servicer


def _struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(dict(value))
    return s


def _level_of(value: Any, where: str) -> int:
    name = value.value if isinstance(value, EnforcementLevel) else value
    if not isinstance(name, str) or name not in LEVELS:
        raise PolicyConfigError(f"{where}: enforcement level {name!r} is not one of {', '.join(LEVELS)}")
    return LEVELS[name]


def configure_request(
    policy_config: Mapping[str, Any] | None, policies: Sequence[Policy] = POLICIES
) -> proto.ConfigureAnalyzerRequest:
    """The Configure request the engine sends: every policy's level resolved, properties schema-checked.

    Accepts the CLI's `--policy-pack-config` shape: {"<policy>": "<level>" | {"enforcementLevel": …, k: v},
    "all": "<level>"}.
    """
    if policy_config is not None and not isinstance(policy_config, Mapping):
        raise PolicyConfigError(f"the policy config must be a JSON object, got {type(policy_config).__name__}")
    config = dict(policy_config or {})
    by_name = {p.name: p for p in policies}
    unknown = sorted(set(config) - set(by_name) - {"all"})
    if unknown:
        raise PolicyConfigError(f"unknown policy {unknown[0]!r}; policies: {', '.join(by_name)}")
    # The CLI takes only a level for "all" (no properties: they are per policy).
    all_level = _level_of(config["all"], "all") if "all" in config else None
    request = proto.ConfigureAnalyzerRequest()
    for name, policy in by_name.items():
        entry = config.get(name, {})
        if not isinstance(entry, Mapping):
            entry = {"enforcementLevel": entry}
        props = {k: v for k, v in entry.items() if k != "enforcementLevel"}
        schema = {
            "type": "object",
            "additionalProperties": False,
            "properties": dict(policy.config_schema.properties) if policy.config_schema else {},
        }
        if props:
            _validate(props, schema, name)
        if "enforcementLevel" in entry:
            level = _level_of(entry["enforcementLevel"], name)
        elif all_level is not None:
            level = all_level
        else:
            level = LEVELS[(policy.enforcement_level or DEFAULT_LEVEL).value]
        request.policyConfig[name].CopyFrom(proto.PolicyConfig(enforcementLevel=level, properties=_struct(props)))
    return request


def _validate(props: Mapping[str, Any], schema: dict[str, Any], name: str) -> None:
    """Check a policy's config properties against its schema, as the CLI does (gojsonschema)."""
    import jsonschema  # imported only when properties are configured: the default plan never needs it

    try:
        jsonschema.validate(dict(props), schema)
    except jsonschema.ValidationError as err:
        path = ".".join(str(p) for p in err.absolute_path)
        raise PolicyConfigError(f"{name}{'.' + path if path else ''}: {err.message}") from None


def _provider_of(reg: Registration, by_urn: Mapping[str, Registration]) -> proto.AnalyzerProviderResource | None:
    """The provider reference `urn::id` resolved to the provider's registration."""
    urn = reg.provider.rsplit("::", 1)[0] if reg.provider else ""
    prov = by_urn.get(urn)
    if prov is None:
        return None
    return proto.AnalyzerProviderResource(urn=prov.urn, type=prov.type, name=prov.name, properties=_struct(prov.inputs))


def _options(reg: Registration) -> proto.AnalyzerResourceOptions:
    o = reg.options
    timeouts = o.get("customTimeouts") or {}
    opts = proto.AnalyzerResourceOptions(
        parent=reg.parent,
        protect=bool(o.get("protect")),
        ignoreChanges=list(o.get("ignoreChanges") or []),
        deleteBeforeReplace=bool(o.get("deleteBeforeReplace")),
        deleteBeforeReplaceDefined=True,
        additionalSecretOutputs=list(o.get("additionalSecretOutputs") or []),
    )
    if timeouts:
        opts.customTimeouts.CopyFrom(
            proto.AnalyzerResourceOptions.CustomTimeouts(
                create=_seconds(timeouts.get("create")),
                update=_seconds(timeouts.get("update")),
                delete=_seconds(timeouts.get("delete")),
            )
        )
    return opts


def _seconds(duration: str | None) -> float:
    """'20m' / '1h30m' / '90s' -> seconds (the engine parses Go durations the same way)."""
    total = 0.0
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", duration or ""):
        total += float(amount) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def _violations(response: Any, default_urn: str, by_urn: Mapping[str, Registration]) -> list[Violation]:
    out = []
    for d in response.diagnostics:
        urn = d.urn or default_urn
        reg = by_urn.get(urn)
        out.append(
            Violation(
                d.policyName,
                LEVEL_NAMES[d.enforcementLevel],
                urn,
                d.message,
                reg.type if reg else "",
                reg.name if reg else "",
            )
        )
    return out


def analyze(
    registrations: Iterable[Registration],
    policy_config: Mapping[str, Any] | None = None,
    policies: Sequence[Policy] = POLICIES,
) -> list[Violation]:
    """Every violation the pack (or `policies` of it) reports on these registrations (Analyze per resource, then
    AnalyzeStack)."""
    regs = list(registrations)
    by_urn = {r.urn: r for r in regs}
    servicer = configured_servicer(policy_config, policies)
    violations: list[Violation] = []
    for reg in regs:
        request = proto.AnalyzeRequest(
            urn=reg.urn, type=reg.type, name=reg.name, properties=_struct(reg.inputs), options=_options(reg)
        )
        provider = _provider_of(reg, by_urn)
        if provider is not None:
            request.provider.CopyFrom(provider)
        violations += _violations(servicer.Analyze(request, None), reg.urn, by_urn)
    stack = proto.AnalyzeStackRequest(
        resources=[
            proto.AnalyzerResource(
                urn=r.urn,
                type=r.type,
                name=r.name,
                # AnalyzeStack sees outputs: components' register_outputs; custom resources echo their inputs.
                properties=_struct(r.outputs if not r.custom else r.inputs),
                options=_options(r),
                parent=r.parent,
                dependencies=r.dependencies,
                propertyDependencies={
                    k: proto.AnalyzerPropertyDependencies(urns=v) for k, v in r.property_dependencies.items()
                },
            )
            for r in regs
        ]
    )
    violations += _violations(servicer.AnalyzeStack(stack, None), "", by_urn)
    return violations
