"""Rules for servers of engines beside vLLM (LMDeploy TurboMind, llama.cpp), read from the ModelServer's props.

Each rule judges the argv the product generated (parsed by a parser rebuilt from the engine's real CLI,
components/engines/<engine>/data) against the image's facts (components.engines.lmdeploy.facts / llamacpp), the same tables the
components read: image vs GPU, model format vs GPU and converter rules, KV cache quantization, flags,
split modes and multi-node. vLLM servers are judged by the vLLM rules (hardware, image, flags).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy

from components.facts.hardware import GPUS, GpuModel
from components.engines.llamacpp.facts import IMAGES as LLAMACPP_IMAGES
from components.engines.llamacpp.facts import LlamacppImage, llamacpp_image
from components.engines.lmdeploy.facts import IMAGES as LMDEPLOY_IMAGES
from components.engines.lmdeploy.facts import LmdeployImage, lmdeploy_image
from components.facts.models import model_arch
from components.engines.lmdeploy.engine import HF_ARCHITECTURES, MODEL_FORMATS
from policies.rules.cli_dump import build_parser, parse_errors
from policies.rules.common import MODEL_SERVER, number, per_pool

Check = Callable[["Server"], list[str]]


class Server:
    """A non-vLLM ModelServer as the rules see it: engine, GPU, image facts and its parsed argv."""

    def __init__(self, props: Mapping[str, Any], gpu: GpuModel):
        self.props = props
        self.engine = str(props.get("engine"))
        self.gpu = gpu
        self.image = str(props.get("image") or "")
        self.argv = [str(t) for t in props.get("argv") or []]
        self.facts: LmdeployImage | LlamacppImage | None = (
            lmdeploy_image(self.image) if self.engine == "lmdeploy" else llamacpp_image(self.image))

    @property
    def where(self) -> str:
        """'Tesla V100-SXM2-32GB (sm_70)'."""
        return f"{self.gpu.name} (sm_{self.gpu.capability})"

    @property
    def cap(self) -> int:
        """The GPU's compute capability (70 for sm_70)."""
        return self.gpu.capability

    def tail(self) -> list[str]:
        """The arguments after the program (`lmdeploy serve api_server` / `llama-server`)."""
        skip = 3 if self.engine == "lmdeploy" else 1
        return self.argv[skip:]

    def args(self) -> argparse.Namespace | None:
        """The argv parsed by the image's own (dumped) parser; None when it does not parse or is unknown."""
        if self.facts is None:
            return None
        parser = _parser(self.engine, self.facts.serve_args)
        try:
            ns, _ = parser.parse_known_args(self.tail())
        except Exception:  # noqa: BLE001 - engine-flags reports the parse error itself
            return None
        return ns


def _quant_policy(value: str) -> int:
    """LMDeploy's --quant-policy type: a policy name or number (lmdeploy/cli/utils.py quant_policy._parse)."""
    names = {p.name: v for v, p in next(iter(LMDEPLOY_IMAGES.values())).kv_quant_policies.items()}
    names["fp8_e4m3"] = 16
    return names[value.lower()] if value.lower() in names else int(value)


_quant_policy.__name__ = "quant_policy"
_PROGRAMS = {"lmdeploy": "lmdeploy serve api_server", "llamacpp": "llama-server"}


def _parser(engine: str, dump: str) -> argparse.ArgumentParser:
    return build_parser(dump, _PROGRAMS[engine], {"_parse": _quant_policy})


def engine_policy(name: str, description: str, engines: tuple[str, ...], check: Check,
                  level: EnforcementLevel = EnforcementLevel.MANDATORY) -> ResourceValidationPolicy:
    """A rule over the ModelServers of these engines; one violation per message, once per pool."""

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        props = args.props
        if args.resource_type != MODEL_SERVER or props.get("engine") not in engines:
            args.not_applicable(f"not a {' or '.join(engines)} server")
            return
        gpu = GPUS.get(str(props.get("gpuModel")))
        if gpu is None:
            args.not_applicable(f"GPU model {props.get('gpuModel')!r} is not in the facts table")
            return
        for message in check(Server(props, gpu)):
            report(message, None)

    return ResourceValidationPolicy(name=name, description=description, validate=per_pool(validate),
                                    enforcement_level=level)


# -- both engines ---------------------------------------------------------------------------------------

def check_image(s: Server) -> list[str]:
    """The image's engine build has kernels for the GPU (the CUDA 13 builds have none for Volta)."""
    if s.facts is None or s.facts.runs_on(s.cap):
        return []  # an unknown image: engine-image-unknown (advisory)
    working = [ref for ref, f in (LMDEPLOY_IMAGES if s.engine == "lmdeploy" else LLAMACPP_IMAGES).items()
               if f.runs_on(s.cap)]
    return [f"image {s.image} has no kernels for {s.where}: {s.facts.note} ({s.facts.cite('sass')}). "
            f"Use {' or '.join(working)}"]


