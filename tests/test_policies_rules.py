"""Each rule through pulumi_policy's analyzer servicer with real AnalyzeRequest messages: a compliant
resource, and the same resource with one field changed, with the exact message."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from components.engines.base import container_envs
from components.engines.estimate import KV_ERROR_UNMEASURED
from components.engines.registry import ENGINES
from components.engines.vllm.capacity import with_range
from components.engines.vllm.memory import KV_ERROR_TERMS
from components.planning.fabric.ray import RAY_HEAD_SCRIPT, ray_head_script
from components.planning.monitoring.prometheus import (
    alertmanager_args,
    dcgm_exporter_env,
    grafana_env,
    node_exporter_args,
    prometheus_args,
)
from components.spec import StackSpec
from components.spec.monitoring import ServiceSpec
from components.spec.topology import all_instances
from plan.analyze import configure_request
from plan.harness import UNKNOWN, ProgramRun
from policies.rules.bindings import LISTENERS
from policies.rules.common import RAY_ROLES, role_of
from policies.rules.security import EXPOSURE_CONFIG
from tests.support.policies import CAPACITY, CHAT_ARGV, CHAT_ENV, V100, analyze, model_server, only, server


def set_flag(props: dict[str, Any], flag: str, value: str) -> dict[str, Any]:
    """Replace one flag's value in the props' argv."""
    argv = props["argv"]
    argv[argv.index(flag) + 1] = value
    return props


def of(policy: str, diagnostics: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [d for d in diagnostics if d[0] == policy]


def test_reference_chat_replica_is_clean() -> None:
    assert model_server(server()) == []


# --- rule 1: dtype -----------------------------------------------------------------------------


def test_bfloat16_on_v100_is_refused_with_half_as_the_way_out() -> None:
    got = model_server(set_flag(server(), "--dtype", "bfloat16"))
    assert got == only(
        "gpu-dtype",
        "--dtype bfloat16: bfloat16 needs compute capability 8.0; Tesla "
        "V100-SXM2-32GB (sm_70) has none (vLLM refuses it at startup; vLLM 0.19.0 platforms/cuda.py "
        "supported dtypes below sm_80: fp16, fp32 [read from code]). Instead, set "
        "models.qwen3-30b-a3b.dtype: half.",
    )
    # Every version refuses it: an image the table does not know is judged too.
    unknown = model_server(set_flag(server(image="registry.local/vllm:dev"), "--dtype", "bfloat16"))
    assert [d[0] for d in unknown] == ["gpu-dtype", "vllm-image-unknown"]
    assert "(vLLM refuses it at startup; every known vLLM version)" in unknown[0][2]


def test_bfloat16_on_a100_is_fine() -> None:
    props = set_flag(server(gpuModel="NVIDIA A100-SXM4-80GB", env={}), "--dtype", "bfloat16")
    assert of("gpu-dtype", model_server(props)) == []


def test_float32_by_accident_is_refused_unless_configured() -> None:
    props = set_flag(server(), "--dtype", "float")
    assert of("gpu-dtype", model_server(props)) == only(
        "gpu-dtype",
        "--dtype float: float32 doubles the weights' memory and runs without tensor cores on Tesla "
        "V100-SXM2-32GB (sm_70). Use --dtype half, or set allowFloat32 in this policy's config if meant.",
    )
    assert model_server(props, config={"gpu-dtype": {"allowFloat32": True}}) == []


# --- rule 2: VLLM_USE_V1 -----------------------------------------------------------------------


def v092(**changes: Any) -> dict[str, Any]:
    """The chat replica on the runbook's vllm/vllm-openai:v0.9.2 (V0, VLLM_USE_V1=0, no --attention-backend)."""
    props = server(
        image="vllm/vllm-openai:v0.9.2", env={**CHAT_ENV, "VLLM_USE_V1": "0"}, argv_drop=["--attention-backend"]
    )
    props.update(changes)
    return props


def test_v1_engine_unset_is_refused_on_v100() -> None:
    env = {k: v for k, v in CHAT_ENV.items() if k != "VLLM_USE_V1"}
    assert of("vllm-v1-engine", model_server(v092(env=env))) == only(
        "vllm-v1-engine",
        "VLLM_USE_V1 is unset (vLLM 0.9.2 reads unset as 1): the V1 engine of image "
        "vllm/vllm-openai:v0.9.2 (vLLM 0.9.2) needs compute capability 8.0 and Tesla V100-SXM2-32GB (sm_70) has "
        "less (VLLM_USE_V1=1 raises NotImplementedError; vLLM 0.9.2 arg_utils.py:1353-1363 [read from code]). Set "
        "VLLM_USE_V1=0 in the container's env.",
    )


def test_v1_engine_one_is_refused_on_v100_and_fine_on_h100() -> None:
    env = {**CHAT_ENV, "VLLM_USE_V1": "1"}
    assert of("vllm-v1-engine", model_server(v092(env=env))) == only(
        "vllm-v1-engine",
        "VLLM_USE_V1 is '1': the V1 engine of image vllm/vllm-openai:v0.9.2 (vLLM 0.9.2) needs "
        "compute capability 8.0 and Tesla V100-SXM2-32GB (sm_70) has less (VLLM_USE_V1=1 raises "
        "NotImplementedError; vLLM 0.9.2 arg_utils.py:1353-1363 [read from code]). Set VLLM_USE_V1=0 in the "
        "container's env.",
    )
    assert model_server(v092(env=env, gpuModel="NVIDIA H100 80GB HBM3")) == []


def test_v1_switch_on_a_line_that_no_longer_reads_it_is_called_meaningless() -> None:
    assert model_server(server(env={**CHAT_ENV, "VLLM_USE_V1": "0"})) == only(
        "vllm-v1-ignored",
        "VLLM_USE_V1=0 does nothing in image vllm/vllm-openai:v0.19.1 (vLLM 0.19.1): its envs.py "
        "no longer reads it and the only engine is V1 (vLLM 0.19.1 vllm/envs.py has no VLLM_USE_V1 (removed in "
        "0.12.0) [read from code]). Remove VLLM_USE_V1.",
        level="advisory",
    )
    # The 0.19.1 replica on V100 runs V1 and needs no switch at all.
    assert of("vllm-v1-engine", model_server(server())) == []


# --- rule 3: quantization ----------------------------------------------------------------------

Q0191 = "vLLM 0.19.1 quantization/__init__.py QUANTIZATION_METHODS, get_min_capability of each method; gptq.py:171-183 GPTQ MoE -> MoeWNA16 [read from code]"


def test_awq_checkpoint_on_v100_names_gptq_and_lmdeploy() -> None:
    assert model_server(server(quantization="awq")) == only(
        "gpu-quantization",
        "the checkpoint's quantization awq (models.qwen3-30b-a3b.quantization): vLLM 0.19.1 "
        'needs sm_75 (compute capability 7.5) for awq; Tesla V100-SXM2-32GB (sm_70) has less ("Minimum capability: '
        f'75. Current capability: 70."; {Q0191}). Instead, serve a GPTQ checkpoint of the model (--quantization '
        "gptq), or serve the AWQ checkpoint with LMDeploy (TurboMind runs AWQ on sm_70).",
    )


def test_gptq_marlin_flag_on_v100_points_to_plain_gptq() -> None:
    got = model_server(server(quantization="gptq", argv_add=["--quantization", "gptq_marlin"]))
    assert got == only(
        "gpu-quantization",
        "--quantization gptq_marlin: vLLM 0.19.1 needs sm_75 (compute capability 7.5) for "
        'gptq_marlin; Tesla V100-SXM2-32GB (sm_70) has less ("Minimum capability: 75. Current capability: 70."; '
        f"{Q0191}). Instead, use --quantization gptq (or leave it unset: vLLM picks plain gptq itself where Marlin "
        "does not run).",
    )
    # The minimum is the version's own: 0.9.2 asked for sm_80.
    assert (
        "vLLM 0.9.2 needs sm_80 (compute capability 8.0) for gptq_marlin"
        in of(
            "gpu-quantization",
            model_server(v092(quantization="gptq", argv=v092()["argv"] + ["--quantization", "gptq_marlin"])),
        )[0][2]
    )


def test_gptq_on_a_moe_model_is_refused_on_0_9_2_and_routed_on_0_19() -> None:
    props = v092(arch="deepseek-r1", quantization="gptq", env={**CHAT_ENV, "VLLM_USE_V1": "0", "VLLM_MLA_DISABLE": "1"})
    assert of("quantization-moe", model_server(props)) == only(
        "quantization-moe",
        "the checkpoint's quantization gptq (models.qwen3-30b-a3b.quantization) on deepseek-r1 "
        "(deepseek_v3, a MoE model): vLLM 0.9.2 has no FusedMoE method for gptq, so the model fails to build "
        "(AssertionError in FusedMoE; vLLM 0.9.2 get_min_capability of each quantization/*.py; config.py:4469-4478; "
        "MoE vllm#22001, 0.9.2 fused_moe/layer.py:732-736 [read from code]). Instead, set "
        "models.qwen3-30b-a3b.quantization: moe_wna16 (a GPTQ 4/8-bit checkpoint with desc_act: false; its Triton "
        "path needs a Triton that compiles for the GPU) or use vllm/vllm-openai:v0.19.1 (pools.chat.image), whose "
        f"vLLM 0.19.1 routes gptq MoE layers to MoeWNA16 by itself ({Q0191}).",
    )
    assert of("quantization-moe", model_server(v092(arch="deepseek-r1", quantization="moe_wna16"))) == []
    assert of("quantization-moe", model_server(server(arch="deepseek-r1", quantization="gptq"))) == []
    # A dense model has no FusedMoE layer: plain gptq is fine on 0.9.2.
    assert of("quantization-moe", model_server(v092(arch="deepseek-r1-distill-qwen-32b", quantization="gptq"))) == []


