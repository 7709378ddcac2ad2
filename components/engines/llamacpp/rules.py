"""llama.cpp's own policy rules (KV cache, split mode, PTX JIT), read from the ModelServer's argv and the
image's facts; the policy pack loads them through the registry."""

from __future__ import annotations

from components.engines.judged import EngineRule, JudgedServer
from components.engines.llamacpp.facts import LlamacppImage


def check_llamacpp_split(s: JudgedServer) -> list[str]:
    """Advisory: -sm row / tensor are not what the evidence shows working on V100."""
    if not isinstance(s.facts, LlamacppImage):
        return []
    mode = str(getattr(s.args(), "split_mode", "layer") or "layer")
    known = s.facts.split_modes.get(mode)
    if known is not None and not known.production:
        return [
            f"--split-mode {mode} splits {known.parallel} across GPUs, but {known.why}; -sm layer is the "
            "default that the V100 reports use"
        ]
    return []


def check_llamacpp_cache(s: JudgedServer) -> list[str]:
    """A quantized V cache needs FlashAttention (llama.cpp refuses to create the context otherwise)."""
    if not isinstance(s.facts, LlamacppImage):
        return []
    args = s.args()
    v_type = str(getattr(args, "cache_type_v", "f16") or "f16")
    if v_type not in ("f16", "f32", "bf16") and getattr(args, "flash_attn", "auto") in ("off", "0", "false"):
        return [
            f"--cache-type-v {v_type} with --flash-attn off: llama.cpp stops with 'quantized V cache requires "
            "flash_attn to be enabled' (src/llama-context.cpp at b11312); set llamacpp.flashAttention: on"
        ]
    return []


def check_llamacpp_jit(s: JudgedServer) -> list[str]:
    """Advisory: GPUs served from PTX compile the kernels at first start (and need a new enough driver)."""
    if not isinstance(s.facts, LlamacppImage) or not s.facts.jit_only(s.cap):
        return []
    return [
        f"{s.image} has no SASS for {s.where}, only PTX: the first start JIT-compiles every kernel for minutes "
        f"(keep loadTimeoutMinutes generous) and the driver must support CUDA {s.facts.cuda} (R570+), or the "
        f"load fails ({s.facts.cite('ptx')})"
    ]


RULES = (
    EngineRule("llamacpp-kv-cache", "A quantized V cache has FlashAttention on.", check_llamacpp_cache),
    EngineRule(
        "llamacpp-split-mode",
        "Split modes other than layer/none are not shown to work on V100.",
        check_llamacpp_split,
        advisory=True,
    ),
    EngineRule(
        "llamacpp-ptx-jit",
        "The image runs the GPU from PTX: the first start compiles for minutes.",
        check_llamacpp_jit,
        advisory=True,
    ),
)
