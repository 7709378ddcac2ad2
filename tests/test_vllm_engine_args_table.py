"""The vllm-engine-args rule's checks called directly on a Launch, as tables (no stack planned): which engine
runs (each image line x GPU x VLLM_USE_V1, and an image without facts by its tag), whether chunked prefill is
on and why, the context window, the checkpoint's quantization, every scheduler bound and the data-parallel
world, each on both sides, with vLLM's words. tests/test_engine_args.py takes the same rule through whole
stacks; this one is what each of its mutants meets in a second."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from components.engines.vllm.launch import Launch
from components.engines.vllm.rules.engine_args import (
    check_checkpoint_quantization,
    check_context,
    check_engine_args,
    check_scheduler,
    check_world_size,
    chunked_prefill,
    engine_version,
    runs_v1,
)
from tests.test_vllm_rules_table import V011, V19, V92, launch

A100 = "NVIDIA A100-SXM4-80GB"
T4 = "Tesla T4"
PRIVATE = "registry.example/vllm"


def v92(**changes: Any) -> Launch:
    """The chat server on 0.9.2 (its parser has no --attention-backend)."""
    drop = ["--attention-backend", *changes.pop("argv_drop", [])]
    return launch(image=V92, argv_drop=drop, **changes)


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.19.1", (0, 19)),
        ("vllm/vllm-openai:0.10.2", (0, 10)),
        ("vllm/vllm-openai:v1.2", (1, 2)),
        ("vllm/vllm-openai:latest", (0, 9)),
        ("vllm/vllm-openai", (0, 9)),
        (None, (0, 9)),
        ("", (0, 9)),
        ("localhost:5000/vllm:v0.11.0-cu128", (0, 11)),
    ],
)
def test_the_vllm_version_read_from_an_images_tag(image: str | None, version: tuple[int, int]) -> None:
    assert engine_version(image) == version


# (image, GPU, VLLM_USE_V1, whether V1 runs): the facts where the image has them, else its tag and the GPU.
ENGINES: list[tuple[str, str, str | None, bool]] = [
    (V92, "Tesla V100-SXM2-32GB", None, False),
    (V92, T4, None, False),
    (V92, A100, None, True),
    (V92, A100, "0", False),
    (V92, A100, "1", True),
    (V011, "Tesla V100-SXM2-32GB", None, True),
    (V011, "Tesla V100-SXM2-32GB", "0", False),
    # 0.19.1 no longer reads the switch: V1 whatever it says.
    (V19, "Tesla V100-SXM2-32GB", "0", True),
    (f"{PRIVATE}:v0.10.0", "Tesla V100-SXM2-32GB", "0", True),
    (f"{PRIVATE}:v0.9.1", A100, None, True),
    (f"{PRIVATE}:v0.9.1", A100, "0", False),
    (f"{PRIVATE}:v0.9.1", A100, "1", True),
    (f"{PRIVATE}:v0.9.1", "NVIDIA A10", None, True),
    (f"{PRIVATE}:v0.9.1", T4, None, False),
    (f"{PRIVATE}:v0.9.1", "no such GPU", None, False),
]


@pytest.mark.parametrize(("image", "gpu", "use_v1", "v1"), ENGINES)
def test_which_engine_runs_on_each_image_gpu_and_switch(image: str, gpu: str, use_v1: str | None, v1: bool) -> None:
    env = {"VLLM_USE_V1": use_v1} if use_v1 is not None else {}
    found = launch(image=image, gpuModel=gpu, env=env, argv_drop=["--attention-backend"])
    assert runs_v1(found) is v1


# (launch changes, max_model_len, (on, why)).
CHUNKED: list[tuple[dict[str, Any], int | None, tuple[bool, str]]] = [
    ({"argv_add": ["--enable-chunked-prefill"]}, 100, (True, "--enable-chunked-prefill")),
    ({"argv_add": ["--no-enable-chunked-prefill"]}, 100, (False, "--no-enable-chunked-prefill")),
    ({"gpuModel": A100}, 100, (True, "the V1 engine's default")),
    ({}, 32768, (False, "the V0 engine's default for --max-model-len up to 32768")),
    ({}, 32769, (True, "the V0 engine's default for --max-model-len above 32768")),
    ({}, None, (False, "the V0 engine's default for --max-model-len up to 32768")),
]


@pytest.mark.parametrize(("changes", "length", "found"), CHUNKED)
def test_chunked_prefill_is_the_flag_else_the_engines_default(
    changes: dict[str, Any], length: int | None, found: tuple[bool, str]
) -> None:
    assert chunked_prefill(v92(**changes), length) == found


def test_the_v0_threshold_is_the_images_facts() -> None:
    """A line whose facts name another threshold is judged by it (0.9.2's is 32768, the fallback's value)."""
    found = v92()
    assert found.facts is not None
    lower = replace(found, facts=replace(found.facts, chunked_prefill_auto_above=8192))
    assert chunked_prefill(lower, 8192) == (False, "the V0 engine's default for --max-model-len up to 8192")
    assert chunked_prefill(lower, 8193) == (True, "the V0 engine's default for --max-model-len above 8192")


def test_an_image_without_facts_on_v0_turns_chunked_prefill_on_above_32768() -> None:
    private = launch(image=f"{PRIVATE}:v0.9.1", argv_drop=["--attention-backend"])
    assert private.facts is None
    assert chunked_prefill(private, 32768) == (False, "the V0 engine's default for --max-model-len up to 32768")
    assert chunked_prefill(private, 32769) == (True, "the V0 engine's default for --max-model-len above 32768")


def too_long(length: int, limit: int, why: str) -> str:
    return (
        f"--max-model-len {length} is longer than the model's context window of {limit} tokens ({why} in its "
        f'config.json): vLLM refuses it at startup ("User-specified max_model_len ({length}) is greater than the '
        f'derived max_model_len"). Use --max-model-len {limit} or less.'
    )


SLIDING = (
    "--disable-sliding-window on a model with rope_scaling: vLLM raises NotImplementedError "
    '("Disabling sliding window is not supported for models with rope_scaling"). Remove the flag.'
)
WINDOW = {"tokens": 32768, "derivedFrom": "max_position_embeddings"}
# (launch changes, messages): the chat server's --max-model-len is 32768.
CONTEXTS: list[tuple[dict[str, Any], list[str]]] = [
    ({}, []),
    ({"contextWindow": WINDOW}, []),
    ({"contextWindow": {**WINDOW, "tokens": 32767}}, [too_long(32768, 32767, "max_position_embeddings")]),
    ({"contextWindow": {"tokens": 32767}}, [too_long(32768, 32767, "")]),
    ({"contextWindow": {**WINDOW, "tokens": 32767}, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}}, []),
    ({"contextWindow": {**WINDOW, "tokens": 32767}, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "true"}}, []),
    (
        {"contextWindow": {**WINDOW, "tokens": 32767}, "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "0"}},
        [too_long(32768, 32767, "max_position_embeddings")],
    ),
    ({"contextWindow": {"derivedFrom": "x"}}, []),
    ({"contextWindow": 32767}, []),
    ({"contextWindow": {**WINDOW, "ropeScaled": True}, "argv_add": ["--disable-sliding-window"]}, [SLIDING]),
    ({"contextWindow": {**WINDOW, "ropeScaled": False}, "argv_add": ["--disable-sliding-window"]}, []),
    ({"contextWindow": {**WINDOW, "ropeScaled": True}}, []),
    (
        {"contextWindow": {**WINDOW, "tokens": 8192, "ropeScaled": True}, "argv_add": ["--disable-sliding-window"]},
        [too_long(32768, 8192, "max_position_embeddings"), SLIDING],
    ),
]


@pytest.mark.parametrize(("changes", "messages"), CONTEXTS)
def test_max_model_len_against_the_models_context_window(changes: dict[str, Any], messages: list[str]) -> None:
    assert check_context(launch(**changes)) == messages


def test_a_server_without_max_model_len_is_not_judged_against_the_window() -> None:
    found = launch(argv_drop=["--max-model-len"], contextWindow={**WINDOW, "tokens": 10})
    assert check_context(found) == []


def unset(method: str, dtype: str = "half") -> str:
    return (
        f"the checkpoint's config.json is quantized with {method}, but models.qwen3-30b-a3b.quantization is unset: "
        f"vLLM loads it as {method} anyway, while the capacity plan and the hardware rules take it for {dtype} "
        f"weights. State quantization: {method} (and its quantBits and groupSize)."
    )


def mismatch(given: str, method: str) -> str:
    return (
        f"--quantization {given} does not match the checkpoint's config.json ({method}): vLLM refuses it "
        f'("Quantization method specified in the model config ({method}) does not match the quantization method '
        f'specified in the `quantization` argument ({given})."). Use --quantization {method}, or a checkpoint '
        f"quantized with {given}."
    )


GPTQ_OK = ["gptq", "gptq_marlin", "gptq_marlin_24", "marlin", "gptq_bitblas", "moe_wna16"]
AWQ_OK = ["awq", "awq_marlin", "moe_wna16"]
QUANTS: list[tuple[str | None, str | None, dict[str, Any], list[str]]] = [
    (None, None, {}, []),
    ("", "gptq", {}, []),
    ("gptq", None, {}, [unset("gptq")]),
    ("awq", None, {"dtype": None}, [unset("awq", "fp16")]),
    ("fp8", None, {"model": None, "dtype": "bfloat16"}, [unset("fp8", "bfloat16").replace("qwen3-30b-a3b", "<model>")]),
    *[("gptq", given, {}, []) for given in GPTQ_OK],
    *[("awq", given, {}, []) for given in AWQ_OK],
    ("gptq", "awq", {}, [mismatch("awq", "gptq")]),
    ("gptq", "awq_marlin", {}, [mismatch("awq_marlin", "gptq")]),
    ("awq", "gptq_marlin", {}, [mismatch("gptq_marlin", "awq")]),
    ("awq", "marlin", {}, [mismatch("marlin", "awq")]),
    ("fp8", "fp8", {}, []),
    ("fp8", "gptq", {}, [mismatch("gptq", "fp8")]),
    ("compressed-tensors", "compressed-tensors", {}, []),
]


@pytest.mark.parametrize(("checkpoint", "given", "props", "messages"), QUANTS)
def test_quantization_against_the_checkpoints_own(
    checkpoint: str | None, given: str | None, props: dict[str, Any], messages: list[str]
) -> None:
    add = ["--quantization", given] if given else []
    found = launch(argv_add=add, checkpointQuantization=checkpoint, **props)
    assert check_checkpoint_quantization(found) == messages


def below_length(batched: int, length: int, why: str) -> str:
    return (
        f"--max-num-batched-tokens {batched} is smaller than --max-model-len {length} with chunked prefill off "
        f'({why}): vLLM refuses it ("max_num_batched_tokens ({batched}) is smaller than max_model_len ({length})"), '
        f"since a prompt must fit one batch. Raise --max-num-batched-tokens to {length} or more, or lower "
        "--max-model-len."
    )


def below_seqs(batched: int, seqs: int, default: bool = False) -> str:
    return (
        f"--max-num-batched-tokens {batched} is smaller than --max-num-seqs {seqs}{' (its default)' if default else ''}"
        f': vLLM refuses it ("max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs '
        f'({seqs})"), every running sequence needs a token per step. Raise --max-num-batched-tokens to {seqs} or '
        "more, or lower --max-num-seqs."
    )


V0_OFF = "the V0 engine's default for --max-model-len up to 32768"
PARTIAL_OFF = (
    '--max-num-partial-prefills {n} with chunked prefill off ({why}): vLLM refuses it ("Chunked prefill must be '
    'enabled to set max_num_partial_prefills > 1."). Pass --enable-chunked-prefill or drop the flag.'
)


def long_partial(n: int, of: int) -> str:
    return f"--max-long-partial-prefills {n} must be between 1 and --max-num-partial-prefills ({of}), as vLLM checks."


def threshold(t: int, length: int) -> str:
    return (
        f"--long-prefill-token-threshold {t} is above --max-model-len {length}: vLLM refuses it. Use {length} or less."
    )


# (launch changes on 0.9.2 on a V100, where V0 runs and chunked prefill is off up to 32768; messages).
SCHEDULER: list[tuple[dict[str, Any], list[str]]] = [
    ({}, []),
    ({"argv_add": ["--max-num-batched-tokens", "32768"]}, []),
    ({"argv_add": ["--max-num-batched-tokens", "32767"]}, [below_length(32767, 32768, V0_OFF)]),
    ({"argv_add": ["--max-num-batched-tokens", "32767", "--enable-chunked-prefill"]}, []),
    ({"argv_add": ["--max-num-batched-tokens", "32767"], "gpuModel": A100}, []),
    # Above 32768 V0 chunks prefill by default: a batch below the length is then allowed.
    (
        {
            "argv_drop": ["--max-model-len"],
            "argv_add": ["--max-model-len", "32769", "--max-num-batched-tokens", "32768"],
        },
        [],
    ),
    (
        {"argv_add": ["--max-num-batched-tokens", "127", "--enable-chunked-prefill"]},
        [below_seqs(127, 128)],
    ),
    ({"argv_add": ["--max-num-batched-tokens", "128", "--enable-chunked-prefill"]}, []),
    (
        {"argv_drop": ["--max-num-seqs"], "argv_add": ["--max-num-batched-tokens", "255", "--enable-chunked-prefill"]},
        [below_seqs(255, 256, default=True)],
    ),
    (
        {"argv_drop": ["--max-num-seqs"], "argv_add": ["--max-num-batched-tokens", "256", "--enable-chunked-prefill"]},
        [],
    ),
    # Without --max-model-len, the model's window is the length.
    (
        {
            "argv_drop": ["--max-model-len"],
            "argv_add": ["--max-num-batched-tokens", "4096"],
            "contextWindow": {"tokens": 8192},
        },
        [below_length(4096, 8192, V0_OFF)],
    ),
    ({"argv_drop": ["--max-model-len"], "argv_add": ["--max-num-batched-tokens", "4096"]}, []),
    ({"argv_drop": ["--max-model-len"], "argv_add": ["--max-num-batched-tokens", "4096"], "contextWindow": 8192}, []),
    # Partial prefills.
    (
        {"argv_add": ["--max-num-partial-prefills", "0", "--enable-chunked-prefill"]},
        ["--max-num-partial-prefills 0: vLLM needs 1 or more."],
    ),
    ({"argv_add": ["--max-num-partial-prefills", "1"]}, []),
    ({"argv_add": ["--max-num-partial-prefills", "2"]}, [PARTIAL_OFF.format(n=2, why=V0_OFF)]),
    ({"argv_add": ["--max-num-partial-prefills", "2", "--enable-chunked-prefill"]}, []),
    (
        {
            "argv_add": [
                "--max-num-partial-prefills",
                "2",
                "--enable-chunked-prefill",
                "--long-prefill-token-threshold",
                "32769",
            ]
        },
        [threshold(32769, 32768)],
    ),
    (
        {
            "argv_add": [
                "--max-num-partial-prefills",
                "2",
                "--enable-chunked-prefill",
                "--long-prefill-token-threshold",
                "32768",
            ]
        },
        [],
    ),
    # One partial prefill: the threshold is not checked.
    ({"argv_add": ["--max-num-partial-prefills", "1", "--long-prefill-token-threshold", "40000"]}, []),
    ({"argv_add": ["--max-long-partial-prefills", "1"]}, []),
    ({"argv_add": ["--max-long-partial-prefills", "0"]}, [long_partial(0, 1)]),
    ({"argv_add": ["--max-long-partial-prefills", "2"]}, [long_partial(2, 1)]),
    (
        {
            "argv_add": [
                "--max-num-partial-prefills",
                "3",
                "--enable-chunked-prefill",
                "--max-long-partial-prefills",
                "3",
            ]
        },
        [],
    ),
    (
        {
            "argv_add": [
                "--max-num-partial-prefills",
                "3",
                "--enable-chunked-prefill",
                "--max-long-partial-prefills",
                "4",
            ]
        },
        [long_partial(4, 3)],
    ),
    ({"argv_add": ["--num-lookahead-slots", "0"]}, []),
    ({"argv_add": ["--num-lookahead-slots", "-1"]}, ["--num-lookahead-slots -1: vLLM needs 0 or more."]),
    ({"argv_add": ["--num-scheduler-steps", "1"]}, []),
    ({"argv_add": ["--num-scheduler-steps", "0"]}, ["--num-scheduler-steps 0: vLLM needs 1 or more."]),
]


@pytest.mark.parametrize(("changes", "messages"), SCHEDULER)
def test_each_scheduler_bound_on_both_sides(changes: dict[str, Any], messages: list[str]) -> None:
    found = v92(**changes)
    assert found.args.errors == ()
    assert check_scheduler(found) == messages


def world(dp: int, tp: int, pp: int, have: int) -> str:
    return (
        f"--data-parallel-size {dp} x --tensor-parallel-size {tp} x --pipeline-parallel-size {pp} = {dp * tp * pp} "
        f"GPUs, but the server has {have}: vLLM cannot place its ranks and stops at startup. Serve more copies as "
        "more instances of the pool (its nodes, replicasPerNode) rather than --data-parallel-size."
    )


# (tp, pp, dp, nodes, GPUs per node, messages).
WORLDS: list[tuple[int | None, int | None, int | None, int, float | None, list[str]]] = [
    (8, None, None, 1, 8.0, []),
    (8, None, 1, 1, 8.0, []),
    # One data-parallel rank is no data parallelism: a TP too wide for the node is the topology rule's.
    (16, None, 1, 1, 8.0, []),
    (4, None, 2, 1, 8.0, []),
    (8, None, 2, 1, 8.0, [world(2, 8, 1, 8)]),
    (8, None, 2, 2, 8.0, []),
    (8, 2, 2, 2, 8.0, [world(2, 8, 2, 16)]),
    (None, None, 2, 1, 1.0, [world(2, 1, 1, 1)]),
    (None, None, 2, 1, 2.0, []),
    (8, None, 2, 1, None, []),
    (8, None, 2, 0, 8.0, [world(2, 8, 1, 8)]),
]


@pytest.mark.parametrize(("tp", "pp", "dp", "nodes", "per_node", "messages"), WORLDS)
def test_the_data_parallel_world_against_the_servers_gpus(
    tp: int | None, pp: int | None, dp: int | None, nodes: int, per_node: float | None, messages: list[str]
) -> None:
    add = [
        *(["--tensor-parallel-size", str(tp)] if tp else []),
        *(["--pipeline-parallel-size", str(pp)] if pp else []),
        *(["--data-parallel-size", str(dp)] if dp else []),
    ]
    found = launch(
        argv_drop=["--tensor-parallel-size"],
        argv_add=add,
        nodes=[f"gpu-{i:02}" for i in range(1, nodes + 1)],
        gpuCount=per_node,
    )
    assert check_world_size(found) == messages


def test_the_rule_gives_every_check_in_order() -> None:
    found = v92(
        argv_add=["--quantization", "awq", "--max-num-batched-tokens", "100", "--data-parallel-size", "2"],
        contextWindow={**WINDOW, "tokens": 16384},
        checkpointQuantization="gptq",
    )
    assert check_engine_args(found, {}) == [
        too_long(32768, 16384, "max_position_embeddings"),
        mismatch("awq", "gptq"),
        below_length(100, 32768, V0_OFF),
        below_seqs(100, 128),
        world(2, 8, 1, 8),
    ]
