"""The rest of VllmEngine (what is not an argv/env builder) called directly, as tables: the engines x GPU
cells per image x capability, the gpuMemoryUsedRatio floor on both sides of each branch with its exact
message, the gate check's whole arguments, the drain stop timeout, the advisor's launcher and env per image x
capability, extraArgs refusals per spelling, and each method that hands a call on (launches, capacity, uploads)
compared with the function it calls. A wrong branch or word fails here in a second, without planning a stack."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from components.engines.gate import DOT_BLOCK, TRITON_DOT_KERNEL, GateCheck
from components.engines.judged import ServerCall
from components.engines.vllm import engine as vllm_engine
from components.engines.vllm.capacity import capacity_dict
from components.engines.vllm.engine import (
    TUNED_CONFIG_DIR,
    VLLM_CHECK,
    VllmEngine,
    moe_configs,
    multi_node_issues,
    vllm_argv,
    vllm_env,
    vllm_node_argv,
)
from components.engines.vllm.facts import IMAGES, QUANTIZATION_METHODS, image_facts
from components.engines.vllm.launch import container_launch, model_server_launch
from components.facts.engine_matrix import Cell
from components.facts.evidence import Evidence, Sourced
from components.facts.models import MODELS
from components.spec import SpecIssue, StackSpec
from components.spec.engines import Launcher
from components.spec.stack import config_sections, validate_sections
from components.spec.topology import Instance
from tests.conftest import prod_config

ROOT = Path(__file__).resolve().parent.parent
ENGINE = VllmEngine()
V92 = "vllm/vllm-openai:v0.9.2"
V011 = "vllm/vllm-openai:v0.11.0"
V19 = "vllm/vllm-openai:v0.19.1"
V19_2404 = "vllm/vllm-openai:v0.19.1-ubuntu2404"
UNKNOWN = "registry.example/vllm:private"


def stack(
    chat: dict[str, Any] | None = None,
    vllm: dict[str, Any] | None = None,
    gpu: str | None = None,
    ratio: float | None = None,
    nodes: dict[str, Any] | None = None,
) -> StackSpec:
    """The reference stack: its chat pool changed by `chat`, the chat pool's vllm block by `vllm`, every node's GPU
    by `gpu`, monitoring's gpuMemoryUsedRatio by `ratio`, nodes by `nodes`."""
    config = prod_config()
    pool = config["llm-cluster:pools"]["chat"]
    pool.update(chat or {})
    pool["vllm"].update(vllm or {})
    if gpu is not None:
        config["llm-cluster:nodeDefaults"]["gpu"]["model"] = gpu
    if ratio is not None:
        config["llm-cluster:monitoring"]["thresholds"] = {"gpuMemoryUsedRatio": ratio}
    for name, node in (nodes or {}).items():
        config["llm-cluster:nodes"][name].update(node)
    # Parsed, not judged: the stack's own checks would refuse what these tables ask the engine about.
    sections, secrets = config_sections(config, set())
    return validate_sections(sections, secrets)


# -- the engines x GPU table ---------------------------------------------------------------------------------

# (image, capability, its cell): torch's arch list decides "no" (same major, minor up to the GPU's), Triton's fp16
# dot "dense only"; the evidence is the arch list's (observed only counts on the V100 it was seen on, else code).
CELLS = [
    (V92, 60, Cell("no", "read from code")),
    (V92, 70, Cell("no", "observed")),
    (V92, 75, Cell("dense only: no fp16 Triton MoE", "read from code")),
    (V92, 79, Cell("dense only: no fp16 Triton MoE", "read from code")),
    (V92, 80, Cell("deployed", "read from code")),
    (V92, 89, Cell("deployed", "read from code")),
    (V011, 60, Cell("no", "unverified")),
    (V011, 70, Cell("deployed", "unverified")),
    (V011, 90, Cell("deployed", "unverified")),
    (V19, 70, Cell("deployed", "unverified")),
    (V19, 61, Cell("no", "unverified")),
    (V19_2404, 70, Cell("no", "read from code")),
    (V19_2404, 80, Cell("no", "read from code")),
    (V19_2404, 86, Cell("no", "read from code")),
    (V19_2404, 87, Cell("deployed", "read from code")),
    (V19_2404, 89, Cell("deployed", "read from code")),
    (V19_2404, 120, Cell("deployed", "read from code")),
]


