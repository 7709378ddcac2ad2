"""The capacity planner's non-torch overhead and gpu-memory-utilization as each image's profiler applies
them: NCCL's share grows with the peers a GPU talks to, counts inside the budget where the memory baseline
precedes NCCL (0.9.2) and outside it where NCCL starts first (0.19.1), and there vLLM's own start-up
check (free memory >= utilization x total) refuses a pool before the KV cache is sized."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.vllm.capacity import pool_capacity
from components.engines.vllm.facts import IMAGES
from components.engines.vllm.memory import (
    COMM_GIB_PER_PEER,
    COMM_GIB_PER_PEER_NVLS,
    NON_TORCH_BASE_GIB,
    V1_COMM_GIB_P2P,
    V1_NON_TORCH_BASE_GIB,
    communicator_gib,
    estimate,
)
from components.facts.hardware import CUDA_CONTEXT_GIB, GPUS
from components.facts.models import model_arch
from components.planning.load import load_stack_config
from plan.analyze import analyze
from tests.conftest import prod_config, run_stack

NS = "llm-cluster:"
V100 = 31.74  # what torch sees of a V100-SXM2-32GB
QWEN = dict(dtype="float16", max_model_len=8192, max_num_seqs=128)


def test_the_communicators_grow_with_every_tensor_parallel_peer_and_pipeline_neighbour() -> None:
    assert communicator_gib(1, 1) == 0
    assert communicator_gib(2, 1) == pytest.approx(COMM_GIB_PER_PEER)
    assert communicator_gib(8, 1) == pytest.approx(7 * COMM_GIB_PER_PEER)
    # One neighbour at either end of the pipeline, two for a middle stage, none more.
    assert communicator_gib(8, 2) == pytest.approx(8 * COMM_GIB_PER_PEER)
    assert communicator_gib(8, 3) == communicator_gib(8, 4) == pytest.approx(9 * COMM_GIB_PER_PEER)
    assert communicator_gib(8, 2, nvls=True) == pytest.approx(8 * COMM_GIB_PER_PEER_NVLS)
    assert communicator_gib(8, 2, nvls=True) > communicator_gib(8, 2)


def test_nvls_is_the_nvswitch_hopper_parts_only() -> None:
    assert [name for name, g in sorted(GPUS.items()) if g.nvls] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_where_the_baseline_precedes_nccl_the_communicators_come_out_of_the_kv_cache(tp: int) -> None:
    # Qwen3-32B as 4-bit GPTQ fits on one V100, so every TP size leaves a KV cache to compare.
    est = estimate(model_arch("qwen3-32b"), V100, tp=tp, pp=1, gpu_memory_utilization=0.9, quantization="gptq", **QWEN)
    assert est.kv_cache_gib_per_gpu > 0
    assert est.communicator_in_budget and est.startup_free_gib is None
    assert est.non_torch_gib == pytest.approx(NON_TORCH_BASE_GIB + (tp - 1) * COMM_GIB_PER_PEER)
    budget = V100 * 0.9
    assert est.kv_cache_gib_per_gpu == pytest.approx(
        budget - est.weights_gib_per_gpu - est.activation_gib - est.non_torch_gib
    )


def test_where_nccl_starts_first_the_kv_cache_keeps_it_and_the_start_up_check_pays_it() -> None:
    arch = model_arch("qwen3-30b-a3b")
    inside = estimate(arch, V100, tp=8, pp=1, gpu_memory_utilization=0.9, **QWEN)
    outside = estimate(arch, V100, tp=8, pp=1, gpu_memory_utilization=0.9, nccl_in_budget=False, **QWEN)
    assert outside.non_torch_gib == pytest.approx(NON_TORCH_BASE_GIB)
    assert outside.communicator_gib == pytest.approx(7 * COMM_GIB_PER_PEER) and not outside.communicator_in_budget
    assert outside.kv_cache_gib_per_gpu == pytest.approx(inside.kv_cache_gib_per_gpu + 7 * COMM_GIB_PER_PEER)
    assert outside.startup_free_gib == pytest.approx(V100 - CUDA_CONTEXT_GIB - 7 * COMM_GIB_PER_PEER)
    assert outside.fits and outside.advice == ""


def test_vllm_refuses_to_start_when_less_than_its_request_is_free_after_nccl() -> None:
    # TP 8 x PP 2 on V100s: 31.74 - 0.5 context - 8 peers x 0.25 = 29.24 GiB free; 0.95 x 31.74 = 30.15.
    est = estimate(
        model_arch("qwen3-30b-a3b"), V100, tp=8, pp=2, gpu_memory_utilization=0.95, nccl_in_budget=False, **QWEN
    )
    assert not est.fits
    assert est.reason == (
        "about 29.24 GiB per GPU is free when vLLM sizes its request (31.74 GiB less the CUDA context, 0.5 GiB, "
        "and NCCL/all-reduce buffers for 8 peers, 2.00 GiB), less than gpu-memory-utilization 0.95 x 31.74 = "
        "30.15 GiB: vLLM stops with 'Free memory on device ... on startup is less than desired GPU memory "
        "utilization'"
    )
    assert est.advice == "lower gpu-memory-utilization from 0.95 to 0.92 or less"
    # The advice holds: at 0.92 the request (29.20 GiB) is free, with a note that the margin is thin.
    ok = estimate(
        model_arch("qwen3-30b-a3b"), V100, tp=8, pp=2, gpu_memory_utilization=0.92, nccl_in_budget=False, **QWEN
    )
    assert ok.fits and any(
        n.startswith("only 0.04 GiB per GPU to spare when vLLM checks its request") for n in ok.notes
    )


def test_the_pool_follows_its_images_profiler_order(config: dict[str, Any]) -> None:
    assert IMAGES["vllm/vllm-openai:v0.19.1"].nccl_in_budget is False
    assert IMAGES["vllm/vllm-openai:v0.9.2"].nccl_in_budget is True
    new = pool_capacity(load_stack_config(config, set()), "chat")
    config[NS + "pools"]["chat"]["image"] = "vllm/vllm-openai:v0.9.2"
    old = pool_capacity(load_stack_config(config, set()), "chat")
    # 0.19.1 runs V1 on the V100s: its profiler logs the lazily connected NCCL and all-reduce buffers in its
    # non-torch increase (at least V1_COMM_GIB_P2P over NVLink), and its start-up check pays them as well.
    assert (new.communicator_in_budget, old.communicator_in_budget) == (True, True)
    assert new.communicator_gib == pytest.approx(V1_COMM_GIB_P2P) and V1_COMM_GIB_P2P > 7 * COMM_GIB_PER_PEER
    assert old.communicator_gib == pytest.approx(7 * COMM_GIB_PER_PEER)
    assert old.non_torch_gib == pytest.approx(NON_TORCH_BASE_GIB + 7 * COMM_GIB_PER_PEER)
    assert new.non_torch_gib == pytest.approx(V1_NON_TORCH_BASE_GIB + V1_COMM_GIB_P2P)
    assert new.startup_free_gib == pytest.approx(V100 - CUDA_CONTEXT_GIB - V1_COMM_GIB_P2P)
    assert old.startup_free_gib is None


@pytest.mark.parametrize(
    ("tp", "pp", "p2p", "comm"),
    [
        (1, 1, True, 0.0),
        (2, 1, True, V1_COMM_GIB_P2P),  # one peer over NVLink: the floor, not 0.25
        (8, 2, True, V1_COMM_GIB_P2P),  # 8 peers x 0.25 = 2.00: the floor again
        (8, 4, True, 9 * COMM_GIB_PER_PEER),  # 9 peers x 0.25 = 2.25: above the floor
        (2, 1, False, COMM_GIB_PER_PEER),  # PCIe without P2P: custom all-reduce off, NCCL's share only
        (1, 2, True, COMM_GIB_PER_PEER),  # pipeline only: NCCL send/recv to one neighbour, no all-reduce
    ],
)
def test_v1_counts_the_communicators_in_its_budget_on_every_image(tp: int, pp: int, p2p: bool, comm: float) -> None:
    arch = model_arch("qwen3-30b-a3b")
    kw = dict(tp=tp, pp=pp, gpu_memory_utilization=0.85, v1_engine=True, p2p=p2p, **QWEN)
    before, after = (estimate(arch, V100, nccl_in_budget=order, **kw) for order in (True, False))
    for est in (before, after):
        assert est.communicator_gib == pytest.approx(comm) and est.communicator_in_budget
        assert est.non_torch_gib == pytest.approx(V1_NON_TORCH_BASE_GIB + comm)
    assert after.kv_tokens == before.kv_tokens
    # Where NCCL starts before the baseline (0.11+), the start-up check pays the buffers too: both, safe side.
    assert before.startup_free_gib is None
    assert after.startup_free_gib == pytest.approx(V100 - CUDA_CONTEXT_GIB - comm)


def test_the_memory_fit_policy_names_the_start_up_refusal_and_the_utilization_that_starts() -> None:
    config = prod_config()
    config[NS + "pools"]["reasoning"]["vllm"]["gpuMemoryUtilization"] = 0.95
    config[NS + "monitoring"].setdefault("thresholds", {})["gpuMemoryUsedRatio"] = 0.99  # not this test's rule
    found = [v for v in analyze(run_stack(config, preview=True).registrations) if v.policy_name == "memory-fit"]
    assert [v.resource_name for v in found] == ["reasoning-gpu-01"]
    assert (
        "vLLM stops with 'Free memory on device ... on startup is less than desired GPU memory utilization'"
        in found[0].message
    )
    assert "To fit: lower gpu-memory-utilization from 0.95 to 0.92 or less." in found[0].message


def test_tensor_parallelism_across_nodes_is_not_estimated(config: dict[str, Any]) -> None:
    from components.engines.vllm.capacity import capacity_dict

    config[NS + "pools"]["reasoning"].update(tensorParallel=16, pipelineParallel=1)
    assert capacity_dict(load_stack_config(config, set()), "reasoning") == {
        "error": "capacity not estimated: tensor parallel size 16 spans nodes of 8 GPUs: the planner models "
        "tensor parallelism within a node"
    }
