"""The policy pack as the tests call it: one resource's AnalyzeRequest through pulumi_policy's analyzer
servicer (the reference chat replica's ModelServer props, changed as a test needs), the reference chat
server on each GPU capability and engine image, and the stacks the pack refuses, one rule each."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import struct_pb2
from pulumi.runtime import proto

from components.engines.vllm.facts import ImageFacts
from plan.analyze import LEVEL_NAMES, configured_servicer
from policies.pack import POLICIES

STACK = "urn:pulumi:prod::llm-cluster::"
V100 = "Tesla V100-SXM2-32GB"
DESCRIPTIONS = {p.name: p.description for p in POLICIES}

# The reference cluster's Qwen3-30B-A3B replica, as components.resources.model_server registers it.
CHAT_ARGV = [
    "vllm",
    "serve",
    "/data/models/Qwen3-30B-A3B",
    "--served-model-name",
    "qwen3-30b-a3b",
    "--host",
    "192.168.10.13",
    "--port",
    "8000",
    "--tensor-parallel-size",
    "8",
    "--distributed-executor-backend",
    "mp",
    "--dtype",
    "half",
    "--max-model-len",
    "32768",
    "--max-num-seqs",
    "128",
    "--gpu-memory-utilization",
    "0.9",
    "--attention-backend",
    "TRITON_ATTN",
]
CHAT_ENV = {
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "NCCL_IB_DISABLE": "0",
    "NCCL_IB_HCA": "mlx5_0",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_SOCKET_IFNAME": "bond0",
    "VLLM_HOST_IP": "192.168.10.13",
}
CAPACITY = {"fits": True, "reason": "", "max_concurrency": 20.5, "kv_tokens": 671744.0, "weights_gib_per_gpu": 7.1}


def server(**changes: Any) -> dict[str, Any]:
    """ModelServer props of the reference chat replica, with changes (argv_add, argv_drop, env_* too)."""
    props: dict[str, Any] = {
        "pool": "chat",
        "instance": "chat-gpu-03",
        "model": "qwen3-30b-a3b",
        "modelPath": "/data/models/Qwen3-30B-A3B",
        "arch": "qwen3-30b-a3b",
        "quantization": None,
        "dtype": "half",
        "gpuModel": V100,
        "gpuCount": 8.0,
        "nodes": ["gpu-03"],
        "tensorParallel": 8.0,
        "pipelineParallel": 1.0,
        "image": "vllm/vllm-openai:v0.19.1",
        "argv": list(CHAT_ARGV),
        "env": dict(CHAT_ENV),
        "capacity": dict(CAPACITY),
    }
    argv: list[str] = props["argv"]
    for flag in changes.pop("argv_drop", []):
        i = argv.index(flag)
        del argv[i : i + (1 if flag.startswith("--no-") or i + 1 == len(argv) or argv[i + 1].startswith("--") else 2)]
    argv += changes.pop("argv_add", [])
    props.update(changes)
    return props


def analyze(
    type_: str,
    name: str,
    props: dict[str, Any],
    *,
    parent_type: str | None = None,
    config: dict[str, Any] | None = None,
    delete_before_replace: bool | None = True,
) -> list[tuple[str, str, str]]:
    """(policy, level, message) for one AnalyzeRequest through a freshly configured servicer.

    Resource options as the engine sends them: delete_before_replace None is an option the program left unset.
    """
    servicer = configured_servicer(config)
    chain = f"{parent_type}${type_}" if parent_type else type_
    s = struct_pb2.Struct()
    s.update(props)
    options = proto.AnalyzerResourceOptions(
        deleteBeforeReplace=bool(delete_before_replace), deleteBeforeReplaceDefined=delete_before_replace is not None
    )
    urn = f"{STACK}{chain}::{name}"
    request = proto.AnalyzeRequest(urn=urn, type=type_, name=name, properties=s, options=options)
    diagnostics = list(servicer.Analyze(request, None).diagnostics)
    # The stack policies (policies.rules.grouped) see it in AnalyzeStack, alone in its stack.
    stack = proto.AnalyzeStackRequest(
        resources=[proto.AnalyzerResource(urn=urn, type=type_, name=name, properties=s, options=options)]
    )
    diagnostics += servicer.AnalyzeStack(stack, None).diagnostics
    return [(d.policyName, LEVEL_NAMES[d.enforcementLevel], d.message) for d in diagnostics]


def not_applicable(type_: str, props: dict[str, Any]) -> dict[str, str]:
    """policy -> the reason it gave for not judging a resource (the servicer's not_applicable list)."""
    s = struct_pb2.Struct()
    s.update(props)
    request = proto.AnalyzeRequest(urn=f"{STACK}{type_}::x", type=type_, name="x", properties=s)
    response = configured_servicer(None).Analyze(request, None)
    return {n.policy_name: n.reason for n in response.not_applicable}


def model_server(props: dict[str, Any], **kw: Any) -> list[tuple[str, str, str]]:
    return analyze("llm-cluster:vllm:ModelServer", "chat-gpu-03", props, **kw)


def only(policy: str, message: str, level: str = "mandatory") -> list[tuple[str, str, str]]:
    """The one diagnostic expected: the servicer prefixes the policy's description."""
    return [(policy, level, f"{DESCRIPTIONS[policy]}\n{message}")]


# --- the reference chat server on each GPU capability (every image x sm_70/75/80/86/89/90) -------------

# One GPU per capability, as nvidia-smi names it.
GPU_AT = {
    70: "Tesla V100-SXM2-32GB",
    75: "Tesla T4",
    80: "NVIDIA A100-SXM4-80GB",
    86: "NVIDIA A10",
    89: "NVIDIA L40S",
    90: "NVIDIA H100 80GB HBM3",
}


def server_with(props: dict[str, Any], argv_add: list[str]) -> dict[str, Any]:
    return {**props, "argv": [*props["argv"], *argv_add]}


PREFILL_FLAGS = (
    "--enable-prefix-caching",
    "--no-enable-prefix-caching",
    "--enable-chunked-prefill",
    "--no-enable-chunked-prefill",
)


def _props(f: ImageFacts, capability: int) -> dict[str, Any]:
    """The reference chat server on this image and GPU, clean for every capability rule: prefix caching and
    chunked prefill off, V0 chosen where the image still reads VLLM_USE_V1 and has V0, its attention flag only
    where the image has one."""
    props = server(gpuModel=GPU_AT[capability], image=f.ref)
    argv = [a for a in props["argv"] if a not in PREFILL_FLAGS]
    if not f.attention_backend_flag and "--attention-backend" in argv:
        i = argv.index("--attention-backend")
        del argv[i : i + 2]
    props["argv"] = [*argv, "--no-enable-prefix-caching", "--no-enable-chunked-prefill"]
    if f.reads_vllm_use_v1 and f.v0_engine:
        props["env"] = {**props["env"], "VLLM_USE_V1": "0"}
    return props


# --- stacks the pack refuses, one rule each: (the change, the rule, the resource it names) -------------

NS = "llm-cluster:"


def _pool(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda c: c[NS + "pools"][name]


def _set(path: Callable[[dict[str, Any]], dict[str, Any]], **values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: path(c).update(values)


CHAT = _pool("chat")
REASONING = _pool("reasoning")
QWEN = lambda c: c[NS + "models"]["qwen3-30b-a3b"]  # noqa: E731

ONE_CHANGE: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "bf16": (_set(QWEN, dtype="bfloat16"), "gpu-dtype", "chat-gpu-03"),
    "awq-model": (_set(QWEN, quantization="awq"), "gpu-quantization", "chat-gpu-03"),
    "flash-attn-backend": (
        lambda c: CHAT(c)["vllm"].update(attentionBackend="FLASH_ATTN"),
        "attention-backend",
        "chat-gpu-03",
    ),
    "fp8-kv-cache": (lambda c: CHAT(c)["vllm"].update(kvCacheDtype="fp8"), "gpu-fp8", "chat-gpu-03"),
    "mla-on": (lambda c: REASONING(c).pop("env"), "mla-attention", "reasoning-gpu-01"),
    "swap-space-on-0.19": (lambda c: CHAT(c)["vllm"].update(swapSpaceGib=4), "vllm-serve-flags", "chat-gpu-03"),
    "tp16-on-8-gpu-nodes": (_set(REASONING, tensorParallel=16, pipelineParallel=1), "parallelism", "reasoning-gpu-01"),
    "ubuntu2404-variant": (_set(CHAT, image="vllm/vllm-openai:v0.19.1-ubuntu2404"), "vllm-image", "chat-gpu-03"),
    "unknown-flag": (
        lambda c: CHAT(c)["vllm"].update(extraArgs=["--enable-prefix-cache"]),
        "vllm-serve-flags",
        "chat-gpu-03",
    ),
    "literal-hf-token": (_set(CHAT, env={"HF_TOKEN": "hf_live_abc"}), "no-plaintext-secrets", "chat-gpu-03-vllm"),
}
