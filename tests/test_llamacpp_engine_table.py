"""The rest of llama.cpp's engine module (what is not an argv/env builder) as tables: a model's shape from a GGUF
header (dense, MoE, MLA, split with and without the rest's size) and from the catalog, layers per GPU, the compute
buffer, the estimate on both sides of each refusal with its exact reason and every extra figure, the KV error
classes; then the engine's image cells, gate check and capacity. Tiny models whose bytes are counted by hand."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import pytest

from components.engines.estimate import GIB
from components.engines.gate import GateCheck
from components.engines.llamacpp import engine as llamacpp_engine
from components.engines.llamacpp.engine import (
    CACHE_TYPE_BYTES,
    LLAMACPP_CHECK,
    LlamacppEngine,
    ModelShape,
    compute_bytes,
    kv_error_class,
    kv_estimate_error,
    layers_per_gpu,
    llamacpp_estimate,
    shape_from_arch,
    shape_from_gguf,
)
from components.engines.llamacpp.facts import DEFAULT_IMAGE, IMAGES
from components.facts.engine_matrix import Cell
from components.facts.evidence import Evidence, Sourced
from components.facts.gguf import GgufModel
from components.facts.models import ModelArch
from components.spec.models import model_architecture
from components.spec.stack import config_sections, validate_sections
from tests.support.engine_stacks import llamacpp_config, spec_of

ENGINE = LlamacppEngine()
CUDA13 = "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11312"
TENSORS = {
    "token_embd.weight": 1000,
    "output.weight": 700,
    "output_norm.weight": 64,
    "blk.0.attn_q.weight": 500,
    "blk.0.ffn_up.weight": 300,
    "blk.1.attn_q.weight": 800,
    "blk.2.attn_q.weight": 900,
}


def header(**changes: Any) -> GgufModel:
    """A 3-block dense GGUF of hidden 64, 4 heads, 2 K/V heads of 16, MLP 96, vocab 100 (TENSORS' bytes)."""
    fields: dict[str, Any] = {
        "path": "/m/tiny.gguf",
        "arch": "llama",
        "name": "tiny",
        "file_type": None,
        "split_count": 1,
        "block_count": 3,
        "embedding_length": 64,
        "context_length": 4096,
        "head_count": 4,
        "head_count_kv": 2,
        "key_length": 16,
        "value_length": 16,
        "mla": False,
        "feed_forward_length": 96,
        "expert_count": 0,
        "expert_used_count": 0,
        "expert_feed_forward_length": 0,
        "vocab_size": 100,
        "tensor_bytes": TENSORS,
    }
    return GgufModel(**{**fields, **changes})


# Blocks of 800, 800 and 900 bytes, the output layer 700 + 64, the embedding 1000 (host), 2 x 2 x 16 x 2 = 128 K+V
# bytes a token and layer at f16.
SHAPE = ModelShape("tiny", 3, 64, 100, 4, 96, (800, 800, 900), 764, 1000, 128.0, True, "dense")


# -- shapes ------------------------------------------------------------------------------------------------


def test_a_dense_header() -> None:
    assert shape_from_gguf(header()) == SHAPE


def test_a_moe_header_without_a_name_is_named_by_its_path() -> None:
    moe = header(name="", expert_count=4, expert_used_count=2, expert_feed_forward_length=32)
    assert shape_from_gguf(moe) == dataclasses.replace(SHAPE, name="/m/tiny.gguf", ffn_width=64, kind="moe")


def test_an_mla_header_caches_k_only() -> None:
    # A MoE with MLA is classed by its attention.
    mla = header(mla=True, head_count_kv=1, key_length=576, expert_count=4, expert_used_count=2)
    assert shape_from_gguf(mla) == dataclasses.replace(
        SHAPE, kv_per_token_per_layer_f16=1152.0, ffn_width=0, kind="mla"
    )


def test_a_first_shard_spreads_the_rest_over_the_blocks_it_lacks() -> None:
    shard = header(split_count=2, tensor_bytes={"token_embd.weight": 1000, "blk.0.attn_q.weight": 500})
    # 10000 - 500 (known) - 0 (output) - 1000 (embedding) = 8500 over blocks 1 and 2.
    assert shape_from_gguf(shard, total_bytes=10000) == dataclasses.replace(
        SHAPE, layer_bytes=(500, 4250, 4250), output_bytes=0, exact=False
    )


def test_a_first_shard_with_every_block_spreads_the_rest_over_all() -> None:
    # 10000 - 2500 - 764 - 1000 = 5736: 1912 more on each block.
    got = shape_from_gguf(header(split_count=2), total_bytes=10000)
    assert got == dataclasses.replace(SHAPE, layer_bytes=(2712, 2712, 2812), exact=False)
    # A stated size below what the shard holds adds nothing.
    got = shape_from_gguf(header(split_count=2), total_bytes=100)
    assert got == dataclasses.replace(SHAPE, exact=False)


def test_a_first_shard_spreads_the_rest_in_whole_bytes_and_never_below_nothing() -> None:
    two = {k: v for k, v in TENSORS.items() if not k.startswith("blk.2.")}
    # 10001 - 1600 - 764 - 1000 = 6637 bytes on the one block it lacks; an odd rest over two blocks floors.
    got = shape_from_gguf(header(split_count=2, tensor_bytes=two), total_bytes=10001)
    assert got.layer_bytes == (800, 800, 6637)
    got = shape_from_gguf(header(split_count=2, tensor_bytes=two), total_bytes=100)
    assert got.layer_bytes == (800, 800, 0)
    one = {"token_embd.weight": 1000, "blk.0.attn_q.weight": 500}
    got = shape_from_gguf(header(split_count=2, tensor_bytes=one), total_bytes=10001)
    assert got.layer_bytes == (500, 4250, 4250) and all(type(b) is int for b in got.layer_bytes)


def test_one_expert_is_a_moe() -> None:
    assert shape_from_gguf(header(expert_count=1, expert_used_count=1, expert_feed_forward_length=32)).kind == "moe"


def test_a_first_shard_without_the_models_size_is_refused() -> None:
    with pytest.raises(ValueError) as err:
        shape_from_gguf(header(split_count=3))
    assert str(err.value) == (
        "/m/tiny.gguf is shard 1 of 3: its header lists only its own tensors; state the model's sizeGib (all "
        "shards) to size the rest"
    )


ARCH = ModelArch(
    "tiny",
    "t/tiny",
    "llama",
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=16,
    vocab_size=100,
    intermediate_size=96,
)
# Embedding 100 x 64, output 100 x 64 + 64; (100000 - 6400 - 6464) / 2 = 43568 a block.
ARCH_SHAPE = ModelShape("tiny", 2, 64, 100, 4, 96, (43568, 43568), 6464, 6400, 128.0, False, "dense")


@pytest.mark.parametrize(
    ("arch", "total", "shape"),
    [
        (ARCH, 100000, ARCH_SHAPE),
        (ARCH, 100001, dataclasses.replace(ARCH_SHAPE, layer_bytes=(43568, 43568))),
        (ARCH, 100002, dataclasses.replace(ARCH_SHAPE, layer_bytes=(43569, 43569))),
        (ARCH, 1000, dataclasses.replace(ARCH_SHAPE, layer_bytes=(0, 0))),
        # Embeddings over the stated size leave the blocks nothing, not a byte each.
        (
            dataclasses.replace(ARCH, num_layers=1),
            1000,
            dataclasses.replace(ARCH_SHAPE, layers=1, layer_bytes=(0,)),
        ),
        (
            dataclasses.replace(ARCH, num_experts=4, experts_per_token=2, moe_intermediate_size=40),
            100000,
            dataclasses.replace(ARCH_SHAPE, ffn_width=80, kind="moe"),
        ),
        # DeepSeek's MLA: (kv_lora_rank + rope dims) x 2 bytes, K only.
        (
            dataclasses.replace(
                ARCH, kv_lora_rank=32, qk_rope_head_dim=8, num_experts=4, experts_per_token=1, moe_intermediate_size=40
            ),
            100000,
            dataclasses.replace(ARCH_SHAPE, kv_per_token_per_layer_f16=80.0, ffn_width=40, kind="mla"),
        ),
    ],
)
def test_a_catalog_models_shape_from_its_size(arch: ModelArch, total: float, shape: ModelShape) -> None:
    assert shape_from_arch(arch, total) == shape


@pytest.mark.parametrize("cache_type", sorted(CACHE_TYPE_BYTES))
def test_kv_bytes_per_cache_type(cache_type: str) -> None:
    assert SHAPE.kv_per_token_per_layer(cache_type) == 64.0 * CACHE_TYPE_BYTES[cache_type]
    assert CACHE_TYPE_BYTES["q8_0"] == 34 / 32 and CACHE_TYPE_BYTES["f32"] == 4.0


# (blocks, GPUs) -> blocks per GPU: layers + 1 slots (the output layer last), slot i on GPU i x gpus // (layers + 1).
LAYERS = [
    (28, 2, [15, 13]),
    (2, 1, [2]),
    (3, 2, [2, 1]),
    (8, 4, [3, 2, 2, 1]),
    (1, 2, [1, 0]),
    (7, 3, [3, 3, 1]),
    (5, 2, [3, 2]),
    (0, 2, [0, 0]),
]


@pytest.mark.parametrize(("layers", "gpus", "counts"), LAYERS)
def test_layers_per_gpu(layers: int, gpus: int, counts: list[int]) -> None:
    assert layers_per_gpu(layers, gpus) == counts


@pytest.mark.parametrize(
    ("last", "flash", "size"),
    [
        # 512 x (4 x 64 + 96) x 4 of activations; the last GPU's 512 x 100 x 4 logits; without FlashAttention
        # 512 x 1000 x 4 heads x 4 bytes of scores.
        (False, True, 720896),
        (True, True, 720896 + 204800),
        (False, False, 720896 + 8192000),
        (True, False, 720896 + 204800 + 8192000),
    ],
)
def test_compute_bytes(last: bool, flash: bool, size: int) -> None:
    assert compute_bytes(SHAPE, last=last, ctx_per_slot=1000, flash_attention=flash) == size


# -- the estimate --------------------------------------------------------------------------------------------


def estimate(gib: float = 1.0, shape: ModelShape = SHAPE, **changes: Any) -> Any:
    settings: dict[str, Any] = {
        "gpus": 1,
        "split_mode": "layer",
        "ctx_per_slot": 1000,
        "parallel": 2,
        "cache_type": "f16",
        "flash_attention": True,
        **changes,
    }
    return llamacpp_estimate(shape, gib, **settings)


WIDEST = "too few logs, the widest error measured"
PADDED = "llama.cpp pads each slot's context to 256: 1000 becomes 1024"
TERMS = "the KV buffer (n_ctx x layers x K/V row bytes) and, beside it, the compute buffer"
HALF = GIB // 2


def test_one_gpu_holds_every_block_and_every_figure() -> None:
    e = estimate()
    assert (e.engine, e.model, e.gpu_memory_gib, e.tp, e.max_model_len) == ("llamacpp", "tiny", 1.0, 1, 1024)
    assert (e.weights_gib_per_gpu, e.weights_gib_total) == (3264 / GIB, 3264 / GIB)
    assert (e.kv_bytes_per_token_per_gpu, e.kv_cache_gib_per_gpu) == (384.0, 384 * 2048 / GIB)
    assert (e.kv_tokens, e.max_concurrency) == (2048, 2.0)
    assert e.rule_of_thumb_gib_total == (2500 + 764 + 1000) * 1.2 / GIB
    assert (e.fits, e.reason, e.advice, e.notes) == (True, "", "", (PADDED,))
    assert e.extra == {
        "context_option": "the context per slot (llamacpp.contextPerSlot)",
        "n_ctx": 2048,
        "ctx_per_slot": 1024,
        "parallel": 2,
        "split_mode": "layer",
        "cache_type": "f16",
        "layers_per_gpu": [3.0],
        "compute_gib_per_gpu": 925696 / GIB,
        "host_gib": 1000 / GIB,
        "weights_exact": True,
        "kv_estimate_error": 0.02,
        "kv_error_class": "llama.cpp · TP1 · dense: " + WIDEST,
        "kv_tokens_required": 2048,
        "kv_tokens_low": 2048,
        "max_concurrency_low": 2.0,
        "kv_cache_gib_per_gpu_high": 384 * 2048 * 1.02 / GIB,
        "kv_error_terms": TERMS,
    }


def test_layer_split_puts_the_output_layer_on_the_last_gpu() -> None:
    e = estimate(gpus=2)
    # Blocks 0-1 (1600 bytes) on GPU 0, block 2 and the output layer (900 + 764) on GPU 1; GPU 0 needs the most.
    assert (e.weights_gib_per_gpu, e.weights_gib_total) == (1664 / GIB, 3264 / GIB)
    assert (e.kv_bytes_per_token_per_gpu, e.kv_cache_gib_per_gpu) == (256.0, 256 * 2048 / GIB)
    assert e.extra["layers_per_gpu"] == [2.0, 1.0]
    assert e.extra["compute_gib_per_gpu"] == 720896 / GIB
    assert e.extra["kv_error_class"] == "llama.cpp · TP>=2 · dense: " + WIDEST
    assert (e.fits, e.notes) == (True, (PADDED,))


@pytest.mark.parametrize("mode", ["row", "tensor"])
def test_row_and_tensor_split_put_a_share_of_every_layer_on_each_gpu(mode: str) -> None:
    e = estimate(gpus=2, split_mode=mode)
    assert (e.weights_gib_per_gpu, e.weights_gib_total) == (1632 / GIB, 3264 / GIB)
    assert (e.kv_bytes_per_token_per_gpu, e.kv_cache_gib_per_gpu) == (192.0, 192 * 2048 / GIB)
    assert e.extra["layers_per_gpu"] == [1.5, 1.5]
    assert e.extra["compute_gib_per_gpu"] == 925696 / GIB
    assert e.extra["split_mode"] == mode


WEIGHTS_ADVICE = "give each server more GPUs (tensorParallel), or serve a smaller quantization of the GGUF"
NEED_ADVICE = (
    "lower llamacpp.contextPerSlot or parallel, quantize the KV cache (cacheType q8_0), or give each server more GPUs"
)


def test_weights_that_leave_nothing_beside_the_context_are_refused() -> None:
    e = estimate(gib=(HALF + 3264) / GIB)
    assert (e.fits, e.advice) == (False, WEIGHTS_ADVICE)
    assert e.reason == "the weights need 0.0 GiB on GPU 0 of the server, more than its 0.5 GiB"
    assert (e.extra["kv_tokens_low"], e.extra["max_concurrency_low"]) == (0, 0.0)
    e = estimate(gib=(HALF + 3265) / GIB)
    assert (e.fits, e.advice) == (False, NEED_ADVICE)


def test_a_gpu_that_needs_more_than_it_has_is_refused_and_one_that_needs_all_fits() -> None:
    need = 3264 + 786432 + 925696
    e = estimate(gib=(HALF + need - 1) / GIB)
    assert (e.fits, e.advice, e.notes) == (False, NEED_ADVICE, (PADDED,))
    assert e.reason == (
        "GPU 0 needs 0.5 GiB (weights 0.0 + KV 0.0 for -c 2048 + compute 0.00 + CUDA context 0.5) of its 0.5 GiB: "
        "llama-server fails to allocate at start"
    )
    e = estimate(gib=(HALF + need) / GIB)
    assert (e.fits, e.reason, e.advice) == (True, "", "")
    # At the pessimistic end the KV buffer is 2 % larger: 786432 bytes of room hold 2007 tokens of 384 x 1.02.
    assert (e.extra["kv_tokens_low"], e.extra["max_concurrency_low"]) == (2007, 2 * 2007 / 2048)


def test_the_refused_gpu_is_the_one_that_needs_the_most() -> None:
    # One 256-token slot: GPU 0 needs 1600 + 65536 + 720896, GPU 1 (the logits) 1664 + 32768 + 925696.
    e = estimate(gib=(HALF + 960127) / GIB, gpus=2, ctx_per_slot=256, parallel=1)
    assert e.reason.startswith("GPU 1 needs 0.5 GiB (weights 0.0 + KV 0.0 for -c 256 + compute 0.00 + CUDA context")
    assert e.kv_bytes_per_token_per_gpu == 128.0 and e.notes == ()


SEVEN = dataclasses.replace(SHAPE, layers=7, layer_bytes=(100, 200, 300, 400, 500, 600, 700))


def test_three_gpus_take_consecutive_blocks() -> None:
    # 7 blocks on 3 GPUs: 3 + 3 + 1; GPU 2 holds block 6 and the output layer (700 + 764).
    e = estimate(shape=SEVEN, gpus=3, ctx_per_slot=1024)
    assert e.extra["layers_per_gpu"] == [3.0, 3.0, 1.0]
    assert (e.weights_gib_per_gpu, e.weights_gib_total) == (1500 / GIB, (2800 + 764) / GIB)
    e = estimate(shape=SEVEN, gpus=3, split_mode="row", ctx_per_slot=1024)
    assert e.extra["layers_per_gpu"] == [2.33, 2.33, 2.33]


def test_the_pessimistic_end_floors_the_tokens_that_fit() -> None:
    """One block of 128 bytes a token: 130.56 at the pessimistic end, stored a hair above itself, so the 3264 bytes
    left (25 x 130.56) hold 24 of them, not 25: the pessimistic end rounds down."""
    one = dataclasses.replace(SHAPE, layers=1, layer_bytes=(800,))
    e = estimate(gib=(HALF + 1564 + 925696 + 3264) / GIB, shape=one, ctx_per_slot=1024)
    assert e.fits is False and e.extra["kv_tokens_low"] == 24


def test_a_quantized_cache_and_a_slot_on_the_padding() -> None:
    e = estimate(cache_type="q8_0", ctx_per_slot=1024)
    assert (e.kv_bytes_per_token_per_gpu, e.notes) == (3 * 64 * 34 / 32, ())
    assert e.extra["cache_type"] == "q8_0"


def test_without_flash_attention_the_scores_of_a_slot_count() -> None:
    e = estimate(flash_attention=False, ctx_per_slot=512, ctx_pad=512)
    assert (e.max_model_len, e.kv_tokens, e.notes) == (512, 1024, ())
    assert e.extra["compute_gib_per_gpu"] == (720896 + 204800 + 512 * 512 * 4 * 4) / GIB
    e = estimate(ctx_per_slot=500, ctx_pad=512)
    assert e.notes == ("llama.cpp pads each slot's context to 512: 500 becomes 512",)


def test_a_shape_from_a_stated_size_is_noted_as_approximate() -> None:
    e = estimate(shape=dataclasses.replace(SHAPE, exact=False), ctx_per_slot=1024)
    assert e.notes == (
        "weights spread evenly over the layers from the stated size (no GGUF header): per-GPU figures are approximate",
    )
    assert e.extra["weights_exact"] is False


def test_a_gpu_without_blocks_bounds_nothing_at_the_pessimistic_end() -> None:
    one = dataclasses.replace(SHAPE, layers=1, layer_bytes=(800,))
    e = estimate(shape=one, gpus=2, ctx_per_slot=1024)
    assert e.extra["layers_per_gpu"] == [1.0, 0.0]
    assert e.extra["kv_tokens_low"] == 2048


def test_no_context_has_no_concurrency() -> None:
    e = estimate(ctx_per_slot=0)
    assert (e.kv_tokens, e.extra["max_concurrency_low"]) == (0, 0.0)


@pytest.mark.parametrize(
    ("kind", "gpus", "cls", "error"),
    [
        ("moe", 1, ("llamacpp", "tp1", "moe"), (0.02, "llama.cpp · TP1 · MoE, measured on its logs")),
        ("moe", 2, ("llamacpp", "tp>=2", "moe"), (0.02, "llama.cpp · TP>=2 · MoE: " + WIDEST)),
        ("dense", 1, ("llamacpp", "tp1", "dense"), (0.02, "llama.cpp · TP1 · dense: " + WIDEST)),
        ("mla", 8, ("llamacpp", "tp>=2", "mla"), (0.02, "llama.cpp · TP>=2 · MLA: " + WIDEST)),
    ],
)
def test_kv_error_classes(kind: str, gpus: int, cls: tuple[str, str, str], error: tuple[float, str]) -> None:
    assert kv_error_class(kind, gpus) == cls
    assert kv_estimate_error(cls) == error


# -- the engine ------------------------------------------------------------------------------------------------


def test_the_engines_tables() -> None:
    assert ENGINE.checkpoint_quantizations() == frozenset({"gguf"})
    assert ENGINE.image_refs() == [DEFAULT_IMAGE, CUDA13]
    assert ENGINE.image_table() is IMAGES


@pytest.mark.parametrize(
    ("ref", "capability", "cell"),
    [
        (DEFAULT_IMAGE, 61, Cell("deployed (PTX JIT)", "read from code")),
        (DEFAULT_IMAGE, 70, Cell("deployed (PTX JIT)", "observed")),
        (DEFAULT_IMAGE, 80, Cell("deployed (PTX JIT)", "read from code")),
        (DEFAULT_IMAGE, 86, Cell("deployed", "read from code")),
        (CUDA13, 70, Cell("no", "read from code")),
        (CUDA13, 75, Cell("deployed (PTX JIT)", "read from code")),
        (CUDA13, 120, Cell("deployed", "read from code")),
        ("ghcr.io/ggml-org/llama.cpp:server", 86, None),
    ],
)
def test_image_cells(ref: str, capability: int, cell: Cell | None) -> None:
    assert ENGINE.image_cell(ref, capability) == cell


def test_each_cell_reads_its_own_facts_evidence_at_the_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    base = IMAGES[CUDA13]
    seen = dataclasses.replace(base, sources={**base.sources, "sass": Sourced("seen", Evidence.OBSERVED)})
    monkeypatch.setattr(ENGINE, "image_facts_of", lambda ref: seen)
    assert ENGINE.image_cell(CUDA13, 70) == Cell("no", "observed")
    assert ENGINE.image_cell(CUDA13, 61) == Cell("no", "read from code")
    assert ENGINE.image_cell(CUDA13, 86) == Cell("deployed", "read from code")


def test_a_deployed_cell_reads_its_evidence_at_the_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    base = IMAGES[DEFAULT_IMAGE]
    seen = dataclasses.replace(
        base, sass=(70, *base.sass), sources={**base.sources, "sass": Sourced("seen", Evidence.OBSERVED)}
    )
    monkeypatch.setattr(ENGINE, "image_facts_of", lambda ref: seen)
    assert ENGINE.image_cell(DEFAULT_IMAGE, 70) == Cell("deployed", "observed")
    assert ENGINE.image_cell(DEFAULT_IMAGE, 86) == Cell("deployed", "read from code")


def test_the_gate_check_points_each_argv_at_no_model_and_the_loopback() -> None:
    config = llamacpp_config()
    config["llm-cluster:nodeDefaults"]["gpu"]["model"] = "NVIDIA A10"
    spec = spec_of(config)
    argvs = (
        ("/app/llama-server", "-m", "/data/x.gguf", "--host", "192.168.10.13", "--port", "8000"),
        ("/app/llama-server", "--model", "/data/y y.gguf", "--port", "8001"),
    )
    assert ENGINE.gate_check(spec, "chat", "gpu-03", argvs) == GateCheck(
        "llama.cpp b11312",
        "/bin/bash",
        (
            "-c",
            LLAMACPP_CHECK,
            "llama-cpp-qualification",
            "/app/llama-server",
            "11312",
            "86",
            DEFAULT_IMAGE,
            "/app/llama-server -m /nonexistent/llm-cluster-qualification.gguf --host 127.0.0.1 --port 8000",
            "/app/llama-server --model /nonexistent/llm-cluster-qualification.gguf --port 8001",
        ),
        "llama-server's build, the CUDA device it lists and its compute capability, and the planned flags",
    )
    assert shlex.split(ENGINE.gate_check(spec, "chat", "gpu-03", argvs).args[-1])[2].endswith(".gguf")
    config["llm-cluster:pools"]["chat"]["image"] = "ghcr.io/ggml-org/llama.cpp:server"
    assert ENGINE.gate_check(spec_of(config), "chat", "gpu-03", argvs) is None


def expected(spec: Any, shape: ModelShape, **changes: Any) -> dict[str, object]:
    settings: dict[str, Any] = {
        "gpus": 1,
        "split_mode": "layer",
        "ctx_per_slot": 8192,
        "parallel": 4,
        "cache_type": "f16",
        "flash_attention": True,
        "ctx_pad": 256,
        **changes,
    }
    return llamacpp_estimate(shape, 32.0, **settings).to_dict()


def test_the_capacity_from_the_models_size() -> None:
    spec = spec_of(llamacpp_config())
    shape = shape_from_arch(model_architecture(spec, "qwen3-30b-a3b"), 17.3 * GIB)
    assert ENGINE.capacity(spec, "chat") == expected(spec, shape)
    assert ENGINE.capacity(spec, "chat")["weights_exact"] is False


@pytest.mark.parametrize(("flash", "on"), [("on", True), ("auto", True), ("off", False)])
def test_the_capacity_reads_every_option(flash: str, on: bool) -> None:
    config = llamacpp_config(flashAttention=flash, cacheType="q8_0", splitMode="row", contextPerSlot=4000, parallel=2)
    config["llm-cluster:pools"]["chat"].update(tensorParallel=2, replicasPerNode=4)
    spec = spec_of(config)
    shape = shape_from_arch(model_architecture(spec, "qwen3-30b-a3b"), 17.3 * GIB)
    assert ENGINE.capacity(spec, "chat") == expected(
        spec, shape, gpus=2, split_mode="row", ctx_per_slot=4000, parallel=2, cache_type="q8_0", flash_attention=on
    )


def test_the_capacity_from_a_header_reads_that_file(monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    monkeypatch.setattr(llamacpp_engine, "read_gguf", lambda path: read.append(path) or header())
    spec = spec_of(llamacpp_config(ggufHeader="/tmp/qwen.header"))
    assert ENGINE.capacity(spec, "chat") == expected(spec, shape_from_gguf(header()))
    assert read == ["/tmp/qwen.header"]
    # A split header: the model's sizeGib sizes the other shards; without it, the reason, not an estimate.
    monkeypatch.setattr(llamacpp_engine, "read_gguf", lambda path: header(split_count=2))
    total = int(17.3 * GIB)
    assert ENGINE.capacity(spec, "chat") == expected(spec, shape_from_gguf(header(split_count=2), total_bytes=total))
    config = llamacpp_config(ggufHeader="/tmp/qwen.header")
    del config["llm-cluster:models"]["qwen3-30b-a3b"]["sizeGib"]
    assert ENGINE.capacity(spec_of(config), "chat") == {
        "error": "capacity not estimated: /m/tiny.gguf is shard 1 of 2: its header lists only its own tensors; "
        "state the model's sizeGib (all shards) to size the rest"
    }


def test_an_unknown_image_is_sized_as_the_default_and_the_images_padding_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = llamacpp_config()
    config["llm-cluster:pools"]["chat"]["image"] = "registry.example/llama.cpp:private"
    spec = spec_of(config)
    shape = shape_from_arch(model_architecture(spec, "qwen3-30b-a3b"), 17.3 * GIB)
    assert ENGINE.capacity(spec, "chat") == expected(spec, shape)
    image, gpu = ENGINE.sizing_inputs(spec, "chat", IMAGES[DEFAULT_IMAGE])
    monkeypatch.setattr(ENGINE, "sizing_inputs", lambda *a: (dataclasses.replace(image, ctx_pad=1000), gpu))
    got = ENGINE.capacity(spec, "chat")
    assert got == expected(spec, shape, ctx_pad=1000) and got["ctx_per_slot"] == 9000


def test_without_a_header_or_a_size_the_capacity_says_what_to_state() -> None:
    config = llamacpp_config()
    del config["llm-cluster:models"]["qwen3-30b-a3b"]["sizeGib"]
    spec = validate_sections(*config_sections(config, set()))
    assert ENGINE.capacity(spec, "chat") == {
        "error": "capacity not estimated: state llamacpp.ggufHeader (a copy of the GGUF's header) or "
        "models.qwen3-30b-a3b.sizeGib (the GGUF's size) to size the weights"
    }
