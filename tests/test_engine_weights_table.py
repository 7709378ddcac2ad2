"""How a checkpoint's weights weigh and split (components/engines/weights.py), on toy architectures small enough
to count by hand: each figure below is the module's formula written out with the toy's numbers, for every
branch (dense, GQA with KV heads replicated, MLA with and without q compression and its absorbed copy, biases,
gpt-oss, Qwen3's q/k norms, MoE with shared experts and the dense first layers, a tied LM head with and without
pipeline stages), both sides of each boundary, and the checkpoint forms the placement advisor writes."""

from __future__ import annotations

import dataclasses

import pytest

from components.engines.weights import (
    QUANTIZATIONS,
    CheckpointFormat,
    _attention_params,
    _mlp_params,
    _padded_vocab,
    checkpoint_bytes,
    kv_bytes_per_token_per_layer,
    kv_heads_per_gpu,
    layers_per_stage,
    linear_bytes_per_param,
    model_params,
    stage_weight_bytes,
)
from components.facts.models import ModelArch, model_arch

# hidden 64, 12 heads of 16, 4 KV heads, 3 layers, a vocabulary of 100 (padded to 128), MLP 160 wide.
DENSE = ModelArch(
    name="toy",
    hf_id="toy/dense",
    model_type="llama",
    num_layers=3,
    hidden_size=64,
    num_attention_heads=12,
    num_kv_heads=4,
    head_dim=16,
    vocab_size=100,
    intermediate_size=160,
)
# DeepSeek-style MLA: latent 32, q latent 24, rope 8, nope 16, v 16.
MLA = dataclasses.replace(
    DENSE,
    model_type="deepseek_v3",
    kv_lora_rank=32,
    q_lora_rank=24,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=16,
)
# 4 experts of width 40, one shared expert, the first layer dense.
MOE = dataclasses.replace(
    DENSE,
    model_type="qwen2_moe",
    num_experts=4,
    moe_intermediate_size=40,
    num_shared_experts=1,
    first_k_dense_replace=1,
)


# --- the pipeline split ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layers", "pp", "split"),
    [(4, 1, [4]), (4, 4, [1, 1, 1, 1]), (5, 4, [1, 1, 2, 1]), (7, 4, [2, 2, 2, 1]), (6, 4, [1, 2, 2, 1])],
)
def test_layers_per_stage(layers: int, pp: int, split: list[int]) -> None:
    assert layers_per_stage(layers, pp) == split


@pytest.mark.parametrize(("layers", "pp"), [(4, 0), (4, 5), (4, -1)])
def test_a_pipeline_size_outside_one_to_the_layers_is_refused(layers: int, pp: int) -> None:
    with pytest.raises(ValueError) as err:
        layers_per_stage(layers, pp)
    assert str(err.value) == f"pipeline parallel size {pp} must be between 1 and the {layers} layers"


# --- bytes per linear weight ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantization", "act_bytes", "bits", "group", "cost"),
    [
        (None, 2, 4, 128, 2.0),
        (None, 4, 4, 128, 4.0),
        *[(m, 2, 4, 128, 1.0) for m in ("fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp4", "mxfp8")],
        # bitsandbytes: bits/8, then an absmax per 64 and its second-level scale per 256 blocks.
        ("bitsandbytes", 2, 4, 128, 0.5 + 1 / 64 + 4 / (64 * 256)),
        ("bitsandbytes", 2, 8, 128, 1 + 1 / 64 + 4 / (64 * 256)),
        # Grouped integers: an fp16 scale and a `bits` zero per group; per channel (nothing per weight) at 0 and below.
        ("gptq", 2, 4, 128, 0.5 + 2.5 / 128),
        ("awq", 2, 4, 64, 0.5 + 2.5 / 64),
        ("gptq", 2, 8, 1, 1 + 3.0),
        ("moe_wna16", 2, 4, 0, 0.5),
        ("compressed-tensors", 2, 8, -1, 1.0),
    ],
)
def test_linear_bytes_per_param(quantization: str | None, act_bytes: int, bits: int, group: int, cost: float) -> None:
    assert linear_bytes_per_param(quantization, act_bytes, bits, group) == cost


def test_bitsandbytes_costs_exactly_its_block_scales() -> None:
    assert linear_bytes_per_param("bitsandbytes", 2, 4, 128) == 0.515869140625


