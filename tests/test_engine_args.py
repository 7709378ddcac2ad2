"""vLLM's startup validation across flags (components.engines.vllm.rules.engine_args): each test changes one
field of the reference stack and runs the real program through the real pack; the context window of catalog and
configJson models (facts.models.context_window)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components.engines.vllm.launch import Launch
from components.engines.vllm.rules.engine_args import chunked_prefill, engine_version
from components.engines.vllm.serve_args import parse_serve
from components.facts.models import MODELS, arch_from_config_json, context_window
from plan.analyze import Violation, analyze
from policies.pack import POLICIES
from tests.conftest import prod_config, run_stack

NS = "llm-cluster:"
RULE = "vllm-engine-args"
DESCRIPTION = {p.name: p.description for p in POLICIES}[RULE]
CHAT = "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06)"


def refusals(config: dict[str, Any]) -> list[Violation]:
    return [v for v in analyze(run_stack(config, preview=True).registrations) if v.policy_name == RULE]


def messages(config: dict[str, Any]) -> list[str]:
    found = refusals(config)
    assert all(v.enforcement_level == "mandatory" for v in found)
    return [v.message.removeprefix(DESCRIPTION + "\n") for v in found]


def chat_vllm(config: dict[str, Any]) -> dict[str, Any]:
    return config[NS + "pools"]["chat"]["vllm"]


def test_the_reference_stack_passes() -> None:
    assert refusals(prod_config()) == []


def test_a_max_model_len_beyond_the_context_window_is_refused_with_the_models_limit() -> None:
    config = prod_config()
    chat_vllm(config)["maxModelLen"] = 131072
    assert messages(config) == [
        f"{CHAT}: --max-model-len 131072 is longer than the model's context window of 40960 tokens "
        '(max_position_embeddings=40960 in its config.json): vLLM refuses it at startup ("User-specified '
        'max_model_len (131072) is greater than the derived max_model_len"). Use --max-model-len 40960 or less. '
        "Stack key to edit: pools.chat.vllm.maxModelLen (--max-model-len)."
    ]
    # vLLM's own escape hatch lets it through (with its warning).
    config[NS + "pools"]["chat"]["env"] = {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    assert refusals(config) == []


def test_the_window_of_a_config_json_model_follows_its_rope_scaling(tmp_path: Path) -> None:
    qwen = MODELS["qwen3-30b-a3b"]
    config_json = {
        "model_type": "qwen3_moe",
        "hidden_size": qwen.hidden_size,
        "num_hidden_layers": qwen.num_layers,
        "num_attention_heads": qwen.num_attention_heads,
        "num_key_value_heads": qwen.num_kv_heads,
        "head_dim": qwen.head_dim,
        "vocab_size": qwen.vocab_size,
        "intermediate_size": 6144,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "max_position_embeddings": 40960,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_json))
    assert context_window(arch_from_config_json(config_json, "q")) == (
        131072,
        "rope_scaling yarn: original_max_position_embeddings=32768 x factor 4",
    )
    config = prod_config()
    model = config[NS + "models"]["qwen3-30b-a3b"]
    model.pop("arch")
    model["configJson"] = str(path)
    chat_vllm(config)["maxModelLen"] = 65536
    assert refusals(config) == []  # within the scaled window
    chat_vllm(config)["maxModelLen"] = 140000
    [message] = messages(config)
    assert message.startswith(
        f"{CHAT}: --max-model-len 140000 is longer than the model's context window of 131072 "
        "tokens (rope_scaling yarn: original_max_position_embeddings=32768 x factor 4 in its "
        "config.json)"
    )


@pytest.mark.parametrize(
    "keys, expected",
    [
        ({"model_max_length": 8192, "max_position_embeddings": 4096}, (8192, "model_max_length=8192")),
        ({"n_positions": 2048, "max_position_embeddings": 4096}, (2048, "n_positions=2048")),
        (
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
            },
            (131072, "max_position_embeddings=131072"),
        ),
        (
            {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}},
            (8192, "max_position_embeddings=4096 x factor 2"),
        ),
        ({}, None),
    ],
)
def test_the_context_window_is_derived_as_vllm_derives_it(keys: dict[str, Any], expected: Any) -> None:
    base = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "intermediate_size": 128,
    }
    assert context_window(arch_from_config_json({**base, **keys}, "m")) == expected


def test_every_catalog_model_carries_its_context_window() -> None:
    assert {name: context_window(m) and context_window(m)[0] for name, m in MODELS.items()} == {
        "qwen3-30b-a3b": 40960,
        "qwen3-32b": 40960,
        "llama-3.3-70b": 131072,
        "gpt-oss-120b": 131072,
        "qwen3-235b-a22b": 40960,
        "llama-3.1-405b": 131072,
        "deepseek-r1": 163840,
        "kimi-k2": 131072,
        "deepseek-r1-distill-qwen-32b": 131072,
        "deepseek-v3": 163840,
    }


def test_a_batch_budget_below_max_model_len_with_chunked_prefill_off_is_refused() -> None:
    config = prod_config()
    chat_vllm(config).update(maxNumBatchedTokens=8192, enableChunkedPrefill=False)
    assert messages(config) == [
        f"{CHAT}: --max-num-batched-tokens 8192 is smaller than --max-model-len 32768 with chunked prefill off "
        '(--no-enable-chunked-prefill): vLLM refuses it ("max_num_batched_tokens (8192) is smaller than '
        'max_model_len (32768)"), since a prompt must fit one batch. Raise --max-num-batched-tokens to 32768 or '
        "more, or lower --max-model-len. Stack keys to edit: pools.chat.vllm.maxNumBatchedTokens "
        "(--max-num-batched-tokens), pools.chat.vllm.maxModelLen (--max-model-len), "
        "pools.chat.vllm.enableChunkedPrefill (--no-enable-chunked-prefill)."
    ]


def test_a_batch_budget_below_max_num_seqs_is_refused() -> None:
    config = prod_config()
    chat_vllm(config).update(maxNumBatchedTokens=64, maxModelLen=64)
    assert messages(config)[-1] == (
        f"{CHAT}: --max-num-batched-tokens 64 is smaller than --max-num-seqs 128: vLLM refuses it "
        '("max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (128)"), every running '
        "sequence needs a token per step. Raise --max-num-batched-tokens to 128 or more, or lower --max-num-seqs. "
        "Stack keys to edit: pools.chat.vllm.maxNumBatchedTokens (--max-num-batched-tokens), "
        "pools.chat.vllm.maxNumSeqs (--max-num-seqs)."
    )


def test_partial_prefills_from_extra_args_need_chunked_prefill_and_name_the_entry() -> None:
    config = prod_config()
    chat_vllm(config).update(extraArgs=["--max-num-partial-prefills", "2"], enableChunkedPrefill=False)
    [message] = messages(config)
    assert message == (
        f"{CHAT}: --max-num-partial-prefills 2 with chunked prefill off (--no-enable-chunked-prefill): vLLM refuses "
        'it ("Chunked prefill must be enabled to set max_num_partial_prefills > 1."). Pass --enable-chunked-prefill '
        "or drop the flag. Stack keys to edit: pools.chat.vllm.extraArgs[0] (given in extraArgs: "
        "--max-num-partial-prefills), pools.chat.vllm.enableChunkedPrefill (--no-enable-chunked-prefill)."
    )


def launch(image: str, *argv: str, env: dict[str, str] | None = None, gpu: str = "Tesla V100-SXM2-32GB") -> Launch:
    from components.facts.hardware import GPUS

    return Launch(
        resource="container", args=parse_serve(["/m", *argv]), env=env or {}, gpu_name=gpu, gpu=GPUS[gpu], image=image
    )


def test_chunked_prefill_when_unset_follows_the_pools_engine_line() -> None:
    assert engine_version("vllm/vllm-openai:v0.19.1") == (0, 19)
    assert engine_version("vllm/vllm-openai:v0.9.2") == (0, 9)
    # V0 (0.9.2 with VLLM_USE_V1=0): on only above 32768 tokens; V1 (0.10+): always on.
    v0 = launch("vllm/vllm-openai:v0.9.2", env={"VLLM_USE_V1": "0"})
    assert chunked_prefill(v0, 32768) == (False, "the V0 engine's default for --max-model-len up to 32768")
    assert chunked_prefill(v0, 65536)[0] is True
    assert chunked_prefill(launch("vllm/vllm-openai:v0.19.1"), 8192) == (True, "the V1 engine's default")
    # From the image facts: 0.9.2 runs V1 on sm_80 unless VLLM_USE_V1=0; an unknown image is read by its tag.
    a100 = "NVIDIA A100-SXM4-80GB"
    assert chunked_prefill(launch("vllm/vllm-openai:v0.9.2", gpu=a100), 8192)[0] is True
    assert chunked_prefill(launch("vllm/vllm-openai:v0.9.2", gpu=a100, env={"VLLM_USE_V1": "0"}), 8192)[0] is False
    assert chunked_prefill(launch("registry.local/vllm:v0.12.0"), 8192) == (True, "the V1 engine's default")
    off = launch("vllm/vllm-openai:v0.19.1", "--no-enable-chunked-prefill")
    assert chunked_prefill(off, 8192) == (False, "--no-enable-chunked-prefill")


def qwen_config_json(tmp_path: Path, **extra: Any) -> Path:
    qwen = MODELS["qwen3-30b-a3b"]
    data = {
        "model_type": "qwen3_moe",
        "hidden_size": qwen.hidden_size,
        "num_hidden_layers": qwen.num_layers,
        "num_attention_heads": qwen.num_attention_heads,
        "num_key_value_heads": qwen.num_kv_heads,
        "head_dim": qwen.head_dim,
        "vocab_size": qwen.vocab_size,
        "intermediate_size": 6144,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "max_position_embeddings": 40960,
        **extra,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return path


def with_config_json(path: Path, **model: Any) -> dict[str, Any]:
    config = prod_config()
    entry = config[NS + "models"]["qwen3-30b-a3b"]
    entry.pop("arch")
    entry.update(configJson=str(path), **model)
    return config


def test_a_quantization_that_does_not_match_the_checkpoint_is_refused(tmp_path: Path) -> None:
    path = qwen_config_json(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    assert refusals(with_config_json(path, quantization="gptq")) == []
    assert refusals(with_config_json(path, quantization="moe_wna16")) == []  # vLLM's own override
    [message] = messages(with_config_json(path, quantization="awq"))
    assert message.startswith(
        f"{CHAT}: --quantization awq does not match the checkpoint's config.json (gptq): vLLM "
        'refuses it ("Quantization method specified in the model config (gptq) does not match '
        'the quantization method specified in the `quantization` argument (awq).")'
    )
    assert message.endswith("Stack key to edit: models.qwen3-30b-a3b.quantization (--quantization).")


def test_a_quantized_checkpoint_the_stack_calls_unquantized_is_named(tmp_path: Path) -> None:
    path = qwen_config_json(tmp_path, quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128})
    assert messages(with_config_json(path)) == [
        f"{CHAT}: the checkpoint's config.json is quantized with gptq, but models.qwen3-30b-a3b.quantization is "
        "unset: vLLM loads it as gptq anyway, while the capacity plan and the hardware rules take it for half "
        "weights. State quantization: gptq (and its quantBits and groupSize)."
    ]
    assert refusals(with_config_json(qwen_config_json(tmp_path))) == []  # an fp16 checkpoint


def test_data_parallel_ranks_beyond_the_servers_gpus_are_refused() -> None:
    config = prod_config()
    chat_vllm(config)["extraArgs"] = ["--data-parallel-size", "2"]
    assert messages(config) == [
        f"{CHAT}: --data-parallel-size 2 x --tensor-parallel-size 8 x --pipeline-parallel-size 1 = 16 GPUs, but the "
        "server has 8: vLLM cannot place its ranks and stops at startup. Serve more copies as more instances of the "
        "pool (its nodes, replicasPerNode) rather than --data-parallel-size. Stack keys to edit: "
        "pools.chat.vllm.extraArgs[0] (given in extraArgs: --data-parallel-size), pools.chat.tensorParallel "
        "(--tensor-parallel-size), pools.chat.pipelineParallel (--pipeline-parallel-size)."
    ]
