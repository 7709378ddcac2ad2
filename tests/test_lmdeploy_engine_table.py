"""The rest of LMDeploy's engine module (what is not an argv/env builder) as tables: TurboMind's layout pieces
(FFN padding, K/V heads per rank, bytes per weight and per cached token, weights and runtime per GPU) on a tiny
model whose figures are counted by hand, the estimate on both sides of each of its three refusals with the exact
reason and advice, its notes and every extra figure; then the engine's image cells, gate check and capacity.
A wrong operator, boundary or word fails here in a second."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from components.engines.estimate import GIB
from components.engines.gate import GateCheck
from components.engines.lmdeploy.engine import (
    LMDEPLOY_CHECK,
    FfnSplit,
    LmdeployEngine,
    ffn_split,
    kv_bytes_per_token_per_layer,
    kv_error_class,
    kv_estimate_error,
    kv_heads_per_rank,
    runtime_bytes,
    turbomind_estimate,
    weight_bytes_per_param,
    weights_per_gpu,
)
from components.engines.lmdeploy.facts import DEFAULT_IMAGE, IMAGES
from components.engines.lmdeploy.rules import quant_policy
from components.facts.engine_matrix import Cell
from components.facts.evidence import Evidence, Sourced
from components.facts.models import MODELS, ModelArch
from components.spec.models import model_architecture
from components.spec.stack import config_sections, validate_sections
from tests.support.engine_stacks import lmdeploy_config, spec_of

ENGINE = LmdeployEngine()
V016 = IMAGES["openmmlab/lmdeploy:v0.16.0-cu12.8"]
V015 = "openmmlab/lmdeploy:v0.15.0-cu12.8"
CU13 = "openmmlab/lmdeploy:v0.16.0-cu13.0"

# Two decoder layers of hidden 64, 4 query heads and 2 K/V heads of 16, vocab 100, MLP 96: small enough to count.
DENSE = ModelArch(
    "tiny",
    "t/tiny",
    "llama",
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=16,
    vocab_size=100,
    intermediate_size=96,
)
# Three layers, the first dense, then 4 experts of 48 (2 per token) and one shared expert.
MOE = dataclasses.replace(
    DENSE,
    name="tiny-moe",
    model_type="qwen3_moe",
    num_layers=3,
    num_experts=4,
    experts_per_token=2,
    moe_intermediate_size=48,
    num_shared_experts=1,
    first_k_dense_replace=1,
)


# -- the layout ----------------------------------------------------------------------------------------------

# (width, tp, quant group, align) -> (group, padded): groups of lcm(quant group or 1, align), their count rounded
# up to a multiple of TP; TP 1 or no whole group leaves the width as it is.
FFN = [
    (1536, 8, 128, 32, 128, 2048),  # Qwen3-235B's experts at TP 8: 12 groups -> 16
    (1536, 4, 128, 32, 128, 1536),
    (1536, 1, 128, 32, 128, 1536),
    (100, 1, 32, 32, 32, 100),  # TP 1 keeps a width that is no whole number of groups
    (100, 2, 32, 32, 32, 128),  # 3 groups -> 4
    (40, 2, 32, 32, 32, 64),  # one group -> 2
    (20, 2, 32, 32, 32, 20),  # no whole group
    (96, 2, 0, 32, 32, 128),  # no quant group: the alignment alone
    (96, 2, 1, 32, 32, 128),
    (96, 2, 64, 32, 64, 128),
    (96, 2, 48, 32, 96, 192),  # lcm(48, 32) = 96: one group -> 2
    (768, 3, 1, 32, 32, 768),
    # An image that aligns to 1: the quant group alone, or one weight when there is none.
    (96, 2, 0, 1, 1, 96),
    (7, 2, 1, 1, 1, 8),
    (96, 2, 64, 1, 64, 128),
]


@pytest.mark.parametrize(("width", "tp", "quant", "align", "group", "padded"), FFN)
def test_ffn_split_pads_the_group_count_to_a_multiple_of_tp(
    width: int, tp: int, quant: int, align: int, group: int, padded: int
) -> None:
    assert ffn_split(width, tp, quant, align) == FfnSplit(width, group, padded)


def test_padding_ratio_is_the_extra_share() -> None:
    assert FfnSplit(1536, 128, 2048).padding_ratio == 2048 / 1536 - 1
    assert FfnSplit(96, 32, 96).padding_ratio == 0.0
    assert FfnSplit(0, 32, 0).padding_ratio == 0.0


# (K/V heads, TP) -> heads per rank: repeated up to a multiple of TP when TP does not divide them.
KV_HEADS = [(8, 8, 1), (4, 8, 1), (8, 3, 3), (6, 4, 2), (16, 2, 8), (1, 1, 1), (2, 1, 2), (5, 5, 1)]


@pytest.mark.parametrize(("heads", "tp", "per_rank"), KV_HEADS)
def test_kv_heads_per_rank(heads: int, tp: int, per_rank: int) -> None:
    got = kv_heads_per_rank(heads, tp)
    assert got == per_rank and type(got) is int


# (tp, bits) -> K+V bytes of a token in a layer: 2 x heads per rank x (bits x 16 / 8, + 4 for a quantized cache).
KV_BYTES = [(1, 16, 2 * 2 * 32), (1, 8, 2 * 2 * (16 + 4)), (1, 4, 2 * 2 * (8 + 4)), (2, 16, 2 * 1 * 32), (2, 8, 2 * 20)]


@pytest.mark.parametrize(("tp", "bits", "size"), KV_BYTES)
def test_kv_bytes_per_token_per_layer(tp: int, bits: int, size: int) -> None:
    assert kv_bytes_per_token_per_layer(DENSE, tp, bits) == size


@pytest.mark.parametrize(
    ("fmt", "group", "size"),
    [
        ("hf", 128, 2.0),
        ("fp8", 128, 1.0 + 4 / (128 * 128)),
        ("fp8", 32, 1.0 + 4 / (128 * 128)),
        ("mxfp4", 128, 0.5 + 1 / 32),
        ("mxfp4", 64, 0.5 + 1 / 32),  # one scale per 32 whatever the group (int4 at 64 would be 0.5625)
        ("awq", 128, 0.5 + 4 / 128),
        ("gptq", 64, 0.5 + 4 / 64),
        ("compressed-tensors", 32, 0.5 + 4 / 32),
    ],
)
def test_bytes_per_weight(fmt: str, group: int, size: float) -> None:
    assert weight_bytes_per_param(fmt, group) == size


def test_the_tiny_dense_model_weighs_what_is_counted_by_hand() -> None:
    """TP 1, fp16: per layer attention 64x64 (q) + 2x64x32 (k, v) + 64x64 (o) = 12288 weights and an MLP of
    3 x 64 x 96 = 18432, two norms of 64; then embedding and LM head 100 x 64 each and the final norm:
    2 x (2 x (12288 + 18432)) + 2 x (2 x 128 + 12800 + 64) = 149120 bytes."""
    assert weights_per_gpu(DENSE, 1, "hf", 128, 32) == (149120.0, {"dense": FfnSplit(96, 32, 96)})
    # TP 2: 2 query heads and 1 K/V head per rank (6144 attention weights a layer), the MLP padded to 128 and
    # split in two (12288), the vocabulary split too: 2 x 2 x (6144 + 12288) + 2 x (256 + 6400 + 64) = 87168.
    assert weights_per_gpu(DENSE, 2, "hf", 128, 32) == (87168.0, {"dense": FfnSplit(96, 32, 128)})


# (model, tp, format, group) -> (bytes on one GPU, the splits) for every term of the layout.
WEIGHTS = [
    (DENSE, 1, "awq", 64, 60800.0, {"dense": FfnSplit(96, 64, 96)}),
    (DENSE, 1, "gptq", 32, 64640.0, {"dense": FfnSplit(96, 32, 96)}),
    (DENSE, 1, "fp8", 128, 87695.0, {"dense": FfnSplit(96, 128, 96)}),
    # Each quantized format cuts its FFN in quant groups (96 is no whole group of 128: left as it is).
    (DENSE, 1, "gptq", 128, 58880.0, {"dense": FfnSplit(96, 128, 96)}),
    (DENSE, 1, "compressed-tensors", 64, 60800.0, {"dense": FfnSplit(96, 64, 96)}),
    (DENSE, 1, "mxfp4", 128, 149120.0, {"dense": FfnSplit(96, 128, 96)}),
    # mxfp4 checkpoints keep their non-expert linears in fp16: a dense model weighs as in fp16.
    (DENSE, 1, "mxfp4", 32, 149120.0, {"dense": FfnSplit(96, 32, 96)}),
    (dataclasses.replace(DENSE, qkv_bias=True), 1, "hf", 128, 149632.0, {"dense": FfnSplit(96, 32, 96)}),
    (dataclasses.replace(DENSE, model_type="qwen3"), 1, "hf", 128, 149248.0, {"dense": FfnSplit(96, 32, 96)}),
    (dataclasses.replace(DENSE, model_type="qwen3_moe"), 1, "hf", 128, 149248.0, {"dense": FfnSplit(96, 32, 96)}),
    (dataclasses.replace(DENSE, tie_word_embeddings=True), 1, "hf", 128, 136320.0, {"dense": FfnSplit(96, 32, 96)}),
    (
        MOE,
        1,
        "hf",
        128,
        322624.0,
        {"dense": FfnSplit(96, 32, 96), "expert": FfnSplit(48, 32, 48), "shared_expert": FfnSplit(48, 32, 48)},
    ),
    (
        MOE,
        2,
        "gptq",
        32,
        72512.0,
        {"dense": FfnSplit(96, 32, 128), "expert": FfnSplit(48, 32, 64), "shared_expert": FfnSplit(48, 32, 64)},
    ),
    (
        dataclasses.replace(MOE, shared_expert_intermediate_size=64),
        1,
        "hf",
        128,
        334912.0,
        {"dense": FfnSplit(96, 32, 96), "expert": FfnSplit(48, 32, 48), "shared_expert": FfnSplit(64, 32, 64)},
    ),
    (
        dataclasses.replace(MOE, num_shared_experts=2),
        1,
        "hf",
        128,
        359488.0,
        {"dense": FfnSplit(96, 32, 96), "expert": FfnSplit(48, 32, 48), "shared_expert": FfnSplit(48, 32, 48)},
    ),
    (
        dataclasses.replace(MOE, num_shared_experts=0),
        1,
        "hf",
        128,
        285760.0,
        {"dense": FfnSplit(96, 32, 96), "expert": FfnSplit(48, 32, 48)},
    ),
    (
        MOE,
        1,
        "mxfp4",
        32,
        322624.0,
        {"dense": FfnSplit(96, 32, 96), "expert": FfnSplit(48, 32, 48), "shared_expert": FfnSplit(48, 32, 48)},
    ),
]


@pytest.mark.parametrize(("arch", "tp", "fmt", "group", "size", "splits"), WEIGHTS)
def test_weights_per_gpu(arch: ModelArch, tp: int, fmt: str, group: int, size: float, splits: dict) -> None:
    assert weights_per_gpu(arch, tp, fmt, group, 32) == (size, splits)


def test_an_unquantized_ffn_is_cut_in_the_images_alignment_alone() -> None:
    assert weights_per_gpu(DENSE, 1, "hf", 128, 1) == (149120.0, {"dense": FfnSplit(96, 1, 96)})
    assert weights_per_gpu(DENSE, 1, "awq", 64, 1) == (60800.0, {"dense": FfnSplit(96, 64, 96)})


def test_runtime_is_a_prefill_chunk_through_a_layer_and_the_batchs_fp32_logits() -> None:
    # Dense: MLP 8 x 2 x 96 = 1536, (8 x 4 x 64 + 1536) x 2 = 7168, logits 2 x 100 x 4 = 800.
    assert runtime_bytes(DENSE, 1, 8, 2, 0) == 7968.0
    assert runtime_bytes(DENSE, 2, 8, 2, 0) == (8 * 4 * 64 + 8 * 2 * 96 / 2) * 2 + 800
    # MoE: the experts a token uses at the padded width over TP: 8 x 2 x 2 x 48 / 2 = 768.
    assert runtime_bytes(MOE, 2, 8, 2, 48) == 6432.0
    assert runtime_bytes(MOE, 1, 8, 3, 64) == (8 * 4 * 64 + 8 * 2 * 2 * 64) * 2 + 3 * 100 * 4


# -- the estimate --------------------------------------------------------------------------------------------


def estimate(arch: ModelArch = DENSE, gib: float = 1.0, **changes: Any) -> Any:
    settings: dict[str, Any] = {
        "tp": 1,
        "model_format": "hf",
        "group_size": 128,
        "quant_policy": 0,
        "session_len": 1024,
        "max_batch_size": 4,
        "cache_max_entry_count": 0.5,
        "cache_block_seq_len": 64,
        "max_prefill_token_num": 8,
        **changes,
    }
    return turbomind_estimate(arch, V016, gib, **settings)


WIDEST = "no public TurboMind log to compare, the widest error measured on any engine's logs"
TERMS = (
    "the memory TurboMind holds before its weights (CUDA context, cuBLAS and NCCL workspaces), which sets what "
    "cacheMaxEntryCount takes its share of"
)
# 1 GiB less the 0.5 GiB context and the 149120 bytes of weights; half of it KV, 256 bytes a token.
FREE = GIB // 2 - 149120


def test_the_tiny_model_on_one_gib_fits_with_every_figure() -> None:
    e = estimate()
    assert (e.engine, e.model, e.gpu_memory_gib, e.tp, e.max_model_len) == ("lmdeploy", "tiny", 1.0, 1, 1024)
    assert (e.weights_gib_per_gpu, e.weights_gib_total) == (149120 / GIB, 149120 / GIB)
    assert e.kv_bytes_per_token_per_gpu == 256.0
    assert e.kv_cache_gib_per_gpu == FREE * 0.5 / GIB
    blocks = int(FREE * 0.5 // (256 * 64))
    assert blocks == 16379 and e.kv_tokens == 16379 * 64
    assert e.max_concurrency == 16379 * 64 / 1024
    # 74560 parameters x 2 bytes x 1.2.
    assert e.rule_of_thumb_gib_total == 74560 * 2.0 * 1.2 / GIB
    assert (e.fits, e.reason, e.advice, e.notes) == (True, "", "", ())
    assert e.extra == {
        "context_option": "--session-len (lmdeploy.sessionLen)",
        "model_format": "hf",
        "quant_policy": 0,
        "kv_bits": 16,
        "cache_max_entry_count": 0.5,
        "free_gib_after_weights": FREE / GIB,
        "runtime_gib": (7168 + 4 * 100 * 4) / GIB,
        "kv_blocks": 16379,
        "kv_estimate_error": 0.035,
        "kv_error_class": "TurboMind · TP1 · dense: " + WIDEST,
        "kv_tokens_required": 1024,
        "kv_tokens_low": int(16379 * 64 * (1 - 0.035)),
        "max_concurrency_low": 16379 * 64 / 1024 * (1 - 0.035),
        "kv_cache_gib_per_gpu_low": FREE * 0.5 * (1 - 0.035) / GIB,
        "kv_error_terms": TERMS,
        "ffn_padding": {"dense": {"width": 96, "group": 32, "padded": 96}},
    }


@pytest.mark.parametrize(("fmt", "group", "rule_of_thumb"), [("hf", 128, 2.0), ("awq", 64, 0.5625), ("fp8", 128, 1.0)])
def test_the_rule_of_thumb_takes_two_bytes_a_weight_or_the_formats_at_most_one(
    fmt: str, group: int, rule_of_thumb: float
) -> None:
    assert estimate(model_format=fmt, group_size=group).rule_of_thumb_gib_total == 74560 * rule_of_thumb * 1.2 / GIB


WEIGHTS_REASON = (
    "the weights alone need 0.0 GiB per GPU (TurboMind layout) of the 0.5 GiB per GPU (0.5 GiB go to the CUDA "
    "context first)"
)
WEIGHTS_ADVICE = "add GPUs (tensorParallel), or serve a 4-bit checkpoint (AWQ/GPTQ g128)"


@pytest.mark.parametrize("gib", [0.5, 0.5 + 149120 / GIB])
def test_weights_that_leave_nothing_free_are_refused(gib: float) -> None:
    e = estimate(gib=gib)
    assert (e.fits, e.reason, e.advice, e.notes) == (False, WEIGHTS_REASON, WEIGHTS_ADVICE, ())
    assert (e.kv_cache_gib_per_gpu, e.kv_tokens, e.max_concurrency) == (0.0, 0, 0.0)
    assert e.extra["free_gib_after_weights"] == 0.0 and e.extra["kv_blocks"] == 0


def test_one_byte_free_is_not_refused_for_the_weights() -> None:
    e = estimate(gib=0.5 + 149121 / GIB)
    assert e.reason.startswith("the KV cache holds 0 tokens (0.5 of the 0.0 GiB left after the weights)")


def test_a_session_longer_than_the_cache_is_refused_and_one_as_long_fits() -> None:
    e = estimate(session_len=16379 * 64 + 1)
    assert (e.fits, e.notes) == (False, ())
    assert e.reason == (
        "the KV cache holds 1048256 tokens (0.5 of the 0.5 GiB left after the weights), fewer than sessionLen 1048257"
    )
    assert e.advice == (
        "lower lmdeploy.sessionLen to 1048256 or less, raise cacheMaxEntryCount, quantize the KV cache "
        "(quantPolicy 8), or add GPUs"
    )
    e = estimate(session_len=16379 * 64)
    assert (e.fits, e.reason, e.advice) == (True, "", "")
    assert e.notes == ("only 1.0 sequences of sessionLen fit at once, below maxBatchSize 4: long requests queue",)
    assert estimate(session_len=16379 * 64, max_batch_size=1).notes == ()


def test_a_runtime_over_the_room_beside_the_cache_is_refused_and_one_equal_to_it_fits() -> None:
    # Room: half of FREE = 268360896 bytes; a prefill of 299501 tokens takes 896 bytes each (268352896), and
    # each sequence of the batch 400 bytes of logits: 20 fill the room exactly, 21 are over.
    e = estimate(max_prefill_token_num=299501, max_batch_size=21)
    assert (e.fits, e.notes) == (False, ())
    assert e.reason == (
        "the 50% of free memory left beside the KV cache (0.25 GiB) is less than the ~0.25 GiB of activations and "
        "logits for maxPrefillTokenNum 299501 and maxBatchSize 21: TurboMind runs out of memory at the first long "
        "prompt"
    )
    assert e.advice == "lower cacheMaxEntryCount, maxPrefillTokenNum or maxBatchSize"
    assert e.extra["runtime_gib"] == (268352896 + 21 * 400) / GIB
    e = estimate(max_prefill_token_num=299501, max_batch_size=20)
    assert (e.fits, e.reason, e.advice, e.notes) == (True, "", "", ())


PAD = (
    "{kind} intermediate {width} is cut in groups of 32: {groups} groups padded to {padded} for TP 2 (33% more "
    "{kind} weight and GEMM work; a TP that divides the group count pads nothing)"
)


def test_padding_and_a_short_cache_are_noted() -> None:
    e = estimate(tp=2, max_batch_size=2000)
    assert e.fits is True
    assert e.notes == (
        PAD.format(kind="dense", width=96, groups=3, padded=4),
        "only 818.8 sequences of sessionLen fit at once, below maxBatchSize 2000: long requests queue",
    )
    assert (e.weights_gib_per_gpu, e.weights_gib_total) == (87168 / GIB, 2 * 87168 / GIB)
    assert e.extra["kv_error_class"] == "TurboMind · TP>=2 · dense: " + WIDEST
    # 1 GiB less 0.5 + 0.3 GiB (the communicators at TP > 1) and the weights.
    assert e.extra["free_gib_after_weights"] == (GIB - 0.8 * GIB - 87168) / GIB
    # A refused pool gets no concurrency note.
    assert estimate(tp=2, max_batch_size=2000, session_len=10**7).notes == (
        PAD.format(kind="dense", width=96, groups=3, padded=4),
    )


def test_a_quantized_moe_at_tp_2_pads_every_split_and_sizes_its_runtime_by_the_padded_experts() -> None:
    e = estimate(MOE, tp=2, quant_policy=8, model_format="gptq", group_size=32)
    assert e.notes == (
        PAD.format(kind="dense", width=96, groups=3, padded=4),
        PAD.format(kind="expert", width=48, groups=1, padded=2),
        PAD.format(kind="shared_expert", width=48, groups=1, padded=2),
    )
    assert e.kv_bytes_per_token_per_gpu == 3 * 2 * 1 * (16 + 4)
    assert (e.extra["kv_bits"], e.extra["quant_policy"], e.extra["model_format"]) == (8, 8, "gptq")
    assert e.extra["runtime_gib"] == runtime_bytes(MOE, 2, 8, 4, 64) / GIB
    assert e.extra["kv_error_class"] == "TurboMind · TP>=2 · MoE: " + WIDEST
    assert e.extra["ffn_padding"] == {
        "dense": {"width": 96, "group": 32, "padded": 128},
        "expert": {"width": 48, "group": 32, "padded": 64},
        "shared_expert": {"width": 48, "group": 32, "padded": 64},
    }


def test_heads_that_tp_does_not_divide_cannot_be_estimated() -> None:
    with pytest.raises(ValueError) as err:
        estimate(tp=3)
    assert str(err.value) == "tiny has 4 attention heads, not divisible by tensor parallel size 3"


@pytest.mark.parametrize(
    ("arch", "tp", "cls"),
    [
        (DENSE, 1, ("turbomind", "tp1", "dense")),
        (DENSE, 2, ("turbomind", "tp>=2", "dense")),
        (MOE, 8, ("turbomind", "tp>=2", "moe")),
        (MODELS["deepseek-r1"], 1, ("turbomind", "tp1", "mla")),
    ],
)
def test_kv_error_class(arch: ModelArch, tp: int, cls: tuple[str, str, str]) -> None:
    assert kv_error_class(arch, tp) == cls


def test_every_class_takes_the_widest_error_measured() -> None:
    assert kv_estimate_error(("turbomind", "tp1", "dense")) == (0.035, "TurboMind · TP1 · dense: " + WIDEST)
    assert kv_estimate_error(("turbomind", "tp>=2", "mla")) == (0.035, "TurboMind · TP>=2 · MLA: " + WIDEST)


# -- the engine ------------------------------------------------------------------------------------------------


def test_the_engines_tables() -> None:
    assert ENGINE.checkpoint_quantizations() == frozenset({"awq", "gptq", "compressed-tensors", "fp8", "mxfp4"})
    assert ENGINE.image_refs() == [DEFAULT_IMAGE, V015, CU13]
    assert ENGINE.image_table() is IMAGES
    assert ENGINE.cli_value_types() == {"_parse": quant_policy}


@pytest.mark.parametrize(
    ("ref", "capability", "cell"),
    [
        (DEFAULT_IMAGE, 61, Cell("no", "read from code")),
        (DEFAULT_IMAGE, 70, Cell("deployed", "read from code")),
        (V015, 75, Cell("deployed", "read from code")),
        (CU13, 75, Cell("no", "read from code")),
        (CU13, 80, Cell("deployed", "read from code")),
        ("openmmlab/lmdeploy:latest", 80, None),
    ],
)
def test_image_cells(ref: str, capability: int, cell: Cell | None) -> None:
    assert ENGINE.image_cell(ref, capability) == cell


def test_an_observed_cell_is_observed_on_the_v100_only(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = dataclasses.replace(V016, sources={**V016.sources, "sass": Sourced("seen", Evidence.OBSERVED)})
    monkeypatch.setattr(ENGINE, "image_facts_of", lambda ref: seen)
    assert ENGINE.image_cell(DEFAULT_IMAGE, 70) == Cell("deployed", "observed")
    assert ENGINE.image_cell(DEFAULT_IMAGE, 80) == Cell("deployed", "read from code")


def test_the_context_length_is_the_session_length() -> None:
    assert ENGINE.context_length(spec_of(lmdeploy_config(sessionLen=4096)), "chat") == 4096


def test_the_gate_check_states_the_version_the_gpu_and_the_argvs() -> None:
    config = lmdeploy_config()
    config["llm-cluster:nodeDefaults"]["gpu"]["model"] = "NVIDIA A100-SXM4-80GB"
    spec = spec_of(config)
    argvs = (("lmdeploy", "serve", "api_server", "/m"), ("lmdeploy", "serve", "api_server", "/n"))
    data = {
        "version": "0.16.0",
        "module": "lmdeploy.version",
        "argvs": [list(a) for a in argvs],
        "recommended": DEFAULT_IMAGE,
        "capability": 80,
    }
    assert ENGINE.gate_check(spec, "chat", "gpu-03", argvs) == GateCheck(
        "LMDeploy 0.16.0",
        "python3",
        ("-c", LMDEPLOY_CHECK, json.dumps(data, sort_keys=True)),
        "torch's arch list, the planned GPU, an fp16 matmul, TurboMind's kernels for the GPU, the LMDeploy version "
        "and the planned flags",
    )
    v100 = ENGINE.gate_check(spec_of(lmdeploy_config()), "chat", "gpu-03", argvs)
    assert v100 is not None and json.loads(v100.args[2])["capability"] == 70
    config = lmdeploy_config()
    config["llm-cluster:pools"]["chat"]["image"] = "registry.example/lmdeploy:private"
    assert ENGINE.gate_check(spec_of(config), "chat", "gpu-03", argvs) is None


def test_the_capacity_is_turbomind_on_the_pools_model_image_and_options() -> None:
    options = {
        "quantPolicy": 8,
        "cacheMaxEntryCount": 0.6,
        "cacheBlockSeqLen": 128,
        "maxPrefillTokenNum": 4096,
        "maxBatchSize": 32,
        "sessionLen": 8192,
    }
    config = lmdeploy_config(**options)
    config["llm-cluster:pools"]["chat"]["image"] = V015
    config["llm-cluster:models"]["qwen3-30b-a3b"].update(quantization="awq", quantBits=4, groupSize=64)
    spec = spec_of(config)
    expected = turbomind_estimate(
        model_architecture(spec, "qwen3-30b-a3b"),
        IMAGES[V015],
        32.0,
        tp=8,
        model_format="awq",
        group_size=64,
        quant_policy=8,
        session_len=8192,
        max_batch_size=32,
        cache_max_entry_count=0.6,
        cache_block_seq_len=128,
        max_prefill_token_num=4096,
    ).to_dict()
    assert ENGINE.capacity(spec, "chat") == expected
    assert expected["model_format"] == "awq" and expected["kv_bits"] == 8 and expected["tp"] == 8


def test_an_unquantized_model_on_an_unknown_image_is_sized_as_hf_on_the_default() -> None:
    config = lmdeploy_config()
    config["llm-cluster:pools"]["chat"]["image"] = "registry.example/lmdeploy:private"
    spec = spec_of(config)
    got = ENGINE.capacity(spec, "chat")
    assert got["model_format"] == "hf" and got["fits"] is True
    assert (
        got
        == turbomind_estimate(
            model_architecture(spec, "qwen3-30b-a3b"),
            V016,
            32.0,
            tp=8,
            model_format="hf",
            group_size=128,
            quant_policy=0,
            session_len=32768,
            max_batch_size=64,
            cache_max_entry_count=0.8,
            cache_block_seq_len=64,
            max_prefill_token_num=8192,
        ).to_dict()
    )


def test_a_model_tp_does_not_divide_gets_the_reason_not_an_estimate() -> None:
    config = lmdeploy_config()
    config["llm-cluster:pools"]["chat"]["tensorParallel"] = 3
    config["llm-cluster:nodeDefaults"]["gpu"]["count"] = 3
    spec = validate_sections(*config_sections(config, set()))
    assert ENGINE.capacity(spec, "chat") == {
        "error": "capacity not estimated: qwen3-30b-a3b has 32 attention heads, not divisible by tensor parallel size 3"
    }
