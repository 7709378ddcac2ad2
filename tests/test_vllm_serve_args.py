"""`vllm serve` argv as the image's own parser reads it (components.engines.vllm.serve_args), compared whole:
the values by dest and every error in vLLM's words, per program (the CLI, the api_server module) and per
version (0.9.2 refuses --model, 0.19.1 moves it to the positional). The policy pack's flag, context and
quantization rules read these values; a value read wrong there is a wrong verdict at preview."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from components.engines.vllm.facts import image_facts
from components.engines.vllm.serve_args import (
    API_SERVER,
    SERVE,
    ServeArgs,
    _drop_option,
    _human_readable_int,
    _normalize,
    _option_strings,
    parse_serve,
    serve_parser,
)

V19 = image_facts("vllm/vllm-openai:v0.19.1")
V92 = image_facts("vllm/vllm-openai:v0.9.2")
M = "/data/models/m"


@pytest.fixture(autouse=True)
def fresh_parsers() -> Iterator[None]:
    """Each test builds the parsers it reads with (they are cached per process), so what it checks is
    what its own parse built."""
    serve_parser.cache_clear()
    _option_strings.cache_clear()
    yield


# vLLM's human_readable_int: decimal suffixes in lower case, binary in upper case (whole numbers only).
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("25k", 25_000),
        ("25K", 25 * 2**10),
        ("1.5k", 1_500),
        ("3m", 3 * 10**6),
        ("3M", 3 * 2**20),
        ("2g", 2 * 10**9),
        ("2G", 2 * 2**30),
        ("5t", 5 * 10**12),
        ("5T", 5 * 2**40),
        (" 7 ", 7),
        ("4096", 4096),
    ],
)
def test_human_readable_ints_read_as_vllm_reads_them(text: str, value: int) -> None:
    assert _human_readable_int(text) == value


def test_a_binary_suffix_with_decimals_is_vllms_error() -> None:
    with pytest.raises(ValueError, match=r"^decimals are not allowed with binary suffixes: 1\.5K$"):
        _human_readable_int("1.5K")


# (argv after `vllm serve`, the values read, the errors) with vLLM 0.19.1's parser.
SERVE_0_19: list[tuple[list[str], dict[str, Any], tuple[str, ...]]] = [
    ([M, "--max-num-batched-tokens", "25K"], {"max_num_batched_tokens": 25_600}, ()),
    ([M, "--max-num-batched-tokens", "25k"], {"max_num_batched_tokens": 25_000}, ()),
    (
        [M, "--max-num-batched-tokens", "25x"],
        {},
        ("argument --max-num-batched-tokens: invalid human_readable_int value: '25x'",),
    ),
    (
        [M, "--max-num-batched-tokens", "1.5K"],
        {},
        ("argument --max-num-batched-tokens: invalid human_readable_int value: '1.5K'",),
    ),
    ([M, "--max-model-len", "auto"], {"max_model_len": -1}, ()),
    ([M, "--max-model-len", "AUTO"], {"max_model_len": -1}, ()),
    ([M, "--max-model-len", " Auto "], {"max_model_len": -1}, ()),
    ([M, "--max-model-len", "-1"], {"max_model_len": -1}, ()),
    ([M, "--max-model-len", "32k"], {"max_model_len": 32_000}, ()),
    ([M, "--max-model-len", "32K"], {"max_model_len": 32_768}, ()),
    ([M, "--max-model-len", "au"], {}, ("argument --max-model-len: invalid human_readable_int_or_auto value: 'au'",)),
    # optional_type: '' and 'None' are None, the rest goes through the inner type.
    ([M, "--kv-cache-memory-bytes", "None"], {"kv_cache_memory_bytes": None}, ()),
    ([M, "--kv-cache-memory-bytes", ""], {"kv_cache_memory_bytes": None}, ()),
    ([M, "--kv-cache-memory-bytes", "1G"], {"kv_cache_memory_bytes": 2**30}, ()),
    (
        [M, "--kv-cache-memory-bytes", "none"],
        {},
        ("argument --kv-cache-memory-bytes: invalid human_readable_int value: 'none'",),
    ),
    # --x_y is --x-y; BooleanOptionalAction's --no- form; store_true; append.
    (
        [
            M,
            "--max_num_seqs=4",
            "--enforce-eager",
            "--no-enable-prefix-caching",
            "--headless",
            "--middleware",
            "a",
            "--middleware",
            "b",
        ],
        {
            "max_num_seqs": 4,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "headless": True,
            "middleware": ["a", "b"],
        },
        (),
    ),
    ([M, "--seed", "1", "--seed", "2"], {"seed": 2}, ()),  # the last wins, as in argparse
    ([M, "--seed"], {}, ("argument --seed: expected one argument",)),
    ([M, "--enforce-eager=x"], {}, ("argument --enforce-eager/--no-enforce-eager: ignored explicit argument 'x'",)),
    ([M, "--gpu-memory-utilization", "0.85"], {"gpu_memory_utilization": 0.85}, ()),
    ([M, "--served-model-name", "a", "b"], {"served_model_name": ["a", "b"]}, ()),
    # Choices are checked; a comma-separated multi-value option keeps none (vLLM checks it later).
    (
        [M, "--runner", "bogus"],
        {},
        ("argument --runner: invalid choice: 'bogus' (choose from 'auto', 'draft', 'generate', 'pooling')",),
    ),
    ([M, "--runner", "pooling"], {"runner": "pooling"}, ()),
    ([M, "--collect-detailed-traces", "model,all"], {"collect_detailed_traces": ["model,all"]}, ()),
    # Every bad value is reported, not only the first; the rest still read.
    (
        [M, "--max-num-seqs", "x", "--seed", "y", "--dtype", "half"],
        {"dtype": "half"},
        ("argument --max-num-seqs: invalid int value: 'x'", "argument --seed: invalid int value: 'y'"),
    ),
    (
        [M, "--no-such", "v", "extra", "--typo=3", "pos2"],
        {},
        (
            "unrecognized flag --no-such: not a `vllm serve` flag in vLLM 0.19.1",
            "unexpected positional argument 'extra': `vllm serve` takes one model",
            "unrecognized flag --typo: not a `vllm serve` flag in vLLM 0.19.1; did you mean --dtype?",
            "unexpected positional argument 'pos2': `vllm serve` takes one model",
        ),
    ),
    (
        [M, "--max-num-seq", "3"],
        {},
        ("unrecognized flag --max-num-seq: not a `vllm serve` flag in vLLM 0.19.1; did you mean --max-num-seqs?",),
    ),
    # argparse's own abbreviations are off, as in vLLM's parser.
    (
        [M, "--max-num-se=3"],
        {},
        ("unrecognized flag --max-num-se: not a `vllm serve` flag in vLLM 0.19.1; did you mean --max-num-seqs?",),
    ),
    ([M, "-q", "awq"], {"quantization": "awq"}, ()),
    (
        [M, "-q", "bogus"],
        {"quantization": "bogus"},
        (
            "argument --quantization/-q: unknown quantization method 'bogus'; vLLM 0.19.1 knows: awq, awq_marlin, "
            "bitsandbytes, compressed-tensors, cpu_awq, experts_int8, fbgemm_fp8, fp8, fp_quant, gguf, gptq, "
            "gptq_marlin, inc, modelopt, modelopt_fp4, modelopt_mixed, modelopt_mxfp8, moe_wna16, mxfp4, mxfp8, "
            "petit_nvfp4, quark, torchao",
        ),
    ),
    # 0.19.1 moves --model to the positional: alone it is the model, beside a positional it is refused.
    (["--model", "/x"], {"model": "/x"}, ()),
    (
        [M, "--model", "/x"],
        {"model": "/x"},
        (
            "both a positional model (/data/models/m) and --model /x: vLLM 0.19.1 moves --model to the positional, "
            "and its parser then refuses the second model",
        ),
    ),
    ([], {}, ("the model is missing: `vllm serve` takes it as the positional argument (vllm serve /path/to/model …)",)),
    (
        ["--seed", "1"],
        {"seed": 1},
        ("the model is missing: `vllm serve` takes it as the positional argument (vllm serve /path/to/model …)",),
    ),
]


@pytest.mark.parametrize(
    ("argv", "values", "errors"), SERVE_0_19, ids=[" ".join(a[1:]) or "empty" for a, _, _ in SERVE_0_19]
)
def test_vllm_0_19_serve_reads_each_argv_whole(
    argv: list[str], values: dict[str, Any], errors: tuple[str, ...]
) -> None:
    got = parse_serve(argv, facts=V19)
    expected = ({"model_tag": M} if argv[:1] == [M] else {}) | values
    assert (got.values, got.errors, got.program, got.version) == (expected, errors, SERVE, "0.19.1")


def test_vllm_0_9_2_refuses_model_as_a_flag_in_its_own_words() -> None:
    got = parse_serve([M, "--model", "/x"], facts=V92)
    assert got.errors == (
        "With `vllm serve`, you should provide the model as a positional argument or in a config file instead of "
        "via the `--model` option.",
    )
    assert (got.model, got.version) == (M, "0.9.2")
    assert parse_serve(["--model", "/x"], facts=V92).errors == got.errors


def test_vllm_0_9_2_reads_its_own_choices() -> None:
    got = parse_serve([M, "--block-size", "24", "--preemption-mode", "swap"], facts=V92)
    assert got.values == {"model_tag": M, "preemption_mode": "swap"}
    assert got.errors == ("argument --block-size: invalid choice: 24 (choose from 1, 8, 16, 32, 64, 128)",)
    assert parse_serve([M, "--block-size", "32"], facts=V92).values == {"model_tag": M, "block_size": 32}


def test_an_optional_choice_takes_none_as_vllm_0_9_2_does() -> None:
    """None among the dump's choices is optional_type's: the word None reads as None and is allowed."""
    got = parse_serve([M, "--device", "None", "--preemption-mode", "None"], facts=V92)
    assert (got.values, got.errors) == ({"model_tag": M, "device": None, "preemption_mode": None}, ())
    assert parse_serve([M, "--device", "cuda"], facts=V92).values == {"model_tag": M, "device": "cuda"}
    assert parse_serve([M, "--device", "none"], facts=V92).errors == (
        "argument --device: invalid choice: 'none' (choose from 'auto', 'cpu', 'cuda', 'hpu', 'neuron', 'tpu', "
        "'xpu', None)",
    )


def test_an_ambiguous_short_flag_stops_the_parse_with_argparses_words() -> None:
    got = parse_serve([M, "-d"], facts=V19)
    assert got.errors[0] == "ambiguous option: -d could match -dcp, -dp, -dpn, -dpr, -dpl, -dpa, -dpp, -dpb, -dph, -dpe"


def test_the_api_server_takes_the_model_as_a_flag_and_no_positional() -> None:
    got = parse_serve(["--model", "/x", "/y"], program=API_SERVER, facts=V19)
    assert (got.values, got.program, got.model) == ({"model": "/x"}, API_SERVER, "/x")
    assert got.errors == (
        "unexpected positional argument '/y': the api_server takes no positional argument (the model is --model; "
        "to run another program in the vllm/vllm-openai image, set the container's entrypoints)",
    )
    assert parse_serve(["--dtype", "half"], program=API_SERVER, facts=V19).errors == (
        "the model is missing: the api_server takes it as --model /path/to/model (without it vLLM 0.19.1 loads its "
        "default, Qwen/Qwen3-0.6B, from Hugging Face)",
    )
    assert parse_serve(["--dtype", "half"], program=API_SERVER, facts=V92).errors == (
        "the model is missing: the api_server takes it as --model /path/to/model (without it vLLM 0.9.2 loads its "
        "default, facebook/opt-125m, from Hugging Face)",
    )
    assert parse_serve(["--model", "/x", "--no-such"], program=API_SERVER, facts=V19).errors == (
        "unrecognized flag --no-such: not a `vllm.entrypoints.openai.api_server` flag in vLLM 0.19.1",
    )


def test_an_image_without_facts_is_read_by_the_default_parser_and_says_no_version() -> None:
    got = parse_serve([M, "--seed", "1", "--no-such"], facts=None)
    assert (got.values, got.version) == ({"model_tag": M, "seed": 1}, None)
    assert got.errors == ("unrecognized flag --no-such: not a `vllm serve` flag in vLLM 0.19.1",)


def test_an_image_whose_facts_have_no_parser_dump_is_read_by_the_default_parser() -> None:
    declared = dataclasses.replace(V92, serve_args=None)  # a private image declared without a dump
    got = parse_serve([M, "--model", "/x"], facts=declared)
    # The default (0.19.1) parser read it, not 0.9.2's: --model beside a positional, no version.
    assert got.version is None
    assert got.errors == (
        "both a positional model (/data/models/m) and --model /x: vLLM 0.19.1 moves --model to the positional, "
        "and its parser then refuses the second model",
    )


def test_each_programs_parser_is_named_as_vllm_names_it() -> None:
    dump = V19.serve_args
    assert serve_parser(SERVE, dump).prog == "vllm serve"
    assert serve_parser(API_SERVER, dump).prog == "python3 -m vllm.entrypoints.openai.api_server"


def test_the_model_served_is_the_positional_of_serve_and_the_flag_of_the_api_server() -> None:
    assert ServeArgs({"model_tag": "a", "model": "b"}).model == "a"
    assert ServeArgs({"model": "b"}).model == "b"
    assert ServeArgs({"model_tag": "a", "model": "b"}, program=API_SERVER).model == "b"
    assert ServeArgs({"model_tag": "a"}, program=API_SERVER).model is None
    assert ServeArgs({"x": 1}).get("x", 5) == 1
    assert ServeArgs({"x": 1}).get("y", 5) == 5
    assert ServeArgs({"x": 1}).get("y") is None


@pytest.mark.parametrize(
    ("token", "normal"),
    [
        ("--max_model_len=a_b", "--max-model-len=a_b"),
        ("--max_model_len", "--max-model-len"),
        ("-t_p", "-t_p"),
        ("a_b", "a_b"),
    ],
)
def test_only_a_long_flags_name_has_its_underscores_read_as_dashes(token: str, normal: str) -> None:
    assert _normalize(token) == normal


@pytest.mark.parametrize(
    ("tokens", "option", "left"),
    [
        # Every occurrence goes, with the values after it (up to the next flag); a value after =  is its own.
        (["--a", "1", "2", "--b", "--a=3", "x"], "--a", ["--b", "x"]),
        (["--a", "1", "--x"], "--z/--a", ["--x"]),
        (["--a"], "--a", []),
        # Nothing matched: the first token goes, so the parse loop always moves on.
        (["--c", "1"], "--a", ["1"]),
    ],
)
def test_a_failed_option_is_dropped_with_its_values(tokens: list[str], option: str, left: list[str]) -> None:
    assert _drop_option(tokens, option) == left
