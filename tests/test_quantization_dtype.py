"""quantization-dtype: the activation dtype against what the quantization method accepts in the image's vLLM
(VllmConfig._get_quantization_config refuses the rest at startup). The table runs every method x dtype x version
the facts list, its expectation read from the version's dump (components/engines/vllm/data), not from the facts
that load it; the pack-level cases pin the exact messages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components.engines.vllm.facts import IMAGES, known_images
from components.engines.vllm.launch import model_server_launch
from components.engines.vllm.rules import hardware
from components.engines.vllm.rules.hardware import check_quantization_dtype
from components.facts.hardware import DTYPE_ALIASES, GPUS
from components.facts.models import MODELS
from plan.harness import ProgramRun
from tests.support.policies import DESCRIPTIONS, model_server, only, server

DATA = Path(__file__).resolve().parents[1] / "components/engines/vllm/data"
VERSIONS = {f.version: f for f in known_images() if f.engine == "vllm" and not f.variant}
DTYPES = ("half", "float16", "bfloat16", "float", "float32")
A100 = "NVIDIA A100-SXM4-80GB"


def _dump(version: str) -> dict[str, Any]:
    return json.loads((DATA / f"vllm-{version}-quantizations.json").read_text())


def _gpu_for(capability: int | None) -> str | None:
    """The smallest known GPU that has the capability (None: none does, the GPU stays unknown)."""
    fit = sorted(
        (g.capability, name) for name, g in GPUS.items() if capability is not None and g.capability >= capability
    )
    return fit[0][1] if fit else None


def _props(version: str, method: str, dtype: str, gpu: str | None) -> dict[str, Any]:
    props = server(image=VERSIONS[version].ref, quantization=method, gpuModel=gpu)
    props["argv"] = [t if t != "half" else dtype for t in props["argv"]] + ["--quantization", method]
    return props


CASES = [
    (version, method, dtype)
    for version in sorted(VERSIONS)
    for method, capability in sorted(_dump(version)["methods"].items())
    if capability is not None and method in _dump(version)["act_dtypes"]
    for dtype in DTYPES
]


def test_every_version_has_a_dump_and_every_cuda_method_its_dtypes() -> None:
    assert sorted(VERSIONS) == ["0.11.0", "0.19.1", "0.9.2"]
    for version, f in VERSIONS.items():
        dump = _dump(version)
        cuda = {m for m, c in dump["methods"].items() if c is not None}
        assert cuda <= set(dump["act_dtypes"]), version
        assert set(dump["act_dtypes"]) == set(dump["act_dtypes_source"]), version
        for m in cuda:
            assert f.quantizations[m].act_dtypes == tuple(dump["act_dtypes"][m]), (version, m)
    assert len(CASES) == 5 * sum(
        1 for v in VERSIONS for m, c in _dump(v)["methods"].items() if c is not None and m in _dump(v)["act_dtypes"]
    )


@pytest.mark.parametrize(("version", "method", "dtype"), CASES)
def test_each_method_takes_the_dtypes_its_version_lists_and_refuses_the_rest(
    version: str, method: str, dtype: str
) -> None:
    dump = _dump(version)
    gpu = _gpu_for(dump["methods"][method])
    capability = GPUS[gpu].capability if gpu else None
    accepted = dump["act_dtypes"][method]
    for cap, answer in dump["act_dtypes_by_capability"].get(method, {}).items():
        if capability is not None and capability >= int(cap):
            accepted = answer
    launch = model_server_launch(_props(version, method, dtype, gpu))
    assert launch is not None and launch.facts is VERSIONS[version]
    found = check_quantization_dtype(launch, {})
    if DTYPE_ALIASES[dtype] in accepted:
        assert found == [], (version, method, dtype)
    else:
        assert len(found) == 1, (version, method, dtype)
        assert f'"torch.{DTYPE_ALIASES[dtype]} is not supported for quantization method {method}. ' in found[0]
        assert f"Supported dtypes: [{', '.join('torch.' + d for d in accepted)}]" in found[0]


def test_facts_the_sources_state_for_plain_gptq_and_awq_in_every_version() -> None:
    """Pinned as quantization/gptq.py and awq.py return them (torch.half only), not read back from the dumps."""
    for f in VERSIONS.values():
        assert f.quantizations["gptq"].act_dtypes == ("float16",), f.version
        assert f.quantizations["awq"].act_dtypes == ("float16",), f.version
        assert f.quantizations["gptq_marlin"].act_dtypes == ("float16", "bfloat16"), f.version
    assert (
        VERSIONS["0.19.1"].quantizations["gptq"].act_dtypes_source
        == "vllm/model_executor/layers/quantization/gptq.py:130"
    )
    assert (
        VERSIONS["0.9.2"].quantizations["gptq"].act_dtypes_source
        == "vllm/model_executor/layers/quantization/gptq.py:88"
    )
    # gguf.py:62-68 of 0.19.1: no bfloat16 from sm_100 (Blackwell).
    gguf = VERSIONS["0.19.1"].quantizations["gguf"]
    assert gguf.supported_act_dtypes(90) == ("float16", "bfloat16", "float32")
    assert gguf.supported_act_dtypes(100) == gguf.supported_act_dtypes(120) == ("float16", "float32")


def test_the_0_9_2_dump_agrees_with_the_capabilities_read_from_its_sdist() -> None:
    dumped = _dump("0.9.2")["methods"]
    assert {m: q.min_capability for m, q in VERSIONS["0.9.2"].quantizations.items()} == dumped


GPTQ_BF16 = (
    "--quantization gptq with --dtype bfloat16: vLLM 0.19.1 runs gptq in float16 only, so it stops at startup "
    '("torch.bfloat16 is not supported for quantization method gptq. Supported dtypes: [torch.float16]"; vLLM 0.19.1 '
    "config/vllm.py:522-527 (VllmConfig._get_quantization_config, from __post_init__ :702); each method's dtypes: "
    "components/engines/vllm/data/vllm-0.19.1-quantizations.json [read from code]; get_supported_act_dtypes of gptq: "
    "quantization/gptq.py:130). Instead, set models.qwen3-30b-a3b.dtype: half."
)


def test_gptq_with_bfloat16_is_refused_on_an_a100_with_vllms_own_message() -> None:
    assert model_server(_props("0.19.1", "gptq", "bfloat16", A100)) == only("quantization-dtype", GPTQ_BF16)
    assert model_server(_props("0.19.1", "gptq", "half", A100)) == []
    assert model_server(_props("0.19.1", "gptq_marlin", "bfloat16", A100)) == []


def test_gptq_with_bfloat16_on_a_v100_is_refused_by_both_rules() -> None:
    found = model_server(_props("0.19.1", "gptq", "bfloat16", "Tesla V100-SXM2-32GB"))
    assert [f[0] for f in found] == ["gpu-dtype", "quantization-dtype"]
    assert found[1] == only("quantization-dtype", GPTQ_BF16)[0]


def test_the_rule_is_mandatory_right_after_gpu_quantization() -> None:
    names = list(DESCRIPTIONS)
    assert names[names.index("gpu-quantization") + 1] == "quantization-dtype"
    found = model_server(_props("0.19.1", "awq", "float16", A100), config={"quantization-dtype": "advisory"})
    assert found == []
    found = model_server(_props("0.19.1", "awq", "bfloat16", A100), config={"quantization-dtype": "advisory"})
    assert [f[:2] for f in found] == [("quantization-dtype", "advisory")]
    found = model_server(_props("0.19.1", "awq", "bfloat16", A100))
    assert [f[:2] for f in found] == [("quantization-dtype", "mandatory")]


def test_float32_with_plain_gptq_is_refused_even_where_float32_is_allowed() -> None:
    props = _props("0.9.2", "gptq", "float32", A100)
    found = model_server(props, config={"gpu-dtype": {"allowFloat32": True}})
    mine = [f for f in found if f[0] == "quantization-dtype"]
    assert "gpu-dtype" not in [f[0] for f in found] and len(mine) == 1
    assert mine[0][2].endswith(
        '("torch.float32 is not supported for quantization method gptq. Supported dtypes: [torch.float16]"; vLLM 0.9.2 '
        "config.py:4479-4484 (VllmConfig._get_quantization_config, from __post_init__ :4538); each method's dtypes: "
        "components/engines/vllm/data/vllm-0.9.2-quantizations.json [read from code]; get_supported_act_dtypes of "
        "gptq: quantization/gptq.py:88). Instead, set models.qwen3-30b-a3b.dtype: half."
    )


def _launch(**changes: Any) -> Any:
    argv_dtype = changes.pop("dtype", "half")
    props = server(**changes)
    props["argv"] = [t if t != "half" else argv_dtype for t in props["argv"]]
    launch = model_server_launch(props)
    assert launch is not None
    return launch


def test_auto_is_float16_below_sm80_and_the_checkpoints_own_dtype_above() -> None:
    gptq = ["--quantization", "gptq"]
    # V100: auto resolves to float16, which gptq takes.
    assert check_quantization_dtype(_launch(quantization="gptq", dtype="auto", argv_add=gptq), {}) == []
    # A100: auto is config.json's dtype (float16 or bfloat16): not known here, so not refused.
    assert check_quantization_dtype(_launch(quantization="gptq", dtype="auto", gpuModel=A100, argv_add=gptq), {}) == []
    # Unknown GPU and auto: nothing to judge.
    assert check_quantization_dtype(_launch(quantization="gptq", dtype="auto", gpuModel=None, argv_add=gptq), {}) == []


def test_auto_on_a_model_type_that_refuses_float16_is_float32_below_sm80(monkeypatch: pytest.MonkeyPatch) -> None:
    gemma = MODELS["qwen3-30b-a3b"].__class__(**{**MODELS["qwen3-30b-a3b"].__dict__, "model_type": "gemma2"})
    monkeypatch.setattr(hardware, "model_arch_or_none", lambda name: gemma)
    gptq = ["--quantization", "gptq"]
    found = check_quantization_dtype(_launch(quantization="gptq", dtype="auto", argv_add=gptq), {})
    assert len(found) == 1
    assert found[0].startswith(
        "--quantization gptq with --dtype auto (float32 on Tesla V100-SXM2-32GB (sm_70): model type gemma2 refuses "
        "float16): vLLM 0.19.1 runs gptq in float16 only"
    )
    # No dtype gptq takes runs for gemma2 on a V100 (float16 refused by the model type, bfloat16 by the GPU).
    assert found[0].endswith(
        "Instead, no dtype gptq accepts runs here: serve a checkpoint in a method that accepts float32."
    )
    # From sm_80 auto is bfloat16 for such a model: gptq still refuses it, gptq_marlin takes it.
    a100 = _launch(quantization="gptq", dtype="auto", gpuModel=A100, argv_add=gptq)
    assert "torch.bfloat16 is not supported for quantization method gptq" in check_quantization_dtype(a100, {})[0]


def test_a_checkpoint_without_the_flag_is_judged_with_the_marlin_kernel_vllm_swaps_in() -> None:
    # A GPTQ checkpoint and no --quantization: on sm_75+ (0.19.1) vLLM may run it as gptq_marlin, which takes bf16.
    assert check_quantization_dtype(_launch(quantization="gptq", dtype="bfloat16", gpuModel=A100), {}) == []
    # Neither gptq nor gptq_marlin takes float32.
    found = check_quantization_dtype(_launch(quantization="gptq", dtype="float32", gpuModel=A100), {})
    assert found == [
        "the checkpoint's quantization gptq (models.qwen3-30b-a3b.quantization) with --dtype float32: vLLM 0.19.1 "
        "runs gptq in float16 only and gptq_marlin in float16, bfloat16 only (vLLM swaps in gptq_marlin for the "
        "checkpoint when --quantization is unset), so it stops at startup "
        '("torch.float32 is not supported for quantization method gptq. Supported dtypes: [torch.float16]" or '
        '"torch.float32 is not supported for quantization method gptq_marlin. Supported dtypes: [torch.float16, '
        'torch.bfloat16]"; vLLM 0.19.1 config/vllm.py:522-527 (VllmConfig._get_quantization_config, from '
        "__post_init__ :702); each method's dtypes: components/engines/vllm/data/vllm-0.19.1-quantizations.json "
        "[read from code]; get_supported_act_dtypes of gptq: quantization/gptq.py:130, gptq_marlin: "
        "quantization/gptq_marlin.py:179). Instead, set models.qwen3-30b-a3b.dtype: half."
    ]
    # Below Marlin's capability (0.9.2: sm_80) the checkpoint stays plain gptq: bf16 is refused (by gpu-dtype too).
    t4 = _launch(
        quantization="gptq", dtype="bfloat16", gpuModel="Tesla T4", image=IMAGES["vllm/vllm-openai:v0.9.2"].ref
    )
    assert "torch.bfloat16 is not supported for quantization method gptq." in check_quantization_dtype(t4, {})[0]


def test_a_method_below_its_capability_is_left_to_gpu_quantization() -> None:
    awq = ["--quantization", "awq"]
    assert check_quantization_dtype(_launch(quantization="awq", dtype="float32", argv_add=awq), {}) == []


def test_the_reference_stack_runs_gptq_in_half_and_passes(prod_run: ProgramRun) -> None:
    servers = prod_run.by_type("llm-cluster:vllm:ModelServer")
    gptq = [s for s in servers if s.inputs.get("quantization") == "gptq"]
    assert gptq, "the reference stack has a GPTQ pool"
    for s in servers:
        launch = model_server_launch(s.inputs)
        assert launch is not None
        assert check_quantization_dtype(launch, {}) == []
    for s in gptq:
        argv = list(s.inputs["argv"])
        assert argv[argv.index("--dtype") + 1] == "half"