def test_gptq_and_awq_on_their_gpus_are_fine() -> None:
    assert model_server(server(quantization="gptq", argv_add=["--quantization", "gptq"])) == []
    assert of("gpu-quantization", model_server(server(quantization="awq", gpuModel="Tesla T4"))) == []


# --- rule 4: FP8 -------------------------------------------------------------------------------


def test_fp8_kv_cache_on_v100_is_refused() -> None:
    assert model_server(server(argv_add=["--kv-cache-dtype", "fp8"])) == only(
        "gpu-fp8",
        "--kv-cache-dtype fp8: vLLM 0.19.1 cannot keep an fp8 KV cache on Tesla V100-SXM2-32GB (sm_70) "
        "(vLLM 0.19.1: below sm_80 the only backend is TRITON_ATTN, which views an fp8 cache as float8_e4m3fn "
        "(v1/attention/backends/triton_attn.py:399, 475-478), and Triton 3.6 has fp8e4nv only from sm_89 "
        "(backends/nvidia/compiler.py:186-190): 'type fp8e4nv not supported in this architecture' on sm_70 and "
        "sm_75, as tests/test_fp8_bf16_below_sm80.py compiles with the real Triton 3.6.0 wheel [read from code]). "
        "Use --kv-cache-dtype auto (float16 cache) and lower --max-model-len or --max-num-seqs if the cache does "
        "not fit.",
    )


def test_fp8_checkpoint_on_v100_is_one_fp8_violation_not_two() -> None:
    assert model_server(server(quantization="fp8")) == only(
        "gpu-fp8",
        "the checkpoint's quantization fp8 (models.qwen3-30b-a3b.quantization): FP8 weights need sm_75 "
        "(compute capability 7.5) in vLLM 0.19.1 and Tesla V100-SXM2-32GB (sm_70) has no FP8 units (vLLM 0.19.1 "
        "quantization/__init__.py QUANTIZATION_METHODS, get_min_capability of each method; gptq.py:171-183 GPTQ MoE "
        "-> MoeWNA16 [read from code]). Serve an fp16 or GPTQ checkpoint of the model instead.",
    )
    assert model_server(server(quantization="fp8", gpuModel="NVIDIA H100 80GB HBM3", env={})) == []


# --- rule 5: chunked prefill and prefix caching ------------------------------------------------

WHY = (
    "the prefix-prefill kernel of image vllm/vllm-openai:v0.9.2 (vLLM 0.9.2) fails on Tesla V100-SXM2-32GB "
    "(sm_70) (vllm#18993 (V100) and #19203 (T4): the Triton prefix-prefill kernel fails with Triton 3.3.0; "
    "Triton compile matrix for sm_70 [observed])"
)
RULE = "gpu-chunked-prefill-prefix-caching"


def test_prefix_caching_on_v100_is_refused() -> None:
    props = v092(argv=v092()["argv"] + ["--enable-prefix-caching"])
    assert of(RULE, model_server(props)) == only(
        RULE, f"--enable-prefix-caching: {WHY}. Remove it (enablePrefixCaching: false)."
    )
    # 0.19.1's TRITON_ATTN runs prefix caching on sm_70 (V1's default): not refused.
    assert of(RULE, model_server(server(argv_add=["--enable-prefix-caching"]))) == []


def test_max_model_len_above_32k_turns_chunked_prefill_on_by_itself() -> None:
    props = set_flag(v092(), "--max-model-len", "40960")
    assert of(RULE, model_server(props)) == only(
        RULE,
        f"--max-model-len 40960: above 32768 vLLM 0.9.2 turns chunked prefill on by itself; {WHY}. Set "
        "--max-model-len <= 32768 or pass --no-enable-chunked-prefill.",
    )
    # The explicit --no- form is the way out; 32K (binary suffix) is exactly 32768.
    assert (
        of(
            RULE,
            model_server(
                set_flag(v092(argv=v092()["argv"] + ["--no-enable-chunked-prefill"]), "--max-model-len", "40960")
            ),
        )
        == []
    )
    assert of(RULE, model_server(set_flag(v092(), "--max-model-len", "32K"))) == []


def test_unset_max_model_len_is_refused_on_v100() -> None:
    props = v092()
    i = props["argv"].index("--max-model-len")
    del props["argv"][i : i + 2]
    assert of(RULE, model_server(props)) == only(
        RULE,
        f"--max-model-len is unset: vLLM takes the model's context length and turns chunked prefill on by "
        f"itself above 32768; {WHY}. Set --max-model-len <= 32768 or pass --no-enable-chunked-prefill.",
    )


# --- rule 6: image -----------------------------------------------------------------------------

TORCH_092 = "pools.chat.image vllm/vllm-openai:v0.9.2: its torch 2.7.0+cu128 is built for sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, without sm_70, so the first CUDA kernel on Tesla V100-SXM2-32GB (sm_70) fails with \"no kernel image is available for execution on the device\" (pytorch#147607: torch 2.7.0+cu128 is built for sm_75..sm_120 without sm_70; vllm#18818, #19185 'no kernel image is available' on V100 [observed]). Use an image whose torch has sm_70: vllm/vllm-openai:v0.11.0, vllm/vllm-openai:v0.19.1."
TRITON_33 = (
    "Triton 3.3.0 in image vllm/vllm-openai:v0.9.2 (vLLM 0.9.2) cannot compile fp16 tl.dot below sm_80 "
    '("Unsupported conversion from f16 to f16 / LLVM ERROR: Unsupported rounding mode for conversion"; '
    "vllm#17639, #19203, sglang#7467 (sm_75); Triton compile matrix for sm_70 [observed]), so the engine "
    "dies at its startup profile run on Tesla V100-SXM2-32GB (sm_70). Instead, use vllm/vllm-openai:v0.19.1 "
    "(pools.chat.image; Triton 3.6.0 compiles them for sm_70 with FMA, no tensor cores)"
)


def test_an_image_whose_torch_lacks_the_gpus_arch_is_refused() -> None:
    assert of("vllm-image", model_server(v092())) == only("vllm-image", TORCH_092)
    assert of("vllm-image", model_server(server(image="vllm/vllm-openai:v0.19.1-ubuntu2404"))) == only(
        "vllm-image",
        "pools.chat.image vllm/vllm-openai:v0.19.1-ubuntu2404: its torch 2.10.0+cu129 is built for "
        "sm_87, sm_89, sm_90, sm_100, sm_120, without sm_70, so the first CUDA kernel on Tesla V100-SXM2-32GB "
        '(sm_70) fails with "no kernel image is available for execution on the device" (vLLM 0.19.0 '
        ".buildkite/release-pipeline.yaml:151-158 ('8.7 8.9 9.0 10.0+PTX 12.0') [read from code]). Use an image "
        "whose torch has sm_70: vllm/vllm-openai:v0.11.0, vllm/vllm-openai:v0.19.1.",
    )
    assert model_server(server(image="docker.io/vllm/vllm-openai:v0.19.1@sha256:abc")) == []
    # 0.9.2's torch runs on an H100.
    assert of("vllm-image", model_server(v092(gpuModel="NVIDIA H100 80GB HBM3"))) == []


def test_the_runbooks_stack_is_refused_once_per_cause() -> None:
    chat = model_server(v092())
    assert [d[0] for d in chat if d[1] == "mandatory"] == ["triton-fp16-dot", "vllm-image"]
    assert of("triton-fp16-dot", chat) == only(
        "triton-fp16-dot",
        f"the fp16 fused-MoE kernel of qwen3-30b-a3b: {TRITON_33} or set "
        "models.qwen3-30b-a3b.dtype: float32 (fp32 dots compile; twice the weights).",
    )
    reasoning = model_server(
        v092(arch="deepseek-r1", quantization="gptq", argv=v092()["argv"] + ["--quantization", "gptq"])
    )
    assert [d[0] for d in reasoning if d[1] == "mandatory"] == [
        "quantization-moe",
        "triton-fp16-dot",
        "mla-attention",
        "vllm-image",
    ]
    assert of("triton-fp16-dot", reasoning) == only("triton-fp16-dot", f"Triton MLA decode: {TRITON_33}.")
    # fp32 compiles on Triton 3.3: the MoE kernel is no longer an fp16 one (the torch arch list still refuses).
    fp32 = model_server(set_flag(v092(), "--dtype", "float32"), config={"gpu-dtype": {"allowFloat32": True}})
    assert of("triton-fp16-dot", fp32) == []