def check_image_known(s: Server) -> list[str]:
    """Advisory: an image the facts table does not know cannot be judged (a private build, a rolling tag)."""
    if s.facts is not None:
        return []
    known = sorted(LMDEPLOY_IMAGES if s.engine == "lmdeploy" else LLAMACPP_IMAGES)
    return [f"image {s.image} is not in the {s.engine} facts table, so nothing says it runs on {s.where} and its "
            f"flags cannot be checked; capacity is sized as the default image's. Known: {', '.join(known)} "
            f"(components/facts/{s.engine}.py)"]


def check_flags(s: Server) -> list[str]:
    """Every flag exists in the image's CLI with a valid value (the parser rebuilt from its dump)."""
    if s.facts is None:
        return []
    errors = parse_errors(_parser(s.engine, s.facts.serve_args), s.tail())
    program = _PROGRAMS[s.engine]
    out = [f"{program} ({s.image}): {e}" for e in errors]
    forbidden = {"lmdeploy": {"--disable-metrics": "monitoring scrapes /metrics, which it turns off"},
                 "llamacpp": {"--rpc": "the RPC backend is, upstream, \"a proof-of-concept ... fragile and insecure\" "
                                       "(tools/rpc/README.md): llm-cluster serves llama.cpp on one node"}}[s.engine]
    for token in s.tail():
        flag = token.partition("=")[0]
        if flag in forbidden:
            out.append(f"{program}: {flag} is refused: {forbidden[flag]}")
    return out


def check_capacity_modelled(s: Server) -> list[str]:
    """The engine's capacity model could size the pool (else memory fit cannot be judged: say why)."""
    capacity = s.props.get("capacity")
    if isinstance(capacity, Mapping) and capacity.get("error"):
        return [f"{capacity['error']}: memory fit cannot be judged; fix the pool or model it names"]
    return []


# -- LMDeploy ---------------------------------------------------------------------------------------------

def check_lmdeploy_model(s: Server) -> list[str]:
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
        out.append(f"{hf_arch} is not a TurboMind architecture in LMDeploy {facts.version} "
                   f"({facts.cite('architectures')}): with --backend turbomind the server refuses it, and "
                   "LMDeploy's PyTorch engine runs on Triton kernels that do not compile for sm_70. Serve it with "
                   "engine: vllm (DeepSeek-V3/R1: VLLM_MLA_DISABLE=1) or engine: llamacpp (GGUF)")
    args = s.args()
    fmt = getattr(args, "model_format", None) or MODEL_FORMATS.get(s.props.get("quantization"), "hf")
    rule = facts.model_formats.get(str(fmt))
    if rule is not None and (rule.min_capability is None or s.cap < rule.min_capability):
        out.append(f"--model-format {fmt}: TurboMind has no kernels for it on {s.where} ({facts.cite('model_formats')})")
    group = number(s.props.get("groupSize"))
    if rule is not None and rule.group_sizes and group is not None and group not in rule.group_sizes:
        sizes = ", ".join(str(g) for g in sorted(rule.group_sizes))
        out.append(f"--model-format {fmt} with group size {group}: TurboMind's converter accepts group size {sizes} "
                   f"only (it raises 'Unsupported group_size'); quantize with group size {sizes} "
                   f"({facts.cite('model_formats')})")
    head_dim = number(s.props.get("headDim"))
    if head_dim is not None and head_dim not in facts.head_dims(s.cap):
        dims = ", ".join(str(d) for d in sorted(facts.head_dims(s.cap)))
        out.append(f"head size {head_dim}: TurboMind's attention kernels on {s.where} take {dims} "
                   f"({facts.cite('attention_head_dims')})")
    return out


def check_lmdeploy_dtype(s: Server) -> list[str]:
    """bfloat16 below sm_80: TurboMind converts to float16 itself (a warning, not a failure): say it in the stack."""
    if not isinstance(s.facts, LmdeployImage):
        return []
    args = s.args()
    if getattr(args, "dtype", None) == "bfloat16" and s.cap < s.facts.bf16_min_capability:
        return [f"--dtype bfloat16 on {s.where}: no bf16 there; TurboMind falls back to float16 with a warning "
                f"({s.facts.cite('bf16_min_capability')}). State models.<model>.dtype: half"]
    return []


def check_lmdeploy_kv(s: Server) -> list[str]:
    """The KV cache quantization (--quant-policy) has TurboMind kernels on this GPU."""
    if not isinstance(s.facts, LmdeployImage):
        return []
    policy = getattr(s.args(), "quant_policy", 0) or 0
    known = s.facts.kv_quant_policies.get(int(policy))
    if known is None or (known.min_capability is not None and s.cap >= known.min_capability):
        return []
    ok = ", ".join(f"{v} ({p.name})" for v, p in sorted(s.facts.kv_quant_policies.items())
                   if p.min_capability is not None and p.min_capability <= s.cap)
    where = "on any GPU (TurboMind refuses fp8 KV caches)" if known.min_capability is None else f"on {s.where}"
    return [f"--quant-policy {policy} ({known.name}): no TurboMind KV kernels {where} "
            f"({s.facts.cite('kv_quant_policies')}); use lmdeploy.quantPolicy {ok}"]


