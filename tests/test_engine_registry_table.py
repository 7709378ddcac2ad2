"""The engine registry's own functions (components.engines.registry) as tables: what `register` adds to each
engine-indexed table (on toy engines, the real tables put back), the default engine, engine_for's refusal, the
real registry's tables whole, and `stack_keys` whole for a pool of every engine."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from components.engines import registry
from components.engines.base import Engine
from components.engines.http import EngineServer
from components.facts.evidence import unverified
from components.spec import StackSpec
from components.spec import engines as spec_engines
from components.spec.base import Spec
from components.spec.engines import DeployedEngine, Launcher
from components.spec.topology import Instance
from tests.conftest import prod_config
from tests.support.engine_stacks import llamacpp_config, lmdeploy_config, spec_of

# The registry's tables as importing it built them, before any test ran (tests/test_engine_registry.py's toy
# engine leaves its offline variable in TYPED_ENV): every test here starts from copies of these.
BUILT = {
    name: dict(getattr(registry, name))
    for name in ("ENGINES", "DEFAULT_IMAGES", "SECRET_FLAGS", "SECRET_FLAG_NAMES", "TYPED_ENV")
}


@pytest.fixture(autouse=True)
def built_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, table in BUILT.items():
        monkeypatch.setattr(registry, name, dict(table))


class ToyOptions(Spec):
    size: int = 1


class Toy(Engine):
    """An engine that only states what `register` reads."""

    title: ClassVar[str] = "Toy"
    server_role: ClassVar[str] = "toy"
    multi_gpu: ClassVar[tuple[str, ...]] = ()
    multi_node: ClassVar[str] = "none"  # type: ignore[misc]
    metrics_job: ClassVar[str] = "toy"
    http_server: ClassVar[EngineServer] = EngineServer(5, None, (503,), unverified("a toy"))
    memory_keys: ClassVar[str] = "toy.size"
    options_model: ClassVar[type[Spec]] = ToyOptions
    required_option: ClassVar[str] = "size"
    context_key: ClassVar[str] = "size"

    def checkpoint_quantizations(self) -> frozenset[str]:
        return frozenset({f"{self.name}-q"})

    def context_length(self, spec: StackSpec, pool: str) -> int:
        raise NotImplementedError

    def serve_argv(self, spec: StackSpec, instance: Instance) -> list[str]:
        raise NotImplementedError

    def serve_env(self, spec: StackSpec, instance: Instance, node: str) -> dict[str, str]:
        raise NotImplementedError

    def capacity(self, spec: StackSpec, pool: str, *, mla: bool | None = None) -> dict[str, object]:
        raise NotImplementedError


class Alpha(Toy):
    name: ClassVar[str] = "alpha"
    options_key: ClassVar[str] = "alphaOpts"
    default_image: ClassVar[str] = "alpha/server:1"
    secret_flags: ClassVar[Mapping[str, str]] = {"--token": "1", "--keys": "+", "--pass": "1"}
    secret_flag_aliases: ClassVar[Mapping[str, str]] = {"-t": "--token"}
    typed_env: ClassVar[Mapping[str, str]] = {"ALPHA_PORT": "pools.<pool>.alphaOpts.port"}
    offline_vars: ClassVar[Mapping[str, str]] = {"ALPHA_OFFLINE": "1", "HUB_OFFLINE": "1"}


class Beta(Toy):
    name: ClassVar[str] = "beta"
    options_key: ClassVar[str] = "betaOpts"
    default_image: ClassVar[str] = "beta/server:2"
    # --token becomes "+" (one engine reads several values), --keys stays "+", --pass stays "1".
    secret_flags: ClassVar[Mapping[str, str]] = {"--token": "+", "--keys": "1", "--pass": "1", "--beta-key": "1"}
    secret_flag_aliases: ClassVar[Mapping[str, str]] = {"-k": "--beta-key"}
    typed_env: ClassVar[Mapping[str, str]] = {"BETA_HOST": "nodes.<node>.address"}
    offline_vars: ClassVar[Mapping[str, str]] = {"HUB_OFFLINE": "1"}


@pytest.fixture
def toy_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every table `register` fills, empty (the nodes' typed env only), the real ones put back afterwards."""
    for name in ("ENGINES", "DEFAULT_IMAGES", "SECRET_FLAGS", "SECRET_FLAG_NAMES"):
        monkeypatch.setattr(registry, name, {})
    monkeypatch.setattr(registry, "TYPED_ENV", dict(registry.NODE_TYPED_ENV))
    monkeypatch.setattr(spec_engines, "DEPLOYED", {})
    monkeypatch.setattr(spec_engines, "DEPLOYED_KEYS", {})
    monkeypatch.setattr(spec_engines, "DEFAULT_ENGINE", [])
    yield


