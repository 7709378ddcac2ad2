"""What the stack model reads of a model: its architecture (catalog or config.json), the checkpoint's
quantization, its context window and the dtype a GPU runs; each for every shape of config.json it meets,
unreadable ones included (a clear error naming the stack key, never a traceback)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from components.spec.models import (
    checkpoint_quantization,
    context_window_dict,
    model_architecture,
    quantization_config,
    resolved_dtype,
)
from tests.conftest import prod_config

NS = "llm-cluster:"
QWEN = "qwen3-30b-a3b"
# Qwen3-30B-A3B's config.json, the fields the planner reads.
CONFIG: dict[str, Any] = {
    "_name_or_path": "Qwen/Qwen3-30B-A3B",
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def spec_reading(tmp_path: Path, cfg: dict[str, Any] | None = None) -> tuple[StackSpec, Path]:
    """The reference stack with the chat model read from a config.json (the file may change afterwards)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg or {**CONFIG, "quantization_config": GPTQ}))
    config = prod_config()
    model = config[NS + "models"][QWEN]
    model.pop("arch")
    model.update(configJson=str(path), quantization="gptq")
    return load_stack_config(config, set()), path


def test_a_catalog_model_has_no_checkpoint_file_to_read(tmp_path: Path) -> None:
    spec, _ = spec_reading(tmp_path)
    assert model_architecture(spec, "deepseek-r1").model_type == "deepseek_v3"
    assert checkpoint_quantization(spec, "deepseek-r1") is None
    assert quantization_config(spec, "deepseek-r1") is None
    assert context_window_dict(spec, "deepseek-r1") == {
        "tokens": 163840,
        "derivedFrom": "rope_scaling yarn: original_max_position_embeddings=4096 x factor 40",
        "ropeScaled": True,
    }


def test_an_unknown_catalog_name_names_the_key(tmp_path: Path) -> None:
    spec, _ = spec_reading(tmp_path)
    spec.models["deepseek-r1"].__dict__["arch"] = "deepseek-r9"  # past the spec's own check: the reader's message
    with pytest.raises(SpecError) as err:
        model_architecture(spec, "deepseek-r1")
    assert [str(i) for i in err.value.issues] == [
        "models.deepseek-r1.arch: unknown model 'deepseek-r9'; known: deepseek-r1, deepseek-r1-distill-qwen-32b, "
        "deepseek-v3, gpt-oss-120b, kimi-k2, llama-3.1-405b, llama-3.3-70b, qwen3-235b-a22b, qwen3-30b-a3b, "
        "qwen3-32b (or give the path of a config.json)"
    ]


# config.json as found -> (checkpoint_quantization, quantization_config, context_window_dict)
SHAPES: list[tuple[str, dict[str, Any], str | None, dict[str, object] | None, dict[str, object] | None]] = [
    (
        "GPTQ at the top, every key the converters check kept, other values left out",
        {**CONFIG, "quantization_config": {**GPTQ, "version": None, "modules": ["a"], "damp_percent": 0.01}},
        "gptq",
        GPTQ,
        {"tokens": 40960, "derivedFrom": "max_position_embeddings=40960", "ropeScaled": False},
    ),
    (
        "AWQ with its version",
        {**CONFIG, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}},
        "awq",
        {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"},
        {"tokens": 40960, "derivedFrom": "max_position_embeddings=40960", "ropeScaled": False},
    ),
    (
        "nested under text_config (multimodal wrappers)",
        {
            "_name_or_path": "Qwen/Qwen3-30B-A3B",
            "model_type": "qwen3_moe",
            "text_config": {**CONFIG, "quantization_config": GPTQ},
        },
        "gptq",
        GPTQ,
        {"tokens": 40960, "derivedFrom": "max_position_embeddings=40960", "ropeScaled": False},
    ),
    (
        "no quantization_config, yarn-scaled length",
        {
            **CONFIG,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        },
        None,
        None,
        {
            "tokens": 131072,
            "derivedFrom": "rope_scaling yarn: original_max_position_embeddings=32768 x factor 4",
            "ropeScaled": True,
        },
    ),
    (
        "a quantization_config that is no object, no stated length",
        {**{k: v for k, v in CONFIG.items() if k != "max_position_embeddings"}, "quantization_config": "gptq"},
        None,
        None,
        None,
    ),
]


@pytest.mark.parametrize(("shape", "cfg", "method", "qconfig", "window"), SHAPES, ids=[s[0] for s in SHAPES])
def test_what_is_read_of_each_config_json_shape(
    tmp_path: Path,
    shape: str,
    cfg: dict[str, Any],
    method: str | None,
    qconfig: dict[str, object] | None,
    window: dict[str, object] | None,
) -> None:
    spec, path = spec_reading(tmp_path)
    path.write_text(json.dumps(cfg))
    arch = model_architecture(spec, QWEN)
    assert (arch.name, arch.hf_id, arch.model_type) == (QWEN, "Qwen/Qwen3-30B-A3B", "qwen3_moe"), shape
    assert checkpoint_quantization(spec, QWEN) == method
    assert quantization_config(spec, QWEN) == qconfig
    assert context_window_dict(spec, QWEN) == window


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        ("[1, 2]", "holds a JSON list, not an object"),
        ('"config"', "holds a JSON str, not an object"),
        (None, "[Errno 2] No such file or directory: '{path}'"),
    ],
)
def test_an_unreadable_config_json_is_a_spec_error_naming_the_key(tmp_path: Path, text: str | None, why: str) -> None:
    spec, path = spec_reading(tmp_path)
    if text is None:
        path.unlink()
    else:
        path.write_text(text)
    with pytest.raises(SpecError) as err:
        model_architecture(spec, QWEN)
    assert [str(i) for i in err.value.issues] == [
        f"models.{QWEN}.configJson: cannot read {path}: {why.format(path=path)}"
    ]
    # The readers of the checkpoint's quantization leave the report to model_architecture.
    assert checkpoint_quantization(spec, QWEN) is None
    assert quantization_config(spec, QWEN) is None


def test_a_config_json_that_is_no_object_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[]")
    config = prod_config()
    model = config[NS + "models"][QWEN]
    model.pop("arch")
    model["configJson"] = str(path)
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    assert f"models.{QWEN}.configJson: cannot read {path}: holds a JSON list, not an object" in [
        str(i) for i in err.value.issues
    ]


@pytest.mark.parametrize(
    ("dtype", "below_sm80", "from_sm80"),
    [
        ("auto", "float16", "bfloat16"),
        ("half", "float16", "float16"),
        ("float16", "float16", "float16"),
        ("bfloat16", "bfloat16", "bfloat16"),
        ("float", "float32", "float32"),
        ("float32", "float32", "float32"),
    ],
)
def test_resolved_dtype_on_both_sides_of_sm80(dtype: str, below_sm80: str, from_sm80: str) -> None:
    assert [resolved_dtype(dtype, cap) for cap in (70, 79, 80, 90)] == [below_sm80, below_sm80, from_sm80, from_sm80]