def test_an_image_the_facts_do_not_know_gets_one_advisory_and_the_every_version_checks() -> None:
    got = model_server(server(image="vllm/vllm-openai:v0.10.1"))
    assert got == only(
        "vllm-image-unknown",
        "image vllm/vllm-openai:v0.10.1 is not in the facts table (known: "
        "vllm/vllm-openai:v0.11.0, vllm/vllm-openai:v0.19.1, vllm/vllm-openai:v0.19.1-ubuntu2404, "
        "vllm/vllm-openai:v0.9.2), so "
        "vllm-v1-engine, gpu-quantization, quantization-dtype, quantization-moe, triton-fp16-dot, gpu-chunked-prefill-prefix-caching, "
        "attention-backend, vllm-serve-flags, vllm-image cannot judge it; only the checks that need no image "
        "facts ran (bf16, FP8 and MLA below sm_80). To have it judged, declare its facts under "
        "pools.<pool>.imageFacts (like: a known image, then version, cuda, torch, torchArchList, triton), or use "
        "vllm/vllm-openai:v0.19.1 (pools.chat.image).",
        level="advisory",
    )
    assert [d[0] for d in model_server(server(image="vllm/vllm-openai:v0.10.1", arch="deepseek-r1"))] == [
        "mla-attention",
        "vllm-image-unknown",
    ]


def test_declared_facts_of_a_private_build_are_held_to() -> None:
    declared = {"like": "vllm/vllm-openai:v0.19.1", "torch": "2.10.0+cu126", "torch_arch_list": [75, 80, 86]}
    got = model_server(server(image="registry.local/vllm-volta:0.19.1", imageFacts=declared))
    assert [d[0] for d in got] == ["vllm-image"]
    assert "its torch 2.10.0+cu126 is built for sm_75, sm_80, sm_86, without sm_70" in got[0][2]
    assert "(declared by pools.chat.imageFacts [unverified])" in got[0][2]
    declared["torch_arch_list"] = [70, 75, 80]
    assert model_server(server(image="registry.local/vllm-volta:0.19.1", imageFacts=declared)) == []


def test_ray_cluster_image_without_ray_and_vllm_is_refused() -> None:
    props = {
        "pool": "reasoning",
        "instance": "reasoning-gpu-01",
        "nodes": ["gpu-01", "gpu-02"],
        "head": "gpu-01",
        "wantGpus": 16.0,
        "image": "vllm/vllm-openai:v0.19.1",
        "rayPort": 6379.0,
    }
    assert analyze("llm-cluster:ray:RayCluster", "reasoning-gpu-01", props) == []
    got = analyze("llm-cluster:ray:RayCluster", "reasoning-gpu-01", {**props, "image": "nvcr.io/nvidia/pytorch:24.05"})
    assert got == only(
        "vllm-image",
        "image nvcr.io/nvidia/pytorch:24.05 is not known to contain Ray and vLLM, which "
        "every container of a multi-node instance runs (known: vllm/vllm-openai). Use "
        "vllm/vllm-openai:v0.19.1, or list the image in this policy's rayImages.",
    )
    # Ray without vLLM is not enough: the head runs `vllm serve`, the workers vLLM's engine workers.
    got = analyze("llm-cluster:ray:RayCluster", "reasoning-gpu-01", {**props, "image": "rayproject/ray:2.46.0-gpu"})
    assert got == only(
        "vllm-image",
        "image rayproject/ray:2.46.0-gpu is not known to contain Ray and vLLM, which "
        "every container of a multi-node instance runs (known: vllm/vllm-openai). Use "
        "vllm/vllm-openai:v0.19.1, or list the image in this policy's rayImages.",
    )


# --- rule 7: topology --------------------------------------------------------------------------


def test_tensor_parallel_16_on_8_gpu_nodes_gets_the_tp8_pp2_layout() -> None:
    props = set_flag(server(nodes=["gpu-03", "gpu-04"], tensorParallel=16.0), "--tensor-parallel-size", "16")
    assert of("parallelism", model_server(props)) == only(
        "parallelism",
        "--tensor-parallel-size 16 is more than the 8 GPUs of one node: tensor parallelism "
        "all-reduces every layer and must stay inside a node (NVLink/PCIe). Use --tensor-parallel-size 8 "
        "--pipeline-parallel-size 2 across 2 nodes.",
    )


def test_pipeline_parallel_inside_one_node_is_refused() -> None:
    props = set_flag(server(), "--tensor-parallel-size", "4") | {"pipelineParallel": 2.0}
    props["argv"] += ["--pipeline-parallel-size", "2"]
    assert model_server(props) == only(
        "parallelism",
        "--pipeline-parallel-size 2 inside one node: pipeline stages belong across nodes (only "
        "activations cross the network). Use --tensor-parallel-size 8 instead.",
    )


def test_tp_times_pp_must_fill_the_nodes_spanned() -> None:
    props = server(nodes=["gpu-01", "gpu-02"], argv_add=["--pipeline-parallel-size", "2"])
    props = set_flag(props, "--tensor-parallel-size", "4")
    assert of("parallelism", model_server(props)) == only(
        "parallelism",
        "tensor 4 x pipeline 2 = 8 GPUs, but the instance spans 2 nodes x 8 GPUs = 16: Ray would "
        "leave GPUs idle or not find enough. Use --tensor-parallel-size 8 --pipeline-parallel-size 2.",
    )


def test_attention_heads_must_divide_by_tp() -> None:
    props = set_flag(server(arch="deepseek-r1-distill-qwen-32b"), "--tensor-parallel-size", "3")
    assert of("parallelism", model_server(props)) == only(
        "parallelism",
        "--tensor-parallel-size 3: deepseek-r1-distill-qwen-32b has 40 attention heads, not "
        'divisible by 3 (vLLM: "Total number of attention heads (40) must be divisible by tensor parallel size '
        '(3)."). Use one of: 1, 2, 4, 5, 8.',
    )


RAY_WORKER = {
    "name": "ray-worker",
    "networkMode": "host",
    "restart": "unless-stopped",
    "entrypoints": ["ray"],
    "command": ["start", "--block", "--address=192.168.10.11:6379", "--node-ip-address=192.168.10.12"],
    "envs": [f"{k}={v}" for k, v in CHAT_ENV.items()],
    "labels": [
        {"label": "llm-cluster.role", "value": "ray-worker"},
        {"label": "llm-cluster.gpu-model", "value": V100},
        {"label": "llm-cluster.image", "value": "vllm/vllm-openai:v0.19.1"},
    ],
    "image": UNKNOWN,
}
CONTAINER = "docker:index/container:Container"


def ray_worker(**changes: Any) -> list[tuple[str, str, str]]:
    props = {**copy.deepcopy(RAY_WORKER), **changes}
    return analyze(CONTAINER, "reasoning-gpu-01-ray-worker-gpu-02", props, parent_type="llm-cluster:ray:RayCluster")


def test_ray_worker_of_the_reference_is_clean_even_with_an_unknown_image_id() -> None:
    assert ray_worker() == []


def test_ray_worker_without_the_roce_gid_index_is_refused() -> None:
    envs = [e for e in RAY_WORKER["envs"] if not e.startswith("NCCL_IB_GID_INDEX=")]
    assert ray_worker(envs=envs) == only(
        "multi-node-network",
        "NCCL_IB_GID_INDEX not set in the container's env: Ray's executor passes only vLLM's "
        "own variables to workers, so each container needs the NCCL ones itself, or NCCL falls back to the wrong "
        "interface or TCP (RoCE needs the GID index, usually 3). Set them from the node's hca and interface.",
    )
    assert (
        of(
            "multi-node-network",
            ray_worker(
                envs=envs, labels=RAY_WORKER["labels"] + [{"label": "llm-cluster.link-layer", "value": "infiniband"}]
            ),
        )
        == []
    )


def test_ray_worker_on_a_bridge_network_is_refused() -> None:
    assert ray_worker(networkMode="bridge") == only(
        "multi-node-network",
        "networkMode is bridge: Ray and NCCL need the node's own addresses and high ports "
        '(VLLM_HOST_IP, RDMA). Set network_mode="host".',
    )


MISSING_NCCL = (
    " not set in the container's env: Ray's executor passes only vLLM's own variables to workers, so each container "
    "needs the NCCL ones itself, or NCCL falls back to the wrong interface or TCP (RoCE needs the GID index, "
    "usually 3). Set them from the node's hca and interface."
)


def ray_worker_env(drop: tuple[str, ...] = (), **values: str) -> list[str]:
    """RAY_WORKER's env less the names in `drop`, with `values` set."""
    kept = [e for e in RAY_WORKER["envs"] if e.split("=", 1)[0] not in drop and e.split("=", 1)[0] not in values]
    return kept + [f"{k}={v}" for k, v in values.items()]


@pytest.mark.parametrize(
    ("envs", "message"),
    [
        # Without NCCL's IB transport (NCCL_IB_DISABLE=1) the HCA and GID index are not needed; the interface is.
        (ray_worker_env(("NCCL_IB_HCA", "NCCL_IB_GID_INDEX"), NCCL_IB_DISABLE="1"), None),
        (
            ray_worker_env(("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME"), NCCL_IB_DISABLE="1"),
            "NCCL_SOCKET_IFNAME" + MISSING_NCCL,
        ),
        # Any other value keeps IB on: both are needed, every missing name listed in order.
        (
            ray_worker_env(("NCCL_IB_HCA", "NCCL_IB_GID_INDEX"), NCCL_IB_DISABLE="0"),
            "NCCL_IB_HCA, NCCL_IB_GID_INDEX" + MISSING_NCCL,
        ),
        (
            ray_worker_env(("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME")),
            "NCCL_SOCKET_IFNAME, NCCL_IB_HCA, NCCL_IB_GID_INDEX" + MISSING_NCCL,
        ),
    ],
)
def test_ray_worker_nccl_variables_by_ib_transport(envs: list[str], message: str | None) -> None:
    got = of("multi-node-network", ray_worker(envs=envs))
    assert got == ([] if message is None else only("multi-node-network", message))