def test_a_method_not_modelled_is_refused_naming_those_that_are() -> None:
    with pytest.raises(ValueError) as err:
        linear_bytes_per_param("hqq", 2, 4, 128)
    assert str(err.value) == (
        "quantization 'hqq' is not modelled; known: auto-round, awq, awq_marlin, bitsandbytes, compressed-tensors, "
        "fbgemm_fp8, fp8, gptq, gptq_marlin, modelopt, modelopt_fp4, modelopt_mxfp8, moe_wna16, mxfp8, ptpc_fp8"
    )
    assert len(QUANTIZATIONS) == 15


# --- KV cache --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("tp", "heads"), [(1, 4), (2, 2), (3, 1), (4, 1), (8, 1)])
def test_kv_heads_per_gpu_never_fewer_than_one(tp: int, heads: int) -> None:
    assert kv_heads_per_gpu(DENSE, tp) == heads


@pytest.mark.parametrize(
    ("arch", "tp", "kv_bytes", "mla", "per_token"),
    [
        (DENSE, 1, 2, True, 2 * 4 * 16 * 2),
        (DENSE, 3, 2, True, 2 * 1 * 16 * 2),
        (DENSE, 8, 1, False, 2 * 1 * 16 * 1),
        (MLA, 1, 2, True, (32 + 8) * 2),  # the latent and the rope key, whatever the TP
        (MLA, 8, 2, True, (32 + 8) * 2),
        (MLA, 4, 2, False, 2 * 3 * (16 + 8) * 2),  # MLA off: full heads, V padded to the qk size
        (MLA, 8, 2, False, 2 * 1 * (16 + 8) * 2),  # 12 heads over 8 ranks: one each
    ],
)
def test_kv_bytes_per_token_per_layer(arch: ModelArch, tp: int, kv_bytes: int, mla: bool, per_token: int) -> None:
    assert kv_bytes_per_token_per_layer(arch, tp, kv_bytes, mla) == per_token


@pytest.mark.parametrize(("vocab", "padded"), [(100, 128), (128, 128), (129, 192), (1, 64)])
def test_the_vocabulary_is_padded_to_a_multiple_of_64(vocab: int, padded: int) -> None:
    assert _padded_vocab(dataclasses.replace(DENSE, vocab_size=vocab)) == padded


# --- parameters per block --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "tp", "mla", "params"),
    [
        # q 12x16, k and v 4x16 each, o: 64x192 + 2 x 64x64 + 192x64.
        (DENSE, 1, True, (64 * 192 + 2 * 64 * 64 + 192 * 64, 0)),
        # 12 heads over 8 ranks: one each, one KV head each.
        (DENSE, 8, True, (64 * 16 + 2 * 64 * 16 + 16 * 64, 0)),
        (dataclasses.replace(DENSE, qkv_bias=True), 1, True, (32768, 192 + 2 * 64)),
        (dataclasses.replace(DENSE, model_type="qwen3"), 1, True, (32768, 2 * 16)),
        (dataclasses.replace(DENSE, model_type="qwen3_moe"), 1, True, (32768, 2 * 16)),
        # gpt-oss: qkv biases, o_proj's bias and a sink per head.
        (dataclasses.replace(DENSE, model_type="gpt_oss", qkv_bias=True), 1, True, (32768, 192 + 128 + 64 + 12)),
        (dataclasses.replace(DENSE, model_type="gpt_oss"), 8, True, (4096, 64 + 1)),
        # MLA at TP 4 (3 heads a rank, qk 24): q_a + q_b, kv_a (replicated), kv_b, o; the norms, and kv_b again
        # dequantized for the absorbed path when MLA is on.
        (MLA, 4, True, (64 * 24 + 24 * 3 * 24 + 64 * 40 + 32 * 3 * 32 + 3 * 16 * 64, 24 + 32 + 32 * 3 * 32)),
        (MLA, 4, False, (64 * 24 + 24 * 3 * 24 + 64 * 40 + 32 * 3 * 32 + 3 * 16 * 64, 24 + 32)),
        # Without q compression, q straight from the hidden state.
        (dataclasses.replace(MLA, q_lora_rank=0), 4, False, (64 * 3 * 24 + 64 * 40 + 32 * 3 * 32 + 3 * 16 * 64, 32)),
        (dataclasses.replace(MLA, q_lora_rank=0), 8, False, (64 * 1 * 24 + 64 * 40 + 32 * 1 * 32 + 1 * 16 * 64, 32)),
    ],
)
def test_attention_params(arch: ModelArch, tp: int, mla: bool, params: tuple[int, int]) -> None:
    assert _attention_params(arch, tp, mla) == params