@pytest.mark.parametrize(("ref", "capability", "cell"), CELLS)
def test_each_images_cell_per_capability(ref: str, capability: int, cell: Cell) -> None:
    assert ENGINE.image_cell(ref, capability) == cell


def test_an_image_the_table_does_not_know_has_no_cell() -> None:
    assert ENGINE.image_cell(UNKNOWN, 70) is None


def test_an_unknown_triton_is_not_one_that_cannot_dot_fp16(monkeypatch: pytest.MonkeyPatch) -> None:
    base = image_facts(V92)
    assert base is not None
    monkeypatch.setattr(vllm_engine, "image_facts", lambda ref: dataclasses.replace(base, triton=None))
    assert ENGINE.image_cell(V92, 75) == Cell("deployed", "read from code")


def test_each_cell_reads_its_own_facts_evidence_at_the_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    """An observed fact is observed on the V100 only (sm_70): a deployed or dense-only cell there says so."""
    base = image_facts(V92)
    assert base is not None
    seen = Sourced("seen", Evidence.OBSERVED)
    sm70 = dataclasses.replace(
        base, torch_arch_list=(70, *base.torch_arch_list), sources={**base.sources, "triton": seen}
    )
    monkeypatch.setattr(vllm_engine, "image_facts", lambda ref: sm70)
    assert ENGINE.image_cell(V92, 70) == Cell("dense only: no fp16 Triton MoE", "observed")
    assert ENGINE.image_cell(V92, 75) == Cell("dense only: no fp16 Triton MoE", "read from code")
    base = image_facts(V011)
    assert base is not None
    observed = dataclasses.replace(base, sources={**base.sources, "torch_arch_list": seen})
    monkeypatch.setattr(vllm_engine, "image_facts", lambda ref: observed)
    assert ENGINE.image_cell(V011, 70) == Cell("deployed", "observed")
    assert ENGINE.image_cell(V011, 80) == Cell("deployed", "read from code")
    assert ENGINE.image_cell(V011, 60) == Cell("no", "read from code")


def test_the_image_lists() -> None:
    assert ENGINE.image_refs() == [V011, V19, V19_2404, V92]
    assert ENGINE.declarable_images() == [V011, V19, V19_2404, V92]
    assert ENGINE.checkpoint_quantizations() is QUANTIZATION_METHODS
    assert ENGINE.knows_image(V19) is True
    assert ENGINE.knows_image("vllm/vllm-openai:v0.19.1@sha256:" + "0" * 64) is True
    assert ENGINE.knows_image(UNKNOWN) is False


# (image, capability, the evidence of its quantization methods' fact); None: no facts.
FORMAT_EVIDENCE = [
    (V92, 70, "read from code"),
    (V19, 70, "read from code"),
    (V19, 90, "read from code"),
    (UNKNOWN, 70, None),
]


@pytest.mark.parametrize(("ref", "capability", "evidence"), FORMAT_EVIDENCE)
def test_format_evidence_is_the_quantization_facts_level(ref: str, capability: int, evidence: str | None) -> None:
    assert ENGINE.format_evidence(ref, capability) == evidence


def test_format_evidence_reads_the_quantizations_source_at_the_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    """An observed source is observed on the V100 only: the level is read at the capability asked."""
    base = image_facts(V19)
    assert base is not None
    observed = dataclasses.replace(base, sources={**base.sources, "quantizations": Sourced("seen", Evidence.OBSERVED)})
    monkeypatch.setattr(vllm_engine, "image_facts", lambda ref: observed)
    assert ENGINE.format_evidence(V19, 70) == "observed"
    assert ENGINE.format_evidence(V19, 80) == "read from code"


