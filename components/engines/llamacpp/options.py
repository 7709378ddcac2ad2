"""llama.cpp's options block (`pools.<pool>.llamacpp`): each option maps to one flag of `llama-server`,
whose parser dump is in this package's data/."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from components.engines.llamacpp.facts import IMAGES as LLAMACPP_IMAGES
from components.spec.base import Spec

_KV_CACHE_TYPES = sorted({t for i in LLAMACPP_IMAGES.values() for t in i.kv_cache_types})
LLAMACPP_MULTI_NODE = (
    'llama.cpp spans nodes only through its RPC backend, which upstream calls "a proof-of-'
    'concept ... fragile and insecure" (tools/rpc/README.md): the project does not deploy it'
)
# The flags the product sets from typed stack keys (see the lmdeploy package's TYPED_FLAGS).
TYPED_FLAGS: dict[str, str] = {
    "--model": "pools.<pool>.llamacpp.ggufFile",
    "--alias": "models.<model>.servedNames",
    "--host": "nodes.<node>.address",
    "--port": "pools.<pool>.port",
    "--n-gpu-layers": "pools.<pool>.tensorParallel (every layer is offloaded)",
    "--split-mode": "pools.<pool>.llamacpp.splitMode",
    "--ctx-size": "pools.<pool>.llamacpp.contextPerSlot",
    "--parallel": "pools.<pool>.llamacpp.parallel",
    "--flash-attn": "pools.<pool>.llamacpp.flashAttention",
    "--cache-type-k": "pools.<pool>.llamacpp.cacheType",
    "--cache-type-v": "pools.<pool>.llamacpp.cacheType",
    "--fit": "pools.<pool>.llamacpp (the product sets --fit off: what the plan sizes is what starts)",
    "--metrics": "monitoring (the product turns metrics on)",
    "--jinja": "pools.<pool>.llamacpp",
    "--rpc": "pools.<pool>.pipelineParallel (the RPC backend is refused: fragile and insecure upstream)",
    "--threads": "nodes.<node>.cpuCores (split between the node's serving instances)",
}
# llama-server's other spellings of typed flags and of its credential flag (common/arg.cpp at b11312).
LLAMACPP_ALIASES = {
    "-m": "--model",
    "-a": "--alias",
    "-ngl": "--n-gpu-layers",
    "--gpu-layers": "--n-gpu-layers",
    "-sm": "--split-mode",
    "-c": "--ctx-size",
    "-np": "--parallel",
    "-fa": "--flash-attn",
    "-ctk": "--cache-type-k",
    "-ctv": "--cache-type-v",
    "-fit": "--fit",
    "-hft": "--hf-token",
    "-t": "--threads",
}


class LlamacppOptions(Spec):
    """llama.cpp `llama-server` options; each maps to one flag."""

    context_per_slot: int = Field(ge=256)
    """Context of one request (prompt + output). llama-server's `-c` is the whole KV cache, shared out
    evenly among the `-np` slots: the product passes `-c contextPerSlot x parallel`."""
    parallel: int = Field(default=4, ge=1, le=256)
    """`-np`: requests served at once (slots)."""
    split_mode: Literal["none", "layer", "row", "tensor"] = "layer"
    """`-sm`: how one server spreads the model over its tensorParallel GPUs (layer: pipelined layers)."""
    flash_attention: Literal["on", "off", "auto"] = "on"
    """`-fa`: FlashAttention (llama.cpp has Volta tensor-core kernels for it); needed for a quantized V cache."""
    cache_type: str = "f16"
    """`-ctk`/`-ctv`: KV cache element type (f16, q8_0, q4_0, ...)."""
    gguf_file: str = Field(pattern=r"^[A-Za-z0-9._+-][A-Za-z0-9._+/-]*\.gguf$")
    """The GGUF file (or the first shard, `...-00001-of-0000N.gguf`) inside the model's path."""
    gguf_header: str | None = None
    """A copy of that file's header on the operator's machine (`head -c 64M model.gguf > header.gguf`, or
    the file itself): capacity then reads the real tensor sizes and attention shape from it."""
    extra_args: list[str] = Field(default_factory=list)
    """Further `llama-server` flags verbatim; the policy pack checks each against the image's parser."""

    @field_validator("cache_type")
    @classmethod
    def _known_cache_type(cls, v: str) -> str:
        if v not in _KV_CACHE_TYPES:
            raise ValueError(f"{v!r} is not a llama.cpp KV cache type; allowed: {', '.join(_KV_CACHE_TYPES)}")
        return v
