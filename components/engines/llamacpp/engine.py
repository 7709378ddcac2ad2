"""llama.cpp behind the engine seam: `llama-server` argv and env, and the capacity of one server.

Capacity follows llama.cpp at the image's build (sources in components.engines.llamacpp.facts):
- `-c` is the whole KV cache: with `-np N` slots each request gets n_ctx / N tokens, padded to 256
  (src/llama-context.cpp); the product passes `-c contextPerSlot x parallel` so contextPerSlot is what
  a request gets.
- With every layer offloaded (`-ngl 999`) and `-sm layer`, decoder blocks are cut over the server's GPUs by
  their share of the free memory, the output layer counted as one more block on the last GPU, and each GPU
  caches K/V of its own layers (src/llama-kv-cache.cpp: model.dev_layer); the token embedding stays in host
  memory (llama.cpp keeps the input layer on the CPU). A DeepSeek-MLA GGUF caches only K (latent + rope
  key, no V: src/llama-kv-cache.cpp).
- Weights come from the GGUF header when the pool names one (tensor bytes, exact), else from the model's
  stated sizeGib spread over its layers.
Assumptions, not measured: RESERVED_GIB per GPU for the CUDA context and cuBLAS; compute buffers of one
ubatch (COMPUTE_UBATCH tokens) as estimated by compute_bytes.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from components.engines.base import Engine, MultiNode, offline_env, planned_capability
from components.engines.estimate import GIB, KV_ERROR_FLOOR, EngineEstimate, class_kv_error, pool_kind
from components.engines.gate import GateCheck
from components.engines.http import EngineServer
from components.engines.judged import EngineRule
from components.engines.llamacpp.facts import (
    DEFAULT_IMAGE,
    GGUF_BITS_PER_WEIGHT,
    HTTP_SERVER,
    IMAGES,
    LlamacppImage,
    llamacpp_image,
)
from components.engines.llamacpp.options import LLAMACPP_ALIASES, LLAMACPP_MULTI_NODE, TYPED_FLAGS, LlamacppOptions
from components.engines.llamacpp.rules import RULES
from components.engines.llamacpp.startup_failures import STARTUP_FAILURES as LLAMACPP_STARTUP_FAILURES
from components.engines.weights import CheckpointFormat
from components.facts.engine_matrix import Cell, level
from components.facts.gguf import GgufModel, read_gguf
from components.facts.hardware import gpu
from components.facts.models import ModelArch
from components.facts.startup_failures import StartupFailure
from components.spec import SpecIssue, StackSpec
from components.spec.base import Spec
from components.spec.models import model_architecture
from components.spec.topology import Instance, instances

RESERVED_GIB = 0.5
COMPUTE_UBATCH = 512  # llama.cpp's default -ub
# How far the KV buffer estimate has erred low (optimistic: llama-server allocates more than planned) against
# real start-up logs, per class of pool (engine, one GPU or more, dense/MoE/MLA): bench/capacity_accuracy.py
# measures it (docs/perf/capacity.md), tests/test_capacity.py keeps each figure covering its class's logs. The
# KV buffer is n_ctx x layers x K/V row bytes, exactly as llama.cpp sizes it, so no log errs low; SWA models
# (gpt-oss) err high, as the estimate caches every layer for the whole context.
KV_ERROR_BY_CLASS: dict[tuple[str, str, str], float] = {
    ("llamacpp", "tp1", "moe"): KV_ERROR_FLOOR,  # 3 logs (gpt-oss-20b on a T4), none optimistic
}
KV_ERROR_WIDEST = KV_ERROR_FLOOR  # 5 logs, none optimistic
RULE_OF_THUMB_FACTOR = 1.2
# Bytes per cached element of each -ctk/-ctv type (ggml block size and bytes: q8_0 34 B per 32, ...).
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}
# Where llama-server is in the server image (.devops/cuda.Dockerfile ENTRYPOINT ["/app/llama-server"]).
SERVER_BINARY = "/app/llama-server"


@dataclass(frozen=True)
class ModelShape:
    """What the capacity of a llama.cpp server depends on, from a GGUF header or from the catalog."""

    name: str
    layers: int
    embedding: int
    vocab: int
    heads: int
    ffn_width: int  # the widest MLP activation of one token (experts used x expert width for MoE)
    layer_bytes: tuple[int, ...]  # weight bytes of each decoder block
    output_bytes: int  # output.weight + output_norm (on the last GPU)
    input_bytes: int  # token_embd (host memory)
    kv_per_token_per_layer_f16: float  # K+V bytes of one token in one layer at f16
    exact: bool  # weights read from the GGUF header (False: spread from a stated size)
    kind: str = "dense"  # dense, moe or mla: the class whose measured KV error the plan's range takes

    def kv_per_token_per_layer(self, cache_type: str) -> float:
        """K+V bytes of one token in one layer at the cache type."""
        return self.kv_per_token_per_layer_f16 / 2 * CACHE_TYPE_BYTES[cache_type]


def shape_from_gguf(g: GgufModel, *, total_bytes: int | None = None) -> ModelShape:
    """The shape of a GGUF model; a split model's other shards are sized by `total_bytes` (all shards)."""
    layers = tuple(g.layer_bytes(i) for i in range(g.block_count))
    output = g.bytes_named("output.weight", "output_norm.weight")
    inp = g.bytes_named("token_embd.weight")
    if g.split_count > 1:
        if total_bytes is None:
            raise ValueError(
                f"{g.path} is shard 1 of {g.split_count}: its header lists only its own tensors; "
                "state the model's sizeGib (all shards) to size the rest"
            )
        known = sum(layers)
        rest = max(0, total_bytes - known - output - inp)
        missing = [i for i, b in enumerate(layers) if b == 0] or list(range(len(layers)))
        layers = tuple(b + (rest // len(missing) if i in missing else 0) for i, b in enumerate(layers))
    ffn = g.expert_used_count * g.expert_feed_forward_length if g.expert_count else g.feed_forward_length
    return ModelShape(
        name=g.name or g.path,
        layers=g.block_count,
        embedding=g.embedding_length,
        vocab=g.vocab_size,
        heads=g.head_count,
        ffn_width=ffn,
        layer_bytes=layers,
        output_bytes=output,
        input_bytes=inp,
        kv_per_token_per_layer_f16=g.kv_bytes_per_token_per_layer(2.0),
        exact=g.split_count == 1,
        kind=pool_kind(uses_mla=g.mla, is_moe=g.expert_count > 0),
    )


def shape_from_arch(arch: ModelArch, total_bytes: float) -> ModelShape:
    """The shape of a catalog model whose GGUF weighs `total_bytes`: blocks share what embeddings leave."""
    h = arch.hidden_size
    embed = arch.vocab_size * h  # at about one byte per weight in a 4-8 bit GGUF: a small correction
    output = arch.vocab_size * h + h
    per_layer = max(0.0, total_bytes - embed - output) / arch.num_layers
    if arch.uses_mla:
        kv = (arch.kv_lora_rank + arch.qk_rope_head_dim) * 2.0  # llama.cpp's MLA cache: K only
    else:
        kv = 2 * arch.num_kv_heads * arch.head_dim * 2.0
    width = (arch.experts_per_token * arch.moe_intermediate_size) if arch.is_moe else arch.intermediate_size
    return ModelShape(
        name=arch.name,
        layers=arch.num_layers,
        embedding=h,
        vocab=arch.vocab_size,
        heads=arch.num_attention_heads,
        ffn_width=width,
        layer_bytes=tuple(int(per_layer) for _ in range(arch.num_layers)),
        output_bytes=output,
        input_bytes=embed,
        kv_per_token_per_layer_f16=kv,
        exact=False,
        kind=pool_kind(uses_mla=arch.uses_mla, is_moe=arch.is_moe),
    )


def layers_per_gpu(layers: int, gpus: int) -> list[int]:
    """Decoder blocks per GPU with -sm layer over identical GPUs, as llama.cpp places them (src/llama-model.cpp
    load_tensors): the blocks and the output layer are layers + 1 slots, cut at each GPU's cumulative share of
    the free memory (equal here); slot i goes to GPU floor(i x gpus / (layers + 1)). The output layer is the
    last slot, so the first GPUs take the blocks it displaces: 28 blocks on 2 GPUs are 15 + 13, not 14 + 14."""
    counts = [0] * gpus
    for block in range(layers):
        counts[block * gpus // (layers + 1)] += 1  # below gpus: block < layers + 1
    return counts


def compute_bytes(shape: ModelShape, *, last: bool, ctx_per_slot: int, flash_attention: bool) -> float:
    """One GPU's compute buffer for a ubatch: activations, the logits on the last GPU, and without
    FlashAttention the K*Q scores of a full slot [unverified estimate of ggml's graph allocator]."""
    ub = COMPUTE_UBATCH
    act = ub * (4 * shape.embedding + shape.ffn_width) * 4
    logits = ub * shape.vocab * 4 if last else 0
    scores = 0 if flash_attention else ub * ctx_per_slot * shape.heads * 4
    return act + logits + scores


def llamacpp_estimate(
    shape: ModelShape,
    gpu_memory_gib: float,
    *,
    gpus: int,
    split_mode: str,
    ctx_per_slot: int,
    parallel: int,
    cache_type: str,
    flash_attention: bool,
    ctx_pad: int = 256,
) -> EngineEstimate:
    """What one llama-server puts on each of its GPUs, and whether every slot gets its context."""
    slot = -(-ctx_per_slot // ctx_pad) * ctx_pad
    n_ctx = slot * parallel
    per_token_layer = shape.kv_per_token_per_layer(cache_type)
    if split_mode in ("row", "tensor") or gpus == 1:
        # Every GPU holds a share of every layer (row/tensor) or the one GPU holds all.
        share = [shape.layers / gpus] * gpus
        weights = [sum(shape.layer_bytes) / gpus + shape.output_bytes / gpus] * gpus
    else:
        counts = layers_per_gpu(shape.layers, gpus)
        share = [float(c) for c in counts]
        weights, start = [], 0
        for i, c in enumerate(counts):
            weights.append(sum(shape.layer_bytes[start : start + c]) + (shape.output_bytes if i == gpus - 1 else 0))
            start += c
    kv = [s * per_token_layer * n_ctx for s in share]
    compute = [
        compute_bytes(shape, last=i == gpus - 1, ctx_per_slot=slot, flash_attention=flash_attention)
        for i in range(gpus)
    ]
    reserved = RESERVED_GIB * GIB
    need = [w + k + c + reserved for w, k, c in zip(weights, kv, compute)]
    worst = max(range(gpus), key=lambda i: need[i])
    total = gpu_memory_gib * GIB
    fits, reason, advice = True, "", ""
    if weights[worst] + reserved >= total:
        fits = False
        reason = (
            f"the weights need {weights[worst] / GIB:.1f} GiB on GPU {worst} of the server, more than its "
            f"{gpu_memory_gib:.1f} GiB"
        )
        advice = "give each server more GPUs (tensorParallel), or serve a smaller quantization of the GGUF"
    elif need[worst] > total:
        fits = False
        reason = (
            f"GPU {worst} needs {need[worst] / GIB:.1f} GiB (weights {weights[worst] / GIB:.1f} + KV "
            f"{kv[worst] / GIB:.1f} for -c {n_ctx} + compute {compute[worst] / GIB:.2f} + CUDA context "
            f"{RESERVED_GIB:g}) of its {gpu_memory_gib:.1f} GiB: llama-server fails to allocate at start"
        )
        advice = (
            "lower llamacpp.contextPerSlot or parallel, quantize the KV cache (cacheType q8_0), or give each "
            "server more GPUs"
        )
    notes = []
    if not shape.exact:
        notes.append(
            "weights spread evenly over the layers from the stated size (no GGUF header): per-GPU "
            "figures are approximate"
        )
    if slot != ctx_per_slot:
        notes.append(f"llama.cpp pads each slot's context to {ctx_pad}: {ctx_per_slot} becomes {slot}")
    kv_tokens = n_ctx
    rot = (sum(shape.layer_bytes) + shape.output_bytes + shape.input_bytes) * RULE_OF_THUMB_FACTOR
    error, error_class = kv_estimate_error(kv_error_class(shape.kind, gpus))
    # The pessimistic end: every GPU's KV buffer larger by the class's error. -c is allocated whole at start, so
    # the tokens it holds there are n_ctx when every GPU still fits, else the context the tightest GPU can hold.
    room = [total - w - c - reserved for w, c in zip(weights, compute)]
    per_token_high = [s * per_token_layer * (1 + error) for s in share]
    fit_high = min(int(r // t) if t else n_ctx for r, t in zip(room, per_token_high))
    tokens_low = min(n_ctx, max(0, fit_high))
    return EngineEstimate(
        engine="llamacpp",
        model=shape.name,
        gpu_memory_gib=gpu_memory_gib,
        tp=gpus,
        max_model_len=slot,
        weights_gib_per_gpu=max(weights) / GIB,
        weights_gib_total=sum(weights) / GIB,
        kv_bytes_per_token_per_gpu=share[worst] * per_token_layer,
        kv_cache_gib_per_gpu=kv[worst] / GIB,
        kv_tokens=kv_tokens,
        max_concurrency=float(parallel),
        rule_of_thumb_gib_total=rot / GIB,
        fits=fits,
        reason=reason,
        advice=advice,
        notes=tuple(notes),
        extra={
            "context_option": "the context per slot (llamacpp.contextPerSlot)",
            "n_ctx": n_ctx,
            "ctx_per_slot": slot,
            "parallel": parallel,
            "split_mode": split_mode,
            "cache_type": cache_type,
            "layers_per_gpu": [round(s, 2) for s in share],
            "compute_gib_per_gpu": compute[worst] / GIB,
            "host_gib": shape.input_bytes / GIB,
            "weights_exact": shape.exact,
            "kv_estimate_error": error,
            "kv_error_class": error_class,
            "kv_tokens_required": n_ctx,  # llama-server allocates the whole -c at start
            "kv_tokens_low": tokens_low,
            "max_concurrency_low": parallel * tokens_low / n_ctx if n_ctx else 0.0,
            "kv_cache_gib_per_gpu_high": kv[worst] * (1 + error) / GIB,
            "kv_error_terms": "the KV buffer (n_ctx x layers x K/V row bytes) and, beside it, the compute buffer",
        },
    )


def kv_error_class(kind: str, gpus: int) -> tuple[str, str, str]:
    """The class whose measured error a server's range takes: llama.cpp, one GPU or more, dense/MoE/MLA."""
    return ("llamacpp", "tp1" if gpus == 1 else "tp>=2", kind)


def kv_estimate_error(cls: tuple[str, str, str]) -> tuple[float, str]:
    """The class's measured optimistic KV error and how it was found, in words for the plan."""
    return class_kv_error(cls, KV_ERROR_BY_CLASS, KV_ERROR_WIDEST, engine="llama.cpp")


# -- the server ------------------------------------------------------------------------------------------


def gguf_path(spec: StackSpec, pool_name: str) -> str:
    """The GGUF file llama-server loads (-m): the pool's ggufFile inside the model's path."""
    pool = spec.pools[pool_name]
    assert pool.llamacpp is not None  # the spec requires the llamacpp block with engine: llamacpp
    return f"{spec.models[pool.model].path.rstrip('/')}/{pool.llamacpp.gguf_file}"


def llamacpp_argv(spec: StackSpec, instance: Instance) -> list[str]:
    """`llama-server` for one instance: every layer on its GPUs, the pool's slots and context, metrics on."""
    pool = spec.pools[instance.pool]
    o = pool.llamacpp
    assert o is not None
    argv = [
        SERVER_BINARY,
        "-m",
        gguf_path(spec, instance.pool),
        # Comma-separated names the API answers to (llama-server checks none, the gateway routes by them).
        "--alias",
        ",".join(spec.served_names(pool.model)),
        # Bound to the cluster address (the image's LLAMA_ARG_HOST=0.0.0.0 is overridden by the flag).
        "--host",
        spec.node(instance.head).address,
        "--port",
        str(instance.port),
        "--n-gpu-layers",
        "999",
        "--split-mode",
        o.split_mode,
        "--ctx-size",
        str(o.context_per_slot * o.parallel),
        "--parallel",
        str(o.parallel),
        "--flash-attn",
        o.flash_attention,
    ]
    if o.cache_type != "f16":
        argv += ["--cache-type-k", o.cache_type, "--cache-type-v", o.cache_type]
    # --fit off: what the plan sized is what starts; llama.cpp would otherwise shrink unset arguments
    # (context, offloaded layers) to fit and serve less than the plan says, silently.
    argv += ["--fit", "off", "--jinja", "--metrics", "--threads", str(threads_per_instance(spec, instance.head))]
    return argv + list(o.extra_args)


def threads_per_instance(spec: StackSpec, node: str) -> int:
    """llama-server's --threads on a node: its CPUs (cpuCores) shared by every serving instance there.
    Unset, each llama-server takes all of the node's cores (b11312's --threads default -1), so N of them
    on one node ask N times its CPUs."""
    cpus, _ = spec.node_cpus(node)
    here = sum(node in i.nodes for pool in spec.pools for i in instances(spec, pool))
    return max(1, cpus // max(1, here))


# Offline (pools.*.offline): llama-server b11312's `--offline` ("forces use of cache, prevents network
# access"), read from the environment as LLAMA_ARG_OFFLINE (its --help: tests/fixtures/engines). It is
# C++ and reads neither huggingface_hub's variables nor sends usage statistics.
LLAMACPP_OFFLINE_ENV: dict[str, str] = {"LLAMA_ARG_OFFLINE": "1"}


def llamacpp_env(spec: StackSpec, instance: Instance) -> dict[str, str]:
    """Environment of the server container: offline, then the pool's own (llama.cpp reads its options from argv,
    and one server on one node talks no NCCL: nothing of the node)."""
    env = offline_env(spec, instance.pool, LLAMACPP_OFFLINE_ENV)
    env.update(spec.pools[instance.pool].env)
    return env


# Where the gate points -m: the weights may still be copying, and the parser runs before the model loads.
GATE_MODEL = "/nonexistent/llm-cluster-qualification.gguf"
# The gate's check in the image (bash; the server image has no python3): llama-server's build, the CUDA
# device it lists and its compute capability, and each planned argv through llama-server's own parser
# (an unknown flag or value stops it with "invalid argument" / "error while handling argument"; a good
# command line gets as far as loading the model, which GATE_MODEL makes fail at once).
# Arguments: server build capability recommended argv... (each argv one shell-quoted string).
LLAMACPP_CHECK = r"""
set -u
server=$1 build=$2 capability=$3 recommended=$4
shift 4
failed=0
json() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '%s' "${s//$'\n'/ }"; }
report() {
  if [[ $2 == true ]]; then
    printf '{"check": "%s", "ok": true, "detail": "%s"}\n' "$1" "$(json "$3")"
  else
    printf '{"check": "%s", "ok": false, "detail": "%s", "fix": "%s"}\n' "$1" "$(json "$3")" "$(json "$4")"
    failed=1
  fi
}
version=$("$server" --version 2>&1 || true)
if [[ $version == *"(build $build,"* ]]; then
  report engine-version true "$(head -n1 <<<"$version")"
else
  report engine-version false "$(head -n1 <<<"$version")" \
    "the image does not carry llama.cpp b$build: fix the image tag"
fi
devices=$("$server" --list-devices 2>&1 || true)
gpu=$(grep -m1 -E '^  CUDA[0-9]+: ' <<<"$devices" || true)
if [[ -z $gpu ]]; then
  report gpu-visible false "llama-server lists no CUDA device: $(grep -A1 'Available devices' <<<"$devices" | tail -n1 | sed 's/^ *//')" \
    "the container sees no GPU, or this build has no CUDA: check the NVIDIA container runtime (docker info | grep -i runtime), the driver (nvidia-smi), and that the image is a CUDA one ($recommended)"
else
  report gpu-visible true "${gpu#  }"
  found=$(sed -n 's/^ *Device 0: .*, compute capability \([0-9]*\)\.\([0-9]*\),.*/\1\2/p' <<<"$devices" | head -n1)
  if [[ -n $found ]]; then
    if [[ $found == "$capability" ]]; then
      report gpu-as-planned true "device 0 is sm_$found, as planned"
    else
      report gpu-as-planned false "device 0 is sm_$found; the stack plans sm_$capability" \
        "the node's GPU is not the one the stack names: fix nodes.<node>.gpu.model (or nodeDefaults.gpu.model)"
    fi
  fi
fi
for planned in "$@"; do
  argv=()
  eval "argv=($planned)"
  out=$(timeout 120 "${argv[@]}" 2>&1 || true)
  bad=$(grep -m1 -E 'invalid argument|error while handling argument' <<<"$out" || true)
  if [[ -n $bad ]]; then
    report argv-parses false "$bad" "the planned flags are not this image's: fix the image tag, or the flag the message names"
  elif grep -q 'loading model' <<<"$out"; then
    report argv-parses true "${argv[0]} ... parses"
  else
    report argv-parses false "$(tail -n1 <<<"$out")" "llama-server stopped before its model load: see the line above"
  fi
done
exit "$failed"
"""


# Where the gate binds llama-server: the gate's container has no network but its loopback (`docker run
# --network none`), and llama-server b11312 binds its HTTP socket before it loads the model, so the
# planned --host (the node's address) would stop it with "couldn't bind HTTP server socket" before the
# flags after it were ever judged (seen in the lab, tests/lab/test_lab_engines.py).
GATE_HOST = "127.0.0.1"


def gate_argv(argv: tuple[str, ...]) -> list[str]:
    """A planned llama-server argv as the gate runs it: -m on GATE_MODEL, --host on GATE_HOST, the rest as planned."""
    out = list(argv)
    for flag, value in (("-m", GATE_MODEL), ("--model", GATE_MODEL), ("--host", GATE_HOST)):
        if flag in out:
            out[out.index(flag) + 1] = value
    return out


# llama-server b11312's --help: --api-key KEY (several comma-separated), -hft/--hf-token TOKEN.
SECRET_FLAGS = {"--api-key": "1", "-hft": "1", "--hf-token": "1"}


class LlamacppEngine(Engine):
    """llama.cpp's llama-server: one process per GPU group of a node, GGUF weights, no multi-node."""

    # llama-server b11312 (its --help): each of these downloads a model (Hugging Face, Docker Hub's AI
    # models, a URL); --offline only makes it use its cache, which an air-gapped node does not have.
    offline_vars: ClassVar[dict[str, str]] = LLAMACPP_OFFLINE_ENV
    hub_flags: ClassVar[dict[str, str]] = {
        flag: "always"
        for flag in (
            "-hf",
            "-hfr",
            "--hf-repo",
            "-hfd",
            "-hfrd",
            "--hf-repo-draft",
            "--spec-draft-hf",
            "-mu",
            "--model-url",
            "-dr",
            "--docker-repo",
        )
    }
    secret_flags: ClassVar[dict[str, str]] = SECRET_FLAGS
    secret_flag_aliases: ClassVar[dict[str, str]] = {a: f for a, f in LLAMACPP_ALIASES.items() if a in SECRET_FLAGS}

    name: ClassVar[str] = "llamacpp"
    title: ClassVar[str] = "llama.cpp"
    server_role: ClassVar[str] = "llamacpp"
    multi_gpu: ClassVar[tuple[str, ...]] = ("layer", "row", "tensor")
    multi_node: ClassVar[MultiNode] = "none"
    memory_keys: ClassVar[str] = "llamacpp.contextPerSlot or parallel"
    own_startup_failures: ClassVar[tuple[StartupFailure, ...]] = LLAMACPP_STARTUP_FAILURES
    metrics_job: ClassVar[str] = "llamacpp"
    cli_program: ClassVar[str] = "llama-server"
    refused_flags: ClassVar[dict[str, str]] = {
        "--rpc": 'the RPC backend is, upstream, "a proof-of-concept ... fragile and insecure" (tools/rpc/README.md): '
        "llm-cluster serves llama.cpp on one node"
    }
    policy_rules: ClassVar[tuple[EngineRule, ...]] = RULES
    http_server: ClassVar[EngineServer] = HTTP_SERVER

    options_key: ClassVar[str] = "llamacpp"
    options_model: ClassVar[type[Spec]] = LlamacppOptions
    # Whole-checkpoint GGUF quants the advisor can size without a file (GGUF_BITS_SOURCE).
    advice_formats: ClassVar[tuple[CheckpointFormat, ...]] = tuple(
        CheckpointFormat(f"gguf-{name}", "gguf", round(bits), bits_per_weight=bits)
        for name, bits in GGUF_BITS_PER_WEIGHT.items()
    )
    required_option: ClassVar[str] = "contextPerSlot"
    context_key: ClassVar[str] = "contextPerSlot"
    default_image: ClassVar[str] = DEFAULT_IMAGE
    typed_flags: ClassVar[dict[str, str]] = TYPED_FLAGS

    def canonical_flag(self, token: str) -> str | None:
        if not token.startswith("-") or token == "-" or token[1:2].isdigit():
            return None
        name = token.partition("=")[0]
        return LLAMACPP_ALIASES.get(name, name)

    def checkpoint_quantizations(self) -> frozenset[str]:
        return frozenset({"gguf"})

    def spec_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        p = spec.pools[pool]
        model = spec.models.get(p.model)
        if model is None:
            return []
        issues = self.extra_args_issues(spec, pool) + self.one_node_issues(spec, pool, LLAMACPP_MULTI_NODE)
        if model.quantization != "gguf":
            issues.append(
                SpecIssue(
                    f"models.{p.model}.quantization",
                    f"pool {pool!r} runs llama.cpp, which "
                    "loads GGUF files only: set quantization: gguf (and the pool's llamacpp.ggufFile)",
                )
            )
        return issues

    def image_refs(self) -> list[str]:
        return [ll.ref for ll in IMAGES.values()]

    def image_cell(self, ref: str, capability: int) -> Cell | None:
        ll = self.image_facts_of(ref)
        if ll is None:
            return None
        if not ll.runs_on(capability):
            return Cell("no", level(ll.sources["sass"], capability))
        if ll.jit_only(capability):
            return Cell("deployed (PTX JIT)", level(ll.sources["ptx"], capability))
        return Cell("deployed", level(ll.sources["sass"], capability))

    def advice_options(self, context: int, fmt: CheckpointFormat, model: str) -> dict[str, Any]:
        return {"contextPerSlot": context, "ggufFile": f"{model}.gguf"}

    def context_length(self, spec: StackSpec, pool: str) -> int:
        o = spec.pools[pool].llamacpp
        assert o is not None
        return o.context_per_slot  # a request gets its slot's share of -c

    def image_table(self) -> Mapping[str, LlamacppImage]:
        return IMAGES

    def probe_argv(self, url: str) -> list[str]:
        # The server image has curl and no python3 (.devops/cuda.Dockerfile installs libgomp1 curl ffmpeg).
        return ["curl", "-fsS", "-o", "/dev/null", "--max-time", "10", url]

    def serve_argv(self, spec: StackSpec, instance: Instance) -> list[str]:
        return llamacpp_argv(spec, instance)

    def serve_env(self, spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
        return llamacpp_env(spec, instance)

    def gate_check(self, spec: StackSpec, pool: str, node: str, argvs: tuple[tuple[str, ...], ...]) -> GateCheck | None:
        facts = self.image_facts(spec, pool)
        if facts is None:
            return None
        return GateCheck(
            f"{self.title} b{facts.build}",
            "/bin/bash",
            (
                "-c",
                LLAMACPP_CHECK,
                "llama-cpp-qualification",
                SERVER_BINARY,
                str(facts.build),
                str(planned_capability(spec, node)),
                DEFAULT_IMAGE,
                *(shlex.join(gate_argv(a)) for a in argvs),
            ),
            "llama-server's build, the CUDA device it lists and its compute capability, and the planned flags",
        )

    def capacity(self, spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
        p = spec.pools[pool]
        o = p.llamacpp
        assert o is not None  # the spec requires the llamacpp block
        image, node_gpu = self.sizing_inputs(spec, pool, llamacpp_image(DEFAULT_IMAGE))
        model = spec.models[p.model]
        total = model.size_gib * GIB if model.size_gib is not None else None
        try:
            if o.gguf_header is not None:
                shape = shape_from_gguf(read_gguf(o.gguf_header), total_bytes=int(total) if total else None)
            elif total is not None:
                shape = shape_from_arch(model_architecture(spec, p.model), total)
            else:
                raise ValueError(
                    f"state llamacpp.ggufHeader (a copy of the GGUF's header) or models.{p.model}.sizeGib "
                    "(the GGUF's size) to size the weights"
                )
            return llamacpp_estimate(
                shape,
                gpu(node_gpu.model).memory_gib,
                gpus=p.tensor_parallel,
                split_mode=o.split_mode,
                ctx_per_slot=o.context_per_slot,
                parallel=o.parallel,
                cache_type=o.cache_type,
                flash_attention=o.flash_attention != "off",
                ctx_pad=image.ctx_pad,
            ).to_dict()
        except ValueError as err:
            return {"error": f"capacity not estimated: {err}"}
