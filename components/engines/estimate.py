"""The capacity estimate an engine other than vLLM reports: the keys plan.json, the plan report and the
memory-fit policies read of every engine (the same names as vLLM's CapacityEstimate), plus its own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3

# The measured error of each engine's KV estimate (bench/capacity_accuracy.py, docs/perf/capacity.md) is kept per
# class of pool (engine line, TP 1 or >= 2, dense/MoE/MLA). A class with fewer than KV_ERROR_MIN_LOGS compared logs
# takes the widest error measured on its engine's logs; none claims less than the floor.
KV_ERROR_MIN_LOGS = 3
KV_ERROR_FLOOR = 0.02
# A class of pool with too few compared logs (vLLM's), or an engine none of whose public start-up logs could be
# compared (TurboMind), takes the widest error measured on any engine's logs: vLLM's Llama-3-8B H100 log (V0,
# TP 1), +3.45 %, to the tenth of a percent above. Measured nowhere, it claims no better than the worst measured.
KV_ERROR_UNMEASURED = 0.035


def class_kv_error(
    cls: tuple[str, str, str],
    by_class: Mapping[tuple[str, str, str], float],
    widest: float,
    *,
    engine: str,
    widest_how: str = "too few logs, the widest error measured",
) -> tuple[float, str]:
    """A class's measured optimistic KV error and how it was found, in words for the plan."""
    kind = {"moe": "MoE", "mla": "MLA"}.get(cls[2], cls[2])
    name = f"{engine} · {cls[1].upper()} · {kind}"
    if cls in by_class:
        return by_class[cls], f"{name}, measured on its logs"
    return widest, f"{name}: {widest_how}"


def pool_kind(*, uses_mla: bool, is_moe: bool) -> str:
    """dense, moe or mla (MLA first: DeepSeek's MoE models are classed by their attention)."""
    return "mla" if uses_mla else "moe" if is_moe else "dense"


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