def test_ray_worker_without_a_network_mode_is_on_dockers_bridge() -> None:
    props = {k: v for k, v in RAY_WORKER.items() if k != "networkMode"}
    got = analyze(CONTAINER, "reasoning-gpu-01-ray-worker-gpu-02", props, parent_type="llm-cluster:ray:RayCluster")
    assert of("multi-node-network", got) == only(
        "multi-node-network",
        "networkMode is bridge (unset): Ray and NCCL need the node's own addresses and high ports "
        '(VLLM_HOST_IP, RDMA). Set network_mode="host".',
    )


# --- rule 8: flags -----------------------------------------------------------------------------


def flag_errors(*extra: str, drop: tuple[str, ...] = ()) -> list[str]:
    got = model_server(server(argv_add=list(extra), argv_drop=list(drop)))
    return [d[2].split("\n", 1)[1] for d in got if d[0] == "vllm-serve-flags"]


def test_model_flag_gets_vllms_own_refusal() -> None:
    props = v092()
    props["argv"] = ["vllm", "serve", "--model", "/data/models/Qwen3-30B-A3B"] + props["argv"][3:]
    assert of("vllm-serve-flags", model_server(props)) == only(
        "vllm-serve-flags",
        "vllm serve (vLLM 0.9.2): With `vllm serve`, you should provide the model as a "
        "positional argument or in a config file instead of via the `--model` option.",
    )
    # 0.19.1 only warns and takes --model as the positional.
    props = server()
    props["argv"] = ["vllm", "serve", "--model", "/data/models/Qwen3-30B-A3B"] + props["argv"][3:]
    assert of("vllm-serve-flags", model_server(props)) == []


def test_unknown_flag_suggests_the_real_one() -> None:
    assert flag_errors("--enable-prefix-cache") == [
        "vllm serve (vLLM 0.19.1): unrecognized flag --enable-prefix-cache: not a `vllm serve` flag in vLLM 0.19.1; "
        "did you mean --enable-prefix-caching?"
    ]
    # A flag 0.9.2 had and 0.19.1 dropped is refused by the pool's own version.
    assert flag_errors("--swap-space", "4") == [
        "vllm serve (vLLM 0.19.1): unrecognized flag --swap-space: not a `vllm serve` flag in vLLM 0.19.1"
    ]


def test_every_bad_value_is_reported_not_only_the_first() -> None:
    assert flag_errors(
        "--kv-cache-dtype", "fp4", "--quantization", "int4", "--max-num-seqs", "many", "--enable-chunked-prefill=False"
    ) == [
        "vllm serve (vLLM 0.19.1): argument --kv-cache-dtype: invalid choice: 'fp4' (choose from 'auto', 'bfloat16', "
        "'float16', 'fp8', 'fp8_ds_mla', 'fp8_e4m3', 'fp8_e5m2', 'fp8_inc')",
        "vllm serve (vLLM 0.19.1): argument --max-num-seqs: invalid int value: 'many'",
        "vllm serve (vLLM 0.19.1): argument --enable-chunked-prefill/--no-enable-chunked-prefill: ignored explicit "
        "argument 'False'",
        "vllm serve (vLLM 0.19.1): argument --quantization/-q: unknown quantization method 'int4'; vLLM 0.19.1 "
        "knows: awq, awq_marlin, bitsandbytes, compressed-tensors, cpu_awq, experts_int8, fbgemm_fp8, fp8, fp_quant, "
        "gguf, gptq, gptq_marlin, inc, modelopt, modelopt_fp4, modelopt_mixed, modelopt_mxfp8, moe_wna16, mxfp4, "
        "mxfp8, petit_nvfp4, quark, torchao",
    ]


def test_underscore_spelling_and_aliases_are_real_flags() -> None:
    assert flag_errors("--max_num_batched_tokens", "8192", "-q", "gptq", "--no-enable-prefix-caching") == []


# --- rule 9: security --------------------------------------------------------------------------

GATEWAY_PROPS = {
    "node": "gpu-01",
    "port": 443.0,
    "authRequired": True,
    "apiKeyIds": ["default"],
    "keySource": "generated",
    "tls": True,
    "routes": {},
    "pathRoutes": {},
    "exposedPaths": [],
}


def test_gateway_without_keys_is_refused() -> None:
    gateway = "llm-cluster:gateway:Gateway"
    assert analyze(gateway, "gateway", GATEWAY_PROPS) == []
    assert analyze(gateway, "gateway", {**GATEWAY_PROPS, "authRequired": False}) == only(
        "gateway-auth",
        "gateway.auth is false: every model would be open to anyone who reaches the gateway's port. "
        "Set gateway.auth: true (keys in gateway.apiKeys, or none to have one generated on the host), or, for a "
        "lab only, lower this policy's enforcement level.",
    )


def test_gateway_keys_in_clear_are_reported() -> None:
    gateway = "llm-cluster:gateway:Gateway"
    assert analyze(gateway, "gateway", {**GATEWAY_PROPS, "tls": False, "port": 80.0}) == only(
        "gateway-tls",
        "gateway.tls is false: API keys and prompts cross the network in clear on port 80. Leave "
        "gateway.tls at true (a certificate from gatewayTlsCert/gatewayTlsKey, or one made on the gateway host with "
        "its CA as the output gatewayCaCert).",
        "advisory",
    )
    assert analyze(gateway, "gateway", {**GATEWAY_PROPS, "httpRedirectPort": 80.0}) == only(
        "gateway-tls",
        "gateway.httpRedirectPort 80 answers plain HTTP: a client that sends its request there has "
        "sent its API keys and prompts in clear before it is redirected. Unset it unless clients need the redirect.",
        "advisory",
    )


PLAINTEXT = (
    "Anyone with docker or shell access on the node reads it (docker inspect, ps, the command log). Read it "
    'from a file on the host (NAME__FILE, --api-key "$(cat /etc/llm-cluster/…)"), or list a harmless env '
    "name in this policy's ignoreEnv."
)


def test_literal_api_key_and_token_in_a_container_are_refused() -> None:
    props = {
        "networkMode": "host",
        "restart": "unless-stopped",
        "entrypoints": ["vllm"],
        "command": CHAT_ARGV[1:] + ["--api-key", "sk-live-123"],
        "envs": ["HF_TOKEN=hf_abc", "VLLM_USE_V1=0", "GF_SECURITY_ADMIN_PASSWORD__FILE=/run/secrets/pw"],
        "labels": [{"label": "llm-cluster.role", "value": "vllm"}],
    }
    got = analyze(CONTAINER, "chat-gpu-03-vllm", props, parent_type="llm-cluster:vllm:ModelServer")
    assert got == only("no-plaintext-secrets", f"credential in plain text: env HF_TOKEN, --api-key. {PLAINTEXT}")
    props["envs"] = ["HF_TOKEN=hf_abc", "VLLM_USE_V1=0"]
    props["command"] = CHAT_ARGV[1:]
    assert (
        analyze(
            CONTAINER,
            "c",
            props,
            parent_type="llm-cluster:vllm:ModelServer",
            config={"no-plaintext-secrets": {"ignoreEnv": ["HF_TOKEN"]}},
        )
        == []
    )


def test_secret_assignment_in_a_remote_script_is_refused() -> None:
    props = {"connection": {"host": "192.168.10.11"}, "create": 'set -euo pipefail\nKEY="$(openssl rand -hex 16)"\n'}
    assert analyze("command:remote:Command", "keys", props) == []
    props["create"] += "export OPENAI_API_KEY=sk-abc\n"
    assert analyze("command:remote:Command", "keys", props) == only(
        "no-plaintext-secrets", f"credential in plain text: script OPENAI_API_KEY=…. {PLAINTEXT}"
    )


def test_secret_assignment_in_a_containers_shell_snippet_is_refused() -> None:
    script = " ".join(CHAT_ARGV)
    props = {
        "networkMode": "host",
        "restart": "unless-stopped",
        "entrypoints": ["bash", "-c"],
        "command": [f'HF_TOKEN="$(cat /run/secrets/hf)" {script}'],
        "envs": ["VLLM_USE_V1=0"],
        "labels": [{"label": "llm-cluster.role", "value": "vllm"}],
    }
    assert analyze(CONTAINER, "c", props, parent_type="llm-cluster:vllm:ModelServer") == []
    props["command"] = [f"HF_TOKEN=hf_live {script}"]
    assert analyze(CONTAINER, "c", props, parent_type="llm-cluster:vllm:ModelServer") == only(
        "no-plaintext-secrets", f"credential in plain text: script HF_TOKEN=…. {PLAINTEXT}"
    )
    # A flag in the snippet is reported once (by the server's parse), not again as a script flag.
    props["command"] = [f"{script} --api-key sk-live-123"]
    assert analyze(CONTAINER, "c", props, parent_type="llm-cluster:vllm:ModelServer") == only(
        "no-plaintext-secrets", f"credential in plain text: --api-key. {PLAINTEXT}"
    )
    assert (
        analyze(
            CONTAINER,
            "c",
            {**props, "command": [f"HF_TOKEN=hf_live {script}"]},
            parent_type="llm-cluster:vllm:ModelServer",
            config={"no-plaintext-secrets": {"ignoreEnv": ["HF_TOKEN"]}},
        )
        == []
    )


