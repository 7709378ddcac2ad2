"""Every spelling of a server flag each engine's parser accepts, as a table: the long flag it sets (what
the spec's typed-flag refusal, the policy pack's flag checks and the topology rule read), or None for a
value. A spelling missed lets a typed flag through extraArgs, where it would win over the typed key."""

from __future__ import annotations

import pytest

from components.engines.registry import ENGINES
from components.engines.vllm.options import canonical_flag

# (token, the long flag it sets, None: a value) — vLLM's FlexibleArgumentParser spellings.
VLLM: list[tuple[str, str | None]] = [
    ("8", None),
    ("/data/models/x", None),
    ("-", None),  # stdin, a value
    ("-1", None),  # a negative number
    ("-0.5", None),
    ("-1e5", None),
    ("--seed", "--seed"),
    ("--seed=7", "--seed"),
    ("--seed=7=8", "--seed"),  # the value may hold "="
    ("--max_model_len=8", "--max-model-len"),
    ("--enable_chunked_prefill", "--enable-chunked-prefill"),
    ("-tp", "--tensor-parallel-size"),
    ("-tp=4", "--tensor-parallel-size"),
    ("-pp", "--pipeline-parallel-size"),
    ("-q", "--quantization"),
    ("-n", "--nnodes"),
    ("-r", "--node-rank"),
    ("-x", "-x"),  # a short flag vLLM does not alias stays as written
    ("--no-enforce-eager", "--enforce-eager"),
    ("--no_enforce_eager", "--enforce-eager"),
    ("--no-enable-prefix-caching=1", "--enable-prefix-caching"),
    ("--no-such-flag", "--no-such-flag"),  # --no- of no typed flag is its own flag
    ("--my-host", "--my-host"),  # ends in a typed flag's name, is not it
]


@pytest.mark.parametrize(("token", "flag"), VLLM)
def test_vllm_reads_each_spelling_as_its_long_flag(token: str, flag: str | None) -> None:
    assert canonical_flag(token) == flag
    assert ENGINES["vllm"].canonical_flag(token) == flag


# LMDeploy's argparse: underscores are not dashes there, but the product reads them as the same flag.
LMDEPLOY: list[tuple[str, str | None]] = [
    ("8", None),
    ("-", None),
    ("-1", None),
    ("-0.5", None),
    ("--session-len", "--session-len"),
    ("--session_len=8", "--session-len"),
    ("--log-level=INFO=x", "--log-level"),
    ("--tp", "--tp"),
    ("-h", "-h"),
]


@pytest.mark.parametrize(("token", "flag"), LMDEPLOY)
def test_lmdeploy_reads_each_spelling_as_its_long_flag(token: str, flag: str | None) -> None:
    assert ENGINES["lmdeploy"].canonical_flag(token) == flag


# llama-server's common/arg.cpp: each short spelling of a typed or credential flag.
LLAMACPP: list[tuple[str, str | None]] = [
    ("8", None),
    ("-", None),
    ("-1", None),
    ("-0.5", None),
    ("-m", "--model"),
    ("-m=x.gguf", "--model"),
    ("-a", "--alias"),
    ("-ngl", "--n-gpu-layers"),
    ("--gpu-layers", "--n-gpu-layers"),
    ("-sm", "--split-mode"),
    ("-c", "--ctx-size"),
    ("-np", "--parallel"),
    ("-fa", "--flash-attn"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-fit", "--fit"),
    ("-hft", "--hf-token"),
    ("-t", "--threads"),
    ("--ctx-size=4096", "--ctx-size"),
    ("--seed=7=8", "--seed"),
    # llama.cpp's parser does not fold _ into -: --ctx_size is another (unknown) flag.
    ("--ctx_size", "--ctx_size"),
]


@pytest.mark.parametrize(("token", "flag"), LLAMACPP)
def test_llamacpp_reads_each_spelling_as_its_long_flag(token: str, flag: str | None) -> None:
    assert ENGINES["llamacpp"].canonical_flag(token) == flag
