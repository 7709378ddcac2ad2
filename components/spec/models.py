"""What a stack's models are: the architecture from the catalog or the checkpoint's config.json, its
quantization and context window, as every engine's capacity model and the rules read them."""

from __future__ import annotations

import json
from pathlib import Path

from components.facts.hardware import DTYPE_ALIASES
from components.facts.models import (
    ModelArch,
    arch_from_config_json,
    context_window,
    model_arch,
    quantization_from_config_json,
)
from components.spec.base import SpecError, SpecIssue
from components.spec.stack import StackSpec


def model_architecture(spec: StackSpec, model: str) -> ModelArch:
    """The model's architecture: a catalog entry, or parsed from its config.json."""
    m = spec.models[model]
    if m.arch is not None:
        try:
            return model_arch(m.arch)
        except KeyError as e:
            raise SpecError([SpecIssue(f"models.{model}.arch", str(e.args[0]))]) from None
    path = Path(m.config_json or "")
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"holds a JSON {type(data).__name__}, not an object")
        return arch_from_config_json(data, model)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError([SpecIssue(f"models.{model}.configJson", f"cannot read {path}: {e}")]) from None


def checkpoint_quantization(spec: StackSpec, model: str) -> str | None:
    """The quantization method a configJson model's config.json states (quantization_config), None otherwise
    (catalog models carry no checkpoint file to read)."""
    m = spec.models[model]
    if m.config_json is None:
        return None
    try:
        data = json.loads(Path(m.config_json).read_text())
        found = quantization_from_config_json(data) if isinstance(data, dict) else None
    except (OSError, ValueError, TypeError):
        return None  # model_architecture reports an unreadable file
    return found[0] if found else None


def quantization_config(spec: StackSpec, model: str) -> dict[str, object] | None:
    """The checkpoint's quantization_config as its config.json states it (configJson models), for the rules an
    engine's converter enforces (TurboMind: group size, desc_act, sym, AWQ version); None when not known."""
    path = spec.models[model].config_json
    if path is None:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None  # model_architecture reports an unreadable configJson
    if not isinstance(data, dict):
        return None  # and one that is not a JSON object
    q = (data.get("text_config") or {}).get("quantization_config") or data.get("quantization_config")
    if not isinstance(q, dict):
        return None
    keys = ("quant_method", "bits", "group_size", "desc_act", "sym", "version")
    return {k: q[k] for k in keys if k in q and isinstance(q[k], (str, int, float, bool))}


def context_window_dict(spec: StackSpec, model: str) -> dict[str, object] | None:
    """The model's context window as vLLM derives it (ModelServer prop `contextWindow`), None when unknown."""
    arch = model_architecture(spec, model)
    window = context_window(arch)
    if window is None:
        return None
    return {"tokens": window[0], "derivedFrom": window[1], "ropeScaled": bool(arch.rope_scaling)}


def resolved_dtype(dtype: str, capability: int) -> str:
    """What `--dtype` becomes on this GPU: `auto` falls back to float16 where bf16 is missing."""
    resolved = DTYPE_ALIASES[dtype]
    if resolved == "auto":
        # bf16 only from sm_80, in every known version (images: bf16_min_capability).
        return "bfloat16" if capability >= 80 else "float16"
    return resolved