@pytest.mark.parametrize(
    ("arch", "index", "tp", "params"),
    [
        (DENSE, 0, 1, (3 * 64 * 160, 0.0)),
        (DENSE, 2, 8, (3 * 64 * 160 / 8, 0.0)),
        (MOE, 0, 2, (3 * 64 * 160 / 2, 0.0)),  # a dense first layer
        # 4 experts and the shared one (as wide as an expert), split by TP; the router replicated.
        (MOE, 1, 2, (4 * 3 * 64 * 40 / 2 + 1 * 3 * 64 * 40 / 2, 4 * 64)),
        # Qwen2-MoE's wider shared expert, and its gate.
        (dataclasses.replace(MOE, shared_expert_intermediate_size=48), 2, 2, (15360 + 3 * 64 * 48 / 2, 256 + 64)),
        # DeepSeek's e_score_correction_bias per expert, in fp32.
        (dataclasses.replace(MOE, kv_lora_rank=32), 1, 2, (15360 + 3840, 256 + 4 * 2)),
        # gpt-oss: a router bias and biases on each expert's projections.
        (dataclasses.replace(MOE, model_type="gpt_oss"), 1, 2, (15360 + 3840, 256 + 4 * (1 + 3 * 40 / 2 + 64))),
        (dataclasses.replace(MOE, model_type="gpt_oss", num_shared_experts=0), 1, 4, (7680, 256 + 4 * (1 + 30 + 64))),
        # Biases and a shared-expert gate together: the gate adds to the biases.
        (
            dataclasses.replace(MOE, model_type="gpt_oss", shared_expert_intermediate_size=48),
            1,
            2,
            (15360 + 3 * 64 * 48 / 2, 256 + 4 * (1 + 3 * 40 / 2 + 64) + 64),
        ),
    ],
)
def test_mlp_params(arch: ModelArch, index: int, tp: int, params: tuple[float, float]) -> None:
    assert _mlp_params(arch, index, tp) == params


# --- a stage's weights and the checkpoint ----------------------------------------------------------------

LAYER_Q = 32768 + 3 * 64 * 160  # one DENSE layer's linear params at TP 1
LAYER_PLAIN = 2 * 64  # its two norms


@pytest.mark.parametrize(
    ("arch", "where", "plain", "quantized"),
    [
        # One stage: the padded embedding, the final norm and the LM head, three layers.
        (
            DENSE,
            dict(start=0, end=3, pp=1, first=True, last=True),
            128 * 64 + 64 + 128 * 64 + 3 * LAYER_PLAIN,
            3 * LAYER_Q,
        ),
        # A middle stage holds its layers only.
        (DENSE, dict(start=1, end=2, pp=3, first=False, last=False), LAYER_PLAIN, LAYER_Q),
        (DENSE, dict(start=0, end=0, pp=3, first=False, last=False), 0, 0),
        (DENSE, dict(start=0, end=1, pp=2, first=True, last=False), 128 * 64 + LAYER_PLAIN, LAYER_Q),
        (DENSE, dict(start=1, end=3, pp=2, first=False, last=True), 64 + 128 * 64 + 2 * LAYER_PLAIN, 2 * LAYER_Q),
        # A tied head shares the embedding only when one stage holds both.
        (
            dataclasses.replace(DENSE, tie_word_embeddings=True),
            dict(start=0, end=3, pp=1, first=True, last=True),
            128 * 64 + 64 + 3 * LAYER_PLAIN,
            3 * LAYER_Q,
        ),
        (
            dataclasses.replace(DENSE, tie_word_embeddings=True),
            dict(start=1, end=3, pp=2, first=False, last=True),
            64 + 128 * 64 + 2 * LAYER_PLAIN,
            2 * LAYER_Q,
        ),
    ],
)
def test_stage_weight_bytes(arch: ModelArch, where: dict[str, int], plain: int, quantized: int) -> None:
    got = stage_weight_bytes(arch, tp=1, act_bytes=2, linear_bytes=0.5, mla_enabled=True, **where)  # type: ignore[arg-type]
    assert got == plain * 2 + quantized * 0.5