def deployed(e: Toy) -> DeployedEngine:
    return DeployedEngine(
        e.name,
        e.options_key,
        ToyOptions,
        "size",
        e.default_image,
        frozenset({f"{e.name}-q"}),
        e.declarable_images,
        e.knows_image,
        e.launcher,
    )


def test_register_fills_every_table_and_merges_the_secret_flags(toy_tables: None) -> None:
    alpha, beta = Alpha(), Beta()
    registry.register(alpha)
    assert spec_engines.DEFAULT_ENGINE == []
    registry.register(beta, default=True)
    assert registry.ENGINES == {"alpha": alpha, "beta": beta}
    assert registry.DEFAULT_IMAGES == {"alpha": "alpha/server:1", "beta": "beta/server:2"}
    assert registry.SECRET_FLAGS == {"--token": "+", "--keys": "+", "--pass": "1", "--beta-key": "1"}
    assert registry.SECRET_FLAG_NAMES == {"-t": "--token", "-k": "--beta-key"}
    assert registry.TYPED_ENV == {
        **registry.NODE_TYPED_ENV,
        "ALPHA_PORT": "pools.<pool>.alphaOpts.port",
        "ALPHA_OFFLINE": "pools.<pool>.offline",
        "HUB_OFFLINE": "pools.<pool>.offline",
        "BETA_HOST": "nodes.<node>.address",
    }
    assert spec_engines.DEPLOYED == {"alpha": deployed(alpha), "beta": deployed(beta)}
    assert spec_engines.DEPLOYED_KEYS == {"alphaOpts": "alpha", "betaOpts": "beta"}
    assert spec_engines.DEFAULT_ENGINE == ["beta"]
    assert spec_engines.DEPLOYED["alpha"].launcher(None) == Launcher("none")
    # The default engine is the one registered with default=True, not the first.
    assert registry.default_engine() is beta
    assert registry.engine_of({}) is beta
    assert registry.engine_of({"engine": "alpha"}) is alpha


def test_a_flag_one_value_in_every_engine_stays_one_value_whatever_the_order(toy_tables: None) -> None:
    registry.register(Beta())
    registry.register(Alpha())
    assert registry.SECRET_FLAGS == {"--token": "+", "--keys": "+", "--pass": "1", "--beta-key": "1"}


def test_the_real_registrys_tables() -> None:
    assert list(registry.ENGINES) == ["vllm", "lmdeploy", "llamacpp"]
    assert registry.default_engine() is registry.ENGINES["vllm"]
    assert spec_engines.DEFAULT_ENGINE == ["vllm"]
    assert registry.DEFAULT_IMAGES == {
        "vllm": "vllm/vllm-openai:v0.19.1",
        "lmdeploy": "openmmlab/lmdeploy:v0.16.0-cu12.8",
        "llamacpp": "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312",
    }
    assert registry.SECRET_FLAGS == {"--api-key": "+", "--hf-token": "1", "--api-keys": "+", "-hft": "1"}
    assert registry.SECRET_FLAG_NAMES == {"-hft": "--hf-token"}
    assert registry.TYPED_ENV == {
        "NCCL_IB_HCA": "nodes.<node>.hca.device",
        "NCCL_IB_GID_INDEX": "nodes.<node>.hca.gidIndex",
        "NCCL_SOCKET_IFNAME": "nodes.<node>.interface",
        "GLOO_SOCKET_IFNAME": "nodes.<node>.interface",
        "NCCL_IB_DISABLE": "nccl.ibDisable",
        "NCCL_DEBUG": "nccl.debug",
        "VLLM_HOST_IP": "nodes.<node>.address",
        "VLLM_TUNED_CONFIG_FOLDER": "pools.<pool>.vllm.moeConfigFiles",
        **{
            name: "pools.<pool>.offline"
            for name in (
                "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE",
                "VLLM_NO_USAGE_STATS",
                "DO_NOT_TRACK",
                "RAY_USAGE_STATS_ENABLED",
                "LLAMA_ARG_OFFLINE",
            )
        },
    }


@pytest.mark.parametrize("name", ["toy", "VLLM", ""])
def test_engine_for_an_unregistered_engine_names_the_known_ones_sorted(name: str) -> None:
    with pytest.raises(KeyError) as err:
        registry.engine_for(SimpleNamespace(engine=name))  # type: ignore[arg-type]
    assert err.value.args == (f"engine {name!r} has no planning module; known: llamacpp, lmdeploy, vllm",)


