"""Every engine x every option of its options block, as a table: what each value does to the planned
command line, compared whole (every flag and its values), so a flag dropped from one engine's argv, or a
default that starts being sent, fails here whichever engine it is. Options that do not reach argv are
listed with where they go instead, and the table must name every field of each options model."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.llamacpp.options import LlamacppOptions
from components.engines.lmdeploy.options import LmdeployOptions
from components.engines.registry import ENGINES
from components.engines.vllm.options import VllmOptions
from components.spec import SpecError
from components.spec.topology import instances
from tests.conftest import prod_config
from tests.support.engine_stacks import llamacpp_config, lmdeploy_config, spec_of

MODEL = "/data/models/Qwen3-30B-A3B"


def vllm_config(**options: Any) -> dict[str, Any]:
    """The reference stack's chat pool (vLLM 0.19.1, TP 8) with its vllm block changed by `options`."""
    config = prod_config()
    block = config["llm-cluster:pools"]["chat"]["vllm"]
    block.pop("attentionBackend")  # the base sets no optional flag; the table sets each
    block.update(options)
    return config


CONFIGS = {"vllm": vllm_config, "lmdeploy": lmdeploy_config, "llamacpp": llamacpp_config}
MODELS = {"vllm": VllmOptions, "lmdeploy": LmdeployOptions, "llamacpp": LlamacppOptions}


def flags(argv: list[str]) -> dict[str, tuple[str, ...]]:
    """The argv as flag -> the values that follow it (the words before the first flag under "")."""
    out: dict[str, tuple[str, ...]] = {}
    key = ""
    for token in argv:
        if token.startswith("-") and not token[1:2].isdigit():
            assert token not in out, f"{token} twice in {argv}"
            key = token
            out[key] = ()
        else:
            out[key] = (*out.get(key, ()), token)
    return out


def planned_flags(engine: str, **options: Any) -> dict[str, tuple[str, ...]]:
    spec = spec_of(CONFIGS[engine](**options))
    return flags(ENGINES[engine].serve_argv(spec, instances(spec, "chat")[0]))


# (engine, options set, the flags that change: flag -> its values; None = the flag is gone).
TABLE: list[tuple[str, dict[str, Any], dict[str, tuple[str, ...] | None]]] = [
    ("vllm", {"maxModelLen": 4096}, {"--max-model-len": ("4096",)}),
    ("vllm", {"maxNumSeqs": 7}, {"--max-num-seqs": ("7",)}),
    ("vllm", {"gpuMemoryUtilization": 0.85}, {"--gpu-memory-utilization": ("0.85",)}),
    ("vllm", {"maxNumBatchedTokens": 65536}, {"--max-num-batched-tokens": ("65536",)}),
    ("vllm", {"kvCacheDtype": "fp8"}, {"--kv-cache-dtype": ("fp8",)}),
    ("vllm", {"kvCacheDtype": "auto"}, {}),
    ("vllm", {"blockSize": 32}, {"--block-size": ("32",)}),
    ("vllm", {"blockSize": 16}, {}),
    ("vllm", {"swapSpaceGib": 0}, {"--swap-space": ("0",)}),
    ("vllm", {"swapSpaceGib": 4}, {"--swap-space": ("4",)}),
    ("vllm", {"attentionBackend": "TRITON_ATTN"}, {"--attention-backend": ("TRITON_ATTN",)}),
    ("vllm", {"enablePrefixCaching": True}, {"--enable-prefix-caching": ()}),
    ("vllm", {"enablePrefixCaching": False}, {"--no-enable-prefix-caching": ()}),
    ("vllm", {"enableChunkedPrefill": True}, {"--enable-chunked-prefill": ()}),
    ("vllm", {"enableChunkedPrefill": False}, {"--no-enable-chunked-prefill": ()}),
    ("vllm", {"enforceEager": True}, {"--enforce-eager": ()}),
    ("vllm", {"enforceEager": False}, {}),
    ("vllm", {"extraArgs": ["--seed", "7"]}, {"--seed": ("7",)}),
    ("lmdeploy", {"sessionLen": 8192}, {"--session-len": ("8192",)}),
    ("lmdeploy", {"maxBatchSize": 3}, {"--max-batch-size": ("3",)}),
    ("lmdeploy", {"cacheMaxEntryCount": 0.5}, {"--cache-max-entry-count": ("0.5",)}),
    ("lmdeploy", {"cacheMaxEntryCount": 0.95}, {"--cache-max-entry-count": ("0.95",)}),
    ("lmdeploy", {"quantPolicy": 8}, {"--quant-policy": ("8",)}),
    ("lmdeploy", {"quantPolicy": 4}, {"--quant-policy": ("4",)}),
    ("lmdeploy", {"quantPolicy": 0}, {}),
    ("lmdeploy", {"cacheBlockSeqLen": 128}, {"--cache-block-seq-len": ("128",)}),
    ("lmdeploy", {"cacheBlockSeqLen": 64}, {}),
    ("lmdeploy", {"maxPrefillTokenNum": 4096}, {"--max-prefill-token-num": ("4096",)}),
    ("lmdeploy", {"maxPrefillTokenNum": 8192}, {}),
    ("lmdeploy", {"enablePrefixCaching": True}, {"--enable-prefix-caching": ()}),
    ("lmdeploy", {"enablePrefixCaching": False}, {}),
    ("lmdeploy", {"extraArgs": ["--log-level", "INFO"]}, {"--log-level": ("INFO",)}),
    # -c is the whole KV cache, shared by the -np slots: contextPerSlot x parallel.
    ("llamacpp", {"contextPerSlot": 4096}, {"--ctx-size": ("16384",)}),
    ("llamacpp", {"parallel": 2}, {"--parallel": ("2",), "--ctx-size": ("16384",)}),
    ("llamacpp", {"parallel": 1}, {"--parallel": ("1",), "--ctx-size": ("8192",)}),
    ("llamacpp", {"splitMode": "row"}, {"--split-mode": ("row",)}),
    ("llamacpp", {"splitMode": "none"}, {"--split-mode": ("none",)}),
    ("llamacpp", {"flashAttention": "off"}, {"--flash-attn": ("off",)}),
    ("llamacpp", {"flashAttention": "auto"}, {"--flash-attn": ("auto",)}),
    ("llamacpp", {"cacheType": "q8_0"}, {"--cache-type-k": ("q8_0",), "--cache-type-v": ("q8_0",)}),
    ("llamacpp", {"cacheType": "f16"}, {}),
    ("llamacpp", {"ggufFile": "sub/other.gguf"}, {"-m": (f"{MODEL}/sub/other.gguf",)}),
    ("llamacpp", {"extraArgs": ["--seed", "7"]}, {"--seed": ("7",)}),
]

