"""LMDeploy's and llama.cpp's argv and env builders called directly, as tables (no stack planned): every option
and model setting -> the whole server argv and env, both sides of each default; --threads on each count of
servers per node; the gate's argv; every spelling llama-server's flags are read in; each engine's spec refusals
with their exact messages. The vLLM builders have theirs in tests/test_vllm_builders_table.py."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.llamacpp.engine import (
    GATE_HOST,
    GATE_MODEL,
    LlamacppEngine,
    gate_argv,
    gguf_path,
    llamacpp_argv,
    llamacpp_env,
    threads_per_instance,
)
from components.engines.lmdeploy.engine import DTYPES, LmdeployEngine, lmdeploy_argv, lmdeploy_env
from components.engines.lmdeploy.facts import MODEL_FORMATS
from components.engines.lmdeploy.options import LMDEPLOY_DTYPES, LMDEPLOY_FORMATS
from components.spec import SpecError, StackSpec
from components.spec.topology import Instance, instances
from tests.support.engine_stacks import llamacpp_config, lmdeploy_config, spec_of
from tests.support.expected_argv import (
    LLAMACPP_CHAT_TAIL,
    LMDEPLOY_CHAT_ARGV,
    REFERENCE_NCCL_ENV,
    llamacpp_chat_head,
)

MODEL = "/data/models/Qwen3-30B-A3B"


def lmdeploy_spec(model: dict[str, Any] | None = None, pool: dict[str, Any] | None = None, **options: Any) -> StackSpec:
    config = lmdeploy_config(**options)
    config["llm-cluster:models"]["qwen3-30b-a3b"].update(model or {})
    config["llm-cluster:pools"]["chat"].update(pool or {})
    return spec_of(config)


def head(spec: StackSpec, pool: str = "chat") -> Instance:
    return instances(spec, pool)[0]


def replaced(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


# (model changes, lmdeploy block changes, the whole argv).
LMDEPLOY_ARGVS: list[tuple[dict[str, Any], dict[str, Any], list[str]]] = [
    ({}, {}, LMDEPLOY_CHAT_ARGV),
    # The model's dtype in vLLM's names -> TurboMind's --dtype.
    ({"dtype": "bfloat16"}, {}, replaced(LMDEPLOY_CHAT_ARGV, "--dtype", "bfloat16")),
    ({"dtype": "float16"}, {}, LMDEPLOY_CHAT_ARGV),
    ({"dtype": "auto"}, {}, replaced(LMDEPLOY_CHAT_ARGV, "--dtype", "auto")),
    # The checkpoint's quantization -> --model-format (unset is hf).
    (
        {"quantization": "awq", "quantBits": 4, "groupSize": 128},
        {},
        replaced(LMDEPLOY_CHAT_ARGV, "--model-format", "awq"),
    ),
    (
        {"quantization": "gptq", "quantBits": 4, "groupSize": 128},
        {},
        replaced(LMDEPLOY_CHAT_ARGV, "--model-format", "gptq"),
    ),
    ({"quantization": "fp8"}, {}, replaced(LMDEPLOY_CHAT_ARGV, "--model-format", "fp8")),
    ({"trustRemoteCode": True}, {}, [*LMDEPLOY_CHAT_ARGV, "--trust-remote-code"]),
    ({}, {"cacheMaxEntryCount": 0.5}, replaced(LMDEPLOY_CHAT_ARGV, "--cache-max-entry-count", "0.5")),
    # Written as %g: no float noise, no trailing zeros.
    ({}, {"cacheMaxEntryCount": 0.95}, replaced(LMDEPLOY_CHAT_ARGV, "--cache-max-entry-count", "0.95")),
    ({}, {"cacheBlockSeqLen": 64}, LMDEPLOY_CHAT_ARGV),
    ({}, {"cacheBlockSeqLen": 32}, [*LMDEPLOY_CHAT_ARGV, "--cache-block-seq-len", "32"]),
    ({}, {"cacheBlockSeqLen": 128}, [*LMDEPLOY_CHAT_ARGV, "--cache-block-seq-len", "128"]),
    ({}, {"maxPrefillTokenNum": 8192}, LMDEPLOY_CHAT_ARGV),
    ({}, {"maxPrefillTokenNum": 8191}, [*LMDEPLOY_CHAT_ARGV, "--max-prefill-token-num", "8191"]),
    ({}, {"maxPrefillTokenNum": 8193}, [*LMDEPLOY_CHAT_ARGV, "--max-prefill-token-num", "8193"]),
    ({}, {"quantPolicy": 0}, LMDEPLOY_CHAT_ARGV),
    ({}, {"quantPolicy": 4}, [*LMDEPLOY_CHAT_ARGV, "--quant-policy", "4"]),
    ({}, {"quantPolicy": 8}, [*LMDEPLOY_CHAT_ARGV, "--quant-policy", "8"]),
    ({}, {"enablePrefixCaching": True}, [*LMDEPLOY_CHAT_ARGV, "--enable-prefix-caching"]),
    ({}, {"enablePrefixCaching": False}, LMDEPLOY_CHAT_ARGV),
    # Everything at once, in the builder's order, extraArgs last.
    (
        {"trustRemoteCode": True},
        {
            "cacheBlockSeqLen": 32,
            "maxPrefillTokenNum": 4096,
            "quantPolicy": 8,
            "enablePrefixCaching": True,
            "extraArgs": ["--log-level", "INFO"],
        },
        [
            *LMDEPLOY_CHAT_ARGV,
            "--cache-block-seq-len",
            "32",
            "--max-prefill-token-num",
            "4096",
            "--quant-policy",
            "8",
            "--enable-prefix-caching",
            "--trust-remote-code",
            "--log-level",
            "INFO",
        ],
    ),
]


@pytest.mark.parametrize(("model", "options", "argv"), LMDEPLOY_ARGVS)
def test_lmdeploy_each_option_and_model_setting_gives_the_whole_argv(
    model: dict[str, Any], options: dict[str, Any], argv: list[str]
) -> None:
    spec = lmdeploy_spec(model, **options)
    assert lmdeploy_argv(spec, head(spec)) == argv
    assert LmdeployEngine().serve_argv(spec, head(spec)) == argv


def test_lmdeploy_each_instance_binds_its_own_node_and_tp() -> None:
    spec = lmdeploy_spec(pool={"tensorParallel": 4, "replicasPerNode": 2})
    second = instances(spec, "chat")[1]
    argv = lmdeploy_argv(spec, second)
    assert (second.head, second.port) == ("gpu-03", 8001)
    assert argv[argv.index("--server-name") : argv.index("--dtype")] == [
        "--server-name",
        "192.168.10.13",
        "--server-port",
        "8001",
        "--tp",
        "4",
    ]
    last = instances(spec, "chat")[-1]
    assert lmdeploy_argv(spec, last)[8:10] == ["--server-name", "192.168.10.16"]


@pytest.mark.parametrize(
    ("pool", "env"),
    [
        ({}, {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **REFERENCE_NCCL_ENV}),
        ({"offline": False}, REFERENCE_NCCL_ENV),
        # The pool's env last: it may override the hub switch and NCCL's.
        (
            {"env": {"HF_HUB_OFFLINE": "0", "NCCL_DEBUG": "INFO", "X": "1"}},
            {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1", **REFERENCE_NCCL_ENV, "NCCL_DEBUG": "INFO", "X": "1"},
        ),
    ],
)
def test_lmdeploy_env_is_the_hub_off_the_nodes_nccl_and_the_pools_own(
    pool: dict[str, Any], env: dict[str, str]
) -> None:
    spec = lmdeploy_spec(pool=pool)
    assert lmdeploy_env(spec, head(spec), "gpu-03") == env
    assert LmdeployEngine().serve_env(spec, head(spec), "gpu-03") == env


def test_lmdeploy_env_reads_the_node_it_runs_on() -> None:
    config = lmdeploy_config()
    config["llm-cluster:nodes"]["gpu-04"]["interface"] = "eth4"
    spec = spec_of(config)
    instance = instances(spec, "chat")[1]
    assert instance.head == "gpu-04"
    assert lmdeploy_env(spec, instance, "gpu-04")["NCCL_SOCKET_IFNAME"] == "eth4"


# (model changes, pool changes, lmdeploy block changes, the spec's issues: key -> message).
FORMATS = "awq, compressed-tensors, fp8, gptq, mxfp4"
LMDEPLOY_REFUSALS: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[tuple[str, str]]]] = [
    (
        {"quantization": "gguf"},
        {},
        {},
        [
            (
                "models.qwen3-30b-a3b.quantization",
                f"'gguf' is not a TurboMind model format (pool 'chat'); TurboMind loads: unset (hf), {FORMATS}",
            )
        ],
    ),
    (
        {"quantization": "bitsandbytes"},
        {},
        {},
        [
            (
                "models.qwen3-30b-a3b.quantization",
                f"'bitsandbytes' is not a TurboMind model format (pool 'chat'); TurboMind loads: unset (hf), {FORMATS}",
            )
        ],
    ),
    (
        {"dtype": "float32"},
        {},
        {},
        [
            (
                "models.qwen3-30b-a3b.dtype",
                "'float32': TurboMind computes in float16 or bfloat16 (pool 'chat'); use half, bfloat16 or auto",
            )
        ],
    ),
    (
        {},
        {"pipelineParallel": 2, "nodes": ["gpu-03", "gpu-04"]},
        {},
        [
            (
                "pools.chat.pipelineParallel",
                "lmdeploy pools run on one node: TurboMind has no pipeline parallel; it spans nodes only as tensor "
                "parallel over the network (--nnodes), which no one has shown on V100 and which would put every "
                "layer's all-reduce on the NIC; serve one replica per node (pipelineParallel 1), or use engine: "
                "vllm for tensor x pipeline parallel across nodes",
            )
        ],
    ),
    (
        {},
        {},
        {"extraArgs": ["--log-level", "INFO", "--tp", "4"]},
        [
            (
                "pools.chat.lmdeploy.extraArgs[2]",
                "'--tp' is set by the typed key pools.chat.tensorParallel: state it there instead",
            )
        ],
    ),
]


@pytest.mark.parametrize(("model", "pool", "options", "issues"), LMDEPLOY_REFUSALS)
def test_lmdeploy_refuses_what_turbomind_cannot_serve_naming_the_key(
    model: dict[str, Any], pool: dict[str, Any], options: dict[str, Any], issues: list[tuple[str, str]]
) -> None:
    with pytest.raises(SpecError) as err:
        lmdeploy_spec(model, pool, **options)
    assert [(i.path, i.message) for i in err.value.issues] == issues


def test_lmdeploy_maps_every_dtype_and_format_the_spec_takes() -> None:
    # The argv indexes these tables: a dtype or format the spec lets through must be in them.
    assert set(DTYPES) == set(LMDEPLOY_DTYPES)
    assert set(MODEL_FORMATS) == set(LMDEPLOY_FORMATS)


@pytest.mark.parametrize(
    "model",
    [{}, {"dtype": "bfloat16"}, {"dtype": "auto"}, {"quantization": "awq", "quantBits": 4, "groupSize": 128}],
)
def test_lmdeploy_takes_each_format_and_dtype_it_serves(model: dict[str, Any]) -> None:
    spec = lmdeploy_spec(model)
    assert LmdeployEngine().spec_issues(spec, "chat") == []


# -- llama.cpp ---------------------------------------------------------------------------------------------


def llamacpp_spec(
    model: dict[str, Any] | None = None, pool: dict[str, Any] | None = None, cpus: int | None = None, **options: Any
) -> StackSpec:
    config = llamacpp_config(**options)
    config["llm-cluster:models"]["qwen3-30b-a3b"].update(model or {})
    config["llm-cluster:pools"]["chat"].update(pool or {})
    if cpus is not None:
        config["llm-cluster:nodeDefaults"]["cpuCores"] = cpus
    return spec_of(config)


LLAMACPP_BASE = llamacpp_chat_head(8000)

# (model changes, llamacpp block changes, the whole argv).
LLAMACPP_ARGVS: list[tuple[dict[str, Any], dict[str, Any], list[str]]] = [
    ({}, {}, [*LLAMACPP_BASE, *LLAMACPP_CHAT_TAIL]),
    # -c is the whole KV cache shared by the -np slots: contextPerSlot x parallel.
    (
        {},
        {"contextPerSlot": 256, "parallel": 1},
        [*replaced(replaced(LLAMACPP_BASE, "--ctx-size", "256"), "--parallel", "1"), *LLAMACPP_CHAT_TAIL],
    ),
    (
        {},
        {"contextPerSlot": 1000, "parallel": 3},
        [*replaced(replaced(LLAMACPP_BASE, "--ctx-size", "3000"), "--parallel", "3"), *LLAMACPP_CHAT_TAIL],
    ),
    ({}, {"splitMode": "row"}, [*replaced(LLAMACPP_BASE, "--split-mode", "row"), *LLAMACPP_CHAT_TAIL]),
    ({}, {"flashAttention": "auto"}, [*replaced(LLAMACPP_BASE, "--flash-attn", "auto"), *LLAMACPP_CHAT_TAIL]),
    ({}, {"cacheType": "f16"}, [*LLAMACPP_BASE, *LLAMACPP_CHAT_TAIL]),
    (
        {},
        {"cacheType": "q4_0"},
        [*LLAMACPP_BASE, "--cache-type-k", "q4_0", "--cache-type-v", "q4_0", *LLAMACPP_CHAT_TAIL],
    ),
    ({}, {"cacheType": "f32"}, [*LLAMACPP_BASE, "--cache-type-k", "f32", "--cache-type-v", "f32", *LLAMACPP_CHAT_TAIL]),
    # The GGUF inside the model's path, with one slash whatever the path ends with.
    (
        {"path": f"{MODEL}/"},
        {},
        [*LLAMACPP_BASE[:2], f"{MODEL}/Qwen3-30B-A3B-Q4_K_M.gguf", *LLAMACPP_BASE[3:], *LLAMACPP_CHAT_TAIL],
    ),
    # Only slashes are stripped from the path's end.
    (
        {"path": "/data/models/Q-X", "servedNames": ["qwen"]},
        {},
        [
            *replaced(replaced(LLAMACPP_BASE, "-m", "/data/models/Q-X/Qwen3-30B-A3B-Q4_K_M.gguf"), "--alias", "qwen"),
            *LLAMACPP_CHAT_TAIL,
        ],
    ),
    (
        {},
        {"ggufFile": "q4/m-00001-of-00003.gguf"},
        [*replaced(LLAMACPP_BASE, "-m", f"{MODEL}/q4/m-00001-of-00003.gguf"), *LLAMACPP_CHAT_TAIL],
    ),
    ({"servedNames": ["qwen"]}, {}, [*replaced(LLAMACPP_BASE, "--alias", "qwen"), *LLAMACPP_CHAT_TAIL]),
    ({}, {"extraArgs": ["--seed", "7"]}, [*LLAMACPP_BASE, *LLAMACPP_CHAT_TAIL, "--seed", "7"]),
]


@pytest.mark.parametrize(("model", "options", "argv"), LLAMACPP_ARGVS)
def test_llamacpp_each_option_and_model_setting_gives_the_whole_argv(
    model: dict[str, Any], options: dict[str, Any], argv: list[str]
) -> None:
    spec = llamacpp_spec(model, **options)
    assert llamacpp_argv(spec, head(spec)) == argv
    assert LlamacppEngine().serve_argv(spec, head(spec)) == argv
    assert gguf_path(spec, "chat") == argv[2]


# (servers per node, the node's CPUs, --threads): the node's CPUs shared by its servers, at least one each.
THREADS = [(8, 80, 10), (8, 87, 10), (8, 88, 11), (3, 80, 26), (1, 80, 80), (1, 1, 1), (8, 7, 1), (8, 8, 1), (8, 16, 2)]


@pytest.mark.parametrize(("servers", "cpus", "threads"), THREADS)
def test_llamacpp_threads_share_the_nodes_cpus_between_its_servers(servers: int, cpus: int, threads: int) -> None:
    spec = llamacpp_spec(pool={"replicasPerNode": servers, "tensorParallel": 8 // servers or 1}, cpus=cpus)
    for instance in instances(spec, "chat"):
        assert threads_per_instance(spec, instance.head) == threads
        assert llamacpp_argv(spec, instance)[-2:] == ["--threads", str(threads)]


def test_llamacpp_threads_count_every_instance_on_the_node_whatever_its_pool() -> None:
    config = llamacpp_config()
    config["llm-cluster:nodes"]["gpu-07"] = {"address": "192.168.10.17", "cpuCores": 12}
    config["llm-cluster:nodes"]["gpu-01"]["cpuCores"] = 9
    spec = spec_of(config)
    # The reasoning pool's one vLLM instance spans gpu-01 and gpu-02: each node counts it once.
    assert threads_per_instance(spec, "gpu-01") == 9
    assert threads_per_instance(spec, "gpu-02") == 80
    # A node serving nothing: its CPUs, not a division by zero.
    assert threads_per_instance(spec, "gpu-07") == 12


@pytest.mark.parametrize(
    ("pool", "env"),
    [
        ({}, {"LLAMA_ARG_OFFLINE": "1"}),
        ({"offline": False}, {}),
        ({"env": {"LLAMA_ARG_OFFLINE": "0", "X": "1"}}, {"LLAMA_ARG_OFFLINE": "0", "X": "1"}),
        ({"offline": False, "env": {"X": "1"}}, {"X": "1"}),
    ],
)
def test_llamacpp_env_is_offline_then_the_pools_own(pool: dict[str, Any], env: dict[str, str]) -> None:
    spec = llamacpp_spec(pool=pool)
    assert llamacpp_env(spec, head(spec)) == env
    assert LlamacppEngine().serve_env(spec, head(spec), "gpu-03") == env


# The gate runs the planned argv with -m on a file that is not there and --host on loopback.
GATES = [
    (
        ["/app/llama-server", "-m", "/w.gguf", "--host", "10.0.0.1", "--port", "1"],
        ["/app/llama-server", "-m", GATE_MODEL, "--host", GATE_HOST, "--port", "1"],
    ),
    (
        ["/app/llama-server", "--model", "/w.gguf", "--port", "1"],
        ["/app/llama-server", "--model", GATE_MODEL, "--port", "1"],
    ),
    (["/app/llama-server", "--port", "1", "--host", "h"], ["/app/llama-server", "--port", "1", "--host", GATE_HOST]),
    (["/app/llama-server", "--port", "1"], ["/app/llama-server", "--port", "1"]),
]


@pytest.mark.parametrize(("argv", "gated"), GATES)
def test_the_gate_points_the_model_and_host_away_and_keeps_the_rest(argv: list[str], gated: list[str]) -> None:
    assert gate_argv(tuple(argv)) == gated


def test_the_gate_argv_of_the_planned_server() -> None:
    spec = llamacpp_spec()
    planned = llamacpp_argv(spec, head(spec))
    gated = gate_argv(tuple(planned))
    assert gated == replaced(replaced(planned, "-m", GATE_MODEL), "--host", GATE_HOST)
    assert (GATE_MODEL, GATE_HOST) == ("/nonexistent/llm-cluster-qualification.gguf", "127.0.0.1")


# Every spelling of a llama-server flag -> the flag the typed keys know it by (None: not a flag).
SPELLINGS = [
    ("-m", "--model"),
    ("-a", "--alias"),
    ("-ngl", "--n-gpu-layers"),
    ("--gpu-layers", "--n-gpu-layers"),
    ("-sm", "--split-mode"),
    ("-c", "--ctx-size"),
    ("-c=4096", "--ctx-size"),
    ("--ctx-size=4096", "--ctx-size"),
    ("-np", "--parallel"),
    ("-fa", "--flash-attn"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-fit", "--fit"),
    ("-hft", "--hf-token"),
    ("-t", "--threads"),
    ("--seed", "--seed"),
    ("--seed=7", "--seed"),
    ("-", None),
    ("7", None),
    ("-1", None),
    ("-0.5", None),
    ("model.gguf", None),
    ("", None),
]


@pytest.mark.parametrize(("token", "flag"), SPELLINGS)
def test_llamacpp_reads_each_spelling_of_a_flag(token: str, flag: str | None) -> None:
    assert LlamacppEngine().canonical_flag(token) == flag


LLAMACPP_REFUSALS: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[tuple[str, str]]]] = [
    (
        {"quantization": "awq", "quantBits": 4, "groupSize": 128, "sizeGib": None},
        {},
        {},
        [
            (
                "models.qwen3-30b-a3b.quantization",
                "pool 'chat' runs llama.cpp, which loads GGUF files only: set quantization: gguf (and the pool's "
                "llamacpp.ggufFile)",
            )
        ],
    ),
    (
        {},
        {"pipelineParallel": 2, "replicasPerNode": 1, "nodes": ["gpu-03", "gpu-04"]},
        {},
        [
            (
                "pools.chat.pipelineParallel",
                "llamacpp pools run on one node: llama.cpp spans nodes only through its RPC backend, which upstream "
                'calls "a proof-of-concept ... fragile and insecure" (tools/rpc/README.md): the project does not '
                "deploy it; serve one replica per node (pipelineParallel 1), or use engine: vllm for tensor x "
                "pipeline parallel across nodes",
            )
        ],
    ),
    (
        {},
        {},
        {"extraArgs": ["--seed", "7", "-c", "4096", "--threads=4"]},
        [
            (
                "pools.chat.llamacpp.extraArgs[2]",
                "'-c' is set by the typed key pools.chat.llamacpp.contextPerSlot: state it there instead",
            ),
            (
                "pools.chat.llamacpp.extraArgs[4]",
                "'--threads=4' is set by the typed key nodes.<node>.cpuCores (split between the node's serving "
                "instances): state it there instead",
            ),
        ],
    ),
]


@pytest.mark.parametrize(("model", "pool", "options", "issues"), LLAMACPP_REFUSALS)
def test_llamacpp_refuses_what_llama_server_cannot_serve_naming_the_key(
    model: dict[str, Any], pool: dict[str, Any], options: dict[str, Any], issues: list[tuple[str, str]]
) -> None:
    with pytest.raises(SpecError) as err:
        llamacpp_spec({k: v for k, v in model.items() if v is not None}, pool, **options)
    assert [(i.path, i.message) for i in err.value.issues][: len(issues)] == issues


def test_llamacpp_takes_its_reference_pool() -> None:
    spec = llamacpp_spec()
    assert LlamacppEngine().spec_issues(spec, "chat") == []
    assert LlamacppEngine().checkpoint_quantizations() == frozenset({"gguf"})
    assert LlamacppEngine().context_length(spec, "chat") == 8192
    assert LlamacppEngine().context_length(llamacpp_spec(contextPerSlot=4096, parallel=2), "chat") == 4096
    fmt = LlamacppEngine.advice_formats[0]
    assert LlamacppEngine().advice_options(16384, fmt, "qwen3-8b") == {
        "contextPerSlot": 16384,
        "ggufFile": "qwen3-8b.gguf",
    }
    assert LlamacppEngine().probe_argv("http://h:1/health") == [
        "curl",
        "-fsS",
        "-o",
        "/dev/null",
        "--max-time",
        "10",
        "http://h:1/health",
    ]
