"""vLLM's argv and env builders called directly, as tables (no stack planned): every layout (one GPU, TP, PP,
Ray, vLLM's own launcher at each rank) x every option x each image line's facts -> the whole `vllm serve`
argv and the whole container env, both sides of every condition; the multiNode refusals and the MoE tile
configs with their exact messages. A flag or variable dropped for one layout, one image line or one value
fails here in a second, where the whole-stack tests take a minute."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from components.engines.vllm.engine import (
    TUNED_CONFIG_DIR,
    moe_configs,
    multi_node_issues,
    vllm_argv,
    vllm_env,
    vllm_node_argv,
)
from components.engines.vllm.facts import ImageFacts, image_facts
from components.spec import SpecError, StackSpec
from components.spec.topology import Instance
from plan.stackfile import load_stack_file
from tests.conftest import prod_config
from tests.support.engine_stacks import spec_of
from tests.support.expected_argv import R1_PARALLEL, R1_SERVE_TAIL, REFERENCE_NCCL_ENV

ROOT = Path(__file__).resolve().parent.parent
V92 = "vllm/vllm-openai:v0.9.2"
V011 = "vllm/vllm-openai:v0.11.0"
V19 = "vllm/vllm-openai:v0.19.1"
QWEN = "/data/models/Qwen3-30B-A3B"
R1 = "/data/models/DeepSeek-R1-GPTQ-Int4"


def facts(ref: str | None) -> ImageFacts | None:
    if ref is None:
        return None
    found = image_facts(ref)
    assert found is not None, ref
    return found


def chat_spec(gpu: str | None = None, pool: dict[str, Any] | None = None, **vllm: Any) -> StackSpec:
    """The reference stack, its chat pool's vllm block changed by `vllm` (None drops a key), the pool by `pool`,
    every node's GPU model by `gpu`."""
    config = prod_config()
    chat = config["llm-cluster:pools"]["chat"]
    for key, value in vllm.items():
        if value is None:
            chat["vllm"].pop(key, None)
        else:
            chat["vllm"][key] = value
    chat.update(pool or {})
    if gpu is not None:
        config["llm-cluster:nodeDefaults"]["gpu"]["model"] = gpu
    return spec_of(config)


def single(tp: int = 8, pp: int = 1, pool: str = "chat", node: str = "gpu-03") -> Instance:
    return Instance(pool, f"{pool}-x", (node,), 8000, tp, pp, None)


def spanning(launcher: str, pool: str = "reasoning", master_port: int | None = None) -> Instance:
    return Instance(pool, f"{pool}-x", ("gpu-01", "gpu-02"), 8000, 8, 2, None, launcher, master_port)


HEAD = [
    "vllm",
    "serve",
    QWEN,
    "--served-model-name",
    "qwen3-30b-a3b",
    QWEN,
    "--host",
    "192.168.10.13",
    "--port",
    "8000",
]
# What every chat argv ends with before its optional flags: the model's dtype and the pool's sizes.
SIZES = ["--dtype", "half", "--max-model-len", "32768", "--max-num-seqs", "128", "--gpu-memory-utilization", "0.9"]
BASE = [*HEAD, "--tensor-parallel-size", "8", "--distributed-executor-backend", "mp", *SIZES]

