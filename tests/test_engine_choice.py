"""Engines by name: every engine the runbooks name is deployable or refused for the pool's GPU with its reason,
source and way out; each engine gets exactly its own options block and the model formats it loads."""

from __future__ import annotations

import pytest

from components.facts.other_engines import OTHER_ENGINES, refusal
from components.spec import SpecError
from tests.support.engine_stacks import engine_config, llamacpp_config, lmdeploy_config, spec_of


def _issues(config: dict) -> list[str]:
    with pytest.raises(SpecError) as err:
        spec_of(config)
    return [str(i) for i in err.value.issues]


def test_every_runbook_engine_is_known_by_name() -> None:
    assert set(OTHER_ENGINES) == {"sglang", "tgi", "tensorrt-llm", "triton", "deepspeed-mii", "xinference", "ollama"}


@pytest.mark.parametrize("engine", sorted(OTHER_ENGINES))
def test_other_engines_are_refused_on_v100_with_reason_source_and_way_out(engine: str) -> None:
    issues = _issues(engine_config(engine=engine))
    assert len(issues) == 1 and issues[0].startswith("pools.chat.engine: ")
    assert issues[0] == "pools.chat.engine: " + refusal(engine, 70, "Tesla V100-SXM2-32GB")
    assert "source: " in issues[0] and "nearest supported: engine: " in issues[0]


def test_sglang_on_v100_says_why_and_on_a100_says_the_project_does_not_deploy_it() -> None:
    v100 = refusal("sglang", 70, "Tesla V100-SXM2-32GB")
    assert v100.startswith(
        "SGLang does not run on Tesla V100-SXM2-32GB (sm_70): its model runner refuses: "
        '"SGLang only supports sm75 and above."'
    )
    a100 = refusal("sglang", 80, "NVIDIA A100-SXM4-80GB")
    assert a100.startswith(
        "SGLang runs on NVIDIA A100-SXM4-80GB (sm_80), but llm-cluster does not deploy it yet: use engine: vllm there"
    )
    assert refusal("tensorrt-llm", 70, "Tesla V100-SXM2-32GB").startswith(
        "TensorRT-LLM does not run on Tesla V100-SXM2-32GB (sm_70): Volta support was removed in 0.15"
    )
    assert refusal("ollama", 70, "x").startswith("Ollama is a single-node wrapper of llama.cpp")
    assert "engine: llamacpp" in refusal("ollama", 70, "x")


def test_an_engine_needs_its_own_options_block_and_no_other() -> None:
    missing = engine_config(engine="lmdeploy")
    assert any(
        "engine lmdeploy needs its options block `lmdeploy` (e.g. lmdeploy: {sessionLen: ...})" in i
        for i in _issues(missing)
    )
    stray = lmdeploy_config()
    stray["llm-cluster:pools"]["chat"]["vllm"] = {"maxModelLen": 4096}
    assert any("`vllm` options do not apply to engine lmdeploy; state `lmdeploy` instead" in i for i in _issues(stray))


def test_lmdeploy_and_llamacpp_pools_stay_on_one_node() -> None:
    config = lmdeploy_config()
    config["llm-cluster:pools"]["chat"].update(pipelineParallel=2)
    assert any(
        i.startswith("pools.chat.pipelineParallel: lmdeploy pools run on one node: TurboMind has no pipeline parallel")
        for i in _issues(config)
    )
    config = llamacpp_config()
    config["llm-cluster:pools"]["chat"].update(pipelineParallel=2, tensorParallel=8, replicasPerNode=1)
    assert any(
        "llama.cpp spans nodes only through its RPC backend" in i and "fragile and insecure" in i
        for i in _issues(config)
    )


def test_model_formats_must_be_ones_the_engine_loads() -> None:
    config = llamacpp_config()
    config["llm-cluster:models"]["qwen3-30b-a3b"].pop("quantization")
    assert (
        "models.qwen3-30b-a3b.quantization: pool 'chat' runs llama.cpp, which loads GGUF files only: set "
        "quantization: gguf (and the pool's llamacpp.ggufFile)" in _issues(config)
    )
    config = lmdeploy_config()
    config["llm-cluster:models"]["qwen3-30b-a3b"]["quantization"] = "gguf"
    assert any(
        i.startswith("models.qwen3-30b-a3b.quantization: 'gguf' is not a TurboMind model format")
        for i in _issues(config)
    )
    config = lmdeploy_config()
    config["llm-cluster:models"]["qwen3-30b-a3b"]["dtype"] = "float32"
    assert any(
        i.startswith("models.qwen3-30b-a3b.dtype: 'float32': TurboMind computes in float16 or bfloat16")
        for i in _issues(config)
    )


def test_valid_lmdeploy_and_llamacpp_pools_pass_the_spec() -> None:
    assert spec_of(lmdeploy_config()).pools["chat"].engine == "lmdeploy"
    assert spec_of(llamacpp_config()).pools["chat"].llamacpp.parallel == 4  # type: ignore[union-attr]
