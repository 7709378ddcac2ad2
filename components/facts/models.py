"""Model architecture facts (from published config.json files) that the capacity planner needs.

Every catalog entry cites the Hugging Face repo whose config.json it copies. Entries marked "checked"
were compared with copies of that config.json found in public code; the others (Llama-3.3-70B,
Llama-3.1-405B, Qwen3-235B-A22B, gpt-oss-120b, DeepSeek-R1/V3) are transcribed from the cited file
without a second copy to compare against, and their total parameter counts are cross-checked
against the model cards by tests/test_models_catalog.py.
`params_b` is the total parameter count the model card publishes (billions), kept to cross-check
the planner's own count; it is never used for sizing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# config.json model_type values this module reads, grouped by the attention/MLP family vLLM uses.
_DENSE_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_MOE_TYPES = frozenset({"qwen2_moe", "qwen3_moe"})
_MLA_TYPES = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})
_GPT_OSS_TYPES = frozenset({"gpt_oss"})
# Families whose q/k/v projections carry a bias (Qwen2 always does; gpt-oss sets attention_bias).
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})


@dataclass(frozen=True)
class ModelArch:
    """The architecture of one model, as its config.json states it."""

    name: str
    hf_id: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    intermediate_size: int  # dense MLP width (dense models, and dense layers of MoE models)
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    params_b: float | None = None  # published total parameter count, billions
    # MoE
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0  # 0: shared experts use moe_intermediate_size
    first_k_dense_replace: int = 0  # the first k layers keep a dense MLP
    # MLA (DeepSeek-V2/V3 family)
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # 0: no q compression (q_proj straight from hidden)
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Context window, as vLLM derives it (ModelConfig._get_and_verify_max_len): the smallest length key
    # of config.json, then its rope_scaling (a tuple of (key, value) pairs, hashable).
    max_position_embeddings: int = 0  # 0: config.json states no length key
    length_key: str = "max_position_embeddings"
    rope_scaling: tuple[tuple[str, Any], ...] = ()

    @property
    def uses_mla(self) -> bool:
        """Whether the model has Multi-head Latent Attention (a compressed KV cache in vLLM)."""
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        """Whether the model routes tokens to experts."""
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer `index` has a routed-expert MLP rather than a dense one."""
        return self.is_moe and index >= self.first_k_dense_replace