# (vllm block changes, image line, the whole argv of a single-node TP 8 chat instance).
OPTIONS: list[tuple[dict[str, Any], str | None, list[str]]] = [
    ({}, V19, [*BASE, "--attention-backend", "TRITON_ATTN", "--shutdown-timeout", "60"]),
    # Before 0.14 the backend goes to the env (VLLM_ATTENTION_BACKEND), and there is no --shutdown-timeout.
    ({}, V92, BASE),
    ({}, V011, BASE),
    # An image without facts gets neither: no flag its parser might refuse.
    ({}, None, BASE),
    ({"attentionBackend": None}, V19, [*BASE, "--shutdown-timeout", "60"]),
    ({"kvCacheDtype": "fp8"}, None, [*BASE, "--kv-cache-dtype", "fp8"]),
    ({"kvCacheDtype": "auto"}, None, BASE),
    ({"blockSize": 32}, None, [*BASE, "--block-size", "32"]),
    ({"blockSize": 16}, None, BASE),
    ({"blockSize": 8}, None, [*BASE, "--block-size", "8"]),
    ({"swapSpaceGib": 0}, None, [*BASE, "--swap-space", "0"]),
    ({"swapSpaceGib": 4}, None, [*BASE, "--swap-space", "4"]),
    ({"maxNumBatchedTokens": 65536}, None, [*BASE, "--max-num-batched-tokens", "65536"]),
    ({"enablePrefixCaching": True}, None, [*BASE, "--enable-prefix-caching"]),
    ({"enablePrefixCaching": False}, None, [*BASE, "--no-enable-prefix-caching"]),
    ({"enableChunkedPrefill": True}, None, [*BASE, "--enable-chunked-prefill"]),
    ({"enableChunkedPrefill": False}, None, [*BASE, "--no-enable-chunked-prefill"]),
    ({"enforceEager": True}, None, [*BASE, "--enforce-eager"]),
    ({"enforceEager": False}, None, BASE),
    # Every optional flag at once, in the builder's order, extraArgs last (they would win in vLLM).
    (
        {
            "kvCacheDtype": "fp8_e5m2",
            "blockSize": 32,
            "swapSpaceGib": 2,
            "maxNumBatchedTokens": 4096,
            "enablePrefixCaching": False,
            "enableChunkedPrefill": True,
            "enforceEager": True,
            "extraArgs": ["--seed", "7"],
        },
        V19,
        [
            *BASE,
            "--attention-backend",
            "TRITON_ATTN",
            "--kv-cache-dtype",
            "fp8_e5m2",
            "--block-size",
            "32",
            "--swap-space",
            "2",
            "--max-num-batched-tokens",
            "4096",
            "--no-enable-prefix-caching",
            "--enable-chunked-prefill",
            "--enforce-eager",
            "--shutdown-timeout",
            "60",
            "--seed",
            "7",
        ],
    ),
]


@pytest.mark.parametrize(("options", "image", "argv"), OPTIONS)
def test_each_option_and_image_line_gives_the_whole_argv(
    options: dict[str, Any], image: str | None, argv: list[str]
) -> None:
    assert vllm_argv(chat_spec(**options), single(), facts(image)) == argv


@pytest.mark.parametrize(
    ("drain", "flag"), [(0, []), (1, ["--shutdown-timeout", "1"]), (300, ["--shutdown-timeout", "300"])]
)
def test_the_shutdown_timeout_is_the_pools_drain_and_none_without_one(drain: int, flag: list[str]) -> None:
    spec = chat_spec(pool={"drainSeconds": drain}, attentionBackend=None)
    assert vllm_argv(spec, single(), facts(V19)) == [*BASE, *flag]
    assert vllm_argv(spec, single(), facts(V92)) == BASE


