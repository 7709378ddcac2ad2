"""LMDeploy TurboMind: image facts, the exact `lmdeploy serve api_server` argv (parsed by LMDeploy's own
parser, rebuilt from its dump), and TurboMind's capacity model (layout, expert padding, KV from the free memory)."""

from __future__ import annotations

import dataclasses

import pytest

from components.engines.cli_dump import build_parser, options, parse_errors
from components.engines.lmdeploy.engine import (
    ffn_split,
    kv_bytes_per_token_per_layer,
    kv_heads_per_rank,
    lmdeploy_argv,
    turbomind_estimate,
)
from components.engines.lmdeploy.facts import DEFAULT_IMAGE, IMAGES, lmdeploy_image
from components.facts.models import MODELS
from components.spec.topology import instances
from tests.support.engine_stacks import lmdeploy_config, spec_of
from tests.support.expected_argv import LMDEPLOY_CHAT_ARGV

V016 = IMAGES["openmmlab/lmdeploy:v0.16.0-cu12.8"]
GIB = 1024**3


def test_cu12_8_images_have_volta_kernels_and_cu13_has_none() -> None:
    assert V016.runs_on(70) and IMAGES["openmmlab/lmdeploy:v0.15.0-cu12.8"].runs_on(70)
    cu13 = IMAGES["openmmlab/lmdeploy:v0.16.0-cu13.0"]
    assert not cu13.runs_on(70) and not cu13.runs_on(75) and cu13.runs_on(80)
    assert "CUDA 13" in cu13.cite("sass")
    assert lmdeploy_image(DEFAULT_IMAGE) is V016
    assert lmdeploy_image("openmmlab/lmdeploy:latest") is None


def test_every_fact_has_a_source_or_the_entry_is_refused() -> None:
    sources = dict(V016.sources)
    del sources["kv_quant_policies"]
    with pytest.raises(ValueError, match="no source for kv_quant_policies"):
        dataclasses.replace(V016, sources=sources)


