"""Capacity figures pinned to values worked out here by hand from each model's config.json, and to a real
vLLM start-up log: never computed with the planner itself, so a 1 % slip in its arithmetic fails.

Only what does not depend on the calibrated overheads is pinned (activation peak and non-torch memory
are calibrated on logs in tests/test_capacity.py): weights per GPU and KV-cache bytes per token.
The rules written out below are vLLM's (the planner's module docstring cites them): column/row
parallel layers split by TP; KV heads max(1, kv_heads // TP) per GPU; MLA's q_a/kv_a projections,
MoE routers and norms replicated; vocabulary padded to a multiple of 64 and split by TP; embedding on
the first pipeline stage, LM head and final norm on the last; fp16 = 2 bytes.
"""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.vllm.memory import estimate
from components.engines.weights import GIB
from components.facts.models import model_arch
from components.planning.capacity import capacity_report
from components.spec import StackSpec

FP16 = 2
# GPTQ int4, group 128: 4 bits per weight, one fp16 scale and one packed 4-bit zero per 128 weights.
GPTQ4_G128 = 0.5 + (2 + 0.5) / 128


def qwen3_30b_a3b_weights_per_gpu(tp: int) -> int:
    """Qwen/Qwen3-30B-A3B config.json: hidden 2048, 48 layers, 32 heads, 4 KV heads, head_dim 128,
    vocab 151936, 128 experts of width 768, untied LM head, q/k norms; all fp16."""
    h, heads, kv_heads, hd = 2048, 32 // tp, max(1, 4 // tp), 128
    attention = h * heads * hd + 2 * h * kv_heads * hd + heads * hd * h + 2 * hd  # q, k+v, o, q/k norms
    experts = 128 * 3 * h * 768 // tp
    router = 128 * h
    norms = 2 * h
    per_layer = attention + experts + router + norms
    vocab = 151936  # already a multiple of 64
    return (48 * per_layer + 2 * (vocab // tp) * h + h) * FP16  # + embedding, LM head, final norm


def test_qwen3_30b_a3b_tp8_weights_and_kv_per_v100_as_the_chat_pool_runs_it() -> None:
    est = estimate(
        model_arch("qwen3-30b-a3b"),
        32,
        tp=8,
        pp=1,
        gpu_memory_utilization=0.9,
        dtype="float16",
        max_model_len=32768,
        max_num_seqs=128,
    )
    assert qwen3_30b_a3b_weights_per_gpu(8) == 7_680_585_728
    assert est.weights_gib_per_gpu * GIB == pytest.approx(7_680_585_728, rel=1e-9)
    # 4 KV heads over TP 8: one (replicated) head per GPU; K and V, 128 wide, fp16, 48 layers.
    assert est.kv_bytes_per_token_per_gpu == 48 * 2 * 1 * 128 * FP16 == 24_576


def test_qwen3_30b_a3b_tp4_weights_match_vllms_own_log() -> None:
    # tests/fixtures/vllm-startup-logs/qwen3-30b-a3b.tp4.v0.8.5-v1.weights-only.vllm-issue-17469.log:
    # "Model loading took 14.2474 GiB" (bf16, TP 4). The hand count is 0.08 % under it (allocator
    # rounding); 0.2 % is a tenth of what a 1 % slip in the expert arithmetic moves.
    by_hand = qwen3_30b_a3b_weights_per_gpu(4)
    assert by_hand == 15_285_252_096 and by_hand / GIB == pytest.approx(14.2474, rel=0.002)
    est = estimate(
        model_arch("qwen3-30b-a3b"),
        80,
        tp=4,
        pp=1,
        gpu_memory_utilization=0.9,
        dtype="bfloat16",
        max_model_len=8192,
        max_num_seqs=128,
    )
    assert est.weights_gib_per_gpu == pytest.approx(14.2474, rel=0.002)
    assert est.weights_gib_per_gpu * GIB == pytest.approx(by_hand, rel=1e-9)


@pytest.mark.parametrize(
    ("model", "weights", "kv"),
    [
        # Qwen/Qwen3-32B: hidden 5120, 64 layers, 64 heads, 8 KV heads, head_dim 128, MLP 25600,
        # vocab 151936, q/k norms. Per layer per GPU: q 5120x1024, k+v 2x5120x128, o 1024x5120,
        # MLP 3x5120x3200, norms 2x5120 + 2x128 = 60_958_976; embedding and LM head 18992x5120 each.
        ("qwen3-32b", (64 * 60_958_976 + 2 * 18_992 * 5120 + 5120) * FP16, 64 * 2 * 1 * 128 * FP16),
        # meta-llama/Llama-3.3-70B-Instruct: hidden 8192, 80 layers, 64 heads, 8 KV heads, head_dim 128,
        # MLP 28672, vocab 128256. Per layer per GPU: q 8192x1024, k+v 2x8192x128, o 1024x8192,
        # MLP 3x8192x3584, norms 2x8192 = 106_971_136; embedding and LM head 16032x8192 each.
        ("llama-3.3-70b", (80 * 106_971_136 + 2 * 16_032 * 8192 + 8192) * FP16, 80 * 2 * 1 * 128 * FP16),
    ],
)
def test_dense_catalog_models_tp8_on_v100(model: str, weights: int, kv: int) -> None:
    est = estimate(
        model_arch(model),
        32,
        tp=8,
        pp=1,
        gpu_memory_utilization=0.9,
        dtype="float16",
        max_model_len=8192,
        max_num_seqs=64,
    )
    assert est.weights_gib_per_gpu * GIB == pytest.approx(weights, rel=1e-9)
    assert est.kv_bytes_per_token_per_gpu == kv


def deepseek_r1_gptq_stage_bytes(first: bool, last: bool, dense: int, moe: int) -> float:
    """deepseek-ai/DeepSeek-R1 config.json: hidden 7168, 128 heads (16 per GPU at TP 8), q_lora_rank
    1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128, dense MLP 18432, 256 routed + 1 shared
    experts of width 2048, vocab 129280. GPTQ int4 g128 for every decoder linear layer (experts
    included), fp16 for embedding, LM head, norms, routers, e_score_correction_bias (fp32) and, with MLA
    on, the dequantized W_UK/W_UV copies of kv_b_proj."""
    h, heads = 7168, 16
    q = h * 1536 + 1536 * heads * (128 + 64)  # q_a (replicated), q_b
    kv_a = h * (512 + 64)  # replicated
    kv_b = 512 * heads * (128 + 128)
    o = heads * 128 * h
    attention_int4 = q + kv_a + kv_b + o
    attention_fp16 = 1536 + 512 + kv_b  # q_a/kv_a layernorms, absorbed MLA copies
    dense_int4 = 3 * h * 18432 // 8
    moe_int4 = (256 + 1) * 3 * h * 2048 // 8
    moe_fp16 = 256 * h + 256 * 2  # router, fp32 bias as two fp16 slots
    layers = dense + moe
    int4 = layers * attention_int4 + dense * dense_int4 + moe * moe_int4
    fp16 = layers * (attention_fp16 + 2 * h) + moe * moe_fp16
    vocab_slice = 129280 // 8 * h  # 129280 is a multiple of 64
    fp16 += (vocab_slice if first else 0) + ((vocab_slice + h) if last else 0)
    return fp16 * FP16 + int4 * GPTQ4_G128


def test_deepseek_r1_gptq_tp8_pp2_weights_and_kv_per_v100_as_the_reasoning_pool_runs_it() -> None:
    # 61 layers over PP 2: vLLM gives the extra layer to the first stage (31 = 3 dense + 28 MoE, then 30 MoE).
    stage0 = deepseek_r1_gptq_stage_bytes(first=True, last=False, dense=3, moe=28)
    stage1 = deepseek_r1_gptq_stage_bytes(first=False, last=True, dense=0, moe=30)
    assert (stage0, stage1) == (21_713_527_040, 23_090_459_136)
    est = estimate(
        model_arch("deepseek-r1"),
        32,
        tp=8,
        pp=2,
        gpu_memory_utilization=0.92,
        dtype="float16",
        quantization="gptq",
        quant_bits=4,
        group_size=128,
        max_model_len=16384,
        max_num_seqs=32,
    )
    assert est.layers_per_stage == (31, 30)
    assert est.weights_gib_per_gpu * GIB == pytest.approx(stage1, rel=1e-9)
    # MLA caches the 512-wide latent plus the 64-wide rope key, fp16, the same on every rank. The
    # second stage holds 1.3 GiB more weights in one layer fewer, so it has fewer blocks for any
    # overhead (its free memory per layer is lower as long as the first stage's is under 39 GiB).
    assert est.kv_bytes_per_token_per_gpu == 30 * (512 + 64) * FP16 == 34_560


def _pool(report: dict[str, Any], pool: str) -> dict[str, Any]:
    entry = report[pool]
    return entry["asDeployed"] if "asDeployed" in entry else entry


def test_the_reference_stacks_capacity_table_carries_the_hand_counted_figures(prod_spec: StackSpec) -> None:
    report = capacity_report(prod_spec)
    # The reasoning pool runs MLA off on V100 (VLLM_MLA_DISABLE=1); the hand-counted MLA figures are the
    # report's MLA-on alternative.
    chat, reasoning = _pool(report, "chat"), report["reasoning"]["mlaOn"]
    # MLA off: full K and V for 128 / 8 = 16 heads per GPU, V padded to the qk head size 128 + 64 = 192,
    # fp16, on the last stage's 30 of 61 layers (it holds the LM head, so it has the fewest blocks).
    assert report["reasoning"]["asDeployed"]["kv_bytes_per_token_per_gpu"] == 30 * 2 * 16 * 192 * FP16 == 368_640
    assert chat["weights_gib_per_gpu"] == round(7_680_585_728 / GIB, 4)
    assert chat["kv_bytes_per_token_per_gpu"] == 24_576
    assert reasoning["weights_gib_per_gpu"] == round(23_090_459_136 / GIB, 4)
    assert reasoning["kv_bytes_per_token_per_gpu"] == 34_560
    # The whole model once: every stage on every one of its 8 TP ranks.
    assert reasoning["weights_gib_total"] == round(8 * (21_713_527_040 + 23_090_459_136) / GIB, 4)