# (tp, pp, the parallel flags of a single-node chat instance): mp is stated from a world of two.
LAYOUTS: list[tuple[int, int, list[str]]] = [
    (1, 1, ["--tensor-parallel-size", "1"]),
    (2, 1, ["--tensor-parallel-size", "2", "--distributed-executor-backend", "mp"]),
    (1, 2, ["--tensor-parallel-size", "1", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"]),
    (4, 2, ["--tensor-parallel-size", "4", "--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp"]),
    (8, 1, ["--tensor-parallel-size", "8", "--distributed-executor-backend", "mp"]),
]


@pytest.mark.parametrize(("tp", "pp", "parallel"), LAYOUTS)
def test_each_single_node_layout_states_its_parallel_flags(tp: int, pp: int, parallel: list[str]) -> None:
    assert vllm_argv(chat_spec(), single(tp, pp), None) == [*HEAD, *parallel, *SIZES]


# The reasoning pool (DeepSeek-R1 GPTQ, trustRemoteCode) across gpu-01 and gpu-02, TP 8 x PP 2.
R1_HEAD = ["vllm", "serve", R1, "--served-model-name", "deepseek-r1", R1, "--host", "192.168.10.11", "--port", "8000"]


def test_an_instance_on_ray_runs_the_ray_backend_from_its_head() -> None:
    spec = spec_of(prod_config())
    ray = spanning("ray")
    expected = [*R1_HEAD, *R1_PARALLEL, "--distributed-executor-backend", "ray", *R1_SERVE_TAIL]
    assert vllm_argv(spec, ray, facts(V19)) == expected
    assert vllm_node_argv(spec, ray, "gpu-01", facts(V19)) == expected
    with pytest.raises(ValueError) as err:
        vllm_node_argv(spec, ray, "gpu-02", facts(V19))
    assert str(err.value) == "reasoning-x runs on Ray: node 'gpu-02' runs a Ray worker, not vllm serve"
    with pytest.raises(ValueError) as err:
        vllm_node_argv(spec, ray, "gpu-03", facts(V19))
    assert str(err.value) == "node 'gpu-03' is not one of reasoning-x's nodes ['gpu-01', 'gpu-02']"


def native_spec() -> StackSpec:
    config = copy.deepcopy(load_stack_file(ROOT / "Pulumi.vllm-native-multinode.yaml", "vllm-native-multinode").config)
    return spec_of(config)


NATIVE_HEAD = ["vllm", "serve", R1, "--served-model-name", "deepseek-r1", "--host", "192.168.20.11", "--port", "8000"]


@pytest.mark.parametrize(("node", "rank"), [("gpu-01", ["0"]), ("gpu-02", ["1"])])
def test_each_node_on_vllms_own_launcher_states_the_world_its_rank_and_the_heads_rendezvous(
    node: str, rank: list[str]
) -> None:
    spec = native_spec()
    instance = spanning("native", master_port=29501)
    launcher = ["--nnodes", "2", "--node-rank", *rank, "--master-addr", "192.168.20.11", "--master-port", "29501"]
    # The nodes after the head serve no API.
    headless = ["--headless"] if node == "gpu-02" else []
    assert vllm_node_argv(spec, instance, node, facts(V19)) == [
        *NATIVE_HEAD,
        *R1_PARALLEL,
        "--distributed-executor-backend",
        "mp",
        *launcher,
        *headless,
        *R1_SERVE_TAIL,
    ]


def test_the_servers_argv_of_a_native_instance_is_its_heads() -> None:
    spec = native_spec()
    instance = spanning("native", master_port=29501)
    head = vllm_node_argv(spec, instance, "gpu-01", facts(V19))
    assert vllm_argv(spec, instance, facts(V19)) == head
    assert "--headless" not in head
    assert head[head.index("--node-rank") + 1] == "0"


def test_a_native_instance_on_three_nodes_states_three_and_the_rank_asked() -> None:
    three = Instance("reasoning", "r3", ("gpu-01", "gpu-02", "gpu-01"), 8000, 8, 3, None, "native", 29600)
    assert vllm_argv(native_spec(), three, None, rank=2) == [
        *NATIVE_HEAD,
        "--tensor-parallel-size",
        "8",
        "--pipeline-parallel-size",
        "3",
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        "3",
        "--node-rank",
        "2",
        "--master-addr",
        "192.168.20.11",
        "--master-port",
        "29600",
        "--headless",
        *R1_SERVE_TAIL[:8],
        "--quantization",
        "gptq",
        "--enforce-eager",
        "--trust-remote-code",
    ]


# (image line, GPU, vllm block changes, pool changes, the variables the chat container's env adds or drops
# against the V100 0.19.1 base: name -> value, None = absent).
ENV_BASE = {
    "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    "VLLM_TUNED_CONFIG_FOLDER": TUNED_CONFIG_DIR,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    **REFERENCE_NCCL_ENV,
    "VLLM_HOST_IP": "192.168.10.13",
}
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "RAY_USAGE_STATS_ENABLED")
V100 = "Tesla V100-SXM2-32GB"
ENVS: list[tuple[str | None, str, dict[str, Any], dict[str, Any], dict[str, str | None]]] = [
    (V19, V100, {}, {}, {}),
    # 0.9.2 reads VLLM_USE_V1 and its V1 needs sm_80: 0 on sm_70 and sm_75, unset from sm_80.
    (V92, V100, {}, {}, {"VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}),
    (V92, "Tesla T4", {}, {}, {"VLLM_USE_V1": "0", "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}),
    (V92, "NVIDIA A100-SXM4-80GB", {}, {}, {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}),
    # 0.11.0 reads it too, but its V1 runs from sm_70.
    (V011, V100, {}, {}, {"VLLM_ATTENTION_BACKEND": "TRITON_ATTN"}),
    (V92, V100, {"attentionBackend": None}, {}, {"VLLM_USE_V1": "0"}),
    (V19, V100, {"attentionBackend": None}, {}, {}),
    # Without facts: neither the switch nor the MoE folder nor the backend.
    (None, V100, {}, {}, {"VLLM_TUNED_CONFIG_FOLDER": None}),
    (V19, V100, {"moeConfigFiles": []}, {}, {"VLLM_TUNED_CONFIG_FOLDER": None}),
    (
        V92,
        V100,
        {"moeConfigFiles": []},
        {},
        {"VLLM_USE_V1": "0", "VLLM_TUNED_CONFIG_FOLDER": None, "VLLM_ATTENTION_BACKEND": "TRITON_ATTN"},
    ),
    (V19, V100, {}, {"offline": False}, dict.fromkeys(OFFLINE)),
    # The pool's env comes after the offline and NCCL ones and may override them; not the node's own address.
    (
        V19,
        V100,
        {},
        {"env": {"HF_HUB_OFFLINE": "0", "NCCL_DEBUG": "INFO", "VLLM_HOST_IP": "10.0.0.1", "X": "1"}},
        {"HF_HUB_OFFLINE": "0", "NCCL_DEBUG": "INFO", "X": "1"},
    ),
    (V19, V100, {}, {"env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}}, {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}),
]


@pytest.mark.parametrize(("image", "gpu", "options", "pool", "changes"), ENVS)
def test_each_image_line_gpu_and_option_gives_the_whole_env(
    image: str | None, gpu: str, options: dict[str, Any], pool: dict[str, Any], changes: dict[str, str | None]
) -> None:
    expected: dict[str, str] = {**ENV_BASE}
    for key, value in changes.items():
        if value is None:
            expected.pop(key)
        else:
            expected[key] = value
    spec = chat_spec(gpu=gpu, pool=pool, **options)
    assert vllm_env(spec, single(), "gpu-03", facts(image)) == expected


def test_each_node_of_an_instance_gets_its_own_address_and_nccl_settings() -> None:
    config = prod_config()
    config["llm-cluster:nodes"]["gpu-02"].update(
        interface="eth9", hca={"device": "mlx5_3", "port": 2, "linkLayer": "ethernet", "gidIndex": 5, "rateGbps": 200}
    )
    spec = spec_of(config)
    ray = spanning("ray")
    head, worker = (vllm_env(spec, ray, node, facts(V19)) for node in ("gpu-01", "gpu-02"))
    assert head["VLLM_HOST_IP"] == "192.168.10.11"
    assert (head["NCCL_IB_HCA"], head["NCCL_SOCKET_IFNAME"]) == ("mlx5_0", "bond0")
    assert worker["VLLM_HOST_IP"] == "192.168.10.12"
    assert (
        worker["NCCL_IB_HCA"],
        worker["NCCL_IB_GID_INDEX"],
        worker["NCCL_SOCKET_IFNAME"],
        worker["GLOO_SOCKET_IFNAME"],
    ) == (
        "mlx5_3:2",
        "5",
        "eth9",
        "eth9",
    )
    # The reasoning pool's own env (VLLM_MLA_DISABLE) and no MoE folder (it names no tile configs).
    assert worker["VLLM_MLA_DISABLE"] == "1"
    assert "VLLM_TUNED_CONFIG_FOLDER" not in worker


# multiNode: native only where an instance spans nodes, and then with the watchdog on.
NATIVE_ONE_NODE = (
    "pools.reasoning.vllm.multiNode",
    "'native' starts vLLM's own launcher across the nodes of one instance, but each instance of pool "
    "'reasoning' fits on one node (tensorParallel 8 x pipelineParallel 1 on 8 GPUs per node): remove "
    "multiNode (allowed: ray, the default, or native for pools whose instances span nodes)",
)
NATIVE_NO_WATCHDOG = (
    "pools.reasoning.restartUnhealthyAfterSeconds",
    "0 turns the watchdog off, and with multiNode: native it is what stops a headless worker when the first "
    "node stops serving (its workers would wait in a world that is gone instead of rejoining the restarted "
    "one): give it seconds (default 300), or use multiNode: ray",
)


@pytest.mark.parametrize(
    ("pool", "issues"),
    [
        ({}, []),
        ({"restartUnhealthyAfterSeconds": 0}, [NATIVE_NO_WATCHDOG]),
        ({"restartUnhealthyAfterSeconds": 1}, []),
        ({"pipelineParallel": 1}, [NATIVE_ONE_NODE]),
        ({"pipelineParallel": 1, "restartUnhealthyAfterSeconds": 0}, [NATIVE_ONE_NODE]),
        ({"pipelineParallel": 1, "nodes": ["gpu-01"]}, [NATIVE_ONE_NODE]),
        ({"pipelineParallel": 1, "nodes": ["gpu-02"]}, [NATIVE_ONE_NODE]),
        # A node the stack does not have is the spec's to name, not this check's.
        (
            {"nodes": ["gpu-09", "gpu-01"]},
            [("pools.reasoning.nodes[0]", "'gpu-09' is not a node; nodes are: gpu-01, gpu-02")],
        ),
    ],
)
def test_native_is_refused_where_instances_fit_one_node_or_the_watchdog_is_off(
    pool: dict[str, Any], issues: list[tuple[str, str]]
) -> None:
    config = copy.deepcopy(load_stack_file(ROOT / "Pulumi.vllm-native-multinode.yaml", "vllm-native-multinode").config)
    config["llm-cluster:pools"]["reasoning"].update(pool)
    if issues:
        with pytest.raises(SpecError) as err:
            spec_of(config)
        assert [(i.path, i.message) for i in err.value.issues] == issues
    else:
        assert multi_node_issues(spec_of(config), "reasoning") == []


@pytest.mark.parametrize("pool", ["chat", "reasoning"])
def test_ray_pools_have_no_multi_node_issue(pool: str) -> None:
    assert multi_node_issues(spec_of(prod_config()), pool) == []


# The tile-config names vLLM's fused_moe looks up (get_config_file_name), each side.
MOE_NAMES = [
    ("E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json", True),
    ("E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB,dtype=fp8_w8a8.json", True),
    ("E=8,N=14336,device_name=NVIDIA_H100,dtype=int8_w8a16,block_shape=[128, 128].json", True),
    ("E=8,N=14336,device_name=NVIDIA_H100,block_shape=[128,128].json", True),
    ("E=128,N=96,device_name=Tesla V100.json", False),
    ("E=128,device_name=Tesla_V100.json", False),
    ("E=128,N=96,device_name=Tesla_V100.JSON", False),
    ("e=128,N=96,device_name=Tesla_V100.json", False),
    ("E=128,N=96,device_name=Tesla_V100,dtype=FP8.json", False),
    ("xE=128,N=96,device_name=Tesla_V100.json", False),
]


@pytest.mark.parametrize(("name", "ok"), MOE_NAMES)
def test_a_tile_config_is_read_only_under_the_name_vllm_looks_up(tmp_path: Path, name: str, ok: bool) -> None:
    good = tmp_path / "E=4,N=8,device_name=X.json"
    good.write_text('{"1": {"BLOCK_SIZE_M": 16}}')
    (tmp_path / name).write_text("{}")
    files = [str(good), str(tmp_path / name)]
    if ok:
        assert moe_configs(chat_spec(moeConfigFiles=files), "chat") == {
            good.name: '{"1": {"BLOCK_SIZE_M": 16}}',
            name: "{}",
        }
        return
    # The spec reads them (file_issues): a refused file stops the stack before any resource.
    with pytest.raises(SpecError) as err:
        chat_spec(moeConfigFiles=files)
    assert [(i.path, i.message) for i in err.value.issues] == [
        (
            "pools.chat.vllm.moeConfigFiles[1]",
            f"{name!r} is not named as vLLM looks tile configs up: "
            "E=<experts>,N=<width>,device_name=<GPU name, spaces as _>[,dtype=…].json "
            "(e.g. E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json)",
        )
    ]


def test_a_tile_config_that_is_missing_or_not_json_is_refused_naming_its_index(tmp_path: Path) -> None:
    good = tmp_path / "E=4,N=8,device_name=X.json"
    good.write_text("{}")
    bad = tmp_path / "sub" / "E=4,N=8,device_name=Y.json"
    bad.parent.mkdir()
    bad.write_text("{}")
    spec = chat_spec(moeConfigFiles=[str(good), str(good), str(bad)])
    bad.unlink()
    with pytest.raises(SpecError) as err:
        moe_configs(spec, "chat")
    [issue] = err.value.issues
    assert issue.path == "pools.chat.vllm.moeConfigFiles[2]"
    assert issue.message == f"cannot read a JSON tile config from {bad}: [Errno 2] No such file or directory: '{bad}'"
    bad.write_text("{not json")
    with pytest.raises(SpecError) as err:
        moe_configs(spec, "chat")
    [issue] = err.value.issues
    assert (issue.path, issue.message) == (
        "pools.chat.vllm.moeConfigFiles[2]",
        f"cannot read a JSON tile config from {bad}: Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)",
    )
    assert moe_configs(chat_spec(moeConfigFiles=[]), "chat") == {}