def test_a_published_internal_port_is_refused_unless_on_one_address() -> None:
    props = {
        "networkMode": "bridge",
        "restart": "unless-stopped",
        "image": "prom/prometheus:v2.55.1",
        "labels": [{"label": "llm-cluster.role", "value": "prometheus"}],
        "ports": [{"internal": 9090.0, "external": 9090.0, "ip": "192.168.10.11"}],
    }
    assert analyze(CONTAINER, "p", props, parent_type=MONITORING) == []
    props["ports"] = [{"internal": 9090.0, "external": 9090.0}]
    assert analyze(CONTAINER, "p", props, parent_type=MONITORING) == only(
        "internal-ports",
        "port 9090 of a prometheus container is published on every interface: vLLM, Ray and "
        "metrics ports serve without authentication. Publish it on the node's cluster address (ports[].ip) or drop "
        "it and let the gateway/Prometheus reach it over the cluster network.",
    )


# --- rule 9: what host-network services bind ----------------------------------------------------

MONITORING = "llm-cluster:monitoring:Monitoring"
CLUSTER_ADDRESS = "<the node's cluster address>"


def host_container(
    role: str, image: str, *, command: list[str] | None = None, envs: list[str] | None = None
) -> dict[str, Any]:
    """A container as the components register it: fixed name, host network, restart, role and image labels."""
    props: dict[str, Any] = {
        "name": role,
        "networkMode": "host",
        "restart": "unless-stopped",
        "image": UNKNOWN,
        "labels": [{"label": "llm-cluster.role", "value": role}, {"label": "llm-cluster.image", "value": image}],
    }
    if command is not None:
        props["command"] = command
    if envs is not None:
        props["envs"] = envs
    return props


@pytest.fixture(scope="module")
def services(prod_spec: StackSpec) -> dict[str, tuple[dict[str, Any], str]]:
    """Each host-network service of the reference stack (on gpu-02 / the monitoring node) and its parent type,
    from the planning functions the components call."""
    m = prod_spec.monitoring
    assert m is not None and prod_spec.gateway is not None
    with_alertmanager = prod_spec.model_copy(
        update={
            "monitoring": m.model_copy(
                update={"alertmanager": ServiceSpec(image="prom/alertmanager:v0.27.0", port=9093)}
            )
        }
    )
    return {
        "node-exporter": (
            host_container("node-exporter", m.node_exporter.image, command=node_exporter_args(prod_spec, "gpu-02")),
            MONITORING,
        ),
        "dcgm-exporter": (
            host_container("dcgm-exporter", m.dcgm_exporter.image, envs=dcgm_exporter_env(prod_spec, "gpu-02")),
            MONITORING,
        ),
        "prometheus": (
            host_container("prometheus", m.prometheus.image, command=prometheus_args(prod_spec)),
            MONITORING,
        ),
        "grafana": (host_container("grafana", m.grafana.image, envs=grafana_env(prod_spec)), MONITORING),
        "alertmanager": (
            host_container("alertmanager", "prom/alertmanager:v0.27.0", command=alertmanager_args(with_alertmanager)),
            MONITORING,
        ),
    }


def set_setting(props: dict[str, Any], name: str, value: str | None) -> dict[str, Any]:
    """A copy with one flag (`--f=v` or `--f v` in command) or env (`NAME=v`) set to value, or dropped (None)."""
    props = copy.deepcopy(props)
    if not name.startswith("-"):
        envs = [e for e in props["envs"] if not e.startswith(name + "=")]
        props["envs"] = envs + ([f"{name}={value}"] if value is not None else [])
        return props
    argv: list[str] = props["command"]
    if name in argv:
        i = argv.index(name)
        argv[i : i + 2] = [name, value] if value is not None else []
    else:
        found = next((i for i, t in enumerate(argv) if t.startswith(name + "=")), None)
        if found is None:  # a flag the service takes but the deployment leaves out
            argv += [name, value] if value is not None else []
        else:
            argv[found : found + 1] = [f"{name}={value}"] if value is not None else []
    return props


def exposure(props: dict[str, Any], parent_type: str | None, config: dict[str, Any] | None = None) -> list[str]:
    """The internal-ports messages for one container (without the policy's description)."""
    got = analyze(CONTAINER, str(props.get("name") or "c"), props, parent_type=parent_type, config=config)
    return [d[2].split("\n", 1)[1] for d in got if d[0] == "internal-ports"]


def opened(role: str, said: str, serves: str, fix: str) -> str:
    return (
        f"{role} on the host network listens on every interface of the node, public ones included ({said}): "
        f"{serves}. Set {fix}."
    )


NO_AUTH = "answer there without authentication"
GOSSIP_OFF = ", or --cluster.listen-address= (empty) to turn gossip off: one Alertmanager needs none"
GRAFANA_PUBLIC = (
    ", or list grafana in this policy's publicRoles to serve it beyond the cluster network behind its own login"
)


def test_every_host_network_service_of_the_reference_binds_its_cluster_address(
    services: dict[str, tuple[dict[str, Any], str]],
) -> None:
    for role, (props, parent) in services.items():
        assert analyze(CONTAINER, role, props, parent_type=parent) == [], role


def test_every_host_network_role_the_program_registers_is_one_the_rule_reads(prod_run: ProgramRun) -> None:
    """A new host-network service must come with its listen settings in policies/rules/bindings.py."""
    public = set(EXPOSURE_CONFIG.properties["publicRoles"]["default"])
    roles = {
        role_of(r.plain_inputs()) for r in prod_run.by_type(CONTAINER) if r.plain_inputs().get("networkMode") == "host"
    }
    assert roles - set(LISTENERS) - RAY_ROLES - public == {"vllm"}  # vllm: its --host, read from the server's argv
    assert set(LISTENERS) - {"alertmanager"} <= roles  # the reference stack runs no Alertmanager


@pytest.mark.parametrize(
    "role, setting, value, message",
    [
        (
            "node-exporter",
            "--web.listen-address",
            ":9100",
            opened(
                "node-exporter",
                "--web.listen-address=:9100",
                f"the host's metrics {NO_AUTH}",
                f"--web.listen-address={CLUSTER_ADDRESS}:9100",
            ),
        ),
        (
            "node-exporter",
            "--web.listen-address",
            None,
            opened(
                "node-exporter",
                "--web.listen-address unset: the default is :9100",
                f"the host's metrics {NO_AUTH}",
                f"--web.listen-address={CLUSTER_ADDRESS}:9100",
            ),
        ),
        (
            "prometheus",
            "--web.listen-address",
            "0.0.0.0:9090",
            opened(
                "prometheus",
                "--web.listen-address=0.0.0.0:9090",
                f"every metric, the query API and (with --web.enable-lifecycle) reload and shutdown {NO_AUTH}",
                f"--web.listen-address={CLUSTER_ADDRESS}:9090",
            ),
        ),
        (
            "alertmanager",
            "--web.listen-address",
            "[::]:9093",
            opened(
                "alertmanager",
                "--web.listen-address=[::]:9093",
                "its API answers there without authentication (anyone can silence alerts)",
                f"--web.listen-address={CLUSTER_ADDRESS}:9093",
            ),
        ),
        (
            "alertmanager",
            "--cluster.listen-address",
            None,
            opened(
                "alertmanager",
                "--cluster.listen-address unset: the default is 0.0.0.0:9094",
                "anyone who reaches it can join Alertmanager's HA gossip and silence alerts",
                f"--cluster.listen-address={CLUSTER_ADDRESS}:9094" + GOSSIP_OFF,
            ),
        ),
        (
            "dcgm-exporter",
            "DCGM_EXPORTER_LISTEN",
            ":9400",
            opened(
                "dcgm-exporter",
                "DCGM_EXPORTER_LISTEN=:9400",
                f"the GPUs' metrics {NO_AUTH}",
                f"DCGM_EXPORTER_LISTEN={CLUSTER_ADDRESS}:9400 in its env",
            ),
        ),
        (
            "grafana",
            "GF_SERVER_HTTP_ADDR",
            None,
            opened(
                "grafana",
                "GF_SERVER_HTTP_ADDR unset: the default is every interface",
                "its login page and API face every network the node is on",
                f"GF_SERVER_HTTP_ADDR={CLUSTER_ADDRESS} in its env" + GRAFANA_PUBLIC,
            ),
        ),
        (
            "grafana",
            "GF_SERVER_HTTP_ADDR",
            "0.0.0.0",
            opened(
                "grafana",
                "GF_SERVER_HTTP_ADDR=0.0.0.0",
                "its login page and API face every network the node is on",
                f"GF_SERVER_HTTP_ADDR={CLUSTER_ADDRESS} in its env" + GRAFANA_PUBLIC,
            ),
        ),
    ],
)
def test_a_host_network_service_on_every_interface_is_refused_naming_the_setting(
    services: dict[str, tuple[dict[str, Any], str]], role: str, setting: str, value: str | None, message: str
) -> None:
    props, parent = services[role]
    assert exposure(set_setting(props, setting, value), parent) == [message]


def test_an_empty_alertmanager_cluster_address_turns_gossip_off_and_is_fine(
    services: dict[str, tuple[dict[str, Any], str]],
) -> None:
    props, parent = services["alertmanager"]
    assert "--cluster.listen-address=" in props["command"]
    assert exposure(set_setting(props, "--cluster.listen-address", "192.168.10.11:9094"), parent) == []
    assert exposure(set_setting(props, "--web.listen-address", ""), parent) == [
        opened(
            "alertmanager",
            '--web.listen-address=""',
            "its API answers there without authentication (anyone can silence alerts)",
            f"--web.listen-address={CLUSTER_ADDRESS}:9093",
        )
    ]


