"""The capacity estimate an engine other than vLLM reports: the keys plan.json, the plan report and the
memory-fit policies read of every engine (the same names as vLLM's CapacityEstimate), plus its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class EngineEstimate:
    """Weights, KV cache and concurrency per GPU of one instance, and whether it serves its context."""

    engine: str
    model: str
    gpu_memory_gib: float
    tp: int  # GPUs one instance spans
    max_model_len: int  # the longest request the engine accepts (session length, per-slot context)
    weights_gib_per_gpu: float  # the fullest GPU
    weights_gib_total: float  # one instance's weights on all its GPUs (padding and copies counted)
    kv_bytes_per_token_per_gpu: float
    kv_cache_gib_per_gpu: float
    kv_tokens: int
    max_concurrency: float  # sequences of max_model_len the KV cache holds at once
    rule_of_thumb_gib_total: float  # the runbooks' parameters x bytes x 1.2, for comparison
    fits: bool
    reason: str
    advice: str  # what to change when it does not fit, in the engine's own option names
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # engine-specific figures

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (plan.json `capacity`, the ModelServer's `capacity` prop)."""
        d: dict[str, Any] = {
            "engine": self.engine,
            "model": self.model,
            "gpu_memory_gib": self.gpu_memory_gib,
            "tp": self.tp,
            "max_model_len": self.max_model_len,
            "weights_gib_per_gpu": self.weights_gib_per_gpu,
            "weights_gib_total": self.weights_gib_total,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "kv_cache_gib_per_gpu": self.kv_cache_gib_per_gpu,
            "kv_tokens": self.kv_tokens,
            "max_concurrency": self.max_concurrency,
            "rule_of_thumb_gib_total": self.rule_of_thumb_gib_total,
            "fits": self.fits,
            "reason": self.reason,
            "advice": self.advice,
            "notes": list(self.notes),
            # No MLA switch outside vLLM: the keys the vLLM-only MLA advice reads say so.
            "uses_mla": False,
            "mla_enabled": False,
            **dict(self.extra),
        }
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in d.items()}
