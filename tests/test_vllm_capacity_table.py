"""A vLLM pool's capacity from the stack (components/engines/vllm/capacity.py) as tables: which of the pool's,
model's, node's and image's settings reach the memory model and how, the engine line and profiler order per
image x GPU x VLLM_USE_V1, the MLA switch's spellings, the range's pessimistic end, and the refusals."""

from __future__ import annotations

import math
from typing import Any

import pytest

from components.engines.vllm.capacity import capacity_dict, mla_enabled, pool_capacity, with_range
from components.engines.vllm.memory import estimate
from components.facts.models import model_arch
from components.planning.load import load_stack_config


def chat(
    config: dict[str, Any], *, gpu: str | None = None, image: str | None = None, env: dict | None = None, **vllm: Any
):
    """The reference stack with the chat pool (qwen3-30b-a3b, TP 8 on V100s) changed."""
    pool = config["llm-cluster:pools"]["chat"]
    if gpu is not None:
        config["llm-cluster:nodeDefaults"]["gpu"]["model"] = gpu
    if image is not None:
        pool["image"] = image
    if env is not None:
        pool["env"] = env
    pool["vllm"].update(vllm)
    return load_stack_config(config, set())


# The chat pool's settings as the estimate takes them, on the reference stack's V100s and 0.19.1 image.
CHAT = dict(
    tp=8,
    pp=1,
    gpu_memory_utilization=0.9,
    dtype="float16",
    quantization=None,
    quant_bits=4,
    group_size=128,
    kv_cache_dtype="auto",
    max_model_len=32768,
    max_num_seqs=128,
    max_num_batched_tokens=None,
    block_size=16,
    mla_enabled=True,
    v1_engine=True,
    gpu_name="Tesla V100-SXM2-32GB",
    chunked_prefill=None,
    nccl_in_budget=False,
    nvls=False,
)


def test_the_reference_pool_is_estimated_with_its_own_settings(config: dict[str, Any]) -> None:
    assert pool_capacity(chat(config), "chat") == estimate(model_arch("qwen3-30b-a3b"), 31.74, **CHAT)


def test_every_setting_of_pool_model_and_node_reaches_the_estimate(config: dict[str, Any]) -> None:
    config["llm-cluster:models"]["qwen3-30b-a3b"].update(
        {"quantization": "gptq", "quantBits": 8, "groupSize": 64, "dtype": "auto"}
    )
    config["llm-cluster:pools"]["chat"]["pipelineParallel"] = 2
    spec = chat(
        config,
        gpu="NVIDIA H100 80GB HBM3",
        gpuMemoryUtilization=0.85,
        kvCacheDtype="fp8",
        maxModelLen=16384,
        maxNumSeqs=64,
        maxNumBatchedTokens=4096,
        blockSize=32,
        enableChunkedPrefill=False,
    )
    expected = {
        **CHAT,
        "pp": 2,
        "gpu_memory_utilization": 0.85,
        # auto on sm_90 is bfloat16.
        "dtype": "bfloat16",
        "quantization": "gptq",
        "quant_bits": 8,
        "group_size": 64,
        "kv_cache_dtype": "fp8",
        "max_model_len": 16384,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 4096,
        "block_size": 32,
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "chunked_prefill": False,
        # NVLS: 0.32 GiB for each of 7 TP peers and a pipeline neighbour, over V1's 2 GiB floor.
        "nvls": True,
    }
    assert pool_capacity(spec, "chat") == estimate(model_arch("qwen3-30b-a3b"), 78.37, **expected)
    assert pool_capacity(spec, "chat").communicator_gib == pytest.approx(8 * 0.32)


@pytest.mark.parametrize(
    ("gpu", "chunked", "batched"),
    [
        # V1's default budget: 8192 on >= 70 GiB GPUs but A100s, else 2048; without chunked prefill, the context.
        ("NVIDIA H100 80GB HBM3", None, 8192),
        ("NVIDIA A100-SXM4-80GB", None, 2048),
        ("NVIDIA A100-SXM4-80GB", True, 2048),
        ("NVIDIA A100-SXM4-80GB", False, 16384),
    ],
)
def test_the_gpus_name_and_chunked_prefill_pick_the_default_budget(
    config: dict[str, Any], gpu: str, chunked: bool | None, batched: int
) -> None:
    settings = {"maxModelLen": 16384} if chunked is None else {"maxModelLen": 16384, "enableChunkedPrefill": chunked}
    assert pool_capacity(chat(config, gpu=gpu, **settings), "chat").max_num_batched_tokens == batched


