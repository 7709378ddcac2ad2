"""Stacks with LMDeploy and llama.cpp pools, built from the reference stack (shared by the engine tests)."""

from __future__ import annotations

from typing import Any

from components.planning.load import load_stack_config
from components.spec import StackSpec
from tests.conftest import prod_config

LMDEPLOY_IMAGE = "openmmlab/lmdeploy:v0.16.0-cu12.8"
LLAMACPP_IMAGE = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312"


def engine_config(**chat: Any) -> dict[str, Any]:
    """The reference config with its `chat` pool (Qwen3-30B-A3B on gpu-03..06) changed by `chat`
    (None drops a key); the `reasoning` pool stays vLLM."""
    config = prod_config()
    pool = config["llm-cluster:pools"]["chat"]
    pool.pop("vllm")
    for key, value in chat.items():
        if value is None:
            pool.pop(key, None)
        else:
            pool[key] = value
    return config


def lmdeploy_config(**options: Any) -> dict[str, Any]:
    """The chat pool on LMDeploy TurboMind, TP 8, one replica per node."""
    return engine_config(
        engine="lmdeploy", image=LMDEPLOY_IMAGE, lmdeploy={"sessionLen": 32768, "maxBatchSize": 64, **options}
    )


def llamacpp_config(**options: Any) -> dict[str, Any]:
    """The chat pool on llama.cpp: one server per GPU (8 per node) of a Q4_K_M GGUF."""
    config = engine_config(
        engine="llamacpp",
        image=LLAMACPP_IMAGE,
        tensorParallel=1,
        replicasPerNode=8,
        llamacpp={"contextPerSlot": 8192, "parallel": 4, "ggufFile": "Qwen3-30B-A3B-Q4_K_M.gguf", **options},
    )
    model = config["llm-cluster:models"]["qwen3-30b-a3b"]
    model.update(quantization="gguf", sizeGib=17.3)
    return config


def spec_of(config: dict[str, Any]) -> StackSpec:
    """The validated spec of a config."""
    return load_stack_config(config, set())
