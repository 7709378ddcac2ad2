"""LMDeploy's own policy rules (TurboMind's model, KV cache, dtype and checkpoint rules), read from the
ModelServer's props and the image's facts; the policy pack loads them through the registry."""

from __future__ import annotations

from collections.abc import Mapping

from components.engines.judged import EngineRule, JudgedServer, number
from components.engines.lmdeploy.facts import HF_ARCHITECTURES, IMAGES, MODEL_FORMATS, LmdeployImage
from components.facts.models import model_arch


def quant_policy(value: str) -> int:
    """LMDeploy's --quant-policy type: a policy name or number (lmdeploy/cli/utils.py quant_policy._parse)."""
    names = {p.name: v for v, p in next(iter(IMAGES.values())).kv_quant_policies.items()}
    names["fp8_e4m3"] = 16
    return names[value.lower()] if value.lower() in names else int(value)


quant_policy.__name__ = "quant_policy"  # the type name the dump gives it


def check_lmdeploy_model(s: JudgedServer) -> list[str]:
    """TurboMind loads the model's architecture, format and head size on this GPU, by its converter's rules."""
    facts = s.facts
    if not isinstance(facts, LmdeployImage):
        return []
    out = []
    model_type = s.props.get("modelType")
    if model_type is None and s.props.get("arch"):
        try:
            model_type = model_arch(str(s.props["arch"])).model_type
        except KeyError:
            model_type = None
    hf_arch = HF_ARCHITECTURES.get(str(model_type))
    if hf_arch is not None and hf_arch not in facts.architectures:
        out.append(
            f"{hf_arch} is not a TurboMind architecture in LMDeploy {facts.version} "
            f"({facts.cite('architectures')}): with --backend turbomind the server refuses it, and "
            "LMDeploy's PyTorch engine runs on Triton kernels that do not compile for sm_70. Serve it with "
            "engine: vllm (DeepSeek-V3/R1: VLLM_MLA_DISABLE=1) or engine: llamacpp (GGUF)"
        )
    args = s.args()
    fmt = getattr(args, "model_format", None) or MODEL_FORMATS.get(s.props.get("quantization"), "hf")
    rule = facts.model_formats.get(str(fmt))
    if rule is not None and (rule.min_capability is None or s.cap < rule.min_capability):
        out.append(
            f"--model-format {fmt}: TurboMind has no kernels for it on {s.where} ({facts.cite('model_formats')})"
        )
    group = number(s.props.get("groupSize"))
    if rule is not None and rule.group_sizes and group is not None and group not in rule.group_sizes:
        sizes = ", ".join(str(g) for g in sorted(rule.group_sizes))
        out.append(
            f"--model-format {fmt} with group size {group}: TurboMind's converter accepts group size {sizes} "
            f"only (it raises 'Unsupported group_size'); quantize with group size {sizes} "
            f"({facts.cite('model_formats')})"
        )
    head_dim = number(s.props.get("headDim"))
    if head_dim is not None and head_dim not in facts.head_dims(s.cap):
        dims = ", ".join(str(d) for d in sorted(facts.head_dims(s.cap)))
        out.append(
            f"head size {head_dim}: TurboMind's attention kernels on {s.where} take {dims} "
            f"({facts.cite('attention_head_dims')})"
        )
    return out


def check_lmdeploy_dtype(s: JudgedServer) -> list[str]:
    """bfloat16 below sm_80: TurboMind converts to float16 itself (a warning, not a failure): say it in the stack."""
    if not isinstance(s.facts, LmdeployImage):
        return []
    args = s.args()
    if getattr(args, "dtype", None) == "bfloat16" and s.cap < s.facts.bf16_min_capability:
        return [
            f"--dtype bfloat16 on {s.where}: no bf16 there; TurboMind falls back to float16 with a warning "
            f"({s.facts.cite('bf16_min_capability')}). State models.<model>.dtype: half"
        ]
    return []


def check_lmdeploy_kv(s: JudgedServer) -> list[str]:
    """The KV cache quantization (--quant-policy) has TurboMind kernels on this GPU."""
    if not isinstance(s.facts, LmdeployImage):
        return []
    policy = getattr(s.args(), "quant_policy", 0) or 0
    known = s.facts.kv_quant_policies.get(int(policy))
    if known is None or (known.min_capability is not None and s.cap >= known.min_capability):
        return []
    ok = ", ".join(
        f"{v} ({p.name})"
        for v, p in sorted(s.facts.kv_quant_policies.items())
        if p.min_capability is not None and p.min_capability <= s.cap
    )
    where = "on any GPU (TurboMind refuses fp8 KV caches)" if known.min_capability is None else f"on {s.where}"
    return [
        f"--quant-policy {policy} ({known.name}): no TurboMind KV kernels {where} "
        f"({s.facts.cite('kv_quant_policies')}); use lmdeploy.quantPolicy {ok}"
    ]


def check_lmdeploy_checkpoint(s: JudgedServer) -> list[str]:
    """An int4 checkpoint whose config.json the stack gives meets TurboMind's converter asserts (get_tm_config):
    GPTQ desc_act false and symmetric, AWQ version gemm, the format the flag names."""
    if not isinstance(s.facts, LmdeployImage):
        return []
    q = s.props.get("quantizationConfig")
    fmt = getattr(s.args(), "model_format", None)
    if not isinstance(q, Mapping) or fmt not in ("gptq", "awq", "compressed-tensors", "fp8", "mxfp4"):
        return []
    found = []
    method = q.get("quant_method")
    if method is not None and method != fmt:
        found.append(f"quant_method {method!r} but --model-format {fmt} (TurboMind asserts 'mismatched quant method')")
    if fmt == "gptq" and (q.get("desc_act") is True or q.get("sym") is False):
        found.append(
            f"desc_act {q.get('desc_act')}, sym {q.get('sym')}: TurboMind takes desc_act false and sym true "
            "only (act-order or asymmetric GPTQ dies in the converter's assert)"
        )
    if fmt == "awq" and q.get("version") not in (None, "gemm"):
        found.append(f"AWQ version {q.get('version')!r}: TurboMind takes version 'gemm' only")
    if not found:
        return []
    return [
        f"the checkpoint's quantization_config ({s.props.get('modelPath')}): "
        + "; ".join(found)
        + f" ({s.facts.cite('model_formats')}). Use a checkpoint quantized for TurboMind (Qwen/Qwen3-*-GPTQ-Int4 "
        "and *-AWQ are g128, desc_act false, sym)"
    ]


RULES = (
    EngineRule(
        "lmdeploy-model",
        "TurboMind loads the model's architecture, format, group size and head size on the GPU.",
        check_lmdeploy_model,
    ),
    EngineRule("lmdeploy-kv-cache", "TurboMind has KV cache kernels for --quant-policy on the GPU.", check_lmdeploy_kv),
    EngineRule(
        "lmdeploy-dtype",
        "No bfloat16 where the GPU has none (TurboMind falls back to float16).",
        check_lmdeploy_dtype,
        advisory=True,
    ),
    EngineRule(
        "lmdeploy-checkpoint",
        "A quantized checkpoint meets TurboMind's converter rules (desc_act false, "
        "symmetric, AWQ gemm, the named format).",
        check_lmdeploy_checkpoint,
    ),
)
