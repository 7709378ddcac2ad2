"""Engines the runbooks name that llm-cluster does not deploy: on which GPUs each could run, and why not here.

A stack may name any of them as `pools.*.engine`; the spec refuses the pool with the reason for its GPU,
the source, and the nearest way out the project does deploy. Each fact cites its public source: the
engine's own docs and code by file, its release notes and PRs, and GitHub issues as `owner/repo#N`
(https://github.com/owner/repo/issues/N).
"""

from __future__ import annotations

from dataclasses import dataclass

from components.facts.evidence import Sourced, code, observed


@dataclass(frozen=True)
class OtherEngine:
    """An engine llm-cluster knows by name but does not deploy."""

    name: str  # the `pools.*.engine` value
    title: str
    min_capability: int | None  # the lowest GPU it serves on; None: as the engine it wraps
    below: str  # what happens below min_capability (or why it cannot be judged alone)
    source: Sourced
    way_out: str  # the nearest deployable route, on any GPU
    on_newer: str  # what to do on a GPU where it does run


_DEPLOYED = "llm-cluster does not deploy it yet: use engine: vllm there (or lmdeploy / llamacpp)"

OTHER_ENGINES: dict[str, OtherEngine] = {
    e.name: e
    for e in [
        OtherEngine(
            "sglang",
            "SGLang",
            75,
            'its model runner refuses: "SGLang only supports sm75 and above."; sgl-kernel ships cubins for '
            "sm80/89/90 only and FlashInfer needs sm_75",
            observed(
                "SGLang model_runner capability check [code]; MinerU#3416 (V100), samyfodil/jitllm (SGLang "
                "0.5.10 refuses on V100) [obs]"
            ),
            "engine: vllm (vllm/vllm-openai:v0.19.1, TRITON_ATTN) or engine: lmdeploy (TurboMind has Volta kernels)",
            _DEPLOYED,
        ),
        OtherEngine(
            "tgi",
            "Text Generation Inference",
            75,
            'no flash or paged attention below the GPUs it targets ("other GPUs: continuous batching still '
            'applies, but flash attention and paged attention will not be executed"); V100 users get "GPU '
            'with CUDA capability 7 0 is not supported"',
            observed(
                "TGI docs/source/installation_nvidia.md; huggingface/text-generation-inference#533, #1253 (V100) [obs]"
            ),
            "engine: vllm or engine: lmdeploy (both page their KV cache on V100)",
            _DEPLOYED,
        ),
        OtherEngine(
            "tensorrt-llm",
            "TensorRT-LLM",
            75,
            'Volta support was removed in 0.15 ("[BREAKING CHANGE] NVIDIA Volta GPU support is removed"); '
            'TensorRT 10.5+ refuses "Target GPU SM 70 is not supported by this TensorRT release"',
            observed("TensorRT-LLM PR #2389 (0.15) [maint]; NVIDIA/TensorRT-LLM#2400 (V100) [obs]"),
            "engine: lmdeploy (TurboMind: native Volta tensor-core kernels) or engine: vllm",
            _DEPLOYED,
        ),
        OtherEngine(
            "triton",
            "Triton Inference Server",
            None,
            "a host for other backends: with TensorRT-LLM it inherits TensorRT-LLM's sm_75 floor, with vLLM "
            "it runs what that vLLM runs; llm-cluster serves the engines directly instead",
            code("Triton Inference Server backends (tensorrtllm_backend, vllm_backend); TensorRT-LLM PR #2389"),
            "engine: vllm (what Triton's vLLM backend would run) or engine: lmdeploy",
            "llm-cluster deploys the engines themselves, not Triton: use engine: vllm",
        ),
        OtherEngine(
            "deepspeed-mii",
            "DeepSpeed-MII",
            80,
            'its FastGen kernels (DeepSpeed-Kernels) exist for sm_80 and newer only ("We currently only support '
            'Ampere and above architectures (i.e., 8.0+)")',
            code(
                "microsoft/DeepSpeed-Kernels README (the backend of DeepSpeed-FastGen in DeepSpeed-MII): compute "
                "capability 8.0, 8.6, 8.9, 9.0 [maint]"
            ),
            "engine: vllm or engine: lmdeploy",
            _DEPLOYED,
        ),
        OtherEngine(
            "xinference",
            "Xinference",
            None,
            "an orchestrator over other engines (llama.cpp via xllamacpp, transformers, vLLM, SGLang, MLX): it "
            "runs on a GPU only what its chosen backend runs there",
            code("inference.readthedocs.io, backends page"),
            "engine: llamacpp or engine: vllm (the backends Xinference would start on V100)",
            "llm-cluster deploys those backends directly: use engine: vllm or llamacpp",
        ),
        OtherEngine(
            "ollama",
            "Ollama",
            None,
            "a single-node wrapper of llama.cpp (layers split across GPUs, no tensor parallel, no metrics "
            "endpoint): it runs where llama.cpp runs, sm_50 and up",
            code(
                "ollama docs/gpu.mdx (compute capability 5.0+, V100 listed); CMakePresets.json CUDA 12 archs "
                "50;60;61;70;75"
            ),
            "engine: llamacpp (the same GGUF files and kernels, with Prometheus metrics and pinned builds)",
            "use engine: llamacpp: the engine Ollama wraps, deployed directly",
        ),
    ]
}


def refusal(engine: str, capability: int, gpu_name: str) -> str:
    """Why a pool of this engine is refused on this GPU, with the source and the way out."""
    e = OTHER_ENGINES[engine]
    cap = f"sm_{capability}"
    if e.min_capability is not None and capability < e.min_capability:
        why = f"{e.title} does not run on {gpu_name} ({cap}): {e.below}"
        return f"{why} (source: {e.source}); nearest supported: {e.way_out}"
    if e.min_capability is None:
        return f"{e.title} is {e.below} (source: {e.source}); nearest supported: {e.way_out}"
    return f"{e.title} runs on {gpu_name} ({cap}), but {e.on_newer} (source: {e.source})"
