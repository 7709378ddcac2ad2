"""LMDeploy's options block (`pools.<pool>.lmdeploy`, TurboMind): each option maps to one flag of
`lmdeploy serve api_server`, whose parser dump is in this package's data/."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.spec.base import Spec

# The model spec's quantization values TurboMind loads (None: an fp16/bf16 checkpoint, `--model-format hf`),
# and the dtypes it computes in (engine.py maps both onto its flags).
LMDEPLOY_FORMATS = frozenset({None, "awq", "gptq", "compressed-tensors", "fp8", "mxfp4"})
LMDEPLOY_DTYPES = frozenset({"auto", "half", "float16", "bfloat16"})
# The flags the product sets from typed stack keys: a flag in extraArgs would be appended after the typed
# one and win in the engine, while the gates, the gateway, the capacity plan and the policies keep reading
# the typed key. The spec refuses it.
TYPED_FLAGS: dict[str, str] = {
    "--backend": "pools.<pool>.engine (TurboMind is what the facts and capacity describe)",
    "--model-name": "models.<model>.servedNames",
    "--server-name": "nodes.<node>.address",
    "--server-port": "pools.<pool>.port",
    "--tp": "pools.<pool>.tensorParallel",
    "--dtype": "models.<model>.dtype",
    "--model-format": "models.<model>.quantization",
    "--session-len": "pools.<pool>.lmdeploy.sessionLen",
    "--max-batch-size": "pools.<pool>.lmdeploy.maxBatchSize",
    "--cache-max-entry-count": "pools.<pool>.lmdeploy.cacheMaxEntryCount",
    "--cache-block-seq-len": "pools.<pool>.lmdeploy.cacheBlockSeqLen",
    "--max-prefill-token-num": "pools.<pool>.lmdeploy.maxPrefillTokenNum",
    "--quant-policy": "pools.<pool>.lmdeploy.quantPolicy",
    "--enable-prefix-caching": "pools.<pool>.lmdeploy.enablePrefixCaching",
    "--trust-remote-code": "models.<model>.trustRemoteCode",
    "--nnodes": "pools.<pool>.pipelineParallel (lmdeploy pools run on one node)",
    "--node-rank": "pools.<pool>.pipelineParallel (lmdeploy pools run on one node)",
    "--disable-metrics": "monitoring (its Prometheus scrapes every server's /metrics)",
}


class LmdeployOptions(Spec):
    """LMDeploy `serve api_server --backend turbomind` options; each maps to one flag."""

    session_len: int = Field(ge=16)
    """`--session-len`: the longest sequence (prompt + output) one request may reach."""
    max_batch_size: int = Field(default=128, ge=1)
    """`--max-batch-size`: sequences decoded at once."""
    cache_max_entry_count: float = Field(default=0.8, gt=0, lt=1)
    """`--cache-max-entry-count`: share of the GPU memory still free after the weights that becomes KV
    cache (TurboMind 0.15+ accepts only 0 < x < 1; the rest holds activations and workspaces)."""
    quant_policy: Literal[0, 4, 8] = 0
    """`--quant-policy`: KV cache quantization, 0 (fp16), 8 (int8) or 4 (int4); TurboMind has Volta
    kernels for all three and refuses its fp8 policies."""
    cache_block_seq_len: int = Field(default=64, ge=16)
    """`--cache-block-seq-len`: tokens per KV block."""
    max_prefill_token_num: int = Field(default=8192, ge=1)
    """`--max-prefill-token-num`: tokens one prefill iteration processes."""
    enable_prefix_caching: bool = False
    """`--enable-prefix-caching`."""
    extra_args: list[str] = Field(default_factory=list)
    """Further `lmdeploy serve api_server` flags verbatim; the policy pack checks each against the image's parser."""