# -- the advisor -------------------------------------------------------------------------------------------

NATIVE = (
    "vllm.multiNode: native (vLLM 0.19.1's own launcher: one container per node, the others --headless, no Ray ports)"
)


@pytest.mark.parametrize(
    ("image", "launcher"), [(V19, NATIVE), (V19_2404, NATIVE), (V011, None), (V92, None), (UNKNOWN, None)]
)
def test_the_advisors_launcher_is_vllms_own_where_the_image_has_it(image: str, launcher: str | None) -> None:
    assert ENGINE.advice_launcher(image) == launcher


R1 = MODELS["deepseek-r1"]
QWEN = MODELS["qwen3-30b-a3b"]


# (model, image, capability, env): MLA off below the image's MLA minimum (sm_80) only.
ADVICE_ENV = [
    (R1, V19, 70, {"VLLM_MLA_DISABLE": "1"}),
    (R1, V19, 79, {"VLLM_MLA_DISABLE": "1"}),
    (R1, V19, 80, {}),
    (R1, V19, 90, {}),
    (R1, V92, 75, {"VLLM_MLA_DISABLE": "1"}),
    (R1, UNKNOWN, 70, {}),
    (QWEN, V19, 70, {}),
]


@pytest.mark.parametrize(("arch", "image", "capability", "env"), ADVICE_ENV)
def test_the_advisors_env_turns_mla_off_below_its_minimum(arch: Any, image: str, capability: int, env: dict) -> None:
    assert R1.uses_mla and not QWEN.uses_mla
    assert ENGINE.advice_env(arch, image, capability) == env


# -- the gpuMemoryUsedRatio floor ------------------------------------------------------------------------------


def floor_message(ratio: float, pool: str, util: float, outside: str, gpu: str, memory: str, floor: float) -> SpecIssue:
    return SpecIssue(
        "monitoring.thresholds.gpuMemoryUsedRatio",
        f"{ratio} would fire on every GPU of pool {pool!r}: vLLM takes gpuMemoryUtilization {util} at start, plus "
        f"{outside}, of the {memory} GiB {gpu}; set it above {floor}",
    )


CONTEXT = "its CUDA context (about 0.5 GiB)"


def test_the_floor_counts_the_context_and_nccl_on_images_that_measure_after_nccl() -> None:
    # 0.9 + (0.5 + 1.75) / 32 = 0.9703125 -> 0.9703: at the floor it fires, above it does not.
    outside = CONTEXT + " and NCCL communicators (about 1.75 GiB at TP 8 x PP 1)"
    assert ENGINE.alert_issues(stack(ratio=0.9703), "chat") == [
        floor_message(0.9703, "chat", 0.9, outside, "Tesla V100-SXM2-32GB", "32", 0.9703)
    ]
    assert ENGINE.alert_issues(stack(ratio=0.9704), "chat") == []
    assert ENGINE.alert_issues(stack(ratio=0.5), "chat")[0].message.startswith("0.5 would fire")


def test_the_floor_counts_the_context_alone_where_nccl_is_in_the_budget() -> None:
    # v0.9.2 starts NCCL before it measures: 0.9 + 0.5 / 32 = 0.915625 -> 0.9156.
    spec = stack(chat={"image": V92}, ratio=0.9156)
    assert ENGINE.alert_issues(spec, "chat") == [
        floor_message(0.9156, "chat", 0.9, CONTEXT, "Tesla V100-SXM2-32GB", "32", 0.9156)
    ]
    assert ENGINE.alert_issues(stack(chat={"image": V92}, ratio=0.9157), "chat") == []


def test_the_floor_of_an_image_without_facts_counts_the_context_alone() -> None:
    spec = stack(chat={"image": UNKNOWN}, ratio=0.9156)
    assert ENGINE.alert_issues(spec, "chat") == [
        floor_message(0.9156, "chat", 0.9, CONTEXT, "Tesla V100-SXM2-32GB", "32", 0.9156)
    ]
    assert ENGINE.alert_issues(stack(chat={"image": UNKNOWN}, ratio=0.9157), "chat") == []


