"""Model facts: the catalog matches the published config.json files, and custom configs parse."""

from __future__ import annotations

import pytest

from components.engines.weights import model_params
from components.facts.models import MODELS, arch_from_config_json, model_arch, quantization_from_config_json

# Copied from Qwen/Qwen3-30B-A3B config.json (the fields the planner reads).
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
}
# Copied from deepseek-ai/DeepSeek-R1 config.json.
DEEPSEEK_R1_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
}

# (name, layers, hidden, heads, kv heads, head_dim, vocab, intermediate, experts, top-k, moe width)
EXPECTED = [
    ("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 151936, 6144, 128, 8, 768),
    ("qwen3-32b", 64, 5120, 64, 8, 128, 151936, 25600, 0, 0, 0),
    ("llama-3.3-70b", 80, 8192, 64, 8, 128, 128256, 28672, 0, 0, 0),
    ("gpt-oss-120b", 36, 2880, 64, 8, 64, 201088, 2880, 128, 4, 2880),
    ("qwen3-235b-a22b", 94, 4096, 64, 4, 128, 151936, 12288, 128, 8, 1536),
    ("llama-3.1-405b", 126, 16384, 128, 8, 128, 128256, 53248, 0, 0, 0),
    ("deepseek-r1", 61, 7168, 128, 128, 192, 129280, 18432, 256, 8, 2048),
    ("deepseek-v3", 61, 7168, 128, 128, 192, 129280, 18432, 256, 8, 2048),
    ("kimi-k2", 61, 7168, 64, 64, 192, 163840, 18432, 384, 8, 2048),
    ("deepseek-r1-distill-qwen-32b", 64, 5120, 40, 8, 128, 152064, 27648, 0, 0, 0),
]


@pytest.mark.parametrize("row", EXPECTED, ids=[r[0] for r in EXPECTED])
def test_catalog_entry_matches_its_config_json(row: tuple) -> None:
    name, layers, hidden, heads, kv, head_dim, vocab, inter, experts, topk, moe = row
    a = model_arch(name)
    assert (
        a.num_layers,
        a.hidden_size,
        a.num_attention_heads,
        a.num_kv_heads,
        a.head_dim,
        a.vocab_size,
        a.intermediate_size,
        a.num_experts,
        a.experts_per_token,
        a.moe_intermediate_size,
    ) == (layers, hidden, heads, kv, head_dim, vocab, inter, experts, topk, moe)


def test_catalog_covers_every_model_of_the_runbook_tables() -> None:
    assert {r[0] for r in EXPECTED} <= set(MODELS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_counted_parameters_match_the_published_total(name: str) -> None:
    # The planner's layer-by-layer count must land on the model card's figure; Kimi-K2's card
    # rounds to "1T" (1.026 T counted), hence 3 %.
    a = MODELS[name]
    assert model_params(a) / 1e9 == pytest.approx(a.params_b, rel=0.03)


def test_mla_models_say_so_and_others_do_not() -> None:
    assert model_arch("deepseek-r1").uses_mla and model_arch("kimi-k2").uses_mla
    assert not model_arch("qwen3-32b").uses_mla and not model_arch("gpt-oss-120b").uses_mla
    r1 = model_arch("deepseek-r1")
    assert (r1.kv_lora_rank, r1.q_lora_rank, r1.qk_rope_head_dim, r1.qk_nope_head_dim, r1.v_head_dim) == (
        512,
        1536,
        64,
        128,
        128,
    )
    # DeepSeek's first three layers are dense; layer 3 onwards routes to experts.
    assert [r1.is_moe_layer(i) for i in (0, 2, 3, 60)] == [False, False, True, True]


def test_unknown_model_raises_keyerror_listing_known_names() -> None:
    with pytest.raises(KeyError, match="qwen3-32b"):
        model_arch("qwen4")


def test_qwen3_moe_config_json_parses_to_the_catalog_entry() -> None:
    parsed = arch_from_config_json(QWEN3_30B_A3B_CONFIG, "qwen3-30b-a3b")
    cat = model_arch("qwen3-30b-a3b")
    assert parsed.__dict__ | {"hf_id": cat.hf_id, "params_b": cat.params_b} == cat.__dict__


def test_qwen3_moe_config_json_saved_by_transformers_5_counts_its_experts_as_num_local_experts() -> None:
    # transformers 5 saves Qwen3MoeConfig's expert count as num_local_experts (the lab's tiny Qwen3-MoE).
    saved = {k: v for k, v in QWEN3_30B_A3B_CONFIG.items() if k != "num_experts"} | {"num_local_experts": 128}
    assert arch_from_config_json(saved, "q") == arch_from_config_json(QWEN3_30B_A3B_CONFIG, "q")
    with pytest.raises(ValueError, match="has no 'num_experts'"):
        arch_from_config_json({k: v for k, v in saved.items() if k != "num_local_experts"}, "q")


def test_deepseek_config_json_parses_mla_and_moe_fields() -> None:
    parsed = arch_from_config_json(DEEPSEEK_R1_CONFIG, "deepseek-r1")
    cat = model_arch("deepseek-r1")
    assert parsed.__dict__ | {"hf_id": cat.hf_id, "params_b": cat.params_b} == cat.__dict__


def test_nested_text_config_is_read() -> None:
    kimi = {
        "model_type": "kimi_k25",
        "text_config": dict(DEEPSEEK_R1_CONFIG, model_type="kimi_k2", num_attention_heads=64, n_routed_experts=384),
    }
    a = arch_from_config_json(kimi, "k25")
    assert (a.model_type, a.num_attention_heads, a.num_experts, a.uses_mla) == ("kimi_k2", 64, 384, True)


def test_qwen2_config_gets_qkv_bias_and_default_head_dim() -> None:
    a = arch_from_config_json(
        {
            "model_type": "qwen2",
            "hidden_size": 5120,
            "num_attention_heads": 40,
            "num_hidden_layers": 64,
            "num_key_value_heads": 8,
            "intermediate_size": 27648,
            "vocab_size": 152064,
        },
        "q",
    )
    assert (a.qkv_bias, a.head_dim) == (True, 128)


def test_gpt_oss_config_maps_local_experts() -> None:
    a = arch_from_config_json(
        {
            "model_type": "gpt_oss",
            "hidden_size": 2880,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "num_hidden_layers": 36,
            "intermediate_size": 2880,
            "num_local_experts": 128,
            "experts_per_token": 4,
            "vocab_size": 201088,
            "attention_bias": True,
        },
        "g",
    )
    # num_experts_per_tok (newer files) and experts_per_token (the original) mean the same.
    assert a == arch_from_config_json(
        {
            "model_type": "gpt_oss",
            "hidden_size": 2880,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 64,
            "num_hidden_layers": 36,
            "intermediate_size": 2880,
            "num_local_experts": 128,
            "num_experts_per_tok": 4,
            "vocab_size": 201088,
            "attention_bias": True,
        },
        "g",
    )
    assert (a.num_experts, a.experts_per_token, a.moe_intermediate_size, a.qkv_bias) == (128, 4, 2880, True)


def test_unknown_model_type_and_missing_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="model_type 'mamba'"):
        arch_from_config_json({"model_type": "mamba"}, "m")
    with pytest.raises(ValueError, match="num_hidden_layers"):
        arch_from_config_json({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2}, "l")


def test_quantization_config_is_read_from_config_json() -> None:
    gptq = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    assert quantization_from_config_json(gptq) == ("gptq", 4, 128)
    assert quantization_from_config_json({"model_type": "llama"}) is None