def test_a_stage_on_tp_ranks_takes_its_slice_of_the_vocabulary() -> None:
    got = stage_weight_bytes(
        DENSE, 0, 1, tp=2, pp=2, first=True, last=False, act_bytes=1, linear_bytes=1.0, mla_enabled=True
    )
    assert got == 128 / 2 * 64 + (64 * 96 + 2 * 64 * 32 + 96 * 64 + 3 * 64 * 160 / 2) + LAYER_PLAIN


def test_an_mla_stage_counts_the_absorbed_copy_only_when_mla_is_on() -> None:
    on = stage_weight_bytes(
        MLA, 0, 1, tp=4, pp=3, first=False, last=False, act_bytes=2, linear_bytes=1.0, mla_enabled=True
    )
    off = stage_weight_bytes(
        MLA, 0, 1, tp=4, pp=3, first=False, last=False, act_bytes=2, linear_bytes=1.0, mla_enabled=False
    )
    assert on - off == 32 * 3 * 32 * 2


@pytest.mark.parametrize(
    ("arch", "act_bytes", "linear_bytes", "weight"),
    [
        # The embedding and the head at the real vocabulary (100 x 64 each), the final norm, three layers.
        (DENSE, 2, 0.5, (100 * 64 * 2 + 64 + 3 * LAYER_PLAIN) * 2 + 3 * LAYER_Q * 0.5),
        (DENSE, 1, 1.0, 100 * 64 * 2 + 64 + 3 * (LAYER_PLAIN + LAYER_Q)),
        (
            dataclasses.replace(DENSE, tie_word_embeddings=True),
            2,
            0.5,
            (100 * 64 + 64 + 3 * LAYER_PLAIN) * 2 + 3 * LAYER_Q * 0.5,
        ),
        # MLA checkpoints hold no absorbed copy.
        (
            MLA,
            2,
            1.0,
            (100 * 64 * 2 + 64 + 3 * (24 + 32 + LAYER_PLAIN)) * 2
            + 3 * (64 * 24 + 24 * 12 * 24 + 64 * 40 + 32 * 12 * 32 + 12 * 16 * 64 + 3 * 64 * 160),
        ),
    ],
)
def test_checkpoint_bytes_are_the_files_weights_once(
    arch: ModelArch, act_bytes: int, linear_bytes: float, weight: float
) -> None:
    assert checkpoint_bytes(arch, act_bytes=act_bytes, linear_bytes=linear_bytes) == weight


def test_model_params_count_every_weight_once() -> None:
    assert model_params(DENSE) == 100 * 64 * 2 + 64 + 3 * (LAYER_PLAIN + LAYER_Q) == 203712


# --- the checkpoint forms the advisor proposes -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "keys"),
    [
        (CheckpointFormat("fp16"), {"dtype": "half"}),
        (
            CheckpointFormat("gptq-int4", "gptq", 4),
            {"quantization": "gptq", "quantBits": 4, "groupSize": 128, "dtype": "half"},
        ),
        (
            CheckpointFormat("awq-int8-g64", "awq", 8, 64),
            {"quantization": "awq", "quantBits": 8, "groupSize": 64, "dtype": "half"},
        ),
        (CheckpointFormat("fp8", "fp8", 8), {"quantization": "fp8", "dtype": "half"}),
        (CheckpointFormat("bnb-int4", "bitsandbytes", 4), {"quantization": "bitsandbytes", "dtype": "half"}),
        # A GGUF is sized from its bits per weight: Qwen3-32B's 32,762,123,264 weights.
        (CheckpointFormat("gguf-q8_0", "gguf", 8, bits_per_weight=8.5), {"quantization": "gguf", "sizeGib": 32.4}),
        (CheckpointFormat("gguf-q4_k_m", "gguf", 4, bits_per_weight=4.5), {"quantization": "gguf", "sizeGib": 17.2}),
    ],
)
def test_the_model_keys_of_each_checkpoint_form(fmt: CheckpointFormat, keys: dict[str, object]) -> None:
    arch = model_arch("qwen3-32b")
    assert model_params(arch) == 32762123264
    assert fmt.model_keys(arch) == keys
