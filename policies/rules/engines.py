"""Each engine's rules as policies: the rules every engine judged from its image table gets
(components/engines/judged.py) and its own (`Engine.policy_rules`, components/engines/<engine>/rules.py).

A rule judges the argv the product generated (parsed by a parser rebuilt from the engine's real CLI) against
the image's facts, the same tables the components read. An engine with its own launch rules
(`Engine.launch_rules`, listed under their topics: hardware, image, flags, ...) is judged by those instead of
the common ones (`Engine.common_rules` False).
"""

from __future__ import annotations

from collections.abc import Callable

from pulumi_policy import EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from components.engines.base import Engine
from components.engines.judged import COMMON_RULES, EngineRule, JudgedServer
from components.engines.registry import ENGINES
from components.facts.hardware import GPUS
from components.marks import MODEL_SERVER
from policies.rules.common import per_pool


def engine_policy(rule: EngineRule, judges: Callable[[Engine], bool], description: str) -> ResourceValidationPolicy:
    """A rule over the ModelServers of the engines it judges; one violation per message, once per pool.

    Which engines it judges is read from the registry when it runs, so an engine registered after the pack
    was built is judged too."""

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        props = args.props
        engine = ENGINES.get(str(props.get("engine"))) if args.resource_type == MODEL_SERVER else None
        if engine is None or not judges(engine):
            judged = " or ".join(e.name for e in ENGINES.values() if judges(e))
            args.not_applicable(f"not a {judged} server")
            return
        gpu = GPUS.get(str(props.get("gpuModel")))
        if gpu is None:
            args.not_applicable(f"GPU model {props.get('gpuModel')!r} is not in the facts table")
            return
        for message in rule.check(JudgedServer(engine, props, gpu)):
            report(message, None)

    level = EnforcementLevel.ADVISORY if rule.advisory else EnforcementLevel.MANDATORY
    return ResourceValidationPolicy(
        name=rule.name, description=description, validate=per_pool(validate), enforcement_level=level
    )


def policies() -> list[ResourceValidationPolicy]:
    """The common rules over every engine that takes them, then each engine's own, in registry order."""
    titles = ", ".join(e.title for e in ENGINES.values() if e.common_rules)
    out = [
        engine_policy(rule, lambda e: e.common_rules, rule.description.format(engines=titles)) for rule in COMMON_RULES
    ]
    for engine in ENGINES.values():
        out += [
            engine_policy(rule, lambda e, name=engine.name: e.name == name, rule.description)
            for rule in engine.policy_rules
        ]
    return out


POLICIES = policies()