def test_the_floors_nccl_terms_follow_tp_pp_and_nvls() -> None:
    # TP 2: 0.25 GiB of communicators; an H100 with NVLS at TP 8: 2.24 GiB (without NVLS 1.75).
    spec = stack(chat={"tensorParallel": 2}, ratio=0.9)
    outside = CONTEXT + " and NCCL communicators (about 0.25 GiB at TP 2 x PP 1)"
    assert ENGINE.alert_issues(spec, "chat") == [
        floor_message(0.9, "chat", 0.9, outside, "Tesla V100-SXM2-32GB", "32", 0.9234)
    ]
    spec = stack(gpu="NVIDIA H100 80GB HBM3", ratio=0.9)
    outside = CONTEXT + " and NCCL communicators (about 2.24 GiB at TP 8 x PP 1)"
    assert ENGINE.alert_issues(spec, "chat") == [
        floor_message(0.9, "chat", 0.9, outside, "NVIDIA H100 80GB HBM3", "79.6475", 0.9344)
    ]
    # The reasoning pool, TP 8 x PP 2 across two nodes: 2.0 GiB.
    outside = CONTEXT + " and NCCL communicators (about 2.00 GiB at TP 8 x PP 2)"
    assert ENGINE.alert_issues(stack(ratio=0.9), "reasoning") == [
        floor_message(0.9, "reasoning", 0.9, outside, "Tesla V100-SXM2-32GB", "32", 0.9781)
    ]


def test_one_gpu_has_no_communicators_to_count() -> None:
    spec = stack(chat={"tensorParallel": 1}, ratio=0.9)
    assert ENGINE.alert_issues(spec, "chat") == [
        floor_message(0.9, "chat", 0.9, CONTEXT, "Tesla V100-SXM2-32GB", "32", 0.9156)
    ]


def test_a_pool_that_cannot_start_is_left_to_memory_fit() -> None:
    # v0.9.2: 0.984375 + 0.5 / 32 = 1 exactly: memory-fit's, not the alert's; just below it the alert judges.
    assert (
        ENGINE.alert_issues(stack(chat={"image": V92}, vllm={"gpuMemoryUtilization": 0.984375}, ratio=0.99), "chat")
        == []
    )
    [issue] = ENGINE.alert_issues(stack(chat={"image": V92}, vllm={"gpuMemoryUtilization": 0.98}, ratio=0.99), "chat")
    assert issue == floor_message(0.99, "chat", 0.98, CONTEXT, "Tesla V100-SXM2-32GB", "32", 0.9956)


def test_tp_across_nodes_is_not_modelled_and_tp_of_the_node_is() -> None:
    spec = stack(chat={"tensorParallel": 16, "nodes": ["gpu-03", "gpu-04"]}, ratio=0.5)
    assert ENGINE.alert_issues(spec, "chat") == []
    spec = stack(
        chat={"tensorParallel": 4}, nodes={"gpu-03": {"gpu": {"model": "Tesla V100-SXM2-32GB", "count": 4}}}, ratio=0.5
    )
    assert [i.path for i in ENGINE.alert_issues(spec, "chat")] == ["monitoring.thresholds.gpuMemoryUsedRatio"]


