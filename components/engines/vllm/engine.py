"""vLLM behind the engine seam: `vllm serve` argv and env read from the pool's image facts, the
MoE tuned-config upload, and the capacity model of components.engines.vllm.capacity."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from components.engines.base import Engine, MultiNode, Upload, nccl_env, offline_env, planned_capability
from components.engines.gate import (
    DOT_BLOCK,
    ENGINE_VERSION_CHECK,
    TORCH_CHECKS,
    TRITON_DOT_CHECK,
    TRITON_DOT_KERNEL,
    GateCheck,
    argv_check,
    python_check,
)
from components.engines.http import EngineServer
from components.engines.judged import LaunchRule, ServerCall
from components.engines.vllm import capacity_cli
from components.engines.vllm.capacity import capacity_dict
from components.engines.vllm.facts import (
    DEFAULT_IMAGE,
    HTTP_SERVER,
    IMAGES,
    QUANTIZATION_METHODS,
    ImageFacts,
    image_facts,
    known_images,
    pool_image_facts,
)
from components.engines.vllm.launch import Launch, container_launch, container_server, model_server_launch, parse_server
from components.engines.vllm.memory import communicator_gib
from components.engines.vllm.options import FLAG_ALIASES, TYPED_ENV, TYPED_FLAGS, VllmOptions, canonical_flag
from components.engines.vllm.rules import LAUNCH_RULES
from components.engines.vllm.rules.capacity import check_fit
from components.engines.vllm.startup_failures import STARTUP_FAILURES as VLLM_STARTUP_FAILURES
from components.engines.weights import CheckpointFormat
from components.facts.engine_matrix import Cell, level, sass_runs
from components.facts.hardware import CUDA_CONTEXT_GIB, GPUS, gpu
from components.facts.models import ModelArch
from components.facts.startup_failures import StartupFailure
from components.spec import SpecError, SpecIssue, StackSpec
from components.spec.base import Spec
from components.spec.engines import Launcher
from components.spec.topology import Instance, nodes_per_instance

# Where the pool's fused-MoE tile configs are written inside the container (VLLM_TUNED_CONFIG_FOLDER).
TUNED_CONFIG_DIR = "/opt/llm-cluster/moe-configs"
# After --shutdown-timeout, the engine core and its workers still exit and free the GPUs: docker waits this much
# longer before SIGKILL.
STOP_MARGIN_SECONDS = 30
# fused_moe.py get_config_file_name: "E={E},N={N},device_name={name}{,dtype=…}{,block_shape=[…]}.json".
_MOE_CONFIG_NAME = re.compile(
    r"E=\d+,N=\d+,device_name=[A-Za-z0-9_.-]+(,dtype=[a-z0-9_]+)?(,block_shape=\[\d+, ?\d+\])?\.json"
)


# The hub and telemetry off, each name read from the code that reads it (pools.*.offline):
# - HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE: huggingface_hub constants.py (HF_HUB_OFFLINE = _is_true(HF_HUB_OFFLINE or
#   TRANSFORMERS_OFFLINE)), which vLLM 0.19.1 passes as local_files_only (transformers_utils/config.py,
#   model_loader/weight_utils.py) and uses to map hub ids to local paths (engine/arg_utils.py);
# - VLLM_NO_USAGE_STATS / DO_NOT_TRACK: vllm 0.19.1 envs.py ("1" only) read by usage/usage_lib.py is_usage_stats_enabled;
#   DO_NOT_TRACK also turns off huggingface_hub's telemetry;
# - RAY_USAGE_STATS_ENABLED: Ray's usage_constants.py, exactly "0" or "1" (any other value raises), read by
#   `ray start` in the Ray head and worker containers, which get this same env.
VLLM_OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


class VllmEngine(Engine):
    """vLLM's OpenAI server (`vllm serve`); multi-node instances run on Ray, or on vLLM's own launcher where the
    pool says so (pools.<pool>.vllm.multiNode: native)."""

    name: ClassVar[str] = "vllm"
    title: ClassVar[str] = "vLLM"
    server_role: ClassVar[str] = "vllm"
    multi_gpu: ClassVar[tuple[str, ...]] = ("tensor", "pipeline")
    multi_node: ClassVar[MultiNode] = "ray"
    metrics_job: ClassVar[str] = "vllm"
    # Judged by its own rules over a Launch (vllm/rules: hardware, image, flags, engine args, ...; the pack lists
    # them under their topics in policies/rules), not the common ones.
    common_rules: ClassVar[bool] = False
    launch_rules: ClassVar[tuple[LaunchRule, ...]] = LAUNCH_RULES
    flag_aliases: ClassVar[dict[str, str]] = FLAG_ALIASES
    # vLLM 0.19.1 v1/core/kv_cache_utils.py:1319 (info_once, thousands separated), v1/worker/gpu_worker.py:437,
    # v1/worker/gpu_model_runner.py:4821.
    capacity_log_lines: ClassVar[dict[str, str]] = {
        "kv_tokens": r"GPU KV cache size: ([\d,]+) tokens",
        "kv_cache_gib": r"Available KV cache memory: ([\d.]+) GiB",
        "weights_gib": r"Model loading took ([\d.]+) GiB",
        # The profiler's own terms where the log carries them: 0.10.2-0.1x's "Free memory on device ... Actual
        # usage is ..." (INFO up to 0.11, DEBUG in 0.19.1, gpu_worker.py:640-655) or the V0 / early V1 line.
        "activation_gib": r"([\d.]+) GiB for peak activation|PyTorch activation peak memory takes ([\d.]+) ?GiB",
        "non_torch_gib": r"([\d.]+) GiB for non-torch memory|non_torch_memory takes ([\d.]+) ?GiB",
    }
    advice_formats: ClassVar[tuple[CheckpointFormat, ...]] = (
        CheckpointFormat("fp16"),
        CheckpointFormat("gptq-int4", "gptq", 4),
        CheckpointFormat("awq-int4", "awq", 4),
        CheckpointFormat("fp8", "fp8", 8),
    )
    env_prefixes: ClassVar[tuple[str, ...]] = ("VLLM",)
    http_server: ClassVar[EngineServer] = HTTP_SERVER
    memory_keys: ClassVar[str] = "vllm.gpuMemoryUtilization or maxModelLen"
    own_startup_failures: ClassVar[tuple[StartupFailure, ...]] = VLLM_STARTUP_FAILURES
    # EngineArgs of 0.19.1 (and --speculative-model of 0.9.2): a value that is not a local path is a
    # hub repository id vLLM downloads (transformers_utils/repo_utils.py, lora/resolver).
    offline_vars: ClassVar[dict[str, str]] = VLLM_OFFLINE_ENV
    hub_flags: ClassVar[dict[str, str]] = {
        "--tokenizer": "path",
        "--hf-config-path": "path",
        "--speculative-model": "path",
        "--speculative-config": "json-model",
        "-sc": "json-model",
        "--lora-modules": "lora",
    }
    # [cli-0.19.1] --api-key nargs "+" (one value in 0.9.2), --hf-token nargs "?" (alone: the cached login).
    secret_flags: ClassVar[dict[str, str]] = {"--api-key": "+", "--hf-token": "1"}

    options_key: ClassVar[str] = "vllm"
    options_model: ClassVar[type[Spec]] = VllmOptions
    required_option: ClassVar[str] = "maxModelLen"
    context_key: ClassVar[str] = "maxModelLen"
    default_image: ClassVar[str] = DEFAULT_IMAGE
    typed_flags: ClassVar[dict[str, str]] = TYPED_FLAGS
    typed_env: ClassVar[dict[str, str]] = TYPED_ENV

    def image_facts(self, spec: StackSpec, pool: str) -> ImageFacts | None:
        """The facts of the pool's image: declared in the stack for a private build, else the table's
        entry, None when neither knows it (rules then say it cannot be judged)."""
        return pool_image_facts(spec, pool)

    def canonical_flag(self, token: str) -> str | None:
        return canonical_flag(token)

    def launcher(self, options: Spec | None) -> Launcher:
        if isinstance(options, VllmOptions) and options.multi_node == "native":
            return Launcher("native", options.master_port, f"{self.options_key}.masterPort")
        return Launcher("ray")

    def node_argv(self, spec: StackSpec, instance: Instance, node: str) -> list[str]:
        return vllm_node_argv(spec, instance, node, self.image_facts(spec, instance.pool))

    def spec_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        return super().spec_issues(spec, pool) + multi_node_issues(spec, pool)

    def model_server_launch(self, props: Mapping[str, Any]) -> Launch | None:
        return model_server_launch(props)

    def container_launch(self, props: Mapping[str, Any], image: str | None) -> Launch | None:
        return container_launch(props, image)

    def container_server(self, props: Mapping[str, Any], image: str | None) -> ServerCall | None:
        found = container_server(props, image)
        return ServerCall(found[0], parse_server(found).values) if found is not None else None

    def fit_problems(self, capacity: Mapping[str, Any], pool: str, model: str) -> list[str]:
        # Without the capacity model's own advice: the fixes checked against the estimate.
        return super().fit_problems(capacity, pool, model) or check_fit(capacity, pool, model)

    def capacity_cli(self, argv: list[str], prog: str) -> int:
        return capacity_cli.main(argv, prog)

    def checkpoint_quantizations(self) -> frozenset[str]:
        return QUANTIZATION_METHODS

    def declarable_images(self) -> list[str]:
        return sorted(IMAGES)

    def knows_image(self, ref: str) -> bool:
        return image_facts(ref) is not None

    def file_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        if not spec.pools[pool].vllm.moe_config_files:
            return []
        try:
            moe_configs(spec, pool)
        except SpecError as err:
            return err.issues
        return []

    def extra_args_issues(self, spec: StackSpec, pool: str) -> list[SpecIssue]:
        """extraArgs may not set a flag a typed key owns: vLLM takes the last one, the rest of the plan the typed one."""
        p = spec.pools[pool]
        issues: list[SpecIssue] = []
        for i, token in enumerate(p.vllm.extra_args):
            flag = self.canonical_flag(token)
            key = self.typed_key(flag, pool=pool, model=p.model, node="<node>") if flag else None
            if key is None:
                continue
            said = f"{token!r}" + (f" (that is {flag})" if token.partition("=")[0] != flag else "")
            issues.append(
                SpecIssue(
                    f"pools.{pool}.vllm.extraArgs[{i}]",
                    f"{said} is set by the typed key {key}: state it there instead. In extraArgs it would come after the "
                    "product's own flag and win in vLLM, while the readiness gates, the gateway, the capacity plan and "
                    "the policies keep using the typed value",
                )
            )
        return issues

    def format_evidence(self, ref: str, capability: int) -> str | None:
        facts = image_facts(ref)
        return level(facts.sources["quantizations"], capability) if facts is not None else None

    def advice_launcher(self, image: str) -> str | None:
        facts = image_facts(image)
        if facts is None or not facts.native_multi_node:
            return None
        return (
            f"{self.options_key}.multiNode: native (vLLM {facts.version}'s own launcher: one container per node, "
            "the others --headless, no Ray ports)"
        )

    def advice_env(self, arch: ModelArch, image: str, capability: int) -> dict[str, str]:
        facts = image_facts(image)
        if arch.uses_mla and facts is not None and capability < facts.mla_min_capability:
            return {"VLLM_MLA_DISABLE": "1"}  # MLA's kernels need sm_80 (the mla-attention rule)
        return {}

    def image_refs(self) -> list[str]:
        return [f.ref for f in known_images()]

    def image_cell(self, ref: str, capability: int) -> Cell | None:
        """torch's CUDA build decides whether anything starts, Triton whether fp16 MoE compiles."""
        f = image_facts(ref)
        if f is None:
            return None
        if not sass_runs(f.torch_arch_list, capability):
            return Cell("no", level(f.sources["torch_arch_list"], capability))
        if f.triton_fp16_dot(capability) is False:
            return Cell("dense only: no fp16 Triton MoE", level(f.sources["triton"], capability))
        return Cell("deployed", level(f.sources["torch_arch_list"], capability))

    def alert_issues(self, spec: StackSpec, pname: str) -> list[SpecIssue]:
        """monitoring.thresholds.gpuMemoryUsedRatio must lie above what vLLM takes at start on the pool's GPUs."""
        m = spec.monitoring
        assert m is not None
        ratio = m.thresholds.gpu_memory_used_ratio
        pool = spec.pools[pname]
        g = spec.node(pool.nodes[0]).gpu if pool.nodes[0] in spec.nodes else None
        known = GPUS.get(g.model) if g is not None else None
        if g is None or known is None:
            return []  # the pool's own checks name the missing node or the unknown GPU
        if pool.tensor_parallel > g.count:
            return []  # TP across nodes: not modelled (the capacity plan says so, the parallelism rule judges it)
        # FB_USED counts more than vLLM's budget: the CUDA context sits outside it, and so do the NCCL
        # communicators on images that start NCCL before they measure free memory (the capacity model's).
        facts = image_facts(pool.image)
        comm = (
            0.0
            if facts is None or facts.nccl_in_budget
            else communicator_gib(pool.tensor_parallel, pool.pipeline_parallel, nvls=known.nvls)
        )
        floor = round(pool.vllm.gpu_memory_utilization + (CUDA_CONTEXT_GIB + comm) / known.memory_gib, 4)
        if floor >= 1:
            return []  # the pool cannot start at all: memory-fit names that, with the utilization that starts
        if ratio <= floor:
            outside = f"its CUDA context (about {CUDA_CONTEXT_GIB:g} GiB)" + (
                f" and NCCL communicators (about {comm:.2f} GiB at TP {pool.tensor_parallel} x PP "
                f"{pool.pipeline_parallel})"
                if comm
                else ""
            )
            return [
                SpecIssue(
                    "monitoring.thresholds.gpuMemoryUsedRatio",
                    f"{ratio} would fire on every GPU of pool {pname!r}: vLLM takes gpuMemoryUtilization "
                    f"{pool.vllm.gpu_memory_utilization} at start, plus {outside}, of the {known.memory_gib:g} GiB "
                    f"{known.name}; set it above {floor}",
                )
            ]
        return []

    def context_length(self, spec: StackSpec, pool: str) -> int:
        v = spec.pools[pool].vllm
        assert v is not None  # the spec requires the vllm block with engine: vllm
        return v.max_model_len

    def stop_timeout_seconds(self, spec: StackSpec, pool: str) -> int | None:
        facts = self.image_facts(spec, pool)
        drain = spec.pools[pool].drain_seconds
        if facts is None or not facts.shutdown_timeout_flag or not drain:
            return None
        return drain + STOP_MARGIN_SECONDS

    def serve_argv(self, spec: StackSpec, instance: Instance) -> list[str]:
        return vllm_argv(spec, instance, self.image_facts(spec, instance.pool))

    def serve_env(self, spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
        return vllm_env(spec, instance, node, self.image_facts(spec, instance.pool))

    def uploads(self, spec: StackSpec, instance: Instance) -> list[Upload]:
        return [
            Upload(f"{TUNED_CONFIG_DIR}/{name}", content) for name, content in moe_configs(spec, instance.pool).items()
        ]

    def capacity(self, spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
        return capacity_dict(spec, pool, mla=mla)

    def gate_check(self, spec: StackSpec, pool: str, node: str, argvs: tuple[tuple[str, ...], ...]) -> GateCheck | None:
        facts = self.image_facts(spec, pool)
        if facts is None:
            return None
        data = {
            "version": facts.version,
            "module": "vllm",
            "kernel": TRITON_DOT_KERNEL,
            "block": DOT_BLOCK,
            "argvs": [list(a) for a in argvs],
            "recommended": DEFAULT_IMAGE,
            "capability": planned_capability(spec, node),
        }
        return GateCheck(
            f"{self.title} {facts.version}",
            "python3",
            ("-c", VLLM_CHECK, json.dumps(data, sort_keys=True)),
            "torch's arch list, the planned GPU, an fp16 matmul, a Triton fp16 dot, the vLLM version "
            "and the planned flags",
        )


# `vllm serve`'s own parser (make_arg_parser + AsyncEngineArgs), as the image's CLI builds it.
VLLM_ARGV_CHECK = argv_check(
    """
    from vllm.entrypoints.cli.serve import ServeSubcommand
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # before 0.12 it lived in vllm.utils
        from vllm.utils import FlexibleArgumentParser
    root = FlexibleArgumentParser(prog="vllm")
    parser = ServeSubcommand().subparser_init(root.add_subparsers())
""",
    skip=2,
)
VLLM_CHECK = python_check(TORCH_CHECKS, TRITON_DOT_CHECK, ENGINE_VERSION_CHECK, VLLM_ARGV_CHECK)


def moe_configs(spec: StackSpec, pool: str) -> dict[str, str]:
    """The pool's fused-MoE tile configs, file name -> JSON text, read from the operator's machine."""
    out: dict[str, str] = {}
    for i, path in enumerate(spec.pools[pool].vllm.moe_config_files):
        key = f"pools.{pool}.vllm.moeConfigFiles[{i}]"
        file = Path(path)
        if not _MOE_CONFIG_NAME.fullmatch(file.name):
            raise SpecError(
                [
                    SpecIssue(
                        key,
                        f"{file.name!r} is not named as vLLM looks tile configs up: "
                        "E=<experts>,N=<width>,device_name=<GPU name, spaces as _>[,dtype=…].json "
                        "(e.g. E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json)",
                    )
                ]
            )
        try:
            text = file.read_text()
            json.loads(text)
        except (OSError, ValueError) as err:
            raise SpecError([SpecIssue(key, f"cannot read a JSON tile config from {path}: {err}")]) from None
        out[file.name] = text
    return out


def vllm_argv(spec: StackSpec, instance: Instance, facts: ImageFacts | None = None, rank: int = 0) -> list[str]:
    """The full `vllm serve` command line of one instance: flags of the pool's vLLM version, valid values; on
    vLLM's own multi-node launcher, that of the instance's node `rank` (0 serves the API)."""
    pool = spec.pools[instance.pool]
    model = spec.models[pool.model]
    v = pool.vllm
    world = instance.tensor_parallel * instance.pipeline_parallel
    # `vllm serve` takes the model as a positional; `--model` raises a ValueError (0.9.2 and later).
    argv = [
        "vllm",
        "serve",
        model.path,
        "--served-model-name",
        *spec.served_names(pool.model),
        # Bound to the cluster address, not 0.0.0.0: only the gateway and Prometheus reach it.
        "--host",
        spec.node(instance.head).address,
        "--port",
        str(instance.port),
        "--tensor-parallel-size",
        str(instance.tensor_parallel),
    ]
    if instance.pipeline_parallel > 1:
        argv += ["--pipeline-parallel-size", str(instance.pipeline_parallel)]
    if instance.uses_ray:
        argv += ["--distributed-executor-backend", "ray"]
    elif world > 1:
        # Stated rather than left to vLLM's guess, so the plan shows how the engine will run.
        argv += ["--distributed-executor-backend", "mp"]
    if instance.native_launcher:
        # vLLM's own launcher across nodes: every node states the world, its rank and the head's rendezvous;
        # the nodes after the head serve no API.
        argv += [
            "--nnodes",
            str(len(instance.nodes)),
            "--node-rank",
            str(rank),
            "--master-addr",
            spec.node(instance.head).address,
            "--master-port",
            str(instance.master_port),
        ]
        if rank > 0:
            argv.append("--headless")
    argv += [
        "--dtype",
        model.dtype,
        "--max-model-len",
        str(v.max_model_len),
        "--max-num-seqs",
        str(v.max_num_seqs),
        "--gpu-memory-utilization",
        str(v.gpu_memory_utilization),
    ]
    if v.attention_backend is not None and facts is not None and facts.attention_backend_flag:
        argv += ["--attention-backend", v.attention_backend]
    if v.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", v.kv_cache_dtype]
    if model.quantization:
        argv += ["--quantization", model.quantization]
    if v.block_size != 16:
        argv += ["--block-size", str(v.block_size)]
    if v.swap_space_gib is not None:
        argv += ["--swap-space", str(v.swap_space_gib)]
    if v.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(v.max_num_batched_tokens)]
    argv += _tristate("--enable-prefix-caching", v.enable_prefix_caching)
    argv += _tristate("--enable-chunked-prefill", v.enable_chunked_prefill)
    if v.enforce_eager:
        argv.append("--enforce-eager")
    if model.trust_remote_code:
        argv.append("--trust-remote-code")
    if facts is not None and facts.shutdown_timeout_flag and pool.drain_seconds:
        # A stopped container lets the requests in flight finish (vLLM's default, 0, aborts them).
        argv += ["--shutdown-timeout", str(pool.drain_seconds)]
    return argv + list(v.extra_args)


def vllm_node_argv(spec: StackSpec, instance: Instance, node: str, facts: ImageFacts | None = None) -> list[str]:
    """The `vllm serve` argv of one node of an instance on vLLM's own multi-node launcher: the head (rank 0)
    runs vllm_argv and serves the API; node i of the instance runs the same argv with `--node-rank i` and
    `--headless` (no API server: its workers join rank 0 through --master-addr:--master-port)."""
    if node not in instance.nodes:
        raise ValueError(f"node {node!r} is not one of {instance.name}'s nodes {list(instance.nodes)}")
    rank = instance.nodes.index(node)
    if rank > 0 and not instance.native_launcher:
        raise ValueError(f"{instance.name} runs on Ray: node {node!r} runs a Ray worker, not vllm serve")
    return vllm_argv(spec, instance, facts, rank)


def multi_node_issues(spec: StackSpec, pool: str) -> list[SpecIssue]:
    """pools.<pool>.vllm.multiNode: native only where an instance spans nodes (there is nothing to launch across)."""
    p = spec.pools[pool]
    if p.vllm.multi_node != "native" or not p.nodes or p.nodes[0] not in spec.nodes:
        return []
    g = spec.node(p.nodes[0]).gpu
    if g is not None and nodes_per_instance(p, g.count) > 1 and p.restart_unhealthy_after_seconds == 0:
        return [
            SpecIssue(
                f"pools.{pool}.restartUnhealthyAfterSeconds",
                "0 turns the watchdog off, and with multiNode: native it is what stops a headless worker when "
                "the first node stops serving (its workers would wait in a world that is gone instead of "
                "rejoining the restarted one): give it seconds (default 300), or use multiNode: ray",
            )
        ]
    if g is None or nodes_per_instance(p, g.count) > 1:
        return []
    return [
        SpecIssue(
            f"pools.{pool}.vllm.multiNode",
            f"'native' starts vLLM's own launcher across the nodes of one instance, but each instance of pool "
            f"{pool!r} fits on one node (tensorParallel {p.tensor_parallel} x pipelineParallel "
            f"{p.pipeline_parallel} on {g.count} GPUs per node): remove multiNode (allowed: ray, the default, or "
            "native for pools whose instances span nodes)",
        )
    ]


def _tristate(flag: str, value: bool | None) -> list[str]:
    """A BooleanOptionalAction flag: on, `--no-` off, or absent to keep vLLM's default."""
    if value is None:
        return []
    return [flag] if value else ["--no-" + flag[2:]]


def vllm_env(spec: StackSpec, instance: Instance, node: str, facts: ImageFacts | None = None) -> dict[str, str]:
    """Environment of every GPU container of an instance on `node` (vLLM, Ray head and workers)."""
    pool = spec.pools[instance.pool]
    n = spec.node(node)
    assert n.gpu is not None  # the spec refuses nodes without GPUs
    capability = gpu(n.gpu.model).capability
    env: dict[str, str] = {}
    if facts is not None and facts.reads_vllm_use_v1 and not facts.runs_v1(capability):
        # Only where the image's envs.py reads it: unset means V1, which this line refuses below its minimum.
        env["VLLM_USE_V1"] = "0"
    # As in the runbook: fork after CUDA init breaks the TP workers.
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    if pool.vllm.moe_config_files and facts is not None and facts.tuned_moe_config_env:
        env[facts.tuned_moe_config_env] = TUNED_CONFIG_DIR
    if pool.vllm.attention_backend is not None and facts is not None and not facts.attention_backend_flag:
        # Lines without --attention-backend (before 0.14) read the backend from the environment.
        env["VLLM_ATTENTION_BACKEND"] = pool.vllm.attention_backend
    env.update(offline_env(spec, instance.pool, VLLM_OFFLINE_ENV))
    env.update(nccl_env(spec, node))
    env.update(pool.env)
    # Per node by nature (vLLM refuses two Ray nodes with one IP): a pool-wide value cannot override it.
    env["VLLM_HOST_IP"] = n.address
    return env