def test_a_pool_on_one_node_is_estimated_on_that_nodes_gpus(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["nodes"] = ["gpu-03"]
    assert pool_capacity(load_stack_config(config, set()), "chat") == estimate(
        model_arch("qwen3-30b-a3b"), 31.74, **CHAT
    )


@pytest.mark.parametrize(
    ("image", "gpu", "env", "v1", "nccl_in_budget"),
    [
        # 0.9.2 runs V0's batch budget on every GPU and counts NCCL inside its budget.
        ("vllm/vllm-openai:v0.9.2", "Tesla V100-SXM2-32GB", {}, False, True),
        ("vllm/vllm-openai:v0.9.2", "NVIDIA A100-SXM4-80GB", {}, False, True),
        ("vllm/vllm-openai:v0.11.0", "Tesla V100-SXM2-32GB", {}, True, False),
        ("vllm/vllm-openai:v0.19.1", "NVIDIA A100-SXM4-80GB", {}, True, False),
        ("vllm/vllm-openai:v0.19.1", "NVIDIA A100-SXM4-80GB", {"VLLM_USE_V1": "0"}, False, False),
        ("vllm/vllm-openai:v0.19.1", "NVIDIA A100-SXM4-80GB", {"VLLM_USE_V1": "1"}, True, False),
        # An image without facts: V1 from sm_80, V0 below, and NCCL inside the budget (the smaller KV cache).
        ("vllm/vllm-openai:v0.20.0", "Tesla T4", {}, False, True),
        ("vllm/vllm-openai:v0.20.0", "NVIDIA A100-SXM4-80GB", {}, True, True),
        ("vllm/vllm-openai:v0.20.0", "NVIDIA A100-SXM4-80GB", {"VLLM_USE_V1": "0"}, True, True),
    ],
)
def test_the_engine_line_and_profiler_order_per_image_gpu_and_switch(
    config: dict[str, Any], image: str, gpu: str, env: dict[str, str], v1: bool, nccl_in_budget: bool
) -> None:
    config["llm-cluster:pools"]["chat"]["tensorParallel"] = 2
    spec = chat(config, gpu=gpu, image=image, env=env, maxModelLen=4096)
    est = pool_capacity(spec, "chat")
    line = "V1" if v1 else "V0"
    assert (est.kv_error_class.split(" · ")[0], est.communicator_in_budget, est.startup_free_gib is None) == (
        line,
        nccl_in_budget or v1,
        nccl_in_budget,
    )


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", False), ("true", False), ("True", False), ("0", True), ("false", True), ("yes", True), (None, True)],
)
def test_mla_is_on_unless_the_pool_disables_it(config: dict[str, Any], value: str | None, on: bool) -> None:
    spec = chat(config, env={} if value is None else {"VLLM_MLA_DISABLE": value})
    assert mla_enabled(spec, "chat") is on


def test_the_mla_switch_reaches_the_estimate_unless_given(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["reasoning"]["env"] = {}
    spec = load_stack_config(config, set())
    assert pool_capacity(spec, "reasoning").mla_enabled is True
    assert pool_capacity(spec, "reasoning", mla=False).mla_enabled is False
    config["llm-cluster:pools"]["reasoning"]["env"] = {"VLLM_MLA_DISABLE": "1"}
    spec = load_stack_config(config, set())
    assert pool_capacity(spec, "reasoning").mla_enabled is False
    assert pool_capacity(spec, "reasoning", mla=True).mla_enabled is True
    assert capacity_dict(spec, "reasoning", mla=True)["mla_enabled"] is True


def test_tensor_parallelism_across_nodes_is_not_modelled(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["tensorParallel"] = 16
    spec = load_stack_config(config, set())
    message = "tensor parallel size 16 spans nodes of 8 GPUs: the planner models tensor parallelism within a node"
    with pytest.raises(ValueError) as err:
        pool_capacity(spec, "chat")
    assert str(err.value) == message
    assert capacity_dict(spec, "chat") == {"error": f"capacity not estimated: {message}"}


def test_tensor_parallelism_of_a_whole_node_is_modelled(config: dict[str, Any]) -> None:
    assert pool_capacity(chat(config), "chat").tp == 8


def test_the_capacity_dict_is_the_estimate_with_its_range(config: dict[str, Any]) -> None:
    spec = chat(config)
    d = capacity_dict(spec, "chat")
    expected = pool_capacity(spec, "chat").to_dict()
    assert {k: v for k, v in d.items() if not k.endswith("_low")} == expected
    error = expected["kv_estimate_error"]
    assert d["kv_tokens_low"] == math.floor(expected["kv_tokens"] * (1 - error))
    assert d["max_concurrency_low"] == round(expected["max_concurrency"] * (1 - error), 4)
    assert d["kv_cache_gib_per_gpu_low"] == round(expected["kv_cache_gib_per_gpu"] * (1 - error), 4)


@pytest.mark.parametrize(
    ("kv", "conc", "gib", "error", "low"),
    [
        # 1000 x 0.965 = 965 exactly; 1001 x 0.965 = 965.965, down to 965.
        (1000, 0.5, 2.0, 0.035, (965, 0.4825, 1.93)),
        (1001, 0.123456, 3.33333, 0.035, (965, 0.1191, 3.2167)),
        (16384, 4.0, 10.0, 0.02, (16056, 3.92, 9.8)),
        (7, 1, 1, 0.5, (3, 0.5, 0.5)),
    ],
)
def test_the_range_takes_the_error_off_tokens_concurrency_and_cache(
    kv: int, conc: float, gib: float, error: float, low: tuple[int, float, float]
) -> None:
    d = with_range({"kv_tokens": kv, "max_concurrency": conc, "kv_cache_gib_per_gpu": gib, "kv_estimate_error": error})
    assert d == {
        "kv_tokens": kv,
        "max_concurrency": conc,
        "kv_cache_gib_per_gpu": gib,
        "kv_estimate_error": error,
        "kv_tokens_low": low[0],
        "max_concurrency_low": low[1],
        "kv_cache_gib_per_gpu_low": low[2],
    }
    assert isinstance(d["kv_tokens_low"], int)