def test_the_floor_reads_the_pools_first_node(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = stack(ratio=0.5)
    # A GPU the table does not know: the pool's own checks name it.
    monkeypatch.setattr(vllm_engine, "GPUS", {})
    assert ENGINE.alert_issues(spec, "chat") == []
    monkeypatch.undo()
    # A first node the stack lacks (the spec names it elsewhere): nothing to judge.
    gone = spec.model_copy(update={"nodes": {k: v for k, v in spec.nodes.items() if k != "gpu-03"}})
    assert ENGINE.alert_issues(gone, "chat") == []
    # The first node's GPU, not another node's of the pool.
    mixed = stack(ratio=0.9703, nodes={"gpu-04": {"gpu": {"model": "Tesla V100-SXM2-16GB", "count": 8}}})
    outside = CONTEXT + " and NCCL communicators (about 1.75 GiB at TP 8 x PP 1)"
    assert ENGINE.alert_issues(mixed, "chat") == [
        floor_message(0.9703, "chat", 0.9, outside, "Tesla V100-SXM2-32GB", "32", 0.9703)
    ]


# -- the server ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "drain", "timeout"),
    [(V19, 60, 90), (V19, 1, 31), (V19, 0, None), (V92, 60, None), (V011, 60, None), (UNKNOWN, 60, None)],
)
def test_the_stop_timeout_is_the_drain_plus_a_margin_where_vllm_drains(
    image: str, drain: int, timeout: int | None
) -> None:
    assert ENGINE.stop_timeout_seconds(stack(chat={"image": image, "drainSeconds": drain}), "chat") == timeout


def test_the_context_length_is_max_model_len() -> None:
    assert ENGINE.context_length(stack(vllm={"maxModelLen": 4096}), "chat") == 4096
    assert ENGINE.context_length(stack(), "reasoning") == 8192


def test_the_image_facts_are_the_declared_ones_else_the_tables() -> None:
    assert ENGINE.image_facts(stack(), "chat") is IMAGES[V19]
    assert ENGINE.image_facts(stack(chat={"image": UNKNOWN}), "chat") is None
    declared = ENGINE.image_facts(stack(chat={"image": UNKNOWN, "imageFacts": {"like": V92}}), "chat")
    assert declared is not None and declared.version == "0.9.2" and declared.ref == UNKNOWN


def test_the_argv_env_and_uploads_are_the_builders_with_the_pools_facts() -> None:
    one = Instance("chat", "chat-x", ("gpu-03",), 8000, 8, 1, None)
    spec = stack()
    assert ENGINE.serve_argv(spec, one) == vllm_argv(spec, one, IMAGES[V19])
    assert ENGINE.serve_argv(spec, one)[-4:] == ["--attention-backend", "TRITON_ATTN", "--shutdown-timeout", "60"]
    spec = stack(chat={"image": V92})
    assert ENGINE.serve_env(spec, one, "gpu-03") == vllm_env(spec, one, "gpu-03", IMAGES[V92])
    assert ENGINE.serve_env(spec, one, "gpu-03")["VLLM_USE_V1"] == "0"
    assert ENGINE.serve_env(spec, one, "gpu-03")["VLLM_HOST_IP"] == "192.168.10.13"
    native = stack(chat={"nodes": ["gpu-03", "gpu-04"], "pipelineParallel": 2}, vllm={"multiNode": "native"})
    spanning = Instance("chat", "chat-x", ("gpu-03", "gpu-04"), 8000, 8, 2, None, "native", 29500)
    assert ENGINE.node_argv(native, spanning, "gpu-04") == vllm_node_argv(native, spanning, "gpu-04", IMAGES[V19])
    assert "--headless" in ENGINE.node_argv(native, spanning, "gpu-04")
    assert "--shutdown-timeout" in ENGINE.node_argv(native, spanning, "gpu-04")
    [upload] = ENGINE.uploads(spec, one)
    name = "E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json"
    assert upload.path == f"{TUNED_CONFIG_DIR}/{name}" == f"/opt/llm-cluster/moe-configs/{name}"
    assert upload.content == moe_configs(spec, "chat")[name] == (ROOT / "configs/moe" / name).read_text()
    assert upload.executable is False
    assert ENGINE.uploads(stack(vllm={"moeConfigFiles": []}), one) == []


