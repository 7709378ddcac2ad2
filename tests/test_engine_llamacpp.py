"""llama.cpp: image facts, the GGUF header read with the `gguf` package (files written by its own writer),
the capacity of one server from that header, and the exact `llama-server` argv."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from components.engines.llamacpp.engine import (
    layers_per_gpu,
    llamacpp_argv,
    llamacpp_estimate,
    shape_from_arch,
    shape_from_gguf,
)
from components.engines.llamacpp.facts import DEFAULT_IMAGE, IMAGES, llamacpp_image
from components.facts.gguf import read_gguf
from components.facts.models import MODELS
from components.spec import SpecError
from components.spec.topology import instances
from tests.support.engine_stacks import llamacpp_config, spec_of
from tests.support.expected_argv import LLAMACPP_CHAT_TAIL, llamacpp_chat_head

GIB = 1024**3
CUDA12 = IMAGES["ghcr.io/ggml-org/llama.cpp:server-cuda-b11312"]


def test_cuda12_image_runs_volta_as_ptx_and_cuda13_not_at_all() -> None:
    assert llamacpp_image(DEFAULT_IMAGE) is CUDA12
    assert CUDA12.runs_on(70) and CUDA12.jit_only(70) and not CUDA12.jit_only(86)
    cuda13 = IMAGES["ghcr.io/ggml-org/llama.cpp:server-cuda13-b11312"]
    assert not cuda13.runs_on(70) and cuda13.runs_on(75)
    assert "fragile and insecure" in CUDA12.cite("multi_node")
    assert not CUDA12.split_modes["row"].production and CUDA12.split_modes["layer"].production


def _write_gguf(path: Path, *, arch: str, layers: int, mla: bool = False, split_count: int = 1) -> Path:
    """A small GGUF of `arch` with real tensor infos (f16 attention, q8_0 experts) via gguf's own writer."""
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(layers)
    w.add_embedding_length(64)
    w.add_context_length(4096)
    w.add_head_count(4)
    w.add_feed_forward_length(128)
    if mla:
        # DeepSeek MLA as convert_hf_to_gguf writes it: one KV "head" of latent + rope, *_mla the real heads.
        w.add_head_count_kv(1)
        w.add_key_length(576)
        w.add_value_length(512)
        w.add_uint32(f"{arch}.attention.key_length_mla", 192)
        w.add_uint32(f"{arch}.attention.value_length_mla", 128)
        w.add_kv_lora_rank(512)
    else:
        w.add_head_count_kv(2)
        w.add_key_length(16)
        w.add_value_length(16)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(32)
    if split_count > 1:
        w.add_uint16("split.no", 0)
        w.add_uint16("split.count", split_count)
    w.add_token_list([b"a", b"b", b"c", b"d"])
    w.add_tensor("token_embd.weight", np.zeros((4, 64), np.float16))
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_q.weight", np.zeros((64, 64), np.float16))
        # 4 experts x 32 rows of 64 q8_0 values: 2 blocks of 34 bytes per row.
        w.add_tensor(
            f"blk.{i}.ffn_up_exps.weight", np.zeros((4 * 32, 2 * 34), np.uint8), raw_dtype=GGMLQuantizationType.Q8_0
        )
    w.add_tensor("output.weight", np.zeros((4, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_header_of_a_written_gguf_reads_architecture_and_tensor_bytes(tmp_path: Path) -> None:
    g = read_gguf(_write_gguf(tmp_path / "m.gguf", arch="qwen3moe", layers=3))
    assert (g.arch, g.name, g.block_count, g.embedding_length, g.head_count, g.head_count_kv) == (
        "qwen3moe",
        "tiny-qwen3moe",
        3,
        64,
        4,
        2,
    )
    assert (g.expert_count, g.expert_used_count, g.expert_feed_forward_length, g.vocab_size) == (4, 2, 32, 4)
    assert g.tensor_bytes["blk.0.attn_q.weight"] == 64 * 64 * 2
    assert g.tensor_bytes["blk.0.ffn_up_exps.weight"] == 4 * 32 * 2 * 34
    assert g.layer_bytes(1) == 64 * 64 * 2 + 4 * 32 * 68
    assert g.bytes_named("output.weight") == 4 * 64 * 4 and g.bytes_named("token_embd.weight") == 4 * 64 * 2
    assert not g.mla and g.kv_bytes_per_token_per_layer(2.0) == 2 * 2 * 16 * 2


def test_a_header_only_copy_reads_the_same_as_the_whole_file(tmp_path: Path) -> None:
    whole = _write_gguf(tmp_path / "m.gguf", arch="qwen3moe", layers=3)
    header = tmp_path / "header.gguf"
    data = whole.read_bytes()
    g = read_gguf(whole)
    header.write_bytes(data[: len(data) - sum(g.tensor_bytes.values()) + 100])  # tensor data cut away
    h = read_gguf(header)
    assert h.tensor_bytes == g.tensor_bytes and h.block_count == g.block_count and h.path == str(header)


def test_mla_gguf_caches_only_k(tmp_path: Path) -> None:
    g = read_gguf(_write_gguf(tmp_path / "r1.gguf", arch="deepseek2", layers=2, mla=True))
    assert g.mla and g.kv_bytes_per_token_per_layer(2.0) == 576 * 2  # latent 512 + rope 64, no V


def test_unknown_architecture_and_non_gguf_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="GGUF architecture 'gemma3' is not one the planner sizes"):
        read_gguf(_write_gguf(tmp_path / "g.gguf", arch="gemma3", layers=1))
    (tmp_path / "x.gguf").write_bytes(b"not a gguf at all")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        read_gguf(tmp_path / "x.gguf")


def test_split_gguf_needs_the_total_size_to_size_its_other_shards(tmp_path: Path) -> None:
    g = read_gguf(_write_gguf(tmp_path / "s-00001-of-00003.gguf", arch="qwen3moe", layers=3, split_count=3))
    with pytest.raises(
        ValueError, match="is shard 1 of 3: its header lists only its own tensors; state the model's sizeGib"
    ):
        shape_from_gguf(g)
    shape = shape_from_gguf(g, total_bytes=g.total_bytes * 3)
    assert sum(shape.layer_bytes) + shape.output_bytes + shape.input_bytes == g.total_bytes * 3
    assert not shape.exact


def test_layers_split_as_llama_cpp_cuts_them_with_the_output_on_the_last_gpu(tmp_path: Path) -> None:
    # src/llama-model.cpp: blocks and the output layer are layers + 1 slots cut at equal shares of the free
    # memory; slot i goes to GPU floor(i x gpus / (layers + 1)), so the output layer displaces a block forward.
    assert layers_per_gpu(61, 8) == [8, 8, 8, 7, 8, 8, 8, 6]
    assert layers_per_gpu(28, 2) == [15, 13]  # an even split would plan GPU 0's KV cache 1/15 short
    assert layers_per_gpu(64, 2) == [33, 31] and layers_per_gpu(94, 8) == [12] * 7 + [10]
    g = read_gguf(_write_gguf(tmp_path / "m.gguf", arch="qwen3moe", layers=4))
    est = llamacpp_estimate(
        shape_from_gguf(g),
        1.0,
        gpus=2,
        split_mode="layer",
        ctx_per_slot=1000,
        parallel=3,
        cache_type="q8_0",
        flash_attention=True,
    ).to_dict()
    # 4 blocks + the output layer over 2 GPUs: blocks 0-2 on GPU 0, block 3 and the output layer on GPU 1.
    assert est["layers_per_gpu"] == [3, 1] and est["ctx_per_slot"] == 1024 and est["n_ctx"] == 3072
    assert est["weights_gib_per_gpu"] == pytest.approx(3 * g.layer_bytes(0) / GIB, abs=1e-4)
    # q8_0 cache: 34 bytes per 32 elements; three layers on the fuller GPU.
    assert est["kv_bytes_per_token_per_gpu"] == pytest.approx(3 * (2 * 2 * 16) * 34 / 32)
    assert est["max_concurrency"] == 3.0 and est["weights_exact"] is True
    assert any("pads each slot's context to 256: 1000 becomes 1024" in n for n in est["notes"])


def test_deepseek_r1_q2_on_one_v100_node_fits_and_a_32k_q4_qwen_per_gpu_does_not() -> None:
    r1 = llamacpp_estimate(
        shape_from_arch(MODELS["deepseek-r1"], 212e9),
        32.0,
        gpus=8,
        split_mode="layer",
        ctx_per_slot=16384,
        parallel=4,
        cache_type="f16",
        flash_attention=True,
    ).to_dict()
    assert r1["fits"] is True and r1["weights_exact"] is False
    # MLA in llama.cpp: 576 K elements per token per layer at f16, 8 layers on the fullest GPU.
    assert r1["kv_bytes_per_token_per_gpu"] == 8 * 576 * 2
    qwen = llamacpp_estimate(
        shape_from_arch(MODELS["qwen3-30b-a3b"], 18.6e9),
        32.0,
        gpus=1,
        split_mode="none",
        ctx_per_slot=32768,
        parallel=8,
        cache_type="f16",
        flash_attention=True,
    ).to_dict()
    assert qwen["fits"] is False
    assert qwen["reason"].startswith("GPU 0 needs ") and "KV 24.0 for -c 262144" in qwen["reason"]
    assert qwen["advice"].startswith("lower llamacpp.contextPerSlot or parallel")


def test_argv_is_exact_one_server_per_gpu() -> None:
    spec = spec_of(llamacpp_config())
    servers = instances(spec, "chat")
    assert len(servers) == 32 and servers[1].gpu_ids == (1,) and servers[1].port == 8001
    assert llamacpp_argv(spec, servers[1]) == [*llamacpp_chat_head(8001), *LLAMACPP_CHAT_TAIL]


def test_the_nodes_cpus_are_split_between_its_servers_and_threads_is_the_stacks_key() -> None:
    config = llamacpp_config()
    config["llm-cluster:nodeDefaults"]["cpuCores"] = 64
    config["llm-cluster:nodes"]["gpu-04"]["cpuCores"] = 4
    spec = spec_of(config)
    threads = {i.head: llamacpp_argv(spec, i)[-1] for i in instances(spec, "chat")}
    assert threads == {"gpu-03": "8", "gpu-04": "1", "gpu-05": "8", "gpu-06": "8"}  # 4 CPUs for 8: at least 1
    assert spec.node_cpus("gpu-04") == (4, "nodes.gpu-04.cpuCores")
    assert spec.node_cpus("gpu-03") == (64, "nodeDefaults.cpuCores")
    with pytest.raises(SpecError) as err:
        spec_of(llamacpp_config(extraArgs=["-t", "32"]))
    assert [(i.path, i.message) for i in err.value.issues] == [
        (
            "pools.chat.llamacpp.extraArgs[0]",
            "'-t' is set by the typed key nodes.<node>.cpuCores (split between the "
            "node's serving instances): state it there instead",
        )
    ]


def test_argv_quantized_cache_and_extra_args() -> None:
    spec = spec_of(llamacpp_config(cacheType="q8_0", extraArgs=["--no-webui"]))
    argv = llamacpp_argv(spec, instances(spec, "chat")[0])
    assert argv[argv.index("--flash-attn") :] == [
        "--flash-attn",
        "on",
        "--cache-type-k",
        "q8_0",
        "--cache-type-v",
        "q8_0",
        "--fit",
        "off",
        "--jinja",
        "--metrics",
        "--threads",
        "10",
        "--no-webui",
    ]


def test_flag_dump_is_the_help_of_the_b11312_build_parsed() -> None:
    """components/engines/<engine>/data's llama.cpp dump is reproduced from the committed `llama-server --help` of a CPU build."""
    import json

    from components.engines.llamacpp.tools.dump_llamacpp import parse_help  # type: ignore[import-not-found]

    root = Path(__file__).resolve().parent.parent
    text = (root / "tests" / "fixtures" / "engines" / "llama.cpp-b11312-server-help.txt").read_text()
    dump = json.loads((root / "components" / "engines" / "llamacpp" / "data" / CUDA12.serve_args).read_text())
    assert parse_help(text) == dump
    options = [line for line in text.splitlines() if line.startswith("-") and not line.startswith("-----")]
    assert len(options) == len(dump) == 255  # every option line became one entry
    by_opt = {o: e for e in dump for o in e["opts"]}
    assert by_opt["-sm"]["choices"] == ["none", "layer", "row", "tensor"]
    assert by_opt["--metrics"]["kind"] == "_StoreTrueAction" and by_opt["-m"]["opts"] == ["-m", "--model"]


def test_argv_parses_with_llama_servers_own_options() -> None:
    from components.engines.cli_dump import build_parser, parse_errors

    spec = spec_of(llamacpp_config(cacheType="q8_0"))
    parser = build_parser(CUDA12.serve_args, "llama-server")
    argv = llamacpp_argv(spec, instances(spec, "chat")[0])
    assert parse_errors(parser, argv[1:]) == []
    args = parser.parse_args(argv[1:])
    assert (args.split_mode, args.ctx_size, args.parallel, args.fit) == ("layer", "32768", "4", "off")
    assert parse_errors(parser, ["--split-mode", "pipeline"]) == [
        "argument -sm/--split-mode: invalid choice: 'pipeline' (choose from 'none', 'layer', 'row', 'tensor')"
    ]
    assert parse_errors(parser, ["--tensor-parallel-size", "8"]) == ["unrecognized arguments: --tensor-parallel-size 8"]


def test_usage_of_a_real_llama_server_answer_has_openais_shape() -> None:
    """The answer and the last stream chunk of a real b11312 server carry OpenAI's usage object (what the
    gateway logs), with llama.cpp's cached-token detail beside it."""
    import json

    root = Path(__file__).resolve().parent / "fixtures" / "engines"
    answer = json.loads((root / "llama.cpp-b11312-chat.json").read_text())
    assert answer["usage"] == {
        "completion_tokens": 8,
        "prompt_tokens": 17,
        "total_tokens": 25,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    chunks = [
        json.loads(line[6:])
        for line in (root / "llama.cpp-b11312-chat-stream.txt").read_text().splitlines()
        if line.startswith("data: {")
    ]
    assert [c["usage"]["total_tokens"] for c in chunks if "usage" in c] == [13]  # only the last, with include_usage
    assert chunks[-1]["choices"] == []


def test_kv_cache_estimate_matches_a_real_llama_server(tmp_path: Path) -> None:
    """A CPU build of b11312 serving the tiny GGUF with -c 2048 -np 4 logged its cache (fixture): the estimate
    gives the same per-slot context and the same KV bytes, and the GGUF's tensor bytes are its model buffer."""
    import re
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "fixtures" / "engines"))
    from make_tiny_llama_gguf import write_tiny_llama  # type: ignore[import-not-found]

    log = (Path(__file__).parent / "fixtures" / "engines" / "llama.cpp-b11312-tiny-c2048-np4.log").read_text()
    kv_mib = float(re.search(r"llama_kv_cache: size =\s+([\d.]+) MiB", log).group(1))  # type: ignore[union-attr]
    model_mib = float(re.search(r"model buffer size =\s+([\d.]+) MiB", log).group(1))  # type: ignore[union-attr]
    slot = int(re.search(r"n_ctx_seq\s+= (\d+)", log).group(1))  # type: ignore[union-attr]
    shape = shape_from_gguf(read_gguf(write_tiny_llama(tmp_path / "tiny.gguf")))
    est = llamacpp_estimate(
        shape, 32.0, gpus=1, split_mode="none", ctx_per_slot=512, parallel=4, cache_type="f16", flash_attention=True
    ).to_dict()
    assert est["ctx_per_slot"] == slot == 512 and est["n_ctx"] == 2048
    # (the GiB figures are rounded to 4 places in plan.json: compare the exact per-token bytes x cells)
    assert est["kv_bytes_per_token_per_gpu"] * est["n_ctx"] / 2**20 == pytest.approx(kv_mib, abs=0.005)
    total_mib = (sum(shape.layer_bytes) + shape.output_bytes + shape.input_bytes) / 2**20
    assert total_mib == pytest.approx(model_mib, abs=0.005)