def test_dcgm_exporters_address_flag_wins_over_its_env(services: dict[str, tuple[dict[str, Any], str]]) -> None:
    props, parent = services["dcgm-exporter"]
    assert exposure({**props, "command": ["-a", ":9400"]}, parent) == [
        opened("dcgm-exporter", "-a :9400", f"the GPUs' metrics {NO_AUTH}", f"-a {CLUSTER_ADDRESS}:9400")
    ]
    assert exposure({**props, "command": ["--address=192.168.10.12:9400"]}, parent) == []


def test_a_repeated_listen_flag_is_refused_for_its_open_value(services: dict[str, tuple[dict[str, Any], str]]) -> None:
    props, parent = services["node-exporter"]
    props = {**props, "command": props["command"] + ["--web.listen-address", "[::]:9101"]}
    assert exposure(props, parent) == [
        opened(
            "node-exporter",
            "--web.listen-address=[::]:9101",
            f"the host's metrics {NO_AUTH}",
            f"--web.listen-address={CLUSTER_ADDRESS}:9101",
        )
    ]


def test_grafana_may_face_every_network_when_listed_as_public(services: dict[str, tuple[dict[str, Any], str]]) -> None:
    props, parent = services["grafana"]
    props = set_setting(props, "GF_SERVER_HTTP_ADDR", None)
    assert exposure(props, parent, {"internal-ports": {"publicRoles": ["gateway", "grafana"]}}) == []


def test_unlabelled_services_are_recognised_by_image_or_script() -> None:
    raw = {
        "name": "node-exporter",
        "networkMode": "host",
        "restart": "unless-stopped",
        "image": "quay.io/prometheus/node-exporter:v1.8.2",
    }
    assert exposure(raw, None) == [
        opened(
            "node-exporter",
            "--web.listen-address unset: the default is :9100",
            f"the host's metrics {NO_AUTH}",
            f"--web.listen-address={CLUSTER_ADDRESS}:9100",
        )
    ]
    # On a bridge network its sockets are the container's own: only published ports reach the node.
    assert exposure({**raw, "networkMode": "bridge"}, None) == []
    grafana = {
        "name": "g",
        "networkMode": "host",
        "restart": "unless-stopped",
        "image": "grafana/grafana-oss:11.3.0",
        "envs": ["GF_SERVER_HTTP_ADDR=::"],
    }
    assert [m.split(" (")[0] for m in exposure(grafana, None)] == [
        "grafana on the host network listens on every interface of the node, public ones included"
    ]


def test_vllm_on_the_host_network_must_bind_the_cluster_address() -> None:
    props = {
        "networkMode": "host",
        "restart": "unless-stopped",
        "entrypoints": ["vllm"],
        "command": CHAT_ARGV[1:],
        "labels": [{"label": "llm-cluster.role", "value": "vllm"}],
    }
    assert analyze(CONTAINER, "v", props, parent_type="llm-cluster:vllm:ModelServer") == []
    why = (
        "on the host network listens on every interface of the node, and /v1, /metrics and /health answer "
        "without a key there (only the gateway checks keys). Pass --host <the node's cluster address>."
    )
    props["command"] = [t for t in CHAT_ARGV[1:] if t not in ("--host", "192.168.10.13")]
    assert analyze(CONTAINER, "v", props, parent_type="llm-cluster:vllm:ModelServer") == only(
        "internal-ports", f"vllm serve --host (unset) {why}"
    )
    props["command"] += ["--host", "0.0.0.0"]
    assert exposure(props, "llm-cluster:vllm:ModelServer") == [f"vllm serve --host 0.0.0.0 {why}"]


RAY_DASHBOARD = (
    "opens Ray's dashboard (job submission = code execution) on every interface. Bind it to the "
    "node's cluster address or leave it on 127.0.0.1."
)


def test_the_ray_heads_uploaded_script_is_read_for_the_dashboard_host(prod_spec: StackSpec) -> None:
    inst = next(i for i in all_instances(prod_spec) if i.uses_ray)
    script = ray_head_script(prod_spec, inst)
    assert f"--dashboard-host={prod_spec.node(inst.head).address}" in script
    props = host_container(
        "ray-head",
        "vllm/vllm-openai:v0.9.2",
        command=ENGINES["vllm"].serve_argv(prod_spec, inst),
        envs=container_envs(ENGINES["vllm"].serve_env(prod_spec, inst, inst.head)),
    )
    props |= {
        "entrypoints": ["/bin/bash", RAY_HEAD_SCRIPT],
        "uploads": [{"file": RAY_HEAD_SCRIPT, "content": script, "executable": True}],
    }
    assert exposure(props, "llm-cluster:ray:RayCluster") == []
    props["uploads"][0]["content"] = script.replace(
        f"--dashboard-host={prod_spec.node(inst.head).address}", "--dashboard-host=0.0.0.0"
    )
    assert exposure(props, "llm-cluster:ray:RayCluster") == [f"ray start --dashboard-host=0.0.0.0 {RAY_DASHBOARD}"]


def test_a_raw_ray_start_with_the_dashboard_on_every_interface_is_refused() -> None:
    props = {
        "networkMode": "host",
        "restart": "unless-stopped",
        "entrypoints": ["ray"],
        "command": ["start", "--head", "--port=6379", "--block"],
        "image": "vllm/vllm-openai:v0.9.2",
    }
    assert exposure(props, None) == []  # Ray's own default is localhost
    props["command"] += ["--dashboard-host", "::"]
    assert exposure(props, None) == [f"ray start --dashboard-host=:: {RAY_DASHBOARD}"]


# --- rule 10: MLA ------------------------------------------------------------------------------

MLA_ADVICE = (
    "deepseek_v3 uses MLA attention: its prefill calls FlashAttention-2, which needs compute capability "
    "8.0, with no fallback, so vLLM dies in its startup profile run on Tesla V100-SXM2-32GB (sm_70) "
    '("FlashAttention only supports Ampere GPUs or newer"; vLLM 0.19.0 mla_attention.py:1285-1322 '
    "(non-FA prefill only on sm_100), :2139-2150; config/model.py:1581 VLLM_MLA_DISABLE [read from code]). "
    "Set VLLM_MLA_DISABLE=1 in the pool's env (vLLM then keeps the full per-head KV cache: check the "
    "capacity plan), or serve it on sm_80+."
)


def test_mla_on_v100_is_refused_and_vllm_mla_disable_is_the_way_out() -> None:
    props = server(arch="deepseek-r1", quantization="gptq")
    assert of("mla-attention", model_server(props)) == only("mla-attention", MLA_ADVICE)
    props["env"]["VLLM_MLA_DISABLE"] = "1"
    assert of("mla-attention", model_server(props)) == []
    assert (
        of(
            "mla-attention",
            model_server(server(arch="deepseek-r1", quantization="gptq", env={}, gpuModel="NVIDIA H100 80GB HBM3")),
        )
        == []
    )


def test_mla_advice_gives_the_capacity_without_mla() -> None:
    fits = {"fits": True, "kv_tokens": 40960.0, "max_model_len": 8192.0, "reason": ""}
    props = server(arch="deepseek-r1", quantization="gptq", capacityWithoutMla=fits)
    assert of("mla-attention", model_server(props)) == only(
        "mla-attention", MLA_ADVICE + " With it, the KV cache holds 40960 tokens per instance (5.0 sequences of 8192)."
    )
    short = {
        "fits": False,
        "kv_tokens": 14384.0,
        "max_model_len": 16384.0,
        "reason": "the KV cache holds 14384 tokens, fewer than max-model-len 16384",
    }
    props = server(arch="deepseek-r1", quantization="gptq", capacityWithoutMla=short)
    assert of("mla-attention", model_server(props)) == only(
        "mla-attention", MLA_ADVICE + " With it, the KV cache holds 14384 tokens, fewer than max-model-len 16384."
    )


# --- rule 11: memory ---------------------------------------------------------------------------


def test_model_that_does_not_fit_is_mandatory() -> None:
    capacity = {
        **CAPACITY,
        "fits": False,
        "max_concurrency": 0.0,
        "reason": "weights need 41.8 GiB per GPU, more than the 29.4 GiB usable",
    }
    assert model_server(server(capacity=capacity)) == only(
        "memory-fit",
        "does not fit: weights need 41.8 GiB per GPU, more than the 29.4 GiB usable. No single "
        "change of this pool fits it: use GPUs with more memory, or a smaller model.",
    )


def test_low_concurrency_is_advisory_with_a_configurable_threshold() -> None:
    props = server(capacity={**CAPACITY, "max_concurrency": 2.5, "kv_tokens": 81920.0})
    assert model_server(props) == only(
        "memory-headroom",
        "only 2.5 sequences of max-model-len fit in the KV cache at once (81920 tokens), below "
        "minConcurrency 4: requests queue or get preempted under load. Lower --max-model-len to 20480, or add GPUs "
        "to the instance.",
        level="advisory",
    )
    assert model_server(props, config={"memory-headroom": {"minConcurrency": 2}}) == []


def ranged(kv_tokens: int, max_model_len: int = 32768) -> dict[str, Any]:
    """A vLLM pool's capacity with its range, as components/engines/vllm/capacity.py writes it."""
    return with_range(
        {
            **CAPACITY,
            "kv_tokens": kv_tokens,
            "max_model_len": max_model_len,
            "max_concurrency": kv_tokens / max_model_len,
            "kv_cache_gib_per_gpu": 18.5,
            # The chat pool's class: no log of it yet, so the widest error measured (3.5 %).
            "kv_estimate_error": KV_ERROR_UNMEASURED,
            "kv_error_class": "V1 · TP>=2 · MoE: too few logs, the widest error measured",
            "kv_error_terms": KV_ERROR_TERMS,
        }
    )