def test_the_launcher_is_vllms_own_only_where_the_pool_says_native() -> None:
    native = stack(vllm={"multiNode": "native", "masterPort": 29555}).pools["chat"].vllm
    assert ENGINE.launcher(native) == Launcher("native", 29555, "vllm.masterPort")
    assert ENGINE.launcher(stack(vllm={"multiNode": "ray"}).pools["chat"].vllm) == Launcher("ray")
    assert ENGINE.launcher(stack().pools["chat"].vllm) == Launcher("ray")
    assert ENGINE.launcher(None) == Launcher("ray")


def test_the_capacity_is_the_models_at_each_mla_setting() -> None:
    spec = stack()
    for mla in (None, True, False):
        assert ENGINE.capacity(spec, "reasoning", mla=mla) == capacity_dict(spec, "reasoning", mla=mla)
    assert ENGINE.capacity(spec, "reasoning", mla=True) != ENGINE.capacity(spec, "reasoning", mla=False)


def test_the_gate_check_states_the_images_version_the_gpu_and_the_argvs() -> None:
    spec = stack(gpu="NVIDIA A100-SXM4-80GB")
    argvs = (("vllm", "serve", "/m"), ("vllm", "serve", "/m", "--headless"))
    check = ENGINE.gate_check(spec, "chat", "gpu-03", argvs)
    data = {
        "version": "0.19.1",
        "module": "vllm",
        "kernel": TRITON_DOT_KERNEL,
        "block": DOT_BLOCK,
        "argvs": [["vllm", "serve", "/m"], ["vllm", "serve", "/m", "--headless"]],
        "recommended": V19,
        "capability": 80,
    }
    assert check == GateCheck(
        "vLLM 0.19.1",
        "python3",
        ("-c", VLLM_CHECK, json.dumps(data, sort_keys=True)),
        "torch's arch list, the planned GPU, an fp16 matmul, a Triton fp16 dot, the vLLM version and the planned flags",
    )
    assert json.loads(check.args[2])["capability"] == 80
    check = ENGINE.gate_check(stack(chat={"image": V92}), "chat", "gpu-03", argvs)
    assert check is not None and check.engine == "vLLM 0.9.2" and json.loads(check.args[2])["version"] == "0.9.2"
    assert json.loads(check.args[2])["capability"] == 70
    assert ENGINE.gate_check(stack(chat={"image": UNKNOWN}), "chat", "gpu-03", argvs) is None


# -- spec checks -------------------------------------------------------------------------------------------

TYPED = (
    "is set by the typed key {key}: state it there instead. In extraArgs it would come after the product's own "
    "flag and win in vLLM, while the readiness gates, the gateway, the capacity plan and the policies keep using "
    "the typed value"
)


# (extraArgs, the issues by index: token as quoted, the key that owns it).
EXTRA_ARGS = [
    (["--seed", "7"], []),
    (["--max-model-len", "4096"], [(0, "'--max-model-len'", "pools.chat.vllm.maxModelLen")]),
    (["--max-model-len=4096"], [(0, "'--max-model-len=4096'", "pools.chat.vllm.maxModelLen")]),
    (["--max_model_len", "4096"], [(0, "'--max_model_len' (that is --max-model-len)", "pools.chat.vllm.maxModelLen")]),
    (["-tp", "2"], [(0, "'-tp' (that is --tensor-parallel-size)", "pools.chat.tensorParallel")]),
    (["-tp=2"], [(0, "'-tp=2' (that is --tensor-parallel-size)", "pools.chat.tensorParallel")]),
    (
        ["--seed", "1", "--served-model-name", "x", "--port", "1"],
        [(2, "'--served-model-name'", "models.qwen3-30b-a3b.servedNames"), (4, "'--port'", "pools.chat.port")],
    ),
    (["--host", "0.0.0.0"], [(0, "'--host'", "nodes.<node>.address")]),
]


@pytest.mark.parametrize(("extra", "issues"), EXTRA_ARGS)
def test_extra_args_may_not_set_a_typed_flag(extra: list[str], issues: list[tuple[int, str, str]]) -> None:
    spec = stack(vllm={"extraArgs": extra})
    assert ENGINE.extra_args_issues(spec, "chat") == [
        SpecIssue(f"pools.chat.vllm.extraArgs[{i}]", f"{said} " + TYPED.format(key=key)) for i, said, key in issues
    ]


