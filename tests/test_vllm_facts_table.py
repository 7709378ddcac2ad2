"""vLLM's image facts (components.engines.vllm.facts): what each function answers over every image of the table
and every compute capability the hardware facts list, and the functions that build the table from the wheels'
dumps, called directly (the table itself is built at import, before a test runs)."""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from components.engines.vllm import facts
from components.engines.vllm.facts import (
    IMAGES,
    KV_CACHE_DTYPES,
    ImageFacts,
    QuantMethod,
    declared_facts,
    facts_for,
    image_facts,
    known_images,
    kv_cache_bytes,
    pool_image_facts,
)
from components.facts.evidence import code, unverified
from tests.conftest import prod_config
from tests.support.engine_stacks import spec_of

DATA = Path(__file__).resolve().parents[1] / "components/engines/vllm/data"
CAPABILITIES = (60, 70, 75, 80, 86, 89, 90, 100, 120)
V092, V0110, V0191, V0191_U = (
    "vllm/vllm-openai:v0.9.2",
    "vllm/vllm-openai:v0.11.0",
    "vllm/vllm-openai:v0.19.1",
    "vllm/vllm-openai:v0.19.1-ubuntu2404",
)

# image -> per capability of CAPABILITIES: (torch has kernels, fp16 tl.dot compiles, attention backend, runs V1).
PER_GPU = {
    V092: [
        (False, False, "XFORMERS", False),
        (False, False, "XFORMERS", False),
        (True, False, "XFORMERS", False),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (False, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
    ],
    V0110: [
        (False, False, "FLEX_ATTENTION", False),
        (True, True, "FLEX_ATTENTION", True),
        (True, True, "FLEX_ATTENTION", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (False, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
    ],
    V0191: [
        (False, False, "TRITON_ATTN", False),
        (True, True, "TRITON_ATTN", True),
        (True, True, "TRITON_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (False, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
    ],
    V0191_U: [
        (False, False, "TRITON_ATTN", False),
        (False, True, "TRITON_ATTN", True),
        (False, True, "TRITON_ATTN", True),
        (False, True, "FLASH_ATTN", True),
        (False, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
        (True, True, "FLASH_ATTN", True),
    ],
}


def test_the_table_in_its_stable_order() -> None:
    # Sorted by engine, version (as text), variant: stable whatever the table's order.
    assert [f.ref for f in known_images()] == [V0110, V0191, V0191_U, V092]
    assert list(IMAGES) == [V092, V0110, V0191, V0191_U]


@pytest.mark.parametrize("ref", list(PER_GPU))
def test_what_each_image_does_per_gpu(ref: str) -> None:
    f = IMAGES[ref]
    got = [(f.torch_runs_on(c), f.triton_fp16_dot(c), f.attention_backend(c), f.runs_v1(c)) for c in CAPABILITIES]
    assert got == PER_GPU[ref]


@pytest.mark.parametrize("triton", [None, "9.9.9"])
def test_an_image_whose_triton_is_not_in_the_table_compiles_nothing_known(triton: str | None) -> None:
    f = replace(IMAGES[V0191], triton=triton)
    assert (f.triton_facts, [f.triton_fp16_dot(c) for c in CAPABILITIES]) == (None, [None] * len(CAPABILITIES))


def test_an_image_without_v1_never_runs_it() -> None:
    f = replace(IMAGES[V092], v1_min_capability=None)
    assert [f.runs_v1(c) for c in CAPABILITIES] == [False] * len(CAPABILITIES)


@pytest.mark.parametrize(
    ("ref", "capability", "dtypes"),
    [
        # gguf in 0.19.1: bfloat16 only below sm_100 (GGUF's own kernels); the same from sm_100 and sm_120.
        (V0191, None, ("float16", "bfloat16", "float32")),
        (V0191, 90, ("float16", "bfloat16", "float32")),
        (V0191, 99, ("float16", "bfloat16", "float32")),
        (V0191, 100, ("float16", "float32")),
        (V0191, 119, ("float16", "float32")),
        (V0191, 120, ("float16", "float32")),
        (V0191_U, 100, ("float16", "float32")),
        # Without answers per GPU, the one list whatever the GPU.
        (V092, 100, ("float16", "bfloat16", "float32")),
        (V0110, 120, ("float16", "bfloat16", "float32")),
    ],
)
def test_gguf_act_dtypes_per_gpu(ref: str, capability: int | None, dtypes: tuple[str, ...]) -> None:
    assert IMAGES[ref].quantizations["gguf"].supported_act_dtypes(capability) == dtypes


@pytest.mark.parametrize("ref", list(PER_GPU))
def test_every_other_method_has_one_list_whatever_the_gpu(ref: str) -> None:
    methods = IMAGES[ref].quantizations
    for m, q in methods.items():
        if m != "gguf":
            assert q.act_dtypes_from == ()
            assert {q.supported_act_dtypes(c) for c in (None, *CAPABILITIES)} == {q.act_dtypes}, m


def test_act_dtypes_per_capability_are_tried_highest_first() -> None:
    q = QuantMethod(70, "native", ("float16",), "x.py:1", ((100, ("float32",)), (80, ("bfloat16",))))
    assert [q.supported_act_dtypes(c) for c in (None, 79, 80, 99, 100, 120)] == [
        ("float16",),
        ("float16",),
        ("bfloat16",),
        ("bfloat16",),
        ("float32",),
        ("float32",),
    ]


@pytest.mark.parametrize("version", ["0.9.2", "0.11.0", "0.19.1"])
def test_each_wheels_dump_is_read_from_its_own_file(version: str) -> None:
    dump = json.loads((DATA / f"vllm-{version}-quantizations.json").read_text())
    assert facts._dumped(version) == dump
    assert facts._dumped_capabilities(version) == dump["methods"]


def test_capabilities_dumped_from_the_wheels() -> None:
    caps = facts._dumped_capabilities("0.19.1")
    assert (caps["gptq_marlin"], caps["fp8"], caps["gguf"], len(caps)) == (75, 75, 60, 23)
    assert (facts._dumped_capabilities("0.11.0")["tpu_int8"], len(facts._dumped_capabilities("0.9.2"))) == (None, 29)


@pytest.mark.parametrize("ref", list(PER_GPU))
def test_every_methods_act_dtypes_are_its_wheels_dump(ref: str) -> None:
    f = IMAGES[ref]
    dump = json.loads((DATA / f"vllm-{f.version}-quantizations.json").read_text())
    for m, q in f.quantizations.items():
        assert (q.act_dtypes, q.act_dtypes_source) == (
            tuple(dump["act_dtypes"].get(m, ())),
            dump["act_dtypes_source"].get(m, ""),
        ), m


def test_with_act_dtypes_reads_a_dump(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    dump = {
        "methods": {"a": 70, "b": 80, "c": None},
        "act_dtypes": {"a": ["float16", "bfloat16"], "b": ["float16"]},
        "act_dtypes_source": {"a": "vllm/a.py:10", "c": "vllm/c.py:3"},
        # Capabilities as JSON keys (strings): "100" sorts before "90" as text, after it as a number.
        "act_dtypes_by_capability": {"a": {"90": ["float32"], "100": ["float16"], "80": ["bfloat16"]}},
    }
    (tmp_path / "vllm-9.9-quantizations.json").write_text(json.dumps(dump))
    monkeypatch.setattr(facts, "_DATA", tmp_path)
    methods = {"a": QuantMethod(70, "native"), "b": QuantMethod(80, "none"), "c": QuantMethod(None, "moe_wna16")}
    got = facts._with_act_dtypes(methods, "9.9")
    assert isinstance(got, MappingProxyType)
    assert dict(got) == {
        "a": QuantMethod(
            70,
            "native",
            ("float16", "bfloat16"),
            "vllm/a.py:10",
            ((100, ("float16",)), (90, ("float32",)), (80, ("bfloat16",))),
        ),
        "b": QuantMethod(80, "none", ("float16",), "", ()),
        "c": QuantMethod(None, "moe_wna16", (), "vllm/c.py:3", ()),
    }
    assert list(got) == ["a", "b", "c"]


def test_sources_are_the_common_ones_with_the_specific_ones_over_them() -> None:
    common = {"cuda": code("a"), "torch": code("b")}
    got = facts._sources(common, torch=unverified("c"), triton=code("d"))
    assert isinstance(got, MappingProxyType)
    assert dict(got) == {"cuda": code("a"), "torch": unverified("c"), "triton": code("d")}
    assert dict(facts._sources(common)) == common


def as_dict(f: ImageFacts) -> dict[str, Any]:
    return {x.name: getattr(f, x.name) for x in fields(f)}


def test_a_0_19_1_build_is_its_line_with_its_own_tag_variant_archs_and_note() -> None:
    f = facts._vllm_0191("v0.19.1-x", "x", (70, 90), code("arch source"), "a note")
    assert as_dict(f) == {
        "engine": "vllm",
        "version": "0.19.1",
        "repo": "vllm/vllm-openai",
        "tag": "v0.19.1-x",
        "variant": "x",
        "cuda": "12.9.1",
        "torch": "2.10.0+cu129",
        "torch_arch_list": (70, 90),
        "triton": "3.6.0",
        "engine_line": "V1",
        "v0_engine": False,
        "v1_min_capability": 70,
        "reads_vllm_use_v1": False,
        "attention": ((80, "FLASH_ATTN"), (0, "TRITON_ATTN")),
        "attention_backend_flag": True,
        "quantizations": IMAGES[V0191].quantizations,
        "kv_cache_dtypes": ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"),
        "fp8_kv_min_capability": 80,
        "bf16_min_capability": 80,
        "prefix_prefill_min_capability": 70,
        "chunked_prefill_auto_above": None,
        "mla_min_capability": 80,
        "batch_budget": "v1",
        "nccl_in_budget": False,
        "serve_args": "vllm-0.19.1-serve-args.json",
        "metrics": {
            "requests_running": "vllm:num_requests_running",
            "requests_waiting": "vllm:num_requests_waiting",
            "kv_cache_usage": "vllm:kv_cache_usage_perc",
            "preemptions": "vllm:num_preemptions_total",
            "prompt_tokens": "vllm:prompt_tokens_total",
            "generation_tokens": "vllm:generation_tokens_total",
            "time_to_first_token": "vllm:time_to_first_token_seconds",
            "time_per_output_token": "vllm:inter_token_latency_seconds",
            "e2e_latency": "vllm:e2e_request_latency_seconds",
            "prefix_cache_queries": "vllm:prefix_cache_queries_total",
            "prefix_cache_hits": "vllm:prefix_cache_hits_total",
        },
        "tuned_moe_config_env": "VLLM_TUNED_CONFIG_FOLDER",
        "serve_refuses_model_flag": False,
        "native_multi_node": True,
        "shutdown_timeout_flag": True,
        "entrypoint": ("vllm", "serve"),
        "sources": {**IMAGES[V0191].sources, "torch_arch_list": code("arch source")},
        "note": "a note",
    }
    # The two builds of the line differ in exactly these.
    plain, ubuntu = as_dict(IMAGES[V0191]), as_dict(IMAGES[V0191_U])
    assert {k: (plain[k], ubuntu[k]) for k in plain if plain[k] != ubuntu[k]} == {
        "tag": ("v0.19.1", "v0.19.1-ubuntu2404"),
        "variant": ("", "ubuntu2404"),
        "torch_arch_list": ((70, 75, 80, 86, 90, 100, 120), (87, 89, 90, 100, 120)),
        "sources": (plain["sources"], ubuntu["sources"]),
        "note": (
            "the last upstream vLLM line that runs on Volta (V1, TRITON_ATTN)",
            "built without sm_70/sm_75/sm_80: use the plain tag on older GPUs",
        ),
    }


@pytest.mark.parametrize(
    ("ref", "key"),
    [
        (V0191, V0191),
        ("docker.io/vllm/vllm-openai:v0.9.2", V092),
        ("index.docker.io/vllm/vllm-openai:v0.11.0@sha256:" + "0" * 64, V0110),
        ("vllm/vllm-openai:v0.19.1-ubuntu2404", V0191_U),
        ("vllm/vllm-openai:v0.19.0", None),
        ("vllm/vllm-openai", None),
        ("", None),
        (None, None),
    ],
)
def test_image_facts_and_facts_for_without_declared_facts(ref: str | None, key: str | None) -> None:
    want = IMAGES[key] if key else None
    assert image_facts(ref) is want
    assert facts_for(ref) is want
    assert facts_for(ref, {}) is want


DECLARED = {
    "like": V0191,
    # Props arrive through protobuf Structs: numbers as floats, lists as lists.
    "torch_arch_list": [70.0, 80.0],
    "torch": "2.10.0+cu126",
    "triton": "3.4.0",
    "version": "0.19.1",
    "cuda": "12.6",
    "note": "not declarable",  # neither is the rest: left out
    "engine_line": "V0",
}


def declared_sources(by: str, *names: str) -> dict[str, Any]:
    return {**IMAGES[V0191].sources, **{n: unverified(f"declared by {by}") for n in names}}


def test_facts_for_declared_facts_reads_them_as_protobuf_gave_them() -> None:
    f = facts_for("registry.local/vllm-volta:0.19.1-cu126", DECLARED, "pools.chat.imageFacts")
    assert f is not None
    got = as_dict(f)
    assert {k: got[k] for k in ("repo", "tag", "variant", "note")} == {
        "repo": "registry.local/vllm-volta",
        "tag": "0.19.1-cu126",
        "variant": "declared",
        "note": f"declared by pools.chat.imageFacts, based on {V0191}",
    }
    assert (f.torch_arch_list, f.torch, f.triton, f.version, f.cuda, f.engine_line) == (
        (70, 80),
        "2.10.0+cu126",
        "3.4.0",
        "0.19.1",
        "12.6",
        "V1",
    )
    assert type(f.torch_arch_list[0]) is int
    assert dict(f.sources) == declared_sources(
        "pools.chat.imageFacts", "torch_arch_list", "torch", "triton", "version", "cuda"
    )
    # Every fact not declared is the base image's.
    base = as_dict(IMAGES[V0191])
    skip = {"repo", "tag", "variant", "note", "sources", "torch_arch_list", "torch", "triton", "version", "cuda"}
    assert {k: v for k, v in got.items() if k not in skip} == {k: v for k, v in base.items() if k not in skip}


def test_declared_facts_without_a_ref_or_a_declarer_are_the_like_images_and_the_stacks() -> None:
    f = facts_for(None, {"like": V092, "triton": "3.4.0"})
    assert f is not None
    assert (f.repo, f.tag, f.ref, f.triton, f.note) == (
        "vllm/vllm-openai",
        "v0.9.2",
        V092,
        "3.4.0",
        f"declared by the stack, based on {V092}",
    )
    assert dict(f.sources) == {**IMAGES[V092].sources, "triton": unverified("declared by the stack")}


@pytest.mark.parametrize(
    ("ref", "repo", "tag"),
    [
        ("registry.local/vllm-volta:1.0", "registry.local/vllm-volta", "1.0"),
        # A registry's port is no tag: the tag is after the last colon.
        ("reg:5000/vllm-volta:1.0", "reg:5000/vllm-volta", "1.0"),
        ("docker.io/library/vllm-volta:2@sha256:" + "a" * 64, "vllm-volta", "2"),
        # No tag: the whole reference is the repository.
        ("registry.local/vllm-volta", "registry.local/vllm-volta", ""),
    ],
)
def test_declared_facts_split_the_reference(ref: str, repo: str, tag: str) -> None:
    f = declared_facts(ref, V0110, {}, "x")
    assert (f.repo, f.tag, f.variant, f.note) == (repo, tag, "declared", f"declared by x, based on {V0110}")
    assert dict(f.sources) == dict(IMAGES[V0110].sources)


def test_a_pools_image_facts_declared_in_the_stack_or_from_the_table() -> None:
    config = prod_config()
    config["llm-cluster:pools"]["chat"]["image"] = "registry.local/vllm-volta:0.19.1-cu126"
    config["llm-cluster:pools"]["chat"]["imageFacts"] = {"like": V0110, "torchArchList": [70, 80], "triton": "3.6.0"}
    spec = spec_of(config)
    f = pool_image_facts(spec, "chat")
    assert f is not None
    assert (f.repo, f.tag, f.variant, f.torch_arch_list, f.triton, f.version, f.note) == (
        "registry.local/vllm-volta",
        "0.19.1-cu126",
        "declared",
        [70, 80],
        "3.6.0",
        "0.11.0",
        f"declared by pools.chat.imageFacts, based on {V0110}",
    )
    assert dict(f.sources) == {
        **IMAGES[V0110].sources,
        "torch_arch_list": unverified("declared by pools.chat.imageFacts"),
        "triton": unverified("declared by pools.chat.imageFacts"),
    }
    # The reasoning pool declares nothing: its image's entry.
    assert pool_image_facts(spec, "reasoning") is IMAGES[V0191]


def test_a_pool_on_an_image_the_table_does_not_know() -> None:
    config = prod_config()
    config["llm-cluster:pools"]["chat"]["image"] = "registry.local/vllm-volta:1"
    assert pool_image_facts(spec_of(config), "chat") is None


KV_BYTES = [
    ("auto", 2, 2),
    ("auto", 4, 4),
    ("auto", 1, 1),
    ("float16", 4, 2),
    ("bfloat16", 4, 2),
    ("fp8", 2, 1),
    ("fp8_e4m3", 2, 1),
    ("fp8_e5m2", 2, 1),
    ("fp8_inc", 2, 1),
    ("fp8_ds_mla", 2, 1),
]


@pytest.mark.parametrize(("dtype", "act_bytes", "want"), KV_BYTES)
def test_kv_cache_bytes(dtype: str, act_bytes: int, want: int) -> None:
    assert kv_cache_bytes(dtype, act_bytes) == want


def test_every_kv_cache_dtype_some_image_takes_has_its_bytes_above() -> None:
    assert {row[0] for row in KV_BYTES} == set(KV_CACHE_DTYPES)
    assert KV_CACHE_DTYPES == ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "float16", "fp8_ds_mla")