@pytest.mark.parametrize(
    ("kv_tokens", "warned"),
    [
        (32768, True),  # exactly one sequence at the central estimate: 31621 at the pessimistic end
        (33956, True),  # 32767 at the pessimistic end: one token short
        (33957, False),  # 32768 at the pessimistic end: fits
    ],
)
def test_a_pool_that_fits_only_at_the_central_estimate_is_warned_with_the_tokens_it_may_lack(
    kv_tokens: int, warned: bool
) -> None:
    capacity = ranged(kv_tokens)
    got = [d for d in model_server(server(capacity=capacity)) if d[0] == "memory-fit-margin"]
    if not warned:
        assert got == []
        return
    low = capacity["kv_tokens_low"]
    assert got == only(
        "memory-fit-margin",
        f"fits at the central estimate ({kv_tokens} KV tokens for one sequence of 32768) but not at its pessimistic "
        f"end ({low}: the KV estimate has erred up to 3.5% on the optimistic side against real start-up logs of its "
        "class, V1 · TP>=2 · MoE: too few logs, the widest error measured, bench/capacity_accuracy.py), so the "
        f"engine may refuse to start for want of {32768 - low} tokens of KV cache. The uncertain terms are the "
        "activation peak (the sampler over max-num-seqs rows of the vocabulary) and the memory outside torch's "
        "allocator (NCCL and all-reduce buffers at TP >= 2); the engine's first start-up log settles it (its KV "
        "cache line, which doctor compares with the plan). Leave room: lower --max-model-len, or raise the memory "
        "the engine may use.",
        level="advisory",
    )


def test_headroom_is_judged_at_the_pessimistic_end() -> None:
    # 4.1 sequences at the central estimate, 3.96 at the pessimistic end: below minConcurrency 4.
    capacity = ranged(int(4.1 * 32768))
    [(_, level, message)] = [d for d in model_server(server(capacity=capacity)) if d[0] == "memory-headroom"]
    assert level == "advisory" and f"fit in the KV cache at once ({capacity['kv_tokens_low']} tokens)" in message
    assert [d for d in model_server(server(capacity=ranged(int(4.2 * 32768)))) if d[0] == "memory-headroom"] == []


# --- rule 12: containers -----------------------------------------------------------------------


def exporter(**changes: Any) -> dict[str, Any]:
    """The reference node-exporter container (as Monitoring registers it), with changes."""
    props = host_container(
        "node-exporter",
        "prom/node-exporter:v1.8.2",
        command=["--path.rootfs=/host", "--web.listen-address=192.168.10.12:9100"],
    )
    return props | changes


def in_monitoring(props: dict[str, Any], **kw: Any) -> list[tuple[str, str, str]]:
    return analyze(CONTAINER, "monitoring-gpu-02-node-exporter", props, parent_type=MONITORING, **kw)


def unpinned(ref: str, why: str, repo: str) -> list[tuple[str, str, str]]:
    return only(
        "pinned-images",
        f"image {ref} is not pinned ({why}): each node pulls whatever the tag points to "
        "that day, so nodes drift apart and a replaced node can come back with another version. Pin a "
        f"version tag ({repo}:<version>) or a digest ({repo}@sha256:<digest>).",
        level="advisory",
    )


def test_a_latest_or_untagged_image_is_advisory() -> None:
    assert in_monitoring(exporter()) == []
    latest = exporter(
        labels=[
            {"label": "llm-cluster.role", "value": "node-exporter"},
            {"label": "llm-cluster.image", "value": "prom/node-exporter:latest"},
        ]
    )
    assert in_monitoring(latest) == unpinned(
        "prom/node-exporter:latest", "tag latest moves to new builds", "prom/node-exporter"
    )
    # Without the label, a ref in `image` is read; Docker Hub's library/ prefix is dropped in the advice.
    untagged = {"name": "gw", "networkMode": "bridge", "restart": "unless-stopped", "image": "docker.io/library/nginx"}
    assert analyze(CONTAINER, "gw", untagged) == unpinned(
        "docker.io/library/nginx", "it has no tag, so Docker pulls :latest", "nginx"
    )


def test_digests_pin_and_the_mutable_tags_are_configurable() -> None:
    ref = "prom/node-exporter@sha256:" + "0" * 64
    assert in_monitoring(exporter(labels=[{"label": "llm-cluster.image", "value": ref}])) == []
    stable = exporter(labels=[{"label": "llm-cluster.image", "value": "nginx:stable"}])
    assert [d[0] for d in in_monitoring(stable)] == ["pinned-images"]
    assert in_monitoring(stable, config={"pinned-images": {"mutableTags": ["latest"]}}) == []


def test_a_fixed_name_container_replaced_create_first_is_refused() -> None:
    assert in_monitoring(exporter(), delete_before_replace=None) == only(
        "container-replace",
        "the container has a fixed name but is replaced create-first: Docker refuses a second "
        "container of the same name (and the GPUs and ports the old one holds), so the first change that replaces "
        "it fails mid-update. Set delete_before_replace=True in its resource options.",
    )
    assert of("container-replace", in_monitoring(exporter(), delete_before_replace=False))
    unnamed = {k: v for k, v in exporter().items() if k != "name"}
    assert in_monitoring(unnamed, delete_before_replace=None) == []


def test_a_container_that_does_not_come_back_after_a_reboot_is_advisory() -> None:
    fix = 'Set restart="unless-stopped".'
    assert in_monitoring(exporter(restart="always")) == []
    assert in_monitoring({k: v for k, v in exporter().items() if k != "restart"}) == only(
        "container-restart",
        f"restart is no: node-exporter stays down after it exits and after a reboot of the node. {fix}",
        level="advisory",
    )
    assert in_monitoring(exporter(restart="on-failure")) == only(
        "container-restart",
        "restart is on-failure: node-exporter stays down after a clean exit or a reboot of the "
        f"node (on-failure restarts only after a non-zero exit). {fix}",
        level="advisory",
    )


# --- raw containers, preview and config -------------------------------------------------------


def raw_vllm(**changes: Any) -> dict[str, Any]:
    return {
        "networkMode": "host",
        "restart": "unless-stopped",
        "entrypoints": ["vllm"],
        "command": CHAT_ARGV[1:],
        "envs": [f"{k}={v}" for k, v in CHAT_ENV.items()],
        "labels": [
            {"label": "llm-cluster.role", "value": "vllm"},
            {"label": "llm-cluster.gpu-model", "value": V100},
            {"label": "llm-cluster.image", "value": "vllm/vllm-openai:v0.19.1"},
        ],
        **changes,
    }


BF16 = (
    "gpu-dtype",
    "--dtype bfloat16: bfloat16 needs compute capability 8.0; Tesla V100-SXM2-32GB (sm_70) has none "
    "(vLLM refuses it at startup; vLLM 0.19.0 platforms/cuda.py supported dtypes below sm_80: fp16, fp32 [read "
    "from code]). Instead, pass --dtype half.",
)


def test_a_raw_vllm_container_is_checked_but_a_component_child_is_left_to_its_modelserver() -> None:
    props = raw_vllm()
    props["command"] = [t if t != "half" else "bfloat16" for t in props["command"]]
    assert analyze(CONTAINER, "mine", props) == only(*BF16)
    assert analyze(CONTAINER, "mine", props, parent_type="llm-cluster:vllm:ModelServer") == []


API_SERVER = ["python3", "-m", "vllm.entrypoints.openai.api_server"]


def api_server_args(dtype: str = "bfloat16") -> list[str]:
    """The reference replica's flags as the api_server takes them: the model as --model."""
    return ["--model", "/data/models/Qwen3-30B-A3B"] + [t if t != "half" else dtype for t in CHAT_ARGV[3:]]


def image_default_entrypoint(**changes: Any) -> dict[str, Any]:
    """`docker run vllm/vllm-openai:v0.19.1 --model /m …`: no entrypoints, the command is the arguments of the
    image's ENTRYPOINT (in 0.19.1 `vllm serve`, which takes --model with a warning)."""
    props = {k: v for k, v in raw_vllm().items() if k != "entrypoints"}
    props["command"] = api_server_args()
    props.update(changes)
    return props


def api_server_container(**changes: Any) -> dict[str, Any]:
    """The api_server module as the container's own entrypoints (the runbook's form on 0.9.2's image)."""
    return image_default_entrypoint(entrypoints=API_SERVER, **changes)


