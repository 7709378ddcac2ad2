"""llama.cpp's image facts (components.engines.llamacpp.facts): what each image runs per GPU, its own SASS or an
older arch's PTX the driver compiles at first start, over the whole table, and the lookup."""

from __future__ import annotations

import pytest

from components.engines.llamacpp.facts import DEFAULT_IMAGE, IMAGES, llamacpp_image

CUDA12, CUDA13 = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312", "ghcr.io/ggml-org/llama.cpp:server-cuda13-b11312"
CAPABILITIES = (35, 50, 52, 61, 70, 74, 75, 80, 86, 89, 90, 100, 120, 121)
# image -> per capability of CAPABILITIES: (runs, only as PTX compiled at first start).
PER_GPU = {
    CUDA12: [
        (False, False),  # below the oldest PTX (sm_50)
        (True, True),
        (True, True),
        (True, True),
        (True, True),
        (True, True),
        (True, True),
        (True, True),
        (True, False),  # its own SASS
        (True, False),
        (True, True),
        (True, True),
        (True, False),
        (True, True),
    ],
    CUDA13: [
        (False, False),
        (False, False),
        (False, False),
        (False, False),
        (False, False),  # no Volta code at all
        (False, False),
        (True, True),
        (True, True),
        (True, False),
        (True, False),
        (True, True),
        (True, True),
        (True, False),
        (True, False),
    ],
}


def test_the_table() -> None:
    assert list(IMAGES) == [CUDA12, CUDA13]
    assert DEFAULT_IMAGE == CUDA12


@pytest.mark.parametrize("ref", list(PER_GPU))
def test_what_each_image_runs_per_gpu(ref: str) -> None:
    f = IMAGES[ref]
    assert [(f.runs_on(c), f.jit_only(c)) for c in CAPABILITIES] == PER_GPU[ref]
    assert f.quantizations is f.model_formats


@pytest.mark.parametrize(
    ("ref", "key"),
    [
        (CUDA12, CUDA12),
        (CUDA13 + "@sha256:" + "0" * 64, CUDA13),
        ("ghcr.io/ggml-org/llama.cpp:server-cuda", None),
        ("ggml-org/llama.cpp:server-cuda-b11312", None),
    ],
)
def test_llamacpp_image(ref: str, key: str | None) -> None:
    assert llamacpp_image(ref) is (IMAGES[key] if key else None)
