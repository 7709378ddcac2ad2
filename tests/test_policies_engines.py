"""The engine rules (policies.rules.engines) and memory fit for LMDeploy and llama.cpp servers, through the real
analyzer servicer: the ModelServer props the component registers for a clean pool, then one change each."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.resources.model_server import server_props
from components.spec.topology import instances
from tests.support.engine_stacks import llamacpp_config, lmdeploy_config, spec_of
from tests.support.policies import DESCRIPTIONS, analyze

ENGINE_RULES = {p for p in DESCRIPTIONS if p.startswith(("engine-", "lmdeploy-", "llamacpp-"))}


def props_of(config: dict[str, Any]) -> dict[str, Any]:
    """The first chat instance's ModelServer props, as the component registers them."""
    spec = spec_of(config)
    return json.loads(json.dumps(server_props(spec, instances(spec, "chat")[0])))


def diagnostics(props: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        d
        for d in analyze("llm-cluster:vllm:ModelServer", props["instance"], props)
        if d[0] in ENGINE_RULES | {"memory-fit", "memory-headroom"}
    ]


def messages(props: dict[str, Any], policy: str) -> list[str]:
    return [d[2].split("\n", 1)[1] for d in diagnostics(props) if d[0] == policy]


def test_clean_lmdeploy_pool_passes_every_engine_rule_and_no_vllm_rule_fires() -> None:
    props = props_of(lmdeploy_config())
    everything = analyze("llm-cluster:vllm:ModelServer", props["instance"], props)
    assert everything == [], everything


def test_clean_llamacpp_pool_has_only_the_ptx_advisory() -> None:
    props = props_of(llamacpp_config())
    everything = analyze("llm-cluster:vllm:ModelServer", props["instance"], props)
    assert [(d[0], d[1]) for d in everything] == [("llamacpp-ptx-jit", "advisory")]
    assert "the first start JIT-compiles every kernel for minutes" in everything[0][2]


def test_cuda13_lmdeploy_image_on_v100_is_refused_naming_the_cu12_8_tags() -> None:
    props = props_of(lmdeploy_config())
    props["image"] = "openmmlab/lmdeploy:v0.16.0-cu13.0"
    [msg] = messages(props, "engine-image")
    assert msg.startswith(
        "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06): image "
        "openmmlab/lmdeploy:v0.16.0-cu13.0 has no kernels for Tesla V100-SXM2-32GB (sm_70): CUDA 13 "
        "build: no Volta kernels"
    )
    assert "Use openmmlab/lmdeploy:v0.16.0-cu12.8 or openmmlab/lmdeploy:v0.15.0-cu12.8" in msg
    props["image"] = "openmmlab/lmdeploy:latest"
    assert messages(props, "engine-image") == []
    [(policy, level, msg)] = [d for d in diagnostics(props) if d[0] == "engine-image-unknown"]
    assert level == "advisory"
    assert "is not in the lmdeploy facts table, so nothing says it runs on Tesla V100-SXM2-32GB (sm_70)" in msg


def test_a_flag_lmdeploy_does_not_have_is_refused_in_its_parsers_words() -> None:
    props = props_of(lmdeploy_config())
    props["argv"] += ["--tensor-parallel-size", "8"]
    [msg] = messages(props, "engine-flags")
    assert msg.endswith(
        "lmdeploy serve api_server (openmmlab/lmdeploy:v0.16.0-cu12.8): unrecognized arguments: "
        "--tensor-parallel-size 8"
    )
    props = props_of(lmdeploy_config())
    props["argv"] += ["--disable-metrics"]
    [msg] = messages(props, "engine-flags")
    assert "--disable-metrics is refused: monitoring scrapes /metrics, which it turns off" in msg


def test_llamacpp_rpc_is_refused() -> None:
    props = props_of(llamacpp_config())
    props["argv"] += ["--rpc", "192.168.10.14:50052"]
    [msg] = messages(props, "engine-flags")
    assert (
        'llama-server: --rpc is refused: the RPC backend is, upstream, "a proof-of-concept ... fragile and '
        'insecure"' in msg
    )


def test_deepseek_v3_architecture_is_not_turbomind() -> None:
    config = lmdeploy_config()
    config["llm-cluster:models"]["qwen3-30b-a3b"]["arch"] = "deepseek-r1"
    props = props_of(config)
    arch, head = messages(props, "lmdeploy-model")
    assert "DeepseekV3ForCausalLM is not a TurboMind architecture in LMDeploy 0.16.0" in arch
    assert "Serve it with engine: vllm (DeepSeek-V3/R1: VLLM_MLA_DISABLE=1) or engine: llamacpp (GGUF)" in arch
    assert "head size 192: TurboMind's attention kernels on Tesla V100-SXM2-32GB (sm_70) take 64, 128, 256, 576" in head


