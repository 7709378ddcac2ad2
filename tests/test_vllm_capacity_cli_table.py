"""vLLM's capacity estimator on the command line (components/engines/vllm/capacity_cli.py) as tables: every
option with its spelling, default, type and help, how a model is read (catalog, directory, file, each failure),
each refusal with its words, the settings each argument sets in the estimate, the text report whole, and the
exit status of each outcome."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components.engines.vllm import capacity_cli as cli
from components.engines.vllm.facts import DEFAULT_IMAGE, IMAGES, KV_CACHE_DTYPES
from components.engines.vllm.memory import CapacityEstimate, estimate
from components.facts.hardware import DTYPE_ALIASES
from components.facts.models import MODELS, arch_from_config_json, model_arch

CATALOG = ", ".join(sorted(MODELS))
IMAGES_KNOWN = ", ".join(sorted(IMAGES))


# --- the options ----------------------------------------------------------------------------------------


def test_every_option_with_its_spelling_default_type_and_help() -> None:
    parser = cli._parser("prog")
    assert (parser.prog, parser.description) == (
        "prog",
        "Command-line capacity estimator: weights, KV cache and concurrency per GPU for one vLLM pool.",
    )
    options = {
        tuple(a.option_strings): (a.dest, a.default, a.type, a.choices, a.help, type(a).__name__)
        for a in parser._actions
        if a.dest != "help"
    }
    assert options == {
        ("--list",): ("list", False, None, None, "list the catalog models and exit", "_StoreTrueAction"),
        ("--model",): ("model", None, None, None, f"catalog name ({CATALOG}) or path to a config.json", "_StoreAction"),
        ("--gpu",): (
            "gpu",
            None,
            None,
            None,
            "GPU model as nvidia-smi names it, e.g. 'Tesla V100-SXM2-32GB'",
            "_StoreAction",
        ),
        ("--gpu-memory-gib",): ("gpu_memory_gib", None, float, None, "GPU memory in GiB", "_StoreAction"),
        ("--tp", "--tensor-parallel-size"): ("tp", 1, int, None, None, "_StoreAction"),
        ("--pp", "--pipeline-parallel-size"): ("pp", 1, int, None, None, "_StoreAction"),
        ("--gpu-memory-utilization",): ("gpu_memory_utilization", 0.9, float, None, None, "_StoreAction"),
        ("--dtype",): (
            "dtype",
            "half",
            None,
            sorted(DTYPE_ALIASES),
            "as vllm serve takes it; auto means float16 (the V100 answer)",
            "_StoreAction",
        ),
        ("--quantization",): (
            "quantization",
            None,
            None,
            None,
            "gptq, awq, moe_wna16, bitsandbytes, fp8, ... (default: the config.json's, or none)",
            "_StoreAction",
        ),
        ("--quant-bits",): (
            "quant_bits",
            None,
            int,
            None,
            "weight bits for gptq/awq, 2..8 (default: the config.json's, or 4)",
            "_StoreAction",
        ),
        ("--group-size",): (
            "group_size",
            None,
            int,
            None,
            "quantization group size, -1 for per-channel (default: the config.json's, or 128)",
            "_StoreAction",
        ),
        ("--kv-cache-dtype",): ("kv_cache_dtype", "auto", None, KV_CACHE_DTYPES, None, "_StoreAction"),
        ("--max-model-len",): ("max_model_len", None, int, None, None, "_StoreAction"),
        ("--max-num-seqs",): ("max_num_seqs", 256, int, None, None, "_StoreAction"),
        ("--max-num-batched-tokens",): ("max_num_batched_tokens", None, int, None, None, "_StoreAction"),
        ("--block-size",): ("block_size", 16, int, None, None, "_StoreAction"),
        ("--no-mla",): (
            "no_mla",
            False,
            None,
            None,
            "plan as with VLLM_MLA_DISABLE=1 (needed on V100)",
            "_StoreTrueAction",
        ),
        ("--image",): (
            "image",
            DEFAULT_IMAGE,
            None,
            None,
            f"serving image whose profiler and engine line set the budget (default {DEFAULT_IMAGE}; known: "
            f"{IMAGES_KNOWN})",
            "_StoreAction",
        ),
        ("--json",): ("json", False, None, None, "print the estimate as JSON", "_StoreTrueAction"),
    }


def test_gpu_and_gpu_memory_are_one_or_the_other(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", "qwen3-32b", "--max-model-len", "8", "--gpu", "Tesla T4", "--gpu-memory-gib", "16"]
    assert cli.main(argv, "prog") == 2
    assert "argument --gpu-memory-gib: not allowed with argument --gpu" in capsys.readouterr().err


# --- the model ------------------------------------------------------------------------------------------

CFG = {
    "model_type": "qwen2",
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_hidden_layers": 4,
    "num_key_value_heads": 8,
    "intermediate_size": 4096,
    "vocab_size": 32000,
}


def test_a_catalog_model_has_no_checkpoint_quantization() -> None:
    assert cli._load_model("qwen3-32b") == (model_arch("qwen3-32b"), None)


def test_a_directory_is_read_through_its_config_json_named_after_it(tmp_path: Path) -> None:
    d = tmp_path / "Tiny-1B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**CFG, "quantization_config": {"quant_method": "AWQ", "bits": 4}}))
    arch, quant = cli._load_model(str(d))
    assert (arch, quant) == (arch_from_config_json(CFG, "Tiny-1B"), ("awq", 4, -1))


def test_a_config_file_is_named_after_its_directory(tmp_path: Path) -> None:
    (tmp_path / "cfg.json").write_text(json.dumps(CFG))
    arch, quant = cli._load_model(str(tmp_path / "cfg.json"))
    assert (arch.name, quant) == (tmp_path.name, None)


def test_a_config_file_at_the_root_is_named_after_its_stem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.json").write_text(json.dumps(CFG))
    assert cli._load_model("tiny.json")[0].name == "tiny"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "cannot read {path}: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
        (json.dumps({**CFG, "model_type": "bert"}), "model_type 'bert' of 'm' is not one the planner knows: "),
        (json.dumps({k: v for k, v in CFG.items() if k != "hidden_size"}), "config.json of 'm' has no 'hidden_size'"),
    ],
)
def test_a_config_json_the_planner_cannot_read_is_a_usage_error(tmp_path: Path, content: str, message: str) -> None:
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(content)
    with pytest.raises(cli.UsageError) as err:
        cli._load_model(str(d))
    assert str(err.value).startswith(message.format(path=d / "config.json"))


def test_a_model_neither_in_the_catalog_nor_a_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(cli.UsageError) as err:
        cli._load_model(str(tmp_path / "nothing"))
    assert str(err.value) == (
        f"--model '{tmp_path / 'nothing'}' is neither a catalog model ({CATALOG}) nor an existing config.json"
    )
    with pytest.raises(cli.UsageError, match="nor an existing config.json"):
        cli._load_model(str(tmp_path))  # a directory without config.json


# --- the arguments' refusals ----------------------------------------------------------------------------

BASE = ["--model", "qwen3-32b", "--gpu-memory-gib", "32", "--max-model-len", "1024"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "missing --model, --max-model-len, --gpu or --gpu-memory-gib"),
        (["--model", "qwen3-32b"], "missing --max-model-len, --gpu or --gpu-memory-gib"),
        (["--max-model-len", "8", "--gpu", "Tesla T4"], "missing --model"),
        (["--model", "qwen3-32b", "--gpu", "Tesla T4"], "missing --max-model-len"),
        ([*BASE, "--quant-bits", "1"], "--quant-bits 1: weight bits must be between 2 and 8"),
        ([*BASE, "--quant-bits", "9"], "--quant-bits 9: weight bits must be between 2 and 8"),
        ([*BASE, "--group-size", "0"], "--group-size 0: must be -1 (one group per output channel) or at least 1"),
        (
            [*BASE, "--image", "vllm/vllm-openai:v9"],
            f"--image vllm/vllm-openai:v9: not in the facts table; known: {IMAGES_KNOWN}",
        ),
        (
            ["--model", "qwen3-32b", "--gpu", "Tesla K80", "--max-model-len", "8"],
            "unknown GPU model 'Tesla K80'",
        ),
        ([*BASE, "--tp", "3"], "qwen3-32b has 64 attention heads, not divisible by tensor parallel size 3"),
    ],
)
def test_each_refusal_is_a_usage_error_in_its_words(argv: list[str], message: str) -> None:
    with pytest.raises(cli.UsageError) as err:
        cli.run(argv, "prog")
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("flags", "given"),
    [
        (["--quant-bits", "2"], {"quant_bits": 2}),
        (["--quant-bits", "8"], {"quant_bits": 8}),
        (["--group-size", "-1"], {"group_size": -1}),
        (["--group-size", "1"], {"group_size": 1}),
    ],
)
def test_the_bounds_of_bits_and_group_size_are_taken(flags: list[str], given: dict[str, int]) -> None:
    est, _ = cli.run([*BASE, "--quantization", "gptq", *flags], "prog")
    assert est == estimate(
        model_arch("qwen3-32b"),
        32,
        tp=1,
        pp=1,
        gpu_memory_utilization=0.9,
        dtype="float16",
        quantization="gptq",
        max_model_len=1024,
        max_num_seqs=256,
        nccl_in_budget=False,
        **given,
    )


# --- what each argument sets ----------------------------------------------------------------------------


def test_every_argument_reaches_the_estimate() -> None:
    argv = [
        "--model", "qwen3-30b-a3b", "--gpu", "NVIDIA H100 80GB HBM3", "--tensor-parallel-size", "8",
        "--pipeline-parallel-size", "2", "--gpu-memory-utilization", "0.8", "--dtype", "bfloat16",
        "--quantization", "GPTQ", "--quant-bits", "8", "--group-size", "64", "--kv-cache-dtype", "fp8",
        "--max-model-len", "4096", "--max-num-seqs", "64", "--max-num-batched-tokens", "4096",
        "--block-size", "32", "--json",
    ]  # fmt: skip
    est, ctx = cli.run(argv, "prog")
    assert ctx == {"gpu": "NVIDIA H100 80GB HBM3", "json": True}
    assert est == estimate(
        model_arch("qwen3-30b-a3b"),
        78.37,
        tp=8,
        pp=2,
        gpu_memory_utilization=0.8,
        dtype="bfloat16",
        quantization="gptq",
        quant_bits=8,
        group_size=64,
        kv_cache_dtype="fp8",
        max_model_len=4096,
        max_num_seqs=64,
        max_num_batched_tokens=4096,
        block_size=32,
        mla_enabled=True,
        v1_engine=True,
        gpu_name="NVIDIA H100 80GB HBM3",
        nccl_in_budget=False,
        nvls=True,
    )
    # NVLS: 0.32 GiB for each of 7 TP peers and a pipeline neighbour, over V1's 2 GiB floor.
    assert est.communicator_gib == pytest.approx(8 * 0.32)


@pytest.mark.parametrize(
    ("gpu", "batched"),
    [("NVIDIA A100-SXM4-80GB", 2048), ("NVIDIA H100 80GB HBM3", 8192), ("Tesla V100-SXM2-32GB", 2048)],
)
def test_the_gpus_name_picks_v1s_default_budget(gpu: str, batched: int) -> None:
    est, _ = cli.run(["--model", "qwen3-32b", "--gpu", gpu, "--max-model-len", "16384"], "prog")
    assert est.max_num_batched_tokens == batched


def test_a_gpu_given_by_memory_alone_has_no_nvls() -> None:
    est, _ = cli.run([*BASE, "--tp", "8"], "prog")
    # Seven TP peers at 0.25 GiB (V0's terms: no engine line is known without the GPU's name).
    assert (est.communicator_gib, est.max_num_batched_tokens) == (1.75, 2048)


@pytest.mark.parametrize(
    ("argv", "expected", "ctx"),
    [
        # A GPU by memory alone: no name, V0's defaults, no NVLS; auto means float16.
        (
            [*BASE, "--dtype", "auto"],
            dict(dtype="float16", v1_engine=False, gpu_name="", nvls=False, nccl_in_budget=False),
            {"gpu": None, "json": False},
        ),
        (
            [*BASE, "--dtype", "float"],
            dict(dtype="float32", v1_engine=False, gpu_name="", nvls=False, nccl_in_budget=False),
            {"gpu": None, "json": False},
        ),
        # 0.9.2 runs V0's budget, NCCL inside it, on every GPU.
        (
            ["--model", "qwen3-32b", "--gpu", "NVIDIA A100-SXM4-80GB", "--max-model-len", "1024", "--image",
             "vllm/vllm-openai:v0.9.2"],
            dict(dtype="float16", v1_engine=False, gpu_name="NVIDIA A100-SXM4-80GB", nvls=False, nccl_in_budget=True),
            {"gpu": "NVIDIA A100-SXM4-80GB", "json": False},
        ),
        (
            ["--model", "qwen3-32b", "--gpu", "Tesla V100-SXM2-32GB", "--max-model-len", "1024", "--no-mla"],
            dict(dtype="float16", v1_engine=True, gpu_name="Tesla V100-SXM2-32GB", nvls=False, nccl_in_budget=False,
                 mla_enabled=False),
            {"gpu": "Tesla V100-SXM2-32GB", "json": False},
        ),
    ],
)  # fmt: skip
def test_the_gpu_image_dtype_and_mla_switch_set_the_estimate(
    argv: list[str], expected: dict[str, Any], ctx: dict[str, Any]
) -> None:
    est, got_ctx = cli.run(argv, "prog")
    memory = {"Tesla V100-SXM2-32GB": 31.74, "NVIDIA A100-SXM4-80GB": 78.72}.get(expected["gpu_name"], 32)
    assert got_ctx == ctx
    assert est == estimate(
        model_arch("qwen3-32b"),
        memory,
        tp=1,
        pp=1,
        gpu_memory_utilization=0.9,
        max_model_len=1024,
        max_num_seqs=256,
        **expected,
    )


def test_the_checkpoints_quantization_is_taken_unless_given(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({**CFG, "quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": 32}})
    )
    argv = ["--model", str(tmp_path), "--gpu-memory-gib", "16", "--max-model-len", "1024"]
    arch = arch_from_config_json(CFG, tmp_path.name)
    common = dict(tp=1, pp=1, gpu_memory_utilization=0.9, dtype="float16", max_model_len=1024, max_num_seqs=256,
                  nccl_in_budget=False)  # fmt: skip
    assert cli.run(argv, "prog")[0] == estimate(arch, 16, quantization="gptq", quant_bits=8, group_size=32, **common)
    given = [*argv, "--quantization", "AWQ", "--quant-bits", "4", "--group-size", "128"]
    assert cli.run(given, "prog")[0] == estimate(arch, 16, quantization="awq", quant_bits=4, group_size=128, **common)
    # Without a checkpoint's: none, 4 bits, groups of 128.
    (tmp_path / "config.json").write_text(json.dumps(CFG))
    assert cli.run([*argv, "--quantization", "gptq"], "prog")[0] == estimate(
        arch, 16, quantization="gptq", quant_bits=4, group_size=128, **common
    )


# --- the text report ------------------------------------------------------------------------------------

FIELDS: dict[str, Any] = dict(
    model="m", gpu_memory_gib=31.74, tp=8, pp=2, gpu_memory_utilization=0.9, dtype="float16", quantization="gptq",
    kv_cache_dtype="auto", uses_mla=True, mla_enabled=True, max_model_len=8192, max_num_seqs=32,
    max_num_batched_tokens=8192, layers_per_stage=(31, 30), weights_gib_per_gpu=21.456, weights_gib_total=330.44,
    kv_bytes_per_token_per_gpu=34560, activation_gib=1.234, non_torch_gib=2.5, kv_cache_gib_per_gpu=3.21,
    gpu_blocks=6234, kv_tokens=99744, max_concurrency=12.17578125, fits=True, reason="",
    rule_of_thumb_gib_total=401.25, notes=("first note", "second note"), communicator_gib=2.25,
    communicator_in_budget=True, kv_estimate_error=0.035, kv_error_class="V0 · TP>=2 · MLA: too few logs",
)  # fmt: skip


def test_the_text_report_whole() -> None:
    assert cli.render_text(CapacityEstimate(**FIELDS), "Tesla V100-SXM2-32GB") == (
        "m on Tesla V100-SXM2-32GB (31.74 GiB), TP=8 PP=2, float16, quantization gptq, KV cache auto, MLA on\n"
        "  layers per stage        31/30\n"
        "  weights per GPU            21.46 GiB  (whole model 330.4 GiB)\n"
        "  activation peak             1.23 GiB  (max-num-batched-tokens 8192)\n"
        "  non-torch                   2.50 GiB  (NCCL/all-reduce 2.25 GiB, inside the budget)\n"
        "  KV cache per GPU            3.21 GiB  (34560 bytes/token)\n"
        "  KV tokens                  99744      (6234 blocks)\n"
        "  max concurrency            12.18 x    at 8192 tokens per request\n"
        "  pessimistic end            96252      KV tokens, 11.75 x (class V0 · TP>=2 · MLA: too few logs: 3.5% "
        "optimistic at worst)\n"
        "  rule of thumb              401.2 GiB  (params x bytes x 1.2, whole pool)\n"
        "  fits                    yes\n"
        "  note: first note\n"
        "  note: second note"
    )


def test_the_text_report_of_a_refused_pool_by_memory_with_the_start_up_check() -> None:
    est = CapacityEstimate(
        **{
            **FIELDS,
            "quantization": None,
            "uses_mla": False,
            "mla_enabled": False,
            "fits": False,
            "reason": "too big",
            "notes": (),
            "communicator_in_budget": False,
            "startup_free_gib": 29.5,
            "layers_per_stage": (61,),
        }
    )
    text = cli.render_text(est)
    assert text.splitlines()[0] == "m on 31.74 GiB GPUs, TP=8 PP=2, float16, quantization none, KV cache auto"
    assert text.splitlines()[2:5] == [
        "  weights per GPU            21.46 GiB  (whole model 330.4 GiB)",
        "  activation peak             1.23 GiB  (max-num-batched-tokens 8192)",
        "  non-torch                   2.50 GiB  (NCCL/all-reduce 2.25 GiB, outside the budget)",
    ]
    assert text.splitlines()[1] == "  layers per stage        61"
    # The free memory at start comes just before the verdict, with what vLLM requests (0.9 x 31.74).
    assert text.splitlines()[-2:] == [
        "  free at start              29.50 GiB  (vLLM requests 28.57 GiB)",
        "  fits                    NO: too big",
    ]


def test_mla_off_is_said_on_an_mla_model() -> None:
    text = cli.render_text(CapacityEstimate(**{**FIELDS, "mla_enabled": False}), "g")
    assert text.splitlines()[0].endswith("quantization gptq, KV cache auto, MLA off")


# --- exit status and output -----------------------------------------------------------------------------

R1 = ["--model", "deepseek-r1", "--gpu", "Tesla V100-SXM2-32GB", "--tp", "8", "--pp", "2", "--gpu-memory-utilization",
      "0.92", "--quantization", "gptq", "--max-model-len", "16384", "--max-num-seqs", "32", "--image",
      "vllm/vllm-openai:v0.9.2"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status"),
    [(R1, 0), ([*R1, "--no-mla"], 1), ([*R1, "--tp", "3"], 2), (["--help"], 0), (["--tp", "x"], 2), ([], 2)],
)
def test_the_exit_status_of_each_outcome(argv: list[str], status: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv, "prog") == status
    captured = capsys.readouterr()
    if argv == ["--help"]:
        assert captured.out.startswith("usage: prog [-h]")
    elif status == 2:
        assert "Traceback" not in captured.err and captured.err.rstrip().splitlines()[-1].startswith(
            ("error: ", "prog: error: ")
        )


def test_the_text_report_is_printed_for_the_gpu_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(R1, "prog") == 0
    est, _ = cli.run(R1, "prog")
    assert capsys.readouterr().out == cli.render_text(est, "Tesla V100-SXM2-32GB") + "\n"


def test_a_usage_error_is_one_line_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--model", "nothing", "--gpu-memory-gib", "8", "--max-model-len", "8"], "prog") == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        f"error: --model 'nothing' is neither a catalog model ({CATALOG}) nor an existing config.json\n",
    )


def test_the_catalog_is_listed_one_model_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--list", "--json"], "prog") == 0
    assert capsys.readouterr().out == "".join(f"{n:<30} {a.hf_id}\n" for n, a in sorted(MODELS.items()))


def test_the_json_report_names_the_gpu_and_a_pool_that_does_not_fit_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main([*BASE, "--json"], "prog") == 1
    est, _ = cli.run(BASE, "prog")
    out = capsys.readouterr().out
    assert out == json.dumps({"gpu": None, **est.to_dict()}, indent=2) + "\n" and not est.fits
