"""Load a stack: the model's own validation, then every check that needs the engines or planning, in one list.

The spec package validates what a stack states section by section; what only the engines can judge (an
engine's options, formats, typed flags, files it reads) or planning knows (context lengths behind one
name, tarball names) is checked here, after parsing, so the spec never imports the layers above it.
`parse_stack` and `load_stack_config` are what every entry point uses: the Pulumi program, the offline
plan, the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.engines.registry import ENGINES, engine_for
from components.facts.hardware import GPUS
from components.facts.other_engines import OTHER_ENGINES, refusal
from components.planning.image_supply import tarball_name_issues
from components.spec import stack
from components.spec.base import SpecError, SpecIssue
from components.spec.models import model_architecture
from components.spec.stack import StackSpec, _not_one_of


def context_key(s: StackSpec, pool: str) -> str:
    """The stack key of a pool's context length, in its engine's options block."""
    engine = engine_for(s.pools[pool])
    return f"pools.{pool}.{engine.options_key}.{engine.context_key}"


def stack_issues(s: StackSpec) -> list[SpecIssue]:
    """Every cross-section issue of a parsed stack, in the order a person fixes them; the ports last, once
    all else holds."""
    images = stack.check_images(s)
    issues = (
        stack.check_names_and_nodes(s)
        + stack.check_pools(s)
        + stack.check_models(s)
        + (stack.check_gateway(s) + shared_model_issues(s) if s.gateway is not None else [])
        + stack.check_monitoring_and_ssh(s)
        + alert_issues(s)
        + (images or tarball_name_issues(s))
        + engine_issues(s)
        + file_issues(s)
    )
    return issues or stack.check_ports(s)


def parse_stack(sections: Mapping[str, Any], secrets: frozenset[str] = frozenset()) -> StackSpec:
    """Validate the stack's sections (YAML names: ssh, nodes, pools, …); raise SpecError listing every issue."""
    spec = stack.validate_sections(sections, secrets)
    issues = stack_issues(spec)
    if issues:
        raise SpecError(issues)
    return spec


def load_stack_config(config: Mapping[str, Any], secret_keys: set[str] | frozenset[str]) -> StackSpec:
    """Build the spec from Pulumi config (full keys `llm-cluster:<section>`), refusing unknown keys and plaintext secrets."""
    sections, secrets = stack.config_sections(config, secret_keys)
    return parse_stack(sections, secrets)


def engine_issues(spec: StackSpec) -> list[SpecIssue]:
    """What each pool's engine cannot be asked to do, before any resource exists: an engine the project does
    not deploy (with the reason on the pool's GPU), and whatever the pool's own engine refuses."""
    issues: list[SpecIssue] = []
    for pname, pool in spec.pools.items():
        if pool.engine in OTHER_ENGINES:
            node = spec.nodes.get(pool.nodes[0])
            gpu = spec.node(pool.nodes[0]).gpu if node is not None else None
            known = GPUS.get(gpu.model) if gpu is not None else None
            if known is not None:
                issues.append(SpecIssue(f"pools.{pname}.engine", refusal(pool.engine, known.capability, known.name)))
            continue
        issues += ENGINES[pool.engine].spec_issues(spec, pname)
    return issues


def alert_issues(spec: StackSpec) -> list[SpecIssue]:
    """Alert thresholds a pool's engine makes moot (they would fire from the start)."""
    if spec.monitoring is None:
        return []
    return [
        i
        for pname, pool in spec.pools.items()
        if pool.engine in ENGINES
        for i in ENGINES[pool.engine].alert_issues(spec, pname)
    ]


def file_issues(s: StackSpec) -> list[SpecIssue]:
    """What the stack names in a table or a file on the operator's machine, looked up now so a bad one is a
    config error, not a traceback halfway through the plan (each model's architecture: its catalog name or
    its configJson; the files an engine uploads)."""
    issues: list[SpecIssue] = []
    for mname in s.models:
        try:
            model_architecture(s, mname)
        except SpecError as err:
            issues += err.issues
    for pname, p in s.pools.items():
        if p.engine in ENGINES:
            issues += ENGINES[p.engine].file_issues(s, pname)
    return issues


def shared_model_issues(s: StackSpec) -> list[SpecIssue]:
    """Pools serving one model share its traffic by gateway.poolWeights; refuse what the gateway cannot honour."""
    g = s.gateway
    assert g is not None
    issues: list[SpecIssue] = []
    by_model: dict[str, list[str]] = {}
    for pname, p in s.pools.items():
        by_model.setdefault(p.model, []).append(pname)
    for pool, _ in g.pool_weights.items():
        if pool not in s.pools:
            issues.append(SpecIssue(f"gateway.poolWeights.{pool}", _not_one_of(pool, "pool", s.pools)))
        elif len(by_model[s.pools[pool].model]) == 1:
            issues.append(
                SpecIssue(
                    f"gateway.poolWeights.{pool}",
                    f"pool {pool!r} is the only pool serving model "
                    f"{s.pools[pool].model!r}: a weight splits a model's traffic between pools "
                    "that serve it",
                )
            )
    for model, pools in by_model.items():
        if len(pools) < 2:
            continue
        if all(g.pool_weights.get(p, 1) == 0 for p in pools):
            issues.append(
                SpecIssue(
                    "gateway.poolWeights",
                    f"every pool serving model {model!r} "
                    f"({', '.join(pools)}) has weight 0: its requests would find no replica",
                )
            )
        lens = {p: engine_for(s.pools[p]).context_length(s, p) for p in pools}
        if len(set(lens.values())) > 1:
            issues.append(
                SpecIssue(
                    f"pools.{pools[1]}",
                    f"pools {', '.join(pools)} serve model {model!r} behind "
                    "one name but accept different context lengths ("
                    + ", ".join(f"{p}: {n}" for p, n in lens.items())
                    + "): the same request would pass or fail by where it lands; give them one "
                    "context length (" + ", ".join(context_key(s, p) for p in pools) + ")",
                )
            )
        for i, k in enumerate(g.api_keys):
            for j, name in enumerate(k.models):
                if name in pools:
                    issues.append(
                        SpecIssue(
                            f"gateway.apiKeys[{i}].models[{j}]",
                            f"pool {name!r} shares model "
                            f"{model!r} with {', '.join(p for p in pools if p != name)}: a key cannot "
                            f"be held to one of them; name the model ({model!r}) instead",
                        )
                    )
    return issues