def test_gptq_group_size_other_than_128_is_refused() -> None:
    config = lmdeploy_config()
    config["llm-cluster:models"]["qwen3-30b-a3b"].update(quantization="gptq", groupSize=64)
    [msg] = messages(props_of(config), "lmdeploy-model")
    assert "--model-format gptq with group size 64: TurboMind's converter accepts group size 128 only" in msg


def test_act_order_gptq_checkpoint_is_refused_from_its_config_json(tmp_path: Path) -> None:
    cfg = {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 48,
        "vocab_size": 151936,
        "intermediate_size": 6144,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "max_position_embeddings": 40960,
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": True},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    config = lmdeploy_config()
    model = config["llm-cluster:models"]["qwen3-30b-a3b"]
    model.pop("arch")
    model.update(configJson=str(path), quantization="gptq")
    props = props_of(config)
    [msg] = messages(props, "lmdeploy-checkpoint")
    assert "desc_act True, sym True: TurboMind takes desc_act false and sym true only" in msg
    cfg["quantization_config"]["desc_act"] = False
    path.write_text(json.dumps(cfg))
    assert messages(props_of(config), "lmdeploy-checkpoint") == []


def test_kv_quant_policies_per_gpu() -> None:
    props = props_of(lmdeploy_config(quantPolicy=8))
    assert messages(props, "lmdeploy-kv-cache") == []
    props["argv"] += ["--quant-policy", "16"]
    [msg] = messages(props, "lmdeploy-kv-cache")
    assert msg.endswith("Stack key to edit: pools.chat.lmdeploy.quantPolicy (--quant-policy).")
    assert (
        "--quant-policy 16 (fp8): no TurboMind KV kernels on any GPU (TurboMind refuses fp8 KV "
        "caches) ([src-0.16.0] lmdeploy/messages.py QuantPolicy and TurbomindEngineConfig; "
        "kernels/attention/kernel/decoding_sm70_*.cu (half, uint8, uint4 KV) [read from code]); use "
        "lmdeploy.quantPolicy 0 (none), 4 (int4), 8 (int8)"
    ) in msg


def test_bfloat16_on_v100_is_an_advisory_turbomind_falls_back() -> None:
    config = lmdeploy_config()
    config["llm-cluster:models"]["qwen3-30b-a3b"]["dtype"] = "bfloat16"
    [(policy, level, _)] = diagnostics(props_of(config))
    assert (policy, level) == ("lmdeploy-dtype", "advisory")


def test_lmdeploy_pool_that_does_not_fit_says_what_to_change_in_its_own_keys() -> None:
    config = lmdeploy_config(sessionLen=131072)
    config["llm-cluster:pools"]["chat"]["tensorParallel"] = 2
    config["llm-cluster:pools"]["chat"]["replicasPerNode"] = 4
    [msg] = messages(props_of(config), "memory-fit")
    assert (
        "does not fit: the KV cache holds " in msg
        and "fewer than sessionLen 131072. To fit: lower lmdeploy.sessionLen to " in msg
    )


def test_quantized_v_cache_without_flash_attention_is_refused_and_row_split_is_advised_against() -> None:
    props = props_of(llamacpp_config(cacheType="q8_0", flashAttention="off"))
    [msg] = messages(props, "llamacpp-kv-cache")
    assert (
        "--cache-type-v q8_0 with --flash-attn off: llama.cpp stops with 'quantized V cache requires "
        "flash_attn to be enabled'" in msg
    )
    config = llamacpp_config(splitMode="row")
    config["llm-cluster:pools"]["chat"].update(tensorParallel=2, replicasPerNode=4)
    [msg] = messages(props_of(config), "llamacpp-split-mode")
    assert "--split-mode row splits each weight's rows across GPUs, but [ref] redlinedtm-jpg: -sm row broken" in msg


def test_a_pool_its_engine_cannot_size_is_refused_saying_why() -> None:
    config = llamacpp_config()
    config["llm-cluster:models"]["qwen3-30b-a3b"].pop("sizeGib")
    [msg] = messages(props_of(config), "engine-capacity")
    assert (
        "capacity not estimated: state llamacpp.ggufHeader (a copy of the GGUF's header) or "
        "models.qwen3-30b-a3b.sizeGib (the GGUF's size) to size the weights" in msg
    )
    config = lmdeploy_config()
    config["llm-cluster:pools"]["chat"].update(tensorParallel=3)
    config["llm-cluster:pools"]["chat"]["nodes"] = ["gpu-03"]
    assert any("not divisible by tensor parallel size 3" in m for m in messages(props_of(config), "engine-capacity"))


def test_a_private_lmdeploy_build_is_sized_and_advised_not_refused() -> None:
    config = lmdeploy_config()
    config["llm-cluster:pools"]["chat"]["image"] = "registry.local/lmdeploy:custom-cu128"
    props = props_of(config)
    assert props["capacity"]["fits"] is True and props["capacity"]["engine"] == "lmdeploy"
    assert [(d[0], d[1]) for d in diagnostics(props)] == [("engine-image-unknown", "advisory")]