def test_turbomind_architectures_have_qwen3_moe_and_not_deepseek_v3() -> None:
    for image in IMAGES.values():
        assert {"Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "LlamaForCausalLM"} <= image.architectures
        assert "DeepseekV3ForCausalLM" not in image.architectures
    assert "Qwen2VLForConditionalGeneration" in V016.architectures
    assert "Qwen2VLForConditionalGeneration" not in IMAGES["openmmlab/lmdeploy:v0.15.0-cu12.8"].architectures


def test_int4_formats_take_group_128_and_kv_policies_per_gpu() -> None:
    assert V016.model_formats["gptq"].group_sizes == {128}
    assert "desc_act false" in V016.model_formats["gptq"].rule
    assert V016.model_formats["compressed-tensors"].group_sizes == {32, 128}
    assert {
        p for p, k in V016.kv_quant_policies.items() if k.min_capability is not None and k.min_capability <= 70
    } == {0, 4, 8}
    assert V016.kv_quant_policies[16].min_capability is None  # TurboMind refuses fp8 KV everywhere
    assert V016.kv_quant_policies[42].min_capability == 80
    assert 128 in V016.head_dims(70) and 192 not in V016.head_dims(70) and 192 in V016.head_dims(80)


def test_argv_is_exact_and_parses_with_lmdeploys_own_parser() -> None:
    spec = spec_of(lmdeploy_config())
    inst = instances(spec, "chat")[0]
    argv = lmdeploy_argv(spec, inst)
    assert argv == LMDEPLOY_CHAT_ARGV
    parser = build_parser(V016.serve_args, "lmdeploy serve api_server")
    args = parser.parse_args(argv[3:])
    assert (args.model_path, args.backend, args.tp, args.session_len, args.cache_max_entry_count) == (
        "/data/models/Qwen3-30B-A3B",
        "turbomind",
        8,
        32768,
        0.8,
    )
    assert "--disable-metrics" in options(V016.serve_args)  # metrics are on unless this flag is given
    assert "--disable-metrics" not in argv


def test_argv_carries_int4_format_kv_policy_and_options_that_differ_from_defaults() -> None:
    config = lmdeploy_config(
        quantPolicy=8,
        enablePrefixCaching=True,
        cacheBlockSeqLen=128,
        maxPrefillTokenNum=4096,
        cacheMaxEntryCount=0.7,
        extraArgs=["--log-level", "INFO"],
    )
    config["llm-cluster:models"]["qwen3-30b-a3b"].update(
        quantization="gptq", path="/data/models/Qwen3-30B-A3B-GPTQ-Int4"
    )
    spec = spec_of(config)
    argv = lmdeploy_argv(spec, instances(spec, "chat")[1])
    assert argv[argv.index("--model-format") + 1] == "gptq"
    assert argv[argv.index("--server-name") + 1] == "192.168.10.14"
    assert argv[argv.index("--cache-max-entry-count") :] == [
        "--cache-max-entry-count",
        "0.7",
        "--cache-block-seq-len",
        "128",
        "--max-prefill-token-num",
        "4096",
        "--quant-policy",
        "8",
        "--enable-prefix-caching",
        "--log-level",
        "INFO",
    ]
    parser = build_parser(V016.serve_args, "lmdeploy serve api_server", {"_parse": int})
    assert parse_errors(parser, argv[3:]) == []


def test_a_misspelt_or_impossible_flag_is_refused_in_the_parsers_words() -> None:
    parser = build_parser(V016.serve_args, "lmdeploy serve api_server")
    assert parse_errors(parser, ["/m", "--tensor-parallel-size", "8"]) == [
        "unrecognized arguments: --tensor-parallel-size 8"
    ]
    assert parse_errors(parser, ["/m", "--backend", "vllm"]) == [
        "argument --backend: invalid choice: 'vllm' (choose from 'pytorch', 'turbomind')"
    ]
    assert parse_errors(parser, ["/m", "--tp", "eight"]) == ["argument --tp: invalid int value: 'eight'"]


def test_kv_heads_are_repeated_up_to_a_multiple_of_tp() -> None:
    assert kv_heads_per_rank(4, 8) == 1  # Qwen3: 4 KV heads repeated to 8
    assert kv_heads_per_rank(8, 4) == 2
    assert kv_heads_per_rank(6, 4) == 2  # repeated to 8, two per rank


def test_expert_dimension_is_zero_padded_when_tp_does_not_divide_its_groups() -> None:
    # Qwen3-235B-A22B experts: 1536 = 12 groups of 128 (int4); TP 8 pads to 16 groups, TP 4 pads nothing.
    assert ffn_split(1536, 8, 128, 32).padded == 2048
    assert ffn_split(1536, 4, 128, 32).padded == 1536
    # Qwen3-30B-A3B int4: 768 = 6 groups: padded to 8 at TP 4 and TP 8; fp16 cuts in groups of 32 (24: no pad).
    assert ffn_split(768, 4, 128, 32).padded == ffn_split(768, 8, 128, 32).padded == 1024
    assert ffn_split(768, 8, 1, 32).padded == 768


def _estimate(model: str, tp: int, fmt: str, **kw: object) -> dict[str, object]:
    args: dict[str, object] = dict(
        tp=tp,
        model_format=fmt,
        group_size=128,
        quant_policy=0,
        session_len=32768,
        max_batch_size=64,
        cache_max_entry_count=0.8,
        cache_block_seq_len=64,
        max_prefill_token_num=8192,
    )
    args.update(kw)
    return turbomind_estimate(MODELS[model], V016, 32.0, **args).to_dict()  # type: ignore[arg-type]


def test_qwen3_235b_gptq_fits_one_node_at_tp8_with_padded_experts() -> None:
    est = _estimate("qwen3-235b-a22b", 8, "gptq")
    assert est["fits"] is True
    assert est["ffn_padding"] == {"expert": {"width": 1536, "group": 128, "padded": 2048}}
    assert 19.0 < est["weights_gib_per_gpu"] < 20.0  # the padding costs about 4 GiB per GPU
    # 94 layers x 1 KV head per GPU x (K + V) x 128 x 2 bytes.
    assert est["kv_bytes_per_token_per_gpu"] == 94 * 2 * 128 * 2
    free = est["free_gib_after_weights"]
    assert est["kv_cache_gib_per_gpu"] == pytest.approx(0.8 * free, abs=1e-3)
    assert est["kv_tokens"] % 64 == 0
    assert any("12 groups padded to 16 for TP 8" in n for n in est["notes"])


def test_qwen3_235b_gptq_at_tp4_leaves_no_kv_for_a_32k_session() -> None:
    est = _estimate("qwen3-235b-a22b", 4, "gptq")
    assert est["fits"] is False and est["ffn_padding"]["expert"]["padded"] == 1536
    assert est["reason"].startswith(f"the KV cache holds {est['kv_tokens']} tokens (0.8 of the ")
    assert est["reason"].endswith("GiB left after the weights), fewer than sessionLen 32768")
    assert "lower lmdeploy.sessionLen" in est["advice"]


def test_int8_kv_halves_the_cache_plus_a_scale_and_zero_per_head() -> None:
    fp16 = kv_bytes_per_token_per_layer(MODELS["qwen3-32b"], 4, 16)
    int8 = kv_bytes_per_token_per_layer(MODELS["qwen3-32b"], 4, 8)
    int4 = kv_bytes_per_token_per_layer(MODELS["qwen3-32b"], 4, 4)
    assert (fp16, int8, int4) == (2 * 2 * 256, 2 * 2 * (128 + 4), 2 * 2 * (64 + 4))
    assert (
        _estimate("qwen3-32b", 4, "hf", quant_policy=8)["kv_tokens"]
        > 1.9 * _estimate("qwen3-32b", 4, "hf")["kv_tokens"]
    )


def test_weights_that_leave_no_memory_and_a_starved_runtime_are_refused() -> None:
    est = _estimate("qwen3-235b-a22b", 2, "gptq")
    assert est["fits"] is False and est["reason"].startswith("the weights alone need ")
    starved = _estimate("qwen3-30b-a3b", 8, "hf", cache_max_entry_count=0.995, max_batch_size=512)
    assert starved["fits"] is False and "of free memory left beside the KV cache" in starved["reason"]
    assert starved["advice"] == "lower cacheMaxEntryCount, maxPrefillTokenNum or maxBatchSize"


def test_heads_not_divisible_by_tp_cannot_be_modelled() -> None:
    with pytest.raises(ValueError, match="64 attention heads, not divisible by tensor parallel size 3"):
        _estimate("qwen3-32b", 3, "hf")
