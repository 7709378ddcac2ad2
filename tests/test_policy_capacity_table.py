"""memory-fit, memory-fit-margin and memory-headroom (policies/rules/capacity.py) as tables through the real
analyzer servicer: each branch on both sides with its whole message, every engine's own words for the terms
its estimate is unsure of, and the reason each rule gives for a resource it does not judge."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.registry import ENGINES
from components.engines.vllm.memory import KV_ERROR_TERMS
from tests.support.policies import model_server, not_applicable, only, server

RULES = ("memory-fit", "memory-fit-margin", "memory-headroom")


def said(rule: str, capacity: dict[str, Any] | None, config: dict[str, Any] | None = None, **props: Any) -> list[str]:
    """The messages one rule reports on the reference chat server with this capacity (and props)."""
    changed = server(capacity=capacity, **props)
    return [m.split("\n", 1)[1] for p, _, m in model_server(changed, config=config) if p == rule]


# --- which resources the rules judge --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_", "props", "reason"),
    [
        ("docker:index/container:Container", {"capacity": {"fits": False}}, "not a ModelServer"),
        ("llm-cluster:vllm:ModelServer", {"pool": "chat"}, "no capacity estimate on this ModelServer"),
        ("llm-cluster:vllm:ModelServer", {"pool": "chat", "capacity": {}}, "no capacity estimate on this ModelServer"),
    ],
)
def test_each_rule_says_why_it_does_not_judge_a_resource(type_: str, props: dict[str, Any], reason: str) -> None:
    reasons = not_applicable(type_, props)
    assert {rule: reasons.get(rule) for rule in RULES} == dict.fromkeys(RULES, reason)


def test_a_model_server_with_an_estimate_is_judged_by_each_rule() -> None:
    reasons = not_applicable("llm-cluster:vllm:ModelServer", {"pool": "chat", "capacity": {"fits": True}})
    assert not set(RULES) & set(reasons)


# --- memory-fit ----------------------------------------------------------------------------------------

# A pool the planner says does not fit, with the capacity model's own advice (LMDeploy, llama.cpp: `advice`).
ADVISED = {"fits": False, "reason": "weights 70.1 GiB per GPU over 64.0 GiB", "advice": "lower the session length"}
ADVISED_SAID = "does not fit: weights 70.1 GiB per GPU over 64.0 GiB. To fit: lower the session length."
# A vLLM pool that does not fit, without advice: vLLM's checked fixes name the pool's and the model's keys.
SHORT = {
    "fits": False,
    "reason": "no room for the KV cache",
    "gpu_memory_gib": 32.0,
    "gpu_memory_utilization": 0.9,
    "weights_gib_per_gpu": 30.0,
    "activation_gib": 0.5,
    "non_torch_gib": 0.5,
    "kv_bytes_per_token_per_gpu": 2**20,
    "max_model_len": 4096,
    "kv_tokens": 0,
    "tp": 1,
    "pp": 1,
}


def short_said(pool: str, model: str) -> str:
    return (
        "does not fit: no room for the KV cache. To fit: spread each instance over 2 GPUs instead of 1 "
        f"(pools.{pool}.tensorParallel within a node, pools.{pool}.pipelineParallel across nodes); or serve a "
        f"4-bit GPTQ checkpoint (models.{model}.quantization: gptq; about 9.0 GiB of weights per GPU instead of "
        f"30.0). (Raising pools.{pool}.vllm.gpuMemoryUtilization (a fraction) to 0.95 would not be enough.)"
    )


@pytest.mark.parametrize(
    ("capacity", "props", "messages"),
    [
        ({"fits": True, "reason": ""}, {}, []),
        ({**SHORT, "fits": True}, {}, []),
        # vLLM (the default engine when the props name none, and named): its fixes, checked against the estimate.
        (SHORT, {}, [short_said("chat", "qwen3-30b-a3b")]),
        (SHORT, {"engine": "vllm"}, [short_said("chat", "qwen3-30b-a3b")]),
        (SHORT, {"pool": "code", "model": "qwen3-32b"}, [short_said("code", "qwen3-32b")]),
        # A ModelServer that names neither its pool nor its model: placeholders, not "None".
        (SHORT, {"pool": None, "model": None}, [short_said("<pool>", "<model>")]),
        (SHORT, {"pool": "", "model": ""}, [short_said("<pool>", "<model>")]),
        # The capacity model's own advice wins over vLLM's fixes, and is what every other engine says.
        ({**SHORT, **ADVISED}, {}, [ADVISED_SAID]),
        (ADVISED, {"engine": "lmdeploy"}, [ADVISED_SAID]),
        (ADVISED, {"engine": "llamacpp"}, [ADVISED_SAID]),
        ({**ADVISED, "advice": ""}, {"engine": "lmdeploy"}, []),
        # An engine no longer registered: the estimate's advice still reaches the user.
        (ADVISED, {"engine": "retired-engine"}, [ADVISED_SAID]),
        ({**ADVISED, "fits": True}, {"engine": "retired-engine"}, []),
    ],
)
def test_memory_fit(capacity: dict[str, Any], props: dict[str, Any], messages: list[str]) -> None:
    assert said("memory-fit", capacity, **props) == messages


def test_memory_fit_is_mandatory_with_its_description() -> None:
    got = [d for d in model_server(server(capacity=ADVISED, engine="lmdeploy")) if d[0] == "memory-fit"]
    assert got == only("memory-fit", ADVISED_SAID)


# --- memory-fit-margin ---------------------------------------------------------------------------------

# A pool that fits at its central estimate and not at its pessimistic end (one sequence of 32768).
RANGED: dict[str, Any] = {
    "fits": True,
    "kv_tokens": 33000.0,
    "kv_tokens_low": 31845.0,
    "max_model_len": 32768.0,
    "kv_estimate_error": 0.035,
    "kv_error_class": "V1 · TP>=2 · MoE: too few logs, the widest error measured",
    "kv_error_terms": KV_ERROR_TERMS,
}


def margin(
    *,
    tokens: int = 33000,
    low: int = 31845,
    needed: str = "one sequence of 32768",
    short: int = 923,
    error: str = "3.5%",
    of_class: str = " of its class, V1 · TP>=2 · MoE: too few logs, the widest error measured",
    terms: str | None = KV_ERROR_TERMS,
    option: str = "--max-model-len",
) -> str:
    settles = f"The uncertain terms are {terms}; the engine's" if terms else "The engine's"
    return (
        f"fits at the central estimate ({tokens} KV tokens for {needed}) but not at its pessimistic end ({low}: the "
        f"KV estimate has erred up to {error} on the optimistic side against real start-up logs{of_class}, "
        f"bench/capacity_accuracy.py), so the engine may refuse to start for want of {short} tokens of KV cache. "
        f"{settles} first start-up log settles it (its KV cache line, which doctor compares with the plan). Leave "
        f"room: lower {option}, or raise the memory the engine may use."
    )


@pytest.mark.parametrize(
    ("changes", "messages"),
    [
        ({}, [margin()]),
        # One token short of the sequence at the pessimistic end, and exactly enough.
        ({"kv_tokens_low": 32767}, [margin(low=32767, short=1)]),
        ({"kv_tokens_low": 32768}, []),
        ({"kv_tokens_low": 40000}, []),
        # A pool that does not fit is memory-fit's; one whose estimate says nothing of fitting is judged.
        ({"fits": False}, []),
        ({"fits": None}, [margin()]),
        # No range, no central figure, or no length to judge against: nothing to say.
        ({"kv_tokens_low": None}, []),
        ({"kv_tokens": None}, []),
        ({"max_model_len": None}, []),
        ({"max_model_len": 0}, []),
        # What the engine must find at start, when it is not one sequence (llama.cpp's -c over every slot).
        (
            {"kv_tokens_required": 65536, "kv_tokens_low": 60000},
            [margin(low=60000, needed="the 65536 it allocates at start", short=5536)],
        ),
        ({"kv_tokens_required": 65536, "kv_tokens_low": 65536}, []),
        ({"kv_tokens_required": 32768}, [margin()]),
        ({"kv_tokens_required": 0}, [margin()]),
        (
            {"kv_tokens_required": 65536, "max_model_len": None, "kv_tokens_low": 60000},
            [margin(low=60000, needed="the 65536 it allocates at start", short=5536)],
        ),
        # Its class, the error and the option to lower, as the estimate states them.
        ({"kv_error_class": ""}, [margin(of_class="")]),
        ({"kv_error_class": None}, [margin(of_class="")]),
        ({"kv_estimate_error": 0.02}, [margin(error="2.0%")]),
        ({"kv_estimate_error": 0.0345}, [margin(error="3.5%")]),
        ({"kv_estimate_error": 0.1234}, [margin(error="12.3%")]),
        (
            {"context_option": "--session-len (lmdeploy.sessionLen)"},
            [margin(option="--session-len (lmdeploy.sessionLen)")],
        ),
        ({"context_option": ""}, [margin()]),
        # The terms are the estimate's own: no engine's words stand in for an estimate that states none.
        ({"kv_error_terms": "the compute buffer"}, [margin(terms="the compute buffer")]),
        ({"kv_error_terms": None}, [margin(terms=None)]),
        ({"kv_error_terms": ""}, [margin(terms=None)]),
    ],
)
def test_memory_fit_margin(changes: dict[str, Any], messages: list[str]) -> None:
    capacity = {k: v for k, v in {**RANGED, **changes}.items() if v is not None}
    assert said("memory-fit-margin", capacity) == messages


def test_memory_fit_margin_is_advisory_with_its_description() -> None:
    got = [d for d in model_server(server(capacity=RANGED)) if d[0] == "memory-fit-margin"]
    assert got == only("memory-fit-margin", margin(), level="advisory")


def test_every_engines_estimate_names_its_own_uncertain_terms() -> None:
    # vLLM's estimate carries its words as the others carry theirs: the rule holds no engine's default.
    assert KV_ERROR_TERMS.startswith("the activation peak (the sampler over max-num-seqs rows")
    from components.engines.vllm.memory import CapacityEstimate

    assert CapacityEstimate.__dataclass_fields__["kv_error_terms"].default == KV_ERROR_TERMS
    terms = {
        "vllm": KV_ERROR_TERMS,
        "lmdeploy": "the memory TurboMind holds before its weights (CUDA context, cuBLAS and NCCL workspaces), "
        "which sets what cacheMaxEntryCount takes its share of",
        "llamacpp": "the KV buffer (n_ctx x layers x K/V row bytes) and, beside it, the compute buffer",
    }
    assert set(terms) == set(ENGINES)
    for engine, words in terms.items():
        capacity = {**RANGED, "kv_error_terms": words}
        assert said("memory-fit-margin", capacity, engine=engine) == [margin(terms=words)], engine


# --- memory-headroom -----------------------------------------------------------------------------------


def headroom(
    concurrency: str, tokens: str, threshold: str = "4", shorter: str = "", option: str = "--max-model-len"
) -> str:
    return (
        f"only {concurrency} sequences of max-model-len fit in the KV cache at once ({tokens} tokens), below "
        f"minConcurrency {threshold}: requests queue or get preempted under load. Lower {option}{shorter}, or add "
        "GPUs to the instance."
    )


@pytest.mark.parametrize(
    ("capacity", "config", "messages"),
    [
        # Judged at the pessimistic end where the estimate has one, else at the central figures.
        ({"max_concurrency": 3.96, "kv_tokens": 129760}, None, [headroom("4.0", "129760", shorter=" to 32440")]),
        ({"max_concurrency": 4.0, "kv_tokens": 131072}, None, []),
        (
            {"max_concurrency": 5.0, "max_concurrency_low": 3.5, "kv_tokens": 163840, "kv_tokens_low": 114688},
            None,
            [headroom("3.5", "114688", shorter=" to 28672")],
        ),
        ({"max_concurrency": 3.0, "max_concurrency_low": 4.0, "kv_tokens": 98304, "kv_tokens_low": 131072}, None, []),
        ({"max_concurrency": 3.0, "max_concurrency_low": None, "kv_tokens": 98304}, None, []),
        (
            {"max_concurrency": 2.04, "kv_tokens": 66846, "kv_tokens_low": 64511},
            None,
            [headroom("2.0", "64511", shorter=" to 16127")],
        ),
        # The configured minimum, on both sides; 0 warns of nothing.
        ({"max_concurrency": 2.5, "kv_tokens": 81920}, {"minConcurrency": 2}, []),
        (
            {"max_concurrency": 1.5, "kv_tokens": 49152},
            {"minConcurrency": 2},
            [headroom("1.5", "49152", "2", " to 24576")],
        ),
        (
            {"max_concurrency": 1.5, "kv_tokens": 49152},
            {"minConcurrency": 1.6},
            [headroom("1.5", "49152", "1.6", " to 30720")],
        ),
        ({"max_concurrency": 0.0, "kv_tokens": 0}, {"minConcurrency": 0}, []),
        # No tokens to shorten to: the figure is unknown or none.
        ({"max_concurrency": 0.5}, None, [headroom("0.5", "?")]),
        ({"max_concurrency": 0.0, "kv_tokens": 0}, None, [headroom("0.0", "0")]),
        # The option to lower, as the estimate names it (LMDeploy's session length, llama.cpp's slot context).
        (
            {"max_concurrency": 1.0, "kv_tokens": 32768, "context_option": "--session-len (lmdeploy.sessionLen)"},
            None,
            [headroom("1.0", "32768", shorter=" to 8192", option="--session-len (lmdeploy.sessionLen)")],
        ),
        # A pool that does not fit is memory-fit's; no concurrency figure, nothing to judge.
        ({"fits": False, "max_concurrency": 0.5, "kv_tokens": 100}, None, []),
        ({"fits": True, "kv_tokens": 100}, None, []),
    ],
)
def test_memory_headroom(capacity: dict[str, Any], config: dict[str, Any] | None, messages: list[str]) -> None:
    capacity = {"fits": True, **capacity}
    assert said("memory-headroom", capacity, config={"memory-headroom": config} if config else None) == messages