MODELS: dict[str, ModelArch] = {
    m.name: m
    for m in [
        # Qwen/Qwen3-30B-A3B — https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (checked)
        ModelArch(
            "qwen3-30b-a3b",
            "Qwen/Qwen3-30B-A3B",
            "qwen3_moe",
            num_layers=48,
            hidden_size=2048,
            num_attention_heads=32,
            num_kv_heads=4,
            head_dim=128,
            vocab_size=151936,
            intermediate_size=6144,
            num_experts=128,
            experts_per_token=8,
            moe_intermediate_size=768,
            params_b=30.5,
            max_position_embeddings=40960,
        ),
        # Qwen/Qwen3-32B — https://huggingface.co/Qwen/Qwen3-32B/blob/main/config.json (checked)
        ModelArch(
            "qwen3-32b",
            "Qwen/Qwen3-32B",
            "qwen3",
            num_layers=64,
            hidden_size=5120,
            num_attention_heads=64,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=151936,
            intermediate_size=25600,
            params_b=32.8,
            max_position_embeddings=40960,
        ),
        # meta-llama/Llama-3.3-70B-Instruct —
        # https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json
        # (same shape as Llama-3.1-70B; head_dim not in the file: hidden/heads = 128)
        ModelArch(
            "llama-3.3-70b",
            "meta-llama/Llama-3.3-70B-Instruct",
            "llama",
            num_layers=80,
            hidden_size=8192,
            num_attention_heads=64,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
            intermediate_size=28672,
            params_b=70.6,
            max_position_embeddings=131072,
            rope_scaling=(("rope_type", "llama3"), ("factor", 8.0), ("original_max_position_embeddings", 8192)),
        ),
        # openai/gpt-oss-120b — https://huggingface.co/openai/gpt-oss-120b/blob/main/config.json
        # (num_local_experts=128, experts_per_token=4, intermediate_size=2880 is the expert width).
        # Not runnable on vLLM 0.9.2 (added in 0.10.1); listed because the runbook lists it.
        ModelArch(
            "gpt-oss-120b",
            "openai/gpt-oss-120b",
            "gpt_oss",
            num_layers=36,
            hidden_size=2880,
            num_attention_heads=64,
            num_kv_heads=8,
            head_dim=64,
            vocab_size=201088,
            intermediate_size=2880,
            qkv_bias=True,
            num_experts=128,
            experts_per_token=4,
            moe_intermediate_size=2880,
            params_b=116.8,
            max_position_embeddings=131072,
            rope_scaling=(("rope_type", "yarn"), ("factor", 32.0), ("original_max_position_embeddings", 4096)),
        ),
        # Qwen/Qwen3-235B-A22B — https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json
        ModelArch(
            "qwen3-235b-a22b",
            "Qwen/Qwen3-235B-A22B",
            "qwen3_moe",
            num_layers=94,
            hidden_size=4096,
            num_attention_heads=64,
            num_kv_heads=4,
            head_dim=128,
            vocab_size=151936,
            intermediate_size=12288,
            num_experts=128,
            experts_per_token=8,
            moe_intermediate_size=1536,
            params_b=235.0,
            max_position_embeddings=40960,
        ),
        # meta-llama/Llama-3.1-405B-Instruct —
        # https://huggingface.co/meta-llama/Llama-3.1-405B-Instruct/blob/main/config.json
        ModelArch(
            "llama-3.1-405b",
            "meta-llama/Llama-3.1-405B-Instruct",
            "llama",
            num_layers=126,
            hidden_size=16384,
            num_attention_heads=128,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=128256,
            intermediate_size=53248,
            params_b=405.0,
            max_position_embeddings=131072,
            rope_scaling=(("rope_type", "llama3"), ("factor", 8.0), ("original_max_position_embeddings", 8192)),
        ),
        # deepseek-ai/DeepSeek-R1 — https://huggingface.co/deepseek-ai/DeepSeek-R1/blob/main/config.json
        # (identical to DeepSeek-V3's). The MTP layer (num_nextn_predict_layers=1) is not loaded by
        # vLLM without speculative decoding, so params_b is 671, not the 685 HF shows.
        ModelArch(
            "deepseek-r1",
            "deepseek-ai/DeepSeek-R1",
            "deepseek_v3",
            num_layers=61,
            hidden_size=7168,
            num_attention_heads=128,
            num_kv_heads=128,
            head_dim=192,
            vocab_size=129280,
            intermediate_size=18432,
            num_experts=256,
            experts_per_token=8,
            moe_intermediate_size=2048,
            num_shared_experts=1,
            first_k_dense_replace=3,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            params_b=671.0,
            max_position_embeddings=163840,
            rope_scaling=(("rope_type", "yarn"), ("factor", 40.0), ("original_max_position_embeddings", 4096)),
        ),
        # moonshotai/Kimi-K2-Instruct — https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json
        # (DeepSeek-V3 shape with 64 heads, 384 experts, 1 dense layer; checked against a copy of
        # the Kimi-K2.5 text_config. vocab_size 163840 from the K2 config, not re-checked.)
        ModelArch(
            "kimi-k2",
            "moonshotai/Kimi-K2-Instruct",
            "kimi_k2",
            num_layers=61,
            hidden_size=7168,
            num_attention_heads=64,
            num_kv_heads=64,
            head_dim=192,
            vocab_size=163840,
            intermediate_size=18432,
            num_experts=384,
            experts_per_token=8,
            moe_intermediate_size=2048,
            num_shared_experts=1,
            first_k_dense_replace=1,
            kv_lora_rank=512,
            q_lora_rank=1536,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            params_b=1000.0,
            max_position_embeddings=131072,
            rope_scaling=(("rope_type", "yarn"), ("factor", 32.0), ("original_max_position_embeddings", 4096)),
        ),
        # deepseek-ai/DeepSeek-R1-Distill-Qwen-32B —
        # https://huggingface.co/deepseek-ai/DeepSeek-R1-Distill-Qwen-32B/blob/main/config.json
        # (Qwen2.5-32B's architecture; checked against a copy of Qwen2.5-32B's config.json)
        ModelArch(
            "deepseek-r1-distill-qwen-32b",
            "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
            "qwen2",
            num_layers=64,
            hidden_size=5120,
            num_attention_heads=40,
            num_kv_heads=8,
            head_dim=128,
            vocab_size=152064,
            intermediate_size=27648,
            qkv_bias=True,
            params_b=32.8,
            max_position_embeddings=131072,
        ),
    ]
}
# deepseek-ai/DeepSeek-V3 — https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json:
# the same architecture as R1 (R1 is V3 post-trained), so the entry is R1's under V3's name.
MODELS["deepseek-v3"] = replace(MODELS["deepseek-r1"], name="deepseek-v3", hf_id="deepseek-ai/DeepSeek-V3")


