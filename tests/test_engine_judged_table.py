"""The rules every engine judged from its image table gets (components/engines/judged.py), called on a
JudgedServer as the pack builds one: each on both sides with its whole message, and how a server's props
are read (numbers, the image, the argv past the program, the image's own parser once per engine and dump)."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines import judged
from components.engines.judged import (
    JudgedServer,
    advice_fit_problems,
    check_capacity_modelled,
    check_flags,
    check_image,
    check_image_known,
    number,
)
from components.engines.registry import ENGINES
from components.facts.hardware import GPUS

V100 = GPUS["Tesla V100-SXM2-32GB"]
A100 = GPUS["NVIDIA A100-SXM4-80GB"]
LMDEPLOY = "openmmlab/lmdeploy:v0.16.0-cu12.8"
LMDEPLOY_CU13 = "openmmlab/lmdeploy:v0.16.0-cu13.0"
LLAMACPP_CU13 = "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11312"


def lmdeploy(*flags: str, image: str = LMDEPLOY, gpu: Any = V100, **props: Any) -> JudgedServer:
    argv = ["lmdeploy", "serve", "api_server", "/m", *flags]
    return JudgedServer(ENGINES["lmdeploy"], {"image": image, "argv": argv, **props}, gpu)


def llamacpp(*flags: str, image: str = LLAMACPP_CU13, gpu: Any = V100) -> JudgedServer:
    return JudgedServer(ENGINES["llamacpp"], {"image": image, "argv": ["llama-server", "-m", "/m.gguf", *flags]}, gpu)


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (None, None),
        (True, None),
        (False, None),
        (8, 8),
        (8.0, 8),
        (8.9, 8),
        (-2.5, -2),
        ("8.0", 8),
        ("16", 16),
        ("x", None),
        ("", None),
        ([8], None),
    ],
)
def test_a_props_number(value: Any, read: int | None) -> None:
    assert number(value) == read


def test_a_server_is_read_from_its_props() -> None:
    s = lmdeploy("--tp", 2)  # type: ignore[arg-type]
    assert (s.image, s.argv, s.where, s.cap) == (
        LMDEPLOY,
        ["lmdeploy", "serve", "api_server", "/m", "--tp", "2"],
        "Tesla V100-SXM2-32GB (sm_70)",
        70,
    )
    assert s.tail() == ["/m", "--tp", "2"]
    assert llamacpp("-c", "4096").tail() == ["-m", "/m.gguf", "-c", "4096"]
    # No image at all is an image the facts do not know, named as empty.
    bare = JudgedServer(ENGINES["lmdeploy"], {}, V100)
    assert (bare.image, bare.argv, bare.facts, bare.args()) == ("", [], None, None)


def test_the_images_parser_is_built_once_per_engine_and_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judged, "_PARSERS", {})
    parser = lmdeploy().parser()
    assert parser.prog == "lmdeploy serve api_server"
    assert lmdeploy("--tp", "2", image="openmmlab/lmdeploy:v0.16.0-cu13.0").parser() is parser  # the same dump
    other = lmdeploy(image="openmmlab/lmdeploy:v0.15.0-cu12.8").parser()
    assert other is not parser and other.prog == "lmdeploy serve api_server"
    assert llamacpp().parser().prog == "llama-server"
    assert sorted(judged._PARSERS) == [
        ("llamacpp", "llama.cpp-b11312-server-args.json", "llama-server"),
        ("lmdeploy", "lmdeploy-0.15.0-api_server-args.json", "lmdeploy serve api_server"),
        ("lmdeploy", "lmdeploy-0.16.0-api_server-args.json", "lmdeploy serve api_server"),
    ]


def test_the_args_are_the_images_parse_or_none() -> None:
    assert vars(lmdeploy("--tp", "2").args()) == {"model_path": "/m", "tp": 2}  # type: ignore[arg-type]
    # The engine's own value type (LMDeploy's quant policy) converts: 8 stays an int.
    assert vars(lmdeploy("--quant-policy", "8").args()) == {"model_path": "/m", "quant_policy": 8}  # type: ignore[arg-type]
    assert lmdeploy("--tp", "x").args() is None  # engine-flags reports it
    assert lmdeploy("--tp", "2", image="lmdeploy:dev").args() is None  # unknown image


NO_VOLTA_LMDEPLOY = (
    "image openmmlab/lmdeploy:v0.16.0-cu13.0 has no kernels for Tesla V100-SXM2-32GB (sm_70): CUDA 13 build: no "
    "Volta kernels; use the -cu12.8 tag on V100 ([src-0.16.0] CMakeLists.txt:238-240: 70-real and 75-real only for "
    "CUDA < 13.0; CUDA 13 itself has no sm_70 target [read from code]). Use openmmlab/lmdeploy:v0.16.0-cu12.8 or "
    "openmmlab/lmdeploy:v0.15.0-cu12.8"
)
NO_VOLTA_LLAMACPP = (
    "image ghcr.io/ggml-org/llama.cpp:server-cuda13-b11312 has no kernels for Tesla V100-SXM2-32GB (sm_70): CUDA 13 "
    "build: no Volta code; use server-cuda-b11312 on V100 ([src-b11312] ggml/src/ggml-cuda/CMakeLists.txt:43-45: "
    "50/61/70-virtual only for CUDA < 13; CUDA 13 has no sm_70 target at all [read from code]). Use "
    "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312"
)


def test_engine_image_on_both_sides_of_the_images_gpus() -> None:
    assert check_image(lmdeploy(image=LMDEPLOY_CU13)) == [NO_VOLTA_LMDEPLOY]  # two images run there: either
    assert check_image(llamacpp()) == [NO_VOLTA_LLAMACPP]  # one image runs there
    assert check_image(lmdeploy(image=LMDEPLOY_CU13, gpu=A100)) == []
    assert check_image(llamacpp(gpu=A100)) == []
    assert check_image(lmdeploy()) == []
    assert check_image(lmdeploy(image="lmdeploy:dev")) == []  # engine-image-unknown speaks for it


def test_engine_image_unknown_names_the_known_images() -> None:
    assert check_image_known(lmdeploy(image="lmdeploy:dev")) == [
        "image lmdeploy:dev is not in the lmdeploy facts table, so nothing says it runs on Tesla V100-SXM2-32GB "
        "(sm_70) and its flags cannot be checked; capacity is sized as the default image's. Known: "
        "openmmlab/lmdeploy:v0.15.0-cu12.8, openmmlab/lmdeploy:v0.16.0-cu12.8, openmmlab/lmdeploy:v0.16.0-cu13.0 "
        "(components/engines/lmdeploy/facts.py)"
    ]
    assert check_image_known(lmdeploy()) == []


REFUSED_METRICS = (
    "lmdeploy serve api_server: --disable-metrics is refused: monitoring scrapes /metrics, which it turns off"
)


@pytest.mark.parametrize(
    ("flags", "found"),
    [
        ((), []),
        (("--tp", "2"), []),
        (
            ("--tp", "x"),
            [f"lmdeploy serve api_server ({LMDEPLOY}): argument --tp: invalid int value: 'x'"],
        ),
        (("--tp", "2", "--bogus"), [f"lmdeploy serve api_server ({LMDEPLOY}): unrecognized arguments: --bogus"]),
        (("--disable-metrics",), [REFUSED_METRICS]),
        (("--tp", "2", "--disable-metrics", "--backend", "turbomind"), [REFUSED_METRICS]),
        # The flag of `--flag=value` is what precedes the first `=`.
        (
            ("--disable-metrics=a=b",),
            [
                f"lmdeploy serve api_server ({LMDEPLOY}): argument --disable-metrics: ignored explicit argument 'a=b'",
                REFUSED_METRICS,
            ],
        ),
    ],
)
def test_engine_flags_parse_errors_then_refused_flags(flags: tuple[str, ...], found: list[str]) -> None:
    assert check_flags(lmdeploy(*flags)) == found


def test_engine_flags_of_each_engine_and_of_an_unknown_image() -> None:
    assert check_flags(llamacpp("--rpc=10.0.0.2:50052", image="ghcr.io/ggml-org/llama.cpp:server-cuda-b11312")) == [
        'llama-server: --rpc is refused: the RPC backend is, upstream, "a proof-of-concept ... fragile and '
        'insecure" (tools/rpc/README.md): llm-cluster serves llama.cpp on one node'
    ]
    assert check_flags(lmdeploy("--bogus", "--disable-metrics", image="lmdeploy:dev")) == []


@pytest.mark.parametrize(
    ("capacity", "found"),
    [
        (None, []),
        ("heads not divisible", []),
        ({}, []),
        ({"error": ""}, []),
        ({"error": None, "fits": False}, []),
        (
            {"error": "36 heads are not divisible by tensorParallel 8"},
            [
                "36 heads are not divisible by tensorParallel 8: memory fit cannot be judged; fix the pool or model it names"
            ],
        ),
    ],
)
def test_engine_capacity_on_both_sides(capacity: Any, found: list[str]) -> None:
    props = {} if capacity is None else {"capacity": capacity}
    assert check_capacity_modelled(lmdeploy(**props)) == found


@pytest.mark.parametrize(
    ("capacity", "found"),
    [
        (
            {"fits": False, "reason": "weights 70 GiB over 64", "advice": "tensorParallel: 4"},
            ["does not fit: weights 70 GiB over 64. To fit: tensorParallel: 4."],
        ),
        ({"fits": False, "advice": "tensorParallel: 4"}, ["does not fit: None. To fit: tensorParallel: 4."]),
        ({"fits": False, "reason": "r", "advice": ""}, []),
        ({"fits": False, "reason": "r"}, []),
        ({"fits": True, "reason": "r", "advice": "a"}, []),
        ({"fits": None, "reason": "r", "advice": "a"}, []),
        ({"reason": "r", "advice": "a"}, []),
        ({}, []),
    ],
)
def test_a_pool_that_does_not_fit_is_told_its_engines_fixes(capacity: dict[str, Any], found: list[str]) -> None:
    assert advice_fit_problems(capacity) == found