# Options that reach no argv, and where they go instead (each tested there).
NOT_ARGV = {
    ("vllm", "moe_config_files"): "uploaded files and VLLM_TUNED_CONFIG_FOLDER (test_vllm_argv)",
    ("llamacpp", "gguf_header"): "capacity reads the header's tensors (test_engine_llamacpp)",
    # The chat pool's instances fit one node, where the spec refuses multiNode: native.
    ("vllm", "multi_node"): "each node's argv of a pool spanning nodes (test_vllm_native_launcher)",
    ("vllm", "master_port"): "--master-port of a pool spanning nodes on native (test_vllm_native_launcher)",
}


# The base argv of each engine's chat pool, whole: the table's rows are changes to these.
BASE: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {
        "": ("vllm", "serve", MODEL),
        "--served-model-name": ("qwen3-30b-a3b", MODEL),
        "--host": ("192.168.10.13",),
        "--port": ("8000",),
        "--tensor-parallel-size": ("8",),
        "--distributed-executor-backend": ("mp",),
        "--dtype": ("half",),
        "--max-model-len": ("32768",),
        "--max-num-seqs": ("128",),
        "--gpu-memory-utilization": ("0.9",),
        "--shutdown-timeout": ("60",),
    },
    "lmdeploy": {
        "": ("lmdeploy", "serve", "api_server", MODEL),
        "--backend": ("turbomind",),
        "--model-name": ("qwen3-30b-a3b",),
        "--server-name": ("192.168.10.13",),
        "--server-port": ("8000",),
        "--tp": ("8",),
        "--dtype": ("float16",),
        "--model-format": ("hf",),
        "--session-len": ("32768",),
        "--max-batch-size": ("64",),
        "--cache-max-entry-count": ("0.8",),
    },
    "llamacpp": {
        "": ("/app/llama-server",),
        "-m": (f"{MODEL}/Qwen3-30B-A3B-Q4_K_M.gguf",),
        "--alias": (f"qwen3-30b-a3b,{MODEL}",),
        "--host": ("192.168.10.13",),
        "--port": ("8000",),
        "--n-gpu-layers": ("999",),
        "--split-mode": ("layer",),
        "--ctx-size": ("32768",),
        "--parallel": ("4",),
        "--flash-attn": ("on",),
        "--fit": ("off",),
        "--jinja": (),
        "--metrics": (),
        # cpuCores 80 shared by the node's 8 servers.
        "--threads": ("10",),
    },
}


@pytest.mark.parametrize("engine", sorted(BASE))
def test_each_engines_base_argv_is_exact(engine: str) -> None:
    assert planned_flags(engine) == BASE[engine]


@pytest.mark.parametrize(
    ("engine", "options", "changed"),
    TABLE,
    ids=[f"{e}-{'-'.join(f'{k}={v}' for k, v in o.items())}" for e, o, _ in TABLE],
)
def test_each_option_changes_exactly_its_flags(
    engine: str, options: dict[str, Any], changed: dict[str, tuple[str, ...] | None]
) -> None:
    expected = {**BASE[engine], **changed}
    assert planned_flags(engine, **options) == {k: v for k, v in expected.items() if v is not None}


def _snake(key: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in key)


@pytest.mark.parametrize("engine", sorted(MODELS))
def test_the_table_names_every_option_of_every_engine(engine: str) -> None:
    in_table = {_snake(k) for e, options, _ in TABLE if e == engine for k in options}
    elsewhere = {name for e, name in NOT_ARGV if e == engine}
    assert in_table | elsewhere == set(MODELS[engine].model_fields), engine
    assert not in_table & elsewhere


@pytest.mark.parametrize("cache_type", ["bf16", "f16", "f32", "iq4_nl", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
def test_every_llamacpp_cache_type_of_the_images_is_taken(cache_type: str) -> None:
    assert (
        LlamacppOptions.model_validate(
            {"contextPerSlot": 4096, "ggufFile": "m.gguf", "cacheType": cache_type}
        ).cache_type
        == cache_type
    )


@pytest.mark.parametrize("cache_type", ["q9_0", "F16", ""])
def test_a_cache_type_no_image_knows_is_refused_naming_the_key_and_the_allowed(cache_type: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_of(llamacpp_config(cacheType=cache_type))
    assert str(err.value) == (
        f"pools.chat.llamacpp.cacheType: {cache_type!r} is not a llama.cpp KV cache type; allowed: bf16, f16, f32, "
        "iq4_nl, q4_0, q4_1, q5_0, q5_1, q8_0"
    )
