"""How a checkpoint's weights weigh and split: parameters per layer, bytes per quantized weight, layers per
pipeline stage, KV bytes per token — model shape in, figures out, the same for every engine.

The split follows vLLM's layers (column/row parallel divide by TP; MLA's q_a/kv_a projections, MoE
routers and norms are replicated; KV heads are replicated when fewer than TP; the vocabulary padded to a
multiple of 64): the engines' own capacity models start from these figures (components/engines/vllm/
memory.py states the assumptions in full).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.facts.models import ModelArch

GIB = 1024**3
# Checkpoint methods that store FP8 (or FP4) weights: no FP8 units on Volta or Turing (vLLM 0.19.1
# quantization/*.py, as components/engines/vllm/facts.py cites).
FP8_WEIGHT_METHODS = frozenset({"fp8", "fbgemm_fp8", "ptpc_fp8", "modelopt", "modelopt_fp4", "modelopt_mxfp8", "mxfp8"})
# Weight-only integer schemes whose overhead is one fp16 scale + one packed zero per group.
GROUPED_INT_METHODS = frozenset(
    {"gptq", "awq", "moe_wna16", "gptq_marlin", "awq_marlin", "compressed-tensors", "auto-round"}
)
QUANTIZATIONS = GROUPED_INT_METHODS | FP8_WEIGHT_METHODS | {"bitsandbytes"}
# vLLM pads the vocabulary of VocabParallelEmbedding/ParallelLMHead to a multiple of this.
VOCAB_PADDING = 64


@dataclass(frozen=True)
class CheckpointFormat:
    """A form of a model's weights an engine can load, as the placement advisor proposes it (plan.advise):
    the `models.*` keys it sets."""

    label: str  # "fp16", "gptq-int4", "gguf-q8_0": how the advisor names it
    quantization: str | None = None  # models.*.quantization; None: the fp16/bf16 checkpoint
    bits: int = 16  # models.*.quantBits of an integer method
    group_size: int = 128  # models.*.groupSize of an integer method
    # A single-file format the engine sizes from models.*.sizeGib (GGUF): bits per weight of its tensors.
    bits_per_weight: float | None = None

    def model_keys(self, arch: ModelArch) -> dict[str, object]:
        """The models.* keys of a checkpoint of `arch` in this form (besides arch, path and served names)."""
        if self.bits_per_weight is not None:
            return {
                "quantization": self.quantization,
                "sizeGib": round(model_params(arch) * self.bits_per_weight / 8 / GIB, 1),
            }
        if self.quantization is None:
            return {"dtype": "half"}
        if self.quantization in GROUPED_INT_METHODS:
            return {
                "quantization": self.quantization,
                "quantBits": self.bits,
                "groupSize": self.group_size,
                "dtype": "half",
            }
        return {"quantization": self.quantization, "dtype": "half"}


def layers_per_stage(num_layers: int, pp: int) -> list[int]:
    """Decoder layers per pipeline stage, as vLLM's get_pp_indices splits them."""
    if pp < 1 or pp > num_layers:
        raise ValueError(f"pipeline parallel size {pp} must be between 1 and the {num_layers} layers")
    parts = [num_layers // pp] * pp
    # vLLM gives the remainder to the stages just before the last one (the last holds the LM head).
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def linear_bytes_per_param(quantization: str | None, act_bytes: int, quant_bits: int, group_size: int) -> float:
    """Bytes one quantized linear-layer weight costs, scales and zero points included."""
    if quantization is None:
        return float(act_bytes)
    if quantization in FP8_WEIGHT_METHODS:
        return 1.0
    if quantization == "bitsandbytes":
        return quant_bits / 8 + 1 / 64 + 4 / (64 * 256)
    if quantization in GROUPED_INT_METHODS:
        # One fp16 scale and one zero packed at `bits` per group; per-channel when group_size <= 0.
        per_group = (2 + quant_bits / 8) / group_size if group_size > 0 else 0.0
        return quant_bits / 8 + per_group
    raise ValueError(f"quantization {quantization!r} is not modelled; known: {', '.join(sorted(QUANTIZATIONS))}")


def kv_heads_per_gpu(arch: ModelArch, tp: int) -> int:
    """KV heads on one TP rank: vLLM replicates them when there are fewer than TP."""
    return max(1, arch.num_kv_heads // tp)


def kv_bytes_per_token_per_layer(arch: ModelArch, tp: int, kv_bytes: int, mla_enabled: bool) -> int:
    """KV cache bytes one token costs in one layer on one GPU."""
    if arch.uses_mla and mla_enabled:
        # MLA caches the compressed latent plus the shared rope key, the same on every TP rank.
        return (arch.kv_lora_rank + arch.qk_rope_head_dim) * kv_bytes
    if arch.uses_mla:
        # MLA off (VLLM_MLA_DISABLE=1): full per-head K and V; vLLM pads V to the qk head size.
        return 2 * (arch.num_attention_heads // tp) * (arch.qk_nope_head_dim + arch.qk_rope_head_dim) * kv_bytes
    return 2 * kv_heads_per_gpu(arch, tp) * arch.head_dim * kv_bytes


def _padded_vocab(arch: ModelArch) -> int:
    return -(-arch.vocab_size // VOCAB_PADDING) * VOCAB_PADDING


def _attention_params(arch: ModelArch, tp: int, mla_enabled: bool) -> tuple[float, float]:
    """(quantizable linear params, params kept in the activation dtype) of one attention block per GPU."""
    h, heads = arch.hidden_size, arch.num_attention_heads // tp
    if arch.uses_mla:
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        q = (h * arch.q_lora_rank + arch.q_lora_rank * heads * qk) if arch.q_lora_rank else h * heads * qk
        kv_a = h * (arch.kv_lora_rank + arch.qk_rope_head_dim)  # replicated on every rank
        kv_b = arch.kv_lora_rank * heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        o = heads * arch.v_head_dim * h
        norms = arch.q_lora_rank + arch.kv_lora_rank
        # With MLA, vLLM keeps dequantized W_UK^T and W_UV (the size of kv_b) for the absorbed path.
        absorbed = kv_b if mla_enabled else 0
        return q + kv_a + kv_b + o, norms + absorbed
    kv = kv_heads_per_gpu(arch, tp) * arch.head_dim
    q = heads * arch.head_dim
    linear = h * q + 2 * h * kv + q * h
    bias = (q + 2 * kv) if arch.qkv_bias else 0
    if arch.model_type == "gpt_oss":
        bias += h + heads  # o_proj bias and per-head attention sinks
    qk_norms = 2 * arch.head_dim if arch.model_type in ("qwen3", "qwen3_moe") else 0
    return linear, bias + qk_norms


def _mlp_params(arch: ModelArch, index: int, tp: int) -> tuple[float, float]:
    """(quantizable linear params, unquantized params) of one MLP/MoE block per GPU."""
    h = arch.hidden_size
    if not arch.is_moe_layer(index):
        return 3 * h * arch.intermediate_size / tp, 0.0
    experts = arch.num_experts * 3 * h * arch.moe_intermediate_size / tp
    shared_width = arch.shared_expert_intermediate_size or arch.moe_intermediate_size
    shared = arch.num_shared_experts * 3 * h * shared_width / tp
    router = arch.num_experts * h  # replicated, never quantized
    extra = 0.0
    if arch.uses_mla:
        extra = arch.num_experts * 2  # e_score_correction_bias (fp32 = 2 fp16 slots)
    if arch.model_type == "gpt_oss":
        extra = arch.num_experts * (1 + 3 * arch.moe_intermediate_size / tp + h)  # router/expert biases
    if arch.shared_expert_intermediate_size:
        extra += h  # Qwen2-MoE's shared_expert_gate
    return experts + shared, router + extra


def stage_weight_bytes(
    arch: ModelArch,
    start: int,
    end: int,
    *,
    tp: int,
    pp: int,
    first: bool,
    last: bool,
    act_bytes: int,
    linear_bytes: float,
    mla_enabled: bool,
) -> float:
    """Weight bytes on one GPU of the pipeline stage holding layers [start, end)."""
    h = arch.hidden_size
    vocab_slice = _padded_vocab(arch) / tp * h
    plain = 0.0
    if first:
        plain += vocab_slice
    if last:
        plain += h  # final norm
        if not (arch.tie_word_embeddings and pp == 1):
            plain += vocab_slice  # LM head (a tied head shares the embedding only when one stage has both)
    quantized = 0.0
    attn_q, attn_p = _attention_params(arch, tp, mla_enabled)  # the same in every layer
    for i in range(start, end):
        mlp_q, mlp_p = _mlp_params(arch, i, tp)
        quantized += attn_q + mlp_q
        plain += attn_p + mlp_p + 2 * h  # input and post-attention norms
    return plain * act_bytes + quantized * linear_bytes


def checkpoint_bytes(arch: ModelArch, *, act_bytes: int, linear_bytes: float) -> float:
    """The model's weights once, as its files hold them: no TP split, no vocabulary padding, no MLA copies.

    Linear layers cost `linear_bytes` per parameter (quantized), embeddings, LM head, norms, biases and
    routers `act_bytes` (linear_bytes_per_param gives the former).
    """
    padding = (_padded_vocab(arch) - arch.vocab_size) * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return (
        stage_weight_bytes(
            arch,
            0,
            arch.num_layers,
            tp=1,
            pp=1,
            first=True,
            last=True,
            act_bytes=act_bytes,
            linear_bytes=linear_bytes,
            mla_enabled=False,
        )
        - padding * act_bytes
    )


def model_params(arch: ModelArch) -> float:
    """Total parameters the planner counts for the model (one copy, no padding), for cross-checks."""
    return checkpoint_bytes(arch, act_bytes=1, linear_bytes=1.0)
