"""vLLM's options block (`pools.<pool>.vllm`) and the `vllm serve` flags the product sets from typed stack keys."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.engines.vllm.facts import KV_CACHE_DTYPES
from components.spec.base import Spec
from components.spec.cluster import Fraction, Port

# The `vllm serve` flags the product sets from typed stack keys: flag -> the key that owns it, with
# <pool>, <model> and <node> standing for the names. A flag in extraArgs would be appended after the
# typed one and win in vLLM, while the gates, the gateway upstreams, the capacity plan and the
# policies keep reading the typed key: the spec refuses it, naming the key.
TYPED_FLAGS: dict[str, str] = {
    "--model": "models.<model>.path",
    "--served-model-name": "models.<model>.servedNames",
    "--host": "nodes.<node>.address",
    "--port": "pools.<pool>.port",
    "--tensor-parallel-size": "pools.<pool>.tensorParallel",
    "--pipeline-parallel-size": "pools.<pool>.pipelineParallel",
    "--distributed-executor-backend": "pools.<pool>.pipelineParallel",
    "--dtype": "models.<model>.dtype",
    "--quantization": "models.<model>.quantization",
    "--trust-remote-code": "models.<model>.trustRemoteCode",
    "--max-model-len": "pools.<pool>.vllm.maxModelLen",
    "--max-num-seqs": "pools.<pool>.vllm.maxNumSeqs",
    "--gpu-memory-utilization": "pools.<pool>.vllm.gpuMemoryUtilization",
    "--max-num-batched-tokens": "pools.<pool>.vllm.maxNumBatchedTokens",
    "--kv-cache-dtype": "pools.<pool>.vllm.kvCacheDtype",
    "--block-size": "pools.<pool>.vllm.blockSize",
    "--swap-space": "pools.<pool>.vllm.swapSpaceGib",
    "--enable-prefix-caching": "pools.<pool>.vllm.enablePrefixCaching",
    "--enable-chunked-prefill": "pools.<pool>.vllm.enableChunkedPrefill",
    "--enforce-eager": "pools.<pool>.vllm.enforceEager",
    "--attention-backend": "pools.<pool>.vllm.attentionBackend",
    # vLLM's own multi-node launcher (multiNode: native): the plan writes each node's rank and the head's address.
    "--nnodes": "pools.<pool>.vllm.multiNode",
    "--node-rank": "pools.<pool>.vllm.multiNode",
    "--headless": "pools.<pool>.vllm.multiNode",
    "--master-addr": "pools.<pool>.vllm.multiNode",
    "--master-port": "pools.<pool>.vllm.masterPort",
}
# Environment vLLM's containers get from typed keys (beside every engine's NCCL and offline variables).
TYPED_ENV: dict[str, str] = {
    "VLLM_HOST_IP": "nodes.<node>.address",
    "VLLM_TUNED_CONFIG_FOLDER": "pools.<pool>.vllm.moeConfigFiles",
}
# vLLM's short spellings of typed flags (EngineArgs.add_cli_args).
FLAG_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-q": "--quantization",
    "-n": "--nnodes",
    "-r": "--node-rank",
}
# The default of multiNode's rendezvous port: vLLM 0.19.1's --master-port default (its parser dump).
DEFAULT_MASTER_PORT = 29501


def canonical_flag(token: str) -> str | None:
    """The long flag a `vllm serve` token sets (`--max_model_len=8`, `--no-enforce-eager`, `-tp`), None for a value."""
    if not token.startswith("-") or token == "-" or token[1:2].isdigit():
        return None
    name = token.partition("=")[0]
    if name in FLAG_ALIASES:
        return FLAG_ALIASES[name]
    if name.startswith("--"):
        # vLLM's FlexibleArgumentParser reads --max_model_len as --max-model-len.
        name = "--" + name[2:].replace("_", "-")
        if name.startswith("--no-") and "--" + name[5:] in TYPED_FLAGS:
            return "--" + name[5:]
    return name


class VllmOptions(Spec):
    """vLLM engine options; each maps to one `vllm serve` flag (checked against the pool's vLLM version)."""

    max_model_len: int = Field(ge=16)
    """Longest sequence (prompt + output) in tokens; at most the model's context window."""
    max_num_seqs: int = Field(default=256, ge=1)
    gpu_memory_utilization: Fraction = 0.9
    """Fraction of each GPU's memory vLLM may use, 0 < x <= 1 (0.9, not 90)."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = "auto"  # type: ignore[valid-type]
    block_size: Literal[1, 8, 16, 32, 64, 128] = 16
    swap_space_gib: int | None = Field(default=None, ge=0)
    """CPU swap space per GPU (`--swap-space`, V0 lines only: 0.19 has no such flag); unset keeps vLLM's."""
    attention_backend: str | None = Field(default=None, pattern=r"^[A-Z][A-Z0-9_]*$")
    """`--attention-backend` (vLLM >= 0.14), e.g. TRITON_ATTN on V100; the policy pack checks it per GPU."""
    moe_config_files: list[str] = Field(default_factory=list)
    """Fused-MoE tile configs (files on the operator's machine named as vLLM looks them up, e.g.
    `E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json`), uploaded into the container and named by
    VLLM_TUNED_CONFIG_FOLDER: vLLM ships none for V100."""
    enable_prefix_caching: bool | None = None
    """None leaves vLLM's default (on in V1); the policy pack refuses it where the image's Triton kernels die."""
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool = False
    """`--enforce-eager`: no CUDA graphs or torch.compile (the first thing to try when capture fails on V100)."""
    multi_node: Literal["ray", "native"] = "ray"
    """How an instance that spans nodes starts: `ray` (the runbook's way: a Ray head and workers, vLLM's Ray
    executor) or `native` (vLLM's own launcher, vLLM 0.19.1 here, not 0.11.0 or older: one container per node
    running `vllm serve … --nnodes N --node-rank R --master-addr <first node> --master-port <masterPort>`, the
    nodes after the first `--headless`; fewer containers and ports, no Ray dashboard or client port). Only for
    pools whose instances span nodes; the policy pack refuses `native` on an image without that launcher."""
    master_port: Port = DEFAULT_MASTER_PORT
    """With multiNode `native`: the torch.distributed rendezvous port on an instance's first node
    (`--master-port`); the firewall opens it to the instance's nodes only."""
    extra_args: list[str] = Field(default_factory=list)
    """Further `vllm serve` flags verbatim; the policy pack checks each against the pool's vLLM parser.
    Flags a typed key sets (--max-model-len, --port, …) are refused here: state the typed key."""