def node_env(node: str, pool: str = "chat") -> dict[str, str]:
    """The keys of the environment every engine's containers get from typed keys, on `node` of `pool`."""
    return {
        "NCCL_IB_HCA": f"nodes.{node}.hca.device",
        "NCCL_IB_GID_INDEX": f"nodes.{node}.hca.gidIndex",
        "NCCL_SOCKET_IFNAME": f"nodes.{node}.interface",
        "GLOO_SOCKET_IFNAME": f"nodes.{node}.interface",
        "NCCL_IB_DISABLE": "nccl.ibDisable",
        "NCCL_DEBUG": "nccl.debug",
        "VLLM_HOST_IP": f"nodes.{node}.address",
        "VLLM_TUNED_CONFIG_FOLDER": f"pools.{pool}.vllm.moeConfigFiles",
        "HF_HUB_OFFLINE": f"pools.{pool}.offline",
        "TRANSFORMERS_OFFLINE": f"pools.{pool}.offline",
        "VLLM_NO_USAGE_STATS": f"pools.{pool}.offline",
        "DO_NOT_TRACK": f"pools.{pool}.offline",
        "RAY_USAGE_STATS_ENABLED": f"pools.{pool}.offline",
        "LLAMA_ARG_OFFLINE": f"pools.{pool}.offline",
    }


def vllm_typed(pool: str, model: str, node: str) -> dict[str, str]:
    """The stack keys of vLLM's typed flags for a pool of `model` on `node`."""
    return {
        "--model": f"models.{model}.path",
        "--served-model-name": f"models.{model}.servedNames",
        "--host": f"nodes.{node}.address",
        "--port": f"pools.{pool}.port",
        "--tensor-parallel-size": f"pools.{pool}.tensorParallel",
        "--pipeline-parallel-size": f"pools.{pool}.pipelineParallel",
        "--distributed-executor-backend": f"pools.{pool}.pipelineParallel",
        "--dtype": f"models.{model}.dtype",
        "--quantization": f"models.{model}.quantization",
        "--trust-remote-code": f"models.{model}.trustRemoteCode",
        "--max-model-len": f"pools.{pool}.vllm.maxModelLen",
        "--max-num-seqs": f"pools.{pool}.vllm.maxNumSeqs",
        "--gpu-memory-utilization": f"pools.{pool}.vllm.gpuMemoryUtilization",
        "--max-num-batched-tokens": f"pools.{pool}.vllm.maxNumBatchedTokens",
        "--kv-cache-dtype": f"pools.{pool}.vllm.kvCacheDtype",
        "--block-size": f"pools.{pool}.vllm.blockSize",
        "--swap-space": f"pools.{pool}.vllm.swapSpaceGib",
        "--enable-prefix-caching": f"pools.{pool}.vllm.enablePrefixCaching",
        "--enable-chunked-prefill": f"pools.{pool}.vllm.enableChunkedPrefill",
        "--enforce-eager": f"pools.{pool}.vllm.enforceEager",
        "--attention-backend": f"pools.{pool}.vllm.attentionBackend",
        "--nnodes": f"pools.{pool}.vllm.multiNode",
        "--node-rank": f"pools.{pool}.vllm.multiNode",
        "--headless": f"pools.{pool}.vllm.multiNode",
        "--master-addr": f"pools.{pool}.vllm.multiNode",
        "--master-port": f"pools.{pool}.vllm.masterPort",
    }


def vllm_chat(*, extra_args: list[str], env: dict[str, str], nccl_env: dict[str, str]) -> dict[str, Any]:
    """The reference stack with its chat pool given extraArgs and env, and nccl.extraEnv."""
    config = prod_config()
    config["llm-cluster:pools"]["chat"]["vllm"]["extraArgs"] = extra_args
    config["llm-cluster:pools"]["chat"]["env"] = env
    config["llm-cluster:nccl"]["extraEnv"] = nccl_env
    return config


def test_stack_keys_of_a_vllm_pool_with_extra_args_nccl_and_pool_env() -> None:
    spec = spec_of(
        vllm_chat(
            # A flag given twice keeps its first index; a value ("7") and `--x=v` are read as vLLM reads them.
            extra_args=["--seed", "7", "--max-logprobs=5", "--seed", "8", "-O3"],
            # The pool's env wins over nccl.extraEnv for a name in both.
            env={"NCCL_P2P_LEVEL": "SYS", "VLLM_LOGGING_LEVEL": "DEBUG"},
            nccl_env={"NCCL_P2P_LEVEL": "NVL", "NCCL_ALGO": "Ring"},
        )
    )
    keys = registry.stack_keys(spec, "chat", "gpu-05")
    assert keys == {
        **vllm_typed("chat", "qwen3-30b-a3b", "gpu-05"),
        **node_env("gpu-05"),
        "--seed": "pools.chat.vllm.extraArgs[0] (given in extraArgs)",
        "--max-logprobs": "pools.chat.vllm.extraArgs[2] (given in extraArgs)",
        "-O3": "pools.chat.vllm.extraArgs[5] (given in extraArgs)",
        "NCCL_P2P_LEVEL": "pools.chat.env.NCCL_P2P_LEVEL",
        "NCCL_ALGO": "nccl.extraEnv.NCCL_ALGO",
        "VLLM_LOGGING_LEVEL": "pools.chat.env.VLLM_LOGGING_LEVEL",
        "image vllm/vllm-openai:v0.19.1": "pools.chat.image",
        "*env": "pools.chat.env",
    }
    assert list(keys)[-2:] == ["image vllm/vllm-openai:v0.19.1", "*env"]