def test_the_vllm_images_own_entrypoint_is_the_one_its_facts_name() -> None:
    # 0.19.1's ENTRYPOINT is `vllm serve` (IMAGES' entrypoint): --model is taken (a warning), the bf16 on a V100
    # is reported.
    assert analyze(CONTAINER, "mine", image_default_entrypoint()) == only(*BF16)
    # The model as the positional: what `docker run vllm/vllm-openai:v0.19.1 /m --dtype …` hands `vllm serve`.
    positional = image_default_entrypoint(command=["/data/models/Qwen3-30B-A3B", *api_server_args()[2:]])
    assert analyze(CONTAINER, "mine", positional) == only(*BF16)
    # `vllm serve` again as the command: `vllm serve vllm serve /m …`, refused as `vllm serve` refuses it.
    doubled = image_default_entrypoint(command=["vllm", "serve"] + CHAT_ARGV[2:])
    assert [(v[0], v[2].split("\n", 1)[1]) for v in analyze(CONTAINER, "mine", doubled)] == [
        (
            "vllm-serve-flags",
            f"vllm serve (vLLM 0.19.1): unexpected positional argument {word!r}: `vllm serve` takes one model",
        )
        for word in ("serve", "/data/models/Qwen3-30B-A3B")
    ]
    # The image ref from `image` when there is no label.
    unlabelled = image_default_entrypoint(
        image="vllm/vllm-openai:v0.19.1", labels=[{"label": "llm-cluster.gpu-model", "value": V100}]
    )
    assert analyze(CONTAINER, "mine", unlabelled) == only(*BF16)
    # 0.9.2's ENTRYPOINT is the api_server: the model positional is what its parser refuses.
    old = image_default_entrypoint(
        image="vllm/vllm-openai:v0.9.2",
        labels=[{"label": "llm-cluster.gpu-model", "value": V100}],
        command=["/data/models/Qwen3-30B-A3B", "--dtype", "half"],
    )
    flags = [v[2].split("\n", 1)[1] for v in analyze(CONTAINER, "mine", old) if v[0] == "vllm-serve-flags"]
    assert [f.split(":", 2)[1] for f in flags] == [
        " unexpected positional argument '/data/models/Qwen3-30B-A3B'",
        " the model is missing",
    ]
    assert all(f.startswith("vllm.entrypoints.openai.api_server (vLLM 0.9.2)") for f in flags)
    # Another image's entrypoint is not vLLM's: its command alone starts nothing the rules know.
    other = image_default_entrypoint(image="nginx:1.27.3", labels=[{"label": "llm-cluster.gpu-model", "value": V100}])
    assert analyze(CONTAINER, "mine", other) == []


def test_the_api_server_module_spelled_out_is_a_launch_in_argv_and_in_a_script() -> None:
    spelled = image_default_entrypoint(entrypoints=API_SERVER)
    assert analyze(CONTAINER, "mine", spelled) == only(*BF16)
    script = image_default_entrypoint(
        entrypoints=["bash", "-c"], command=["exec " + " ".join(API_SERVER + api_server_args())]
    )
    assert analyze(CONTAINER, "mine", script) == only(*BF16)
    assert analyze(CONTAINER, "mine", image_default_entrypoint(command=api_server_args("half"))) == []


def test_the_api_servers_flags_take_the_model_as_model_and_no_positional() -> None:
    prefix = "vllm.entrypoints.openai.api_server (vLLM 0.19.1): "
    missing = api_server_container(command=api_server_args("half")[2:])
    assert analyze(CONTAINER, "mine", missing) == only(
        "vllm-serve-flags",
        f"{prefix}the model is missing: the api_server takes it as --model /path/to/model "
        "(without it vLLM 0.19.1 loads its default, Qwen/Qwen3-0.6B, from Hugging Face)",
    )
    # `vllm serve` handed to the image's entrypoint as arguments: the api_server refuses each word.
    serve = api_server_container(command=["vllm", "serve"] + CHAT_ARGV[2:])
    positional = (
        "the api_server takes no positional argument (the model is --model; to run another program in "
        "the vllm/vllm-openai image, set the container's entrypoints)"
    )
    assert [d[2].split("\n", 1)[1] for d in of("vllm-serve-flags", analyze(CONTAINER, "mine", serve))] == [
        f"{prefix}unexpected positional argument 'vllm': {positional}",
        f"{prefix}unexpected positional argument 'serve': {positional}",
        f"{prefix}unexpected positional argument '/data/models/Qwen3-30B-A3B': {positional}",
        f"{prefix}the model is missing: the api_server takes it as --model /path/to/model (without it vLLM "
        "0.19.1 loads its default, Qwen/Qwen3-0.6B, from Hugging Face)",
    ]
    unknown = api_server_container(command=api_server_args("half") + ["--enable-prefix-cache"])
    assert analyze(CONTAINER, "mine", unknown) == only(
        "vllm-serve-flags",
        f"{prefix}unrecognized flag --enable-prefix-cache: not a "
        "`vllm.entrypoints.openai.api_server` flag in vLLM 0.19.1; did you mean --enable-prefix-caching?",
    )


def test_the_api_server_on_every_interface_is_refused_like_vllm_serve() -> None:
    props = api_server_container(command=api_server_args("half"))
    props["command"] = [t if t != "192.168.10.13" else "0.0.0.0" for t in props["command"]]
    assert analyze(CONTAINER, "mine", props) == only(
        "internal-ports",
        "vllm.entrypoints.openai.api_server --host 0.0.0.0 on the host network listens on every "
        "interface of the node, and /v1, /metrics and /health answer without a key there (only the gateway checks "
        "keys). Pass --host <the node's cluster address>.",
    )


GPU_UNKNOWN = (
    "the hardware rules (gpu-dtype, vllm-v1-engine, gpu-quantization, quantization-moe, gpu-fp8, "
    "triton-fp16-dot, gpu-chunked-prefill-prefix-caching, mla-attention, attention-backend, vllm-image) "
    "cannot judge"
)


def test_a_raw_vllm_container_without_its_gpu_gets_one_advisory_asking_for_the_label() -> None:
    no_label = image_default_entrypoint(labels=[{"label": "llm-cluster.image", "value": "vllm/vllm-openai:v0.19.1"}])
    expected = only(
        "vllm-gpu-unknown",
        f"this vLLM container has no llm-cluster.gpu-model label, so {GPU_UNKNOWN} "
        "it. Add the label llm-cluster.gpu-model=<nvidia-smi name> (nvidia-smi --query-gpu=name "
        "--format=csv,noheader, e.g. Tesla V100-SXM2-32GB) so the hardware rules apply.",
        level="advisory",
    )
    assert analyze(CONTAINER, "mine", no_label) == expected
    serve = raw_vllm(labels=[{"label": "llm-cluster.image", "value": "vllm/vllm-openai:v0.19.1"}])
    assert analyze(CONTAINER, "mine", serve) == expected
    k80 = image_default_entrypoint(
        labels=[
            {"label": "llm-cluster.gpu-model", "value": "Tesla K80"},
            {"label": "llm-cluster.image", "value": "vllm/vllm-openai:v0.19.1"},
        ]
    )
    assert analyze(CONTAINER, "mine", k80) == only(
        "vllm-gpu-unknown",
        "llm-cluster.gpu-model=Tesla K80 is not a GPU in this pack's facts table (known: Tesla "
        "V100-SXM2-16GB, Tesla V100-SXM2-32GB, Tesla V100-PCIE-16GB, Tesla V100-PCIE-32GB, Tesla T4, NVIDIA A10, "
        "NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-80GB, NVIDIA A100-PCIE-40GB, NVIDIA A100 80GB PCIe, NVIDIA L40S, "
        f"NVIDIA H100 80GB HBM3, NVIDIA H100 PCIe, NVIDIA H200), so {GPU_UNKNOWN} this vLLM container. Label it "
        "with one of the known names.",
        level="advisory",
    )
    # A component's container is its ModelServer's business (which always states its GPU).
    assert analyze(CONTAINER, "mine", no_label, parent_type="llm-cluster:vllm:ModelServer") == []


def test_unknown_argv_at_preview_is_an_advisory_cant_run() -> None:
    got = model_server(server(argv=UNKNOWN))
    assert {d[1] for d in got} == {"advisory"}
    assert got[0][2].startswith(
        "can't run policy 'gpu-dtype' from policy pack 'llm-cluster-hardware@v0.2.0' during preview"
    )


def test_levels_are_configurable_per_policy_and_for_all() -> None:
    props = set_flag(server(), "--dtype", "bfloat16")
    assert model_server(props, config={"gpu-dtype": "disabled"}) == []
    assert [d[1] for d in model_server(props, config={"all": "advisory"})] == ["advisory"]
    assert [
        d[1] for d in model_server(props, config={"all": "advisory", "gpu-dtype": {"enforcementLevel": "mandatory"}})
    ] == ["mandatory"]


@pytest.mark.parametrize(
    "config, message",
    [
        ({"gpu-dtyp": "mandatory"}, "unknown policy 'gpu-dtyp'; policies: gpu-dtype,"),
        (
            {"gpu-dtype": "strict"},
            "gpu-dtype: enforcement level 'strict' is not one of advisory, mandatory, remediate, disabled",
        ),
        ({"gpu-dtype": {"allowFloat32": "yes"}}, "gpu-dtype.allowFloat32: 'yes' is not of type 'boolean'"),
        (
            {"memory-headroom": {"minConcurency": 2}},
            "memory-headroom: Additional properties are not allowed ('minConcurency' was unexpected)",
        ),
    ],
)
def test_policy_config_is_checked_against_the_schemas(config: dict[str, Any], message: str) -> None:
    from plan.analyze import PolicyConfigError

    with pytest.raises(PolicyConfigError) as err:
        configure_request(config)
    assert str(err.value).startswith(message)


def test_an_unlabelled_container_with_an_image_id_unknown_at_preview_is_read_without_the_image() -> None:
    props = {
        "name": "mine",
        "networkMode": "host",
        "restart": "unless-stopped",
        "image": UNKNOWN,
        "command": ["--web.listen-address=:9100"],
    }
    # No role and no image ref to read: nothing to report, and no "can't run during preview" either.
    assert analyze(CONTAINER, "mine", props) == []
