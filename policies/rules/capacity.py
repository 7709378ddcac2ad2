"""Rule 11: memory fit, from the capacity planner's estimate on the ModelServer (`capacity` prop).

A pool that does not fit is told which fixes can work, computed from the same estimate by its engine
(`Engine.fit_problems`)."""

from __future__ import annotations

import math
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

from components.engines.judged import advice_fit_problems, number
from components.engines.registry import engine_of
from components.marks import MODEL_SERVER
from policies.rules.common import config_with_defaults, per_pool


def _capacity(args: ResourceValidationArgs) -> dict[str, Any]:
    """The planner's estimate; not_applicable (raises) when the resource carries none."""
    if args.resource_type != MODEL_SERVER:
        args.not_applicable("not a ModelServer")
    capacity = args.props.get("capacity")
    if not capacity:
        args.not_applicable("no capacity estimate on this ModelServer")
    return dict(capacity)


def validate_fit(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Mandatory: not one sequence of max-model-len fits in the KV cache left after the weights."""
    capacity = _capacity(args)
    engine = engine_of(args.props)
    pool, model = str(args.props.get("pool") or "<pool>"), str(args.props.get("model") or "<model>")
    messages = engine.fit_problems(capacity, pool, model) if engine else advice_fit_problems(capacity)
    for message in messages:
        report(message, None)


def validate_margin(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Advisory: fits at the central estimate, not at its pessimistic end (the estimate's measured error)."""
    capacity = _capacity(args)
    low, tokens = number(capacity.get("kv_tokens_low")), number(capacity.get("kv_tokens"))
    error = capacity.get("kv_estimate_error")
    length = number(capacity.get("max_model_len"))
    # What the engine must find to start: one sequence of max-model-len (vLLM), or what it allocates whole at start
    # (llama.cpp's -c over every slot).
    required = number(capacity.get("kv_tokens_required")) or length
    if capacity.get("fits") is False or low is None or tokens is None or not required or low >= required:
        return
    cls = capacity.get("kv_error_class")
    needed = f"one sequence of {length}" if required == length else f"the {required} it allocates at start"
    # Each engine's estimate names the terms its error lies in (vLLM's activation peak, TurboMind's reserve, ...).
    terms = capacity.get("kv_error_terms")
    settles = f"The uncertain terms are {terms}; the engine's" if terms else "The engine's"
    report(
        f"fits at the central estimate ({tokens} KV tokens for {needed}) but not at its pessimistic "
        f"end ({low}: the KV estimate has erred up to {float(error):.1%} on the optimistic side against real "
        f"start-up logs{f' of its class, {cls}' if cls else ''}, bench/capacity_accuracy.py), so the engine may "
        f"refuse to start for want of {required - low} tokens of KV cache. {settles} first start-up log settles "
        "it (its KV cache line, which doctor compares with the plan). Leave room: lower "
        f"{capacity.get('context_option') or '--max-model-len'}, or raise the memory the engine may use.",
        None,
    )


HEADROOM_CONFIG = PolicyConfigSchema(
    properties={
        "minConcurrency": {
            "type": "number",
            "minimum": 0,
            "default": 4,
            "description": "Warn when fewer full-length sequences than this fit in the KV cache at once.",
        }
    }
)


def validate_headroom(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """Advisory: fewer concurrent full-length sequences than the configured minimum."""
    capacity = _capacity(args)
    threshold = float(config_with_defaults(args, HEADROOM_CONFIG)["minConcurrency"])
    # At the pessimistic end of the estimate where its error is measured (the engine's own range).
    concurrency = capacity.get("max_concurrency_low", capacity.get("max_concurrency"))
    if capacity.get("fits") is False or concurrency is None:
        return
    if float(concurrency) < threshold:
        tokens = number(capacity.get("kv_tokens_low", capacity.get("kv_tokens")))
        # At this length the configured number of full-length sequences fits at once.
        shorter = f" to {math.floor(tokens / threshold)}" if tokens and threshold else ""
        report(
            f"only {float(concurrency):.1f} sequences of max-model-len fit in the KV cache at once "
            f"({tokens if tokens is not None else '?'} tokens), below minConcurrency {threshold:g}: requests "
            f"queue or get preempted under load. Lower {capacity.get('context_option') or '--max-model-len'}"
            f"{shorter}, or add GPUs to the instance.",
            None,
        )


POLICIES = [
    ResourceValidationPolicy(
        name="memory-fit",
        description="The model and one max-model-len sequence fit in GPU memory.",
        validate=per_pool(validate_fit),
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
    ResourceValidationPolicy(
        name="memory-fit-margin",
        description="The model and one max-model-len sequence fit at the pessimistic end of the capacity estimate too.",
        validate=per_pool(validate_margin),
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
    ResourceValidationPolicy(
        name="memory-headroom",
        description="Enough KV cache for the configured number of concurrent full-length sequences.",
        validate=per_pool(validate_headroom),
        config_schema=HEADROOM_CONFIG,
        enforcement_level=EnforcementLevel.ADVISORY,
    ),
]