def model_arch(name: str) -> ModelArch:
    """Look a catalog model up by its short name; KeyError lists the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(
            f"unknown model {name!r}; known: {', '.join(sorted(MODELS))} (or give the path of a config.json)"
        ) from None


# config.json keys vLLM reads a model's length from, smallest wins (ModelConfig._get_and_verify_max_len,
# vllm/config.py at v0.9.2; the same list in later lines).
LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# rope types vLLM does not scale the length by (their max_position_embeddings is already the long one).
UNSCALED_ROPE_TYPES = frozenset({"su", "longrope", "llama3"})


def context_window(arch: ModelArch) -> tuple[int, str] | None:
    """The longest max_model_len vLLM accepts for the model, and how it was derived; None when config.json
    states no length (vLLM then assumes 2048 unless --max-model-len is given)."""
    if not arch.max_position_embeddings:
        return None
    length, why = float(arch.max_position_embeddings), f"{arch.length_key}={arch.max_position_embeddings}"
    rope = dict(arch.rope_scaling)
    rope_type = rope.get("rope_type") or rope.get("type")
    # vLLM: Gemma3's length is already scaled; "default" defines no factor.
    if rope and rope_type not in UNSCALED_ROPE_TYPES and "gemma3" not in arch.model_type:
        factor = float(rope.get("factor", 1.0))
        if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
            length = float(rope["original_max_position_embeddings"])
            why = f"rope_scaling yarn: original_max_position_embeddings={int(length)}"
        length *= factor
        why += f" x factor {factor:g}"
    return int(length), why


def _length_fields(data: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """max_position_embeddings (the smallest length key, or model_max_length where stated), and rope_scaling."""
    found = [(int(cfg[k]), k) for k in LENGTH_KEYS if isinstance(cfg.get(k), (int, float))]
    out: dict[str, Any] = {}
    if found:
        length, key = min(found)
        # vLLM lets model_max_length (Command-R, Cohere) override the smallest key.
        if isinstance(cfg.get("model_max_length"), (int, float)):
            length, key = int(cfg["model_max_length"]), "model_max_length"
        out.update(max_position_embeddings=length, length_key=key)
    rope = cfg.get("rope_scaling") or data.get("rope_scaling")
    if isinstance(rope, dict):
        # What the length derivation reads; vLLM renames the older `type` to `rope_type` (patch_rope_scaling).
        rope = {
            "rope_type": rope.get("rope_type", rope.get("type")),
            "factor": rope.get("factor"),
            "original_max_position_embeddings": rope.get("original_max_position_embeddings"),
        }
        out["rope_scaling"] = tuple((k, v) for k, v in rope.items() if v is not None)
    return out


def _required(cfg: dict[str, Any], key: str, name: str) -> Any:
    if cfg.get(key) is None:
        raise ValueError(f"config.json of {name!r} has no {key!r}")
    return cfg[key]


def arch_from_config_json(data: dict[str, Any], name: str) -> ModelArch:
    """Build a ModelArch from a Hugging Face config.json (llama/qwen2/qwen3/qwen3_moe/deepseek/kimi/gpt-oss)."""
    # Multimodal wrappers (and Kimi-K2.5) nest the language model under text_config.
    cfg = data.get("text_config") or data
    model_type = str(cfg.get("model_type") or data.get("model_type") or "")
    known = _DENSE_TYPES | _MOE_TYPES | _MLA_TYPES | _GPT_OSS_TYPES
    if model_type not in known:
        raise ValueError(
            f"model_type {model_type!r} of {name!r} is not one the planner knows: {', '.join(sorted(known))}"
        )
    hidden = int(_required(cfg, "hidden_size", name))
    heads = int(_required(cfg, "num_attention_heads", name))
    common: dict[str, Any] = dict(
        name=name,
        hf_id=str(data.get("_name_or_path") or name),
        model_type=model_type,
        num_layers=int(_required(cfg, "num_hidden_layers", name)),
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        vocab_size=int(_required(cfg, "vocab_size", name)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", data.get("tie_word_embeddings", False))),
        **_length_fields(data, cfg),
    )
    if model_type in _MLA_TYPES:
        nope, rope = int(cfg["qk_nope_head_dim"]), int(cfg["qk_rope_head_dim"])
        return ModelArch(
            **common,
            head_dim=nope + rope,
            intermediate_size=int(cfg.get("intermediate_size") or 0),
            num_experts=int(cfg.get("n_routed_experts") or 0),
            experts_per_token=int(cfg.get("num_experts_per_tok") or 0),
            moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0),
            num_shared_experts=int(cfg.get("n_shared_experts") or 0),
            first_k_dense_replace=int(cfg.get("first_k_dense_replace") or 0),
            kv_lora_rank=int(_required(cfg, "kv_lora_rank", name)),
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            v_head_dim=int(cfg["v_head_dim"]),
        )
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    qkv_bias = model_type in _QKV_BIAS_TYPES or bool(cfg.get("attention_bias", False))
    if model_type in _GPT_OSS_TYPES:
        width = int(_required(cfg, "intermediate_size", name))
        return ModelArch(
            **common,
            head_dim=head_dim,
            intermediate_size=width,
            qkv_bias=qkv_bias,
            num_experts=int(cfg.get("num_local_experts") or 0),
            experts_per_token=int(cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 0),
            moe_intermediate_size=width,
        )
    if model_type in _MOE_TYPES:
        if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step") or 1) != 1:
            raise ValueError(f"{name!r}: MoE layouts with mlp_only_layers or decoder_sparse_step != 1 are not modelled")
        shared = int(cfg.get("shared_expert_intermediate_size") or 0)
        return ModelArch(
            **common,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            intermediate_size=int(cfg.get("intermediate_size") or 0),
            # Qwen's checkpoints write num_experts; transformers 5 saves the same count as num_local_experts
            # (Qwen3MoeConfig.attribute_map maps num_experts to it), which vLLM reads through that map.
            num_experts=int(
                cfg["num_local_experts"]
                if cfg.get("num_experts") is None and cfg.get("num_local_experts") is not None
                else _required(cfg, "num_experts", name)
            ),
            experts_per_token=int(_required(cfg, "num_experts_per_tok", name)),
            moe_intermediate_size=int(_required(cfg, "moe_intermediate_size", name)),
            num_shared_experts=1 if shared else 0,
            shared_expert_intermediate_size=shared,
        )
    return ModelArch(
        **common, head_dim=head_dim, qkv_bias=qkv_bias, intermediate_size=int(_required(cfg, "intermediate_size", name))
    )


def quantization_from_config_json(data: dict[str, Any]) -> tuple[str, int, int] | None:
    """The checkpoint's (method, bits, group_size) from config.json's quantization_config, if any."""
    q = (data.get("text_config") or {}).get("quantization_config") or data.get("quantization_config")
    if not isinstance(q, dict) or not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    bits = int(q.get("bits") or q.get("w_bit") or (4 if q.get("load_in_4bit") else 8))
    group = int(q.get("group_size") or q.get("q_group_size") or (-1 if method != "bitsandbytes" else 64))
    return method, bits, group