def test_stack_keys_of_the_reference_pool_name_the_node_asked_for() -> None:
    keys = registry.stack_keys(spec_of(prod_config()), "reasoning", "gpu-02")
    assert keys == {
        **vllm_typed("reasoning", "deepseek-r1", "gpu-02"),
        **node_env("gpu-02", "reasoning"),
        "VLLM_MLA_DISABLE": "pools.reasoning.env.VLLM_MLA_DISABLE",
        "image vllm/vllm-openai:v0.19.1": "pools.reasoning.image",
        "*env": "pools.reasoning.env",
    }


def test_stack_keys_of_an_lmdeploy_pool() -> None:
    keys = registry.stack_keys(spec_of(lmdeploy_config(extraArgs=["--log-level", "INFO"])), "chat", "gpu-04")
    assert keys == {
        "--backend": "pools.chat.engine (TurboMind is what the facts and capacity describe)",
        "--model-name": "models.qwen3-30b-a3b.servedNames",
        "--server-name": "nodes.gpu-04.address",
        "--server-port": "pools.chat.port",
        "--tp": "pools.chat.tensorParallel",
        "--dtype": "models.qwen3-30b-a3b.dtype",
        "--model-format": "models.qwen3-30b-a3b.quantization",
        "--session-len": "pools.chat.lmdeploy.sessionLen",
        "--max-batch-size": "pools.chat.lmdeploy.maxBatchSize",
        "--cache-max-entry-count": "pools.chat.lmdeploy.cacheMaxEntryCount",
        "--cache-block-seq-len": "pools.chat.lmdeploy.cacheBlockSeqLen",
        "--max-prefill-token-num": "pools.chat.lmdeploy.maxPrefillTokenNum",
        "--quant-policy": "pools.chat.lmdeploy.quantPolicy",
        "--enable-prefix-caching": "pools.chat.lmdeploy.enablePrefixCaching",
        "--trust-remote-code": "models.qwen3-30b-a3b.trustRemoteCode",
        "--nnodes": "pools.chat.pipelineParallel (lmdeploy pools run on one node)",
        "--node-rank": "pools.chat.pipelineParallel (lmdeploy pools run on one node)",
        "--disable-metrics": "monitoring (its Prometheus scrapes every server's /metrics)",
        **node_env("gpu-04"),
        "--log-level": "pools.chat.lmdeploy.extraArgs[0] (given in extraArgs)",
        "image openmmlab/lmdeploy:v0.16.0-cu12.8": "pools.chat.image",
        "*env": "pools.chat.env",
    }


def test_stack_keys_of_a_llamacpp_pool() -> None:
    keys = registry.stack_keys(spec_of(llamacpp_config(extraArgs=["--seed", "3", "-s", "4"])), "chat", "gpu-06")
    assert keys == {
        "--model": "pools.chat.llamacpp.ggufFile",
        "--alias": "models.qwen3-30b-a3b.servedNames",
        "--host": "nodes.gpu-06.address",
        "--port": "pools.chat.port",
        "--n-gpu-layers": "pools.chat.tensorParallel (every layer is offloaded)",
        "--split-mode": "pools.chat.llamacpp.splitMode",
        "--ctx-size": "pools.chat.llamacpp.contextPerSlot",
        "--parallel": "pools.chat.llamacpp.parallel",
        "--flash-attn": "pools.chat.llamacpp.flashAttention",
        "--cache-type-k": "pools.chat.llamacpp.cacheType",
        "--cache-type-v": "pools.chat.llamacpp.cacheType",
        "--fit": "pools.chat.llamacpp (the product sets --fit off: what the plan sizes is what starts)",
        "--metrics": "monitoring (the product turns metrics on)",
        "--jinja": "pools.chat.llamacpp",
        "--rpc": "pools.chat.pipelineParallel (the RPC backend is refused: fragile and insecure upstream)",
        "--threads": "nodes.gpu-06.cpuCores (split between the node's serving instances)",
        **node_env("gpu-06"),
        "--seed": "pools.chat.llamacpp.extraArgs[0] (given in extraArgs)",
        "-s": "pools.chat.llamacpp.extraArgs[2] (given in extraArgs)",
        "image ghcr.io/ggml-org/llama.cpp:server-cuda-b11312": "pools.chat.image",
        "*env": "pools.chat.env",
    }
