"""Rules on the resources a pool's instances are made of (containers, remote commands), reported once per
pool and rule: a stack policy over every resource, since no single resource sees its pool's others.

Each rule is a `Findings` function: what is wrong with one resource, in words that do not depend on the
instance (so the instances of a pool, built from one pool spec, share them). The policy groups the
findings of the resources that belong to a pool (a `llm-cluster.pool` label, or a parent component
whose outputs name its pool) into one violation: led by the pool's key and instances, each finding with
the stack keys to edit (the pool's ModelServer outputs `stackKeys`), and, when a finding holds for only
some of the pool's resources, which ones. Resources of no pool (gateway, monitoring, a raw container)
report each finding on their own URN, as a resource policy would.

AnalyzeStack sees outputs: at preview a custom resource's outputs are its inputs, unknown where the
provider computes them; a resource whose checked value is unknown is judged at `pulumi up` (the engine
runs the stack policies again on the final outputs), not reported as a violation at preview.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from components.engines.containers import labels
from components.marks import MODEL_SERVER, RAY_CLUSTER
from policies.rules.common import config_with_defaults, name_stack_keys, pool_where

POOL_LABEL = "llm-cluster.pool"
INSTANCE_LABEL = "llm-cluster.instance"


class Subject(Protocol):
    """What a finding reads of a resource: PolicyResource (stack policies) and ResourceValidationArgs alike."""

    resource_type: str
    props: Mapping[str, Any]
    urn: str
    name: str
    opts: Any


Findings = Callable[[Any, dict[str, Any]], list[str]]


def _owner(resource: PolicyResource) -> tuple[str, str] | None:
    """(pool, instance) a resource belongs to: its labels, else the nearest parent component that says."""
    lab = labels(resource.props) if resource.resource_type.startswith("docker:") else {}
    if lab.get(POOL_LABEL):
        return lab[POOL_LABEL], lab.get(INSTANCE_LABEL) or resource.name
    at: PolicyResource | None = resource.parent
    while at is not None:
        if at.resource_type in (MODEL_SERVER, RAY_CLUSTER) and at.props.get("pool"):
            return str(at.props["pool"]), str(at.props.get("instance") or at.name)
        at = at.parent
    return None


def _stack_keys(resources: list[PolicyResource]) -> dict[str, dict[str, str]]:
    """instance -> its ModelServer's stackKeys (components.spec.stack_keys), from the component's outputs."""
    out: dict[str, dict[str, str]] = {}
    for r in resources:
        if r.resource_type == MODEL_SERVER and r.props.get("instance"):
            out[str(r.props["instance"])] = {str(k): str(v) for k, v in (r.props.get("stackKeys") or {}).items()}
    return out


def pool_message(pool: str, found: dict[str, list[tuple[str, str]]], keys: Mapping[str, str]) -> str:
    """One pool's violation: `found` is finding -> [(instance, resource name)] that have it.

    A finding that not every flagged resource of the pool has says first which have it; findings that end in
    the same advice ("credential in plain text: env X. <advice>") share it, so it is said once."""
    instances = sorted({inst for members in found.values() for inst, _ in members})
    resources = sorted({name for members in found.values() for _, name in members})
    by_advice: dict[str, list[str]] = {}
    for finding, members in found.items():
        said, _, advice = finding.partition(". ")
        names = sorted({name for _, name in members})
        # Which resources, said before the finding: a word after a flag would read as its value (plan.redact).
        by_advice.setdefault(advice, []).append((f"in {', '.join(names)}: " if names != resources else "") + said)
    parts = [
        name_stack_keys("; ".join(said) + (f". {advice}" if advice else ""), keys) for advice, said in by_advice.items()
    ]
    return f"{pool_where(pool, instances)}: {' '.join(parts)}"


def pool_rule(
    name: str,
    description: str,
    findings: Findings,
    *,
    level: EnforcementLevel,
    config: PolicyConfigSchema | None = None,
) -> StackValidationPolicy:
    """A stack policy that reports `findings` once per pool (listing its instances), else per resource."""

    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        settings = config_with_defaults(args, config)
        keys = _stack_keys(list(args.resources))
        pools: dict[str, dict[str, list[tuple[str, str]]]] = {}
        first_urn: dict[str, tuple[str, str]] = {}
        for resource in args.resources:
            try:
                found = findings(resource, settings)
                owner = _owner(resource) if found else None
            except UnknownValueError:
                continue  # judged at `pulumi up`, on the final outputs
            if owner is None:
                for finding in found:
                    report(finding, resource.urn)
                continue
            pool, instance = owner
            for finding in found:
                pools.setdefault(pool, {}).setdefault(finding, []).append((instance, resource.name))
            first_urn[pool] = min(first_urn.get(pool, (resource.name, resource.urn)), (resource.name, resource.urn))
        for pool in sorted(pools):
            found = pools[pool]
            first_instance = min(inst for members in found.values() for inst, _ in members)
            report(pool_message(pool, found, keys.get(first_instance, {})), first_urn[pool][1])

    return StackValidationPolicy(
        name=name, description=description, validate=validate, enforcement_level=level, config_schema=config
    )