def test_spec_issues_are_the_extra_args_then_the_multi_node_ones() -> None:
    spec = stack(vllm={"multiNode": "native", "extraArgs": ["--max-model-len", "1"]})
    issues = ENGINE.spec_issues(spec, "chat")
    assert [i.path for i in issues] == ["pools.chat.vllm.extraArgs[0]", "pools.chat.vllm.multiNode"]
    assert issues[1:] == multi_node_issues(spec, "chat")
    assert ENGINE.spec_issues(stack(), "chat") == []


def test_file_issues_are_the_tile_configs_refusal(tmp_path: Path) -> None:
    assert ENGINE.file_issues(stack(), "chat") == []
    assert ENGINE.file_issues(stack(vllm={"moeConfigFiles": []}), "chat") == []
    bad = tmp_path / "tiles.json"
    bad.write_text("{}")
    [issue] = ENGINE.file_issues(stack(vllm={"moeConfigFiles": [str(bad)]}), "chat")
    assert issue.path == "pools.chat.vllm.moeConfigFiles[0]"
    assert issue.message.startswith("'tiles.json' is not named as vLLM looks tile configs up")


# -- what is handed on -----------------------------------------------------------------------------------------


def test_flag_spellings_are_vllms() -> None:
    assert ENGINE.canonical_flag("-tp") == "--tensor-parallel-size"
    assert ENGINE.canonical_flag("--max_model_len=1") == "--max-model-len"
    assert ENGINE.canonical_flag("4096") is None


def test_launches_and_servers_are_the_launch_readers() -> None:
    props = {"argv": ["vllm", "serve", "/m", "--max-model-len", "8"], "image": V19, "gpuModel": "Tesla T4"}
    assert ENGINE.model_server_launch(props) == model_server_launch(props)
    launch = ENGINE.model_server_launch(props)
    assert launch is not None and launch.args.model == "/m" and launch.capability == 75
    container = {"command": ["/m", "--max-model-len", "8"]}
    assert ENGINE.container_launch(container, V19) == container_launch(container, V19)
    assert ENGINE.container_launch(container, V19) is not None
    assert ENGINE.container_server(container, V19) == ServerCall("vllm serve", {"model_tag": "/m", "max_model_len": 8})
    api = {
        "entrypoints": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "command": ["--model", "/m", "-tp", "2"],
    }
    assert ENGINE.container_server(api, None) == ServerCall(
        "vllm.entrypoints.openai.api_server", {"model": "/m", "tensor_parallel_size": 2}
    )
    assert ENGINE.container_server({"command": ["nginx"]}, "nginx:1") is None


CAPACITY = {"fits": False, "reason": "no room", "advice": "lower maxModelLen", "weights_gib_per_gpu": 10.0}


def test_fit_problems_take_the_models_advice_else_the_checked_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ENGINE.fit_problems(CAPACITY, "chat", "qwen") == ["does not fit: no room. To fit: lower maxModelLen."]
    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(vllm_engine, "check_fit", lambda *a: seen.append(a) or ["checked"])
    no_advice = {**CAPACITY, "advice": ""}
    assert ENGINE.fit_problems(no_advice, "chat", "qwen") == ["checked"]
    assert seen == [(no_advice, "chat", "qwen")]
    assert ENGINE.fit_problems({"fits": True}, "pool", "model") == ["checked"]
    assert seen[-1] == ({"fits": True}, "pool", "model")


def test_the_capacity_cli_is_vllms(capsys: pytest.CaptureFixture[str]) -> None:
    assert ENGINE.capacity_cli(["--list"], "prog") == 0
    assert "deepseek-r1" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        raise SystemExit(ENGINE.capacity_cli(["--help"], "the-prog"))
    assert capsys.readouterr().out.startswith("usage: the-prog")