def check_lmdeploy_checkpoint(s: Server) -> list[str]:
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
        found.append(f"desc_act {q.get('desc_act')}, sym {q.get('sym')}: TurboMind takes desc_act false and sym true "
                     "only (act-order or asymmetric GPTQ dies in the converter's assert)")
    if fmt == "awq" and q.get("version") not in (None, "gemm"):
        found.append(f"AWQ version {q.get('version')!r}: TurboMind takes version 'gemm' only")
    if not found:
        return []
    return [f"the checkpoint's quantization_config ({s.props.get('modelPath')}): " + "; ".join(found)
            + f" ({s.facts.cite('model_formats')}). Use a checkpoint quantized for TurboMind (Qwen/Qwen3-*-GPTQ-Int4 "
            "and *-AWQ are g128, desc_act false, sym)"]


# -- llama.cpp --------------------------------------------------------------------------------------------

def check_llamacpp_split(s: Server) -> list[str]:
    """Advisory: -sm row / tensor are not what the evidence shows working on V100."""
    if not isinstance(s.facts, LlamacppImage):
        return []
    mode = str(getattr(s.args(), "split_mode", "layer") or "layer")
    known = s.facts.split_modes.get(mode)
    if known is not None and not known.production:
        return [f"--split-mode {mode} splits {known.parallel} across GPUs, but {known.why}; -sm layer is the "
                "default that the V100 reports use"]
    return []


def check_llamacpp_cache(s: Server) -> list[str]:
    """A quantized V cache needs FlashAttention (llama.cpp refuses to create the context otherwise)."""
    if not isinstance(s.facts, LlamacppImage):
        return []
    args = s.args()
    v_type = str(getattr(args, "cache_type_v", "f16") or "f16")
    if v_type not in ("f16", "f32", "bf16") and getattr(args, "flash_attn", "auto") in ("off", "0", "false"):
        return [f"--cache-type-v {v_type} with --flash-attn off: llama.cpp stops with 'quantized V cache requires "
                "flash_attn to be enabled' (src/llama-context.cpp at b11312); set llamacpp.flashAttention: on"]
    return []


def check_llamacpp_jit(s: Server) -> list[str]:
    """Advisory: GPUs served from PTX compile the kernels at first start (and need a new enough driver)."""
    if not isinstance(s.facts, LlamacppImage) or not s.facts.jit_only(s.cap):
        return []
    return [f"{s.image} has no SASS for {s.where}, only PTX: the first start JIT-compiles every kernel for minutes "
            f"(keep loadTimeoutMinutes generous) and the driver must support CUDA {s.facts.cuda} (R570+), or the "
            f"load fails ({s.facts.cite('ptx')})"]


POLICIES = [
    engine_policy("engine-image", "The engine image has kernels for the pool's GPU (LMDeploy, llama.cpp).",
                  ("lmdeploy", "llamacpp"), check_image),
    engine_policy("engine-image-unknown", "The engine image is one the facts table knows (LMDeploy, llama.cpp).",
                  ("lmdeploy", "llamacpp"), check_image_known, EnforcementLevel.ADVISORY),
    engine_policy("engine-flags", "Every flag exists in the engine image's own CLI with a valid value (LMDeploy, "
                  "llama.cpp).", ("lmdeploy", "llamacpp"), check_flags),
    engine_policy("engine-capacity", "The engine's capacity model sizes the pool (heads divisible by TP, weights "
                  "known).", ("lmdeploy", "llamacpp"), check_capacity_modelled),
    engine_policy("lmdeploy-model", "TurboMind loads the model's architecture, format, group size and head size on "
                  "the GPU.", ("lmdeploy",), check_lmdeploy_model),
    engine_policy("lmdeploy-kv-cache", "TurboMind has KV cache kernels for --quant-policy on the GPU.",
                  ("lmdeploy",), check_lmdeploy_kv),
    engine_policy("lmdeploy-dtype", "No bfloat16 where the GPU has none (TurboMind falls back to float16).",
                  ("lmdeploy",), check_lmdeploy_dtype, EnforcementLevel.ADVISORY),
    engine_policy("lmdeploy-checkpoint", "A quantized checkpoint meets TurboMind's converter rules (desc_act false, "
                  "symmetric, AWQ gemm, the named format).", ("lmdeploy",), check_lmdeploy_checkpoint),
    engine_policy("llamacpp-kv-cache", "A quantized V cache has FlashAttention on.", ("llamacpp",),
                  check_llamacpp_cache),
    engine_policy("llamacpp-split-mode", "Split modes other than layer/none are not shown to work on V100.",
                  ("llamacpp",), check_llamacpp_split, EnforcementLevel.ADVISORY),
    engine_policy("llamacpp-ptx-jit", "The image runs the GPU from PTX: the first start compiles for minutes.",
                  ("llamacpp",), check_llamacpp_jit, EnforcementLevel.ADVISORY),
]
