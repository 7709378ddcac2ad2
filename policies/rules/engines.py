"""Each engine's rules as policies: the rules every engine judged from its image table gets
(components/engines/judged.py) and its own (`Engine.policy_rules`, components/engines/<engine>/rules.py).

A rule judges the argv the product generated (parsed by a parser rebuilt from the engine's real CLI) against
the image's facts, the same tables the components read. vLLM's servers are judged by the vLLM rules
(hardware, image, flags, engine args) instead of the common ones.
"""

from __future__ import annotations

from pulumi_policy import EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from components.engines.judged import COMMON_RULES, EngineRule, JudgedServer
from components.engines.registry import ENGINES
from components.facts.hardware import GPUS
from components.marks import MODEL_SERVER
from policies.rules.common import per_pool


def engine_policy(rule: EngineRule, engines: tuple[str, ...], description: str) -> ResourceValidationPolicy:
    """A rule over the ModelServers of these engines; one violation per message, once per pool."""

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        props = args.props
        if args.resource_type != MODEL_SERVER or props.get("engine") not in engines:
            args.not_applicable(f"not a {' or '.join(engines)} server")
            return
        gpu = GPUS.get(str(props.get("gpuModel")))
        if gpu is None:
            args.not_applicable(f"GPU model {props.get('gpuModel')!r} is not in the facts table")
            return
        for message in rule.check(JudgedServer(ENGINES[str(props["engine"])], props, gpu)):
            report(message, None)

    level = EnforcementLevel.ADVISORY if rule.advisory else EnforcementLevel.MANDATORY
    return ResourceValidationPolicy(
        name=rule.name, description=description, validate=per_pool(validate), enforcement_level=level
    )


def policies() -> list[ResourceValidationPolicy]:
    """The common rules over every engine that takes them, then each engine's own, in registry order."""
    common = tuple(e for e in ENGINES.values() if e.common_rules)
    titles = ", ".join(e.title for e in common)
    out = (
        [
            engine_policy(rule, tuple(e.name for e in common), rule.description.format(engines=titles))
            for rule in COMMON_RULES
        ]
        if common
        else []
    )
    for engine in ENGINES.values():
        out += [engine_policy(rule, (engine.name,), rule.description) for rule in engine.policy_rules]
    return out


POLICIES = policies()
