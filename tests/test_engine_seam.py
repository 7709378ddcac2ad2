"""The engine seam: engine_for, the interface every caller uses, and the image facts table."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from components.engines.base import Engine, container_name, server_container_name
from components.engines.registry import ENGINES, engine_for
from components.engines.vllm.engine import TUNED_CONFIG_DIR, moe_configs
from components.engines.vllm.facts import IMAGES, ImageFacts, declared_facts, image_facts, known_images
from components.facts.evidence import Evidence
from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from components.spec.topology import instances


def test_engine_for_picks_the_pools_engine(prod_spec: StackSpec) -> None:
    engine = engine_for(prod_spec.pools["chat"])
    assert engine is ENGINES["vllm"] and isinstance(engine, Engine)
    assert (engine.health_path, engine.ready_path, engine.metrics_path) == ("/health", "/health", "/metrics")
    assert (engine.multi_node, engine.multi_gpu) == ("ray", ("tensor", "pipeline"))


def test_the_server_container_is_the_engines_own_or_the_ray_head(prod_spec: StackSpec) -> None:
    engine = ENGINES["vllm"]
    chat, ray = instances(prod_spec, "chat")[0], instances(prod_spec, "reasoning")[0]
    assert server_container_name(engine, chat) == container_name(chat, engine.server_role) == "vllm-chat-gpu-03"
    assert server_container_name(engine, ray) == "ray-head-reasoning-gpu-01"


def test_every_image_fact_names_its_source_and_evidence() -> None:
    identity = {"engine", "version", "repo", "tag", "variant", "sources", "note"}
    for facts in known_images():
        for f in fields(ImageFacts):
            if f.name not in identity:
                src = facts.source(f.name)
                assert src.source and isinstance(src.evidence, Evidence), (facts.ref, f.name)


def test_facts_without_a_source_are_refused() -> None:
    base = IMAGES["vllm/vllm-openai:v0.19.1"]
    with pytest.raises(ValueError, match=r"image facts vllm/vllm-openai:v0.19.1: no source for triton$"):
        ImageFacts(
            **{
                **{f.name: getattr(base, f.name) for f in fields(ImageFacts)},
                "sources": {k: v for k, v in base.sources.items() if k != "triton"},
            }
        )


def test_image_refs_are_found_with_registry_prefix_and_digest() -> None:
    assert image_facts("docker.io/vllm/vllm-openai:v0.19.1@sha256:" + "0" * 64) is IMAGES["vllm/vllm-openai:v0.19.1"]
    assert image_facts("vllm/vllm-openai:v0.19.0") is None and image_facts(None) is None


def test_the_ubuntu2404_variant_has_no_volta_kernels_and_the_plain_tag_has() -> None:
    plain, ub = IMAGES["vllm/vllm-openai:v0.19.1"], IMAGES["vllm/vllm-openai:v0.19.1-ubuntu2404"]
    assert plain.torch_runs_on(70) and not ub.torch_runs_on(70) and not ub.torch_runs_on(80)
    assert ub.source("torch_arch_list").evidence is Evidence.CODE
    assert plain.source("torch_arch_list").evidence is Evidence.UNVERIFIED


def test_v0_9_2_facts_say_why_it_dies_on_volta() -> None:
    f = IMAGES["vllm/vllm-openai:v0.9.2"]
    assert not f.torch_runs_on(70) and f.triton_fp16_dot(70) is False and f.triton_fp16_dot(80) is True
    assert f.quantizations["gptq"].moe == "none" and f.quantizations["moe_wna16"].min_capability == 70
    assert (f.engine_line, f.reads_vllm_use_v1, f.runs_v1(70), f.attention_backend(70)) == (
        "V0",
        True,
        False,
        "XFORMERS",
    )
    v19 = IMAGES["vllm/vllm-openai:v0.19.1"]
    assert (v19.reads_vllm_use_v1, v19.runs_v1(70), v19.attention_backend(70), v19.attention_backend(90)) == (
        False,
        True,
        "TRITON_ATTN",
        "FLASH_ATTN",
    )
    assert v19.quantizations["gptq"].moe == "moe_wna16" and v19.triton_fp16_dot(70) is True


def test_a_declared_image_is_its_base_with_the_declared_facts_unverified() -> None:
    f = declared_facts(
        "registry.local/vllm-volta:0.19.1-cu126",
        "vllm/vllm-openai:v0.19.1",
        {"torch": "2.10.0+cu126", "torch_arch_list": (70, 80)},
        "pools.chat.imageFacts",
    )
    assert (f.repo, f.tag, f.torch, f.torch_arch_list, f.triton) == (
        "registry.local/vllm-volta",
        "0.19.1-cu126",
        "2.10.0+cu126",
        (70, 80),
        "3.6.0",
    )
    assert (
        f.source("torch").evidence is Evidence.UNVERIFIED
        and f.source("torch").source == "declared by pools.chat.imageFacts"
    )
    assert f.source("triton") == IMAGES["vllm/vllm-openai:v0.19.1"].source("triton")


@pytest.mark.parametrize(
    ("ref", "repo", "tag", "as_written"),
    [
        ("registry.local/vllm-volta:v1", "registry.local/vllm-volta", "v1", "registry.local/vllm-volta:v1"),
        ("registry.local/vllm-volta", "registry.local/vllm-volta", "", "registry.local/vllm-volta"),
        ("registry.local:5000/vllm-volta", "registry.local:5000/vllm-volta", "", "registry.local:5000/vllm-volta"),
        (
            "registry.local:5000/vllm-volta:v1",
            "registry.local:5000/vllm-volta",
            "v1",
            "registry.local:5000/vllm-volta:v1",
        ),
        ("docker.io/library/vllm-volta:v1@sha256:" + "0" * 64, "vllm-volta", "v1", "vllm-volta:v1"),
    ],
)
def test_a_declared_images_reference_keeps_its_registry_port_and_names_no_empty_tag(
    ref: str, repo: str, tag: str, as_written: str
) -> None:
    f = declared_facts(ref, "vllm/vllm-openai:v0.19.1", {}, "pools.chat.imageFacts")
    assert (f.repo, f.tag, f.ref) == (repo, tag, as_written)
    assert f.note == "declared by pools.chat.imageFacts, based on vllm/vllm-openai:v0.19.1"


def _with_chat(config: dict[str, Any], **vllm: Any) -> StackSpec:
    config["llm-cluster:pools"]["chat"]["vllm"].update(vllm)
    return load_stack_config(config, set())


def test_moe_configs_are_uploaded_and_named_by_the_images_env(config: dict[str, Any], tmp_path: Path) -> None:
    name = "E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json"
    (tmp_path / name).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64}}))
    config["llm-cluster:pools"]["chat"]["image"] = "vllm/vllm-openai:v0.19.1"
    spec = _with_chat(config, moeConfigFiles=[str(tmp_path / name)])
    inst = instances(spec, "chat")[0]
    engine = engine_for(spec.pools["chat"])
    [upload] = engine.uploads(spec, inst)
    assert upload.path == f"{TUNED_CONFIG_DIR}/{name}" and json.loads(upload.content)["1"]["BLOCK_SIZE_K"] == 64
    assert engine.serve_env(spec, inst, "gpu-03")["VLLM_TUNED_CONFIG_FOLDER"] == TUNED_CONFIG_DIR


def test_a_moe_config_misnamed_or_unreadable_names_the_stack_key(config: dict[str, Any], tmp_path: Path) -> None:
    # The spec refuses both when the stack loads (components.spec), the engine again when it reads them.
    (tmp_path / "v100.json").write_text("{}")
    with pytest.raises(SpecError, match=r"pools\.chat\.vllm\.moeConfigFiles\[0\]: 'v100.json' is not named as vLLM"):
        moe_configs(_with_chat(config, moeConfigFiles=[str(tmp_path / "v100.json")]), "chat")
    with pytest.raises(SpecError, match=r"moeConfigFiles\[0\]: cannot read a JSON tile config from"):
        moe_configs(
            _with_chat(config, moeConfigFiles=[str(tmp_path / "E=128,N=96,device_name=Tesla_V100-SXM2-32GB.json")]),
            "chat",
        )


METRICS_DIR = Path(__file__).parent / "fixtures" / "metrics"


def test_every_image_names_only_metrics_its_version_exports() -> None:
    """Monitoring reads metric names from the image facts: each must be in that version's exposition list."""
    lists = {"0.9.2": "vllm-0.9.2-v0.txt", "0.11.0": "vllm-0.11.0-v1.txt", "0.19.1": "vllm-0.19.1-v1.txt"}
    for facts in known_images():
        if facts.engine != "vllm":
            continue
        exported = {
            line.split()[0]
            for line in (METRICS_DIR / lists[facts.version]).read_text().splitlines()
            if line.strip() and not line.startswith("#")
        }
        assert set(facts.metrics.values()) <= exported, facts.ref
    v092, v191 = IMAGES["vllm/vllm-openai:v0.9.2"].metrics, IMAGES["vllm/vllm-openai:v0.19.1"].metrics
    assert (v092["kv_cache_usage"], v191["kv_cache_usage"]) == ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
    assert v191["time_per_output_token"] == "vllm:inter_token_latency_seconds"
