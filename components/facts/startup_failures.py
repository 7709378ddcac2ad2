"""Fatal startup errors as the engines print them: the log line that says it, what it means, what to do.

The readiness gate (components.engines.base.health_gate_script) reads them on the node when a
server dies while it waits, and stops at once with the cause instead of waiting out its timeout and
blaming weights or memory; `doctor` reads them in every server's log. Each engine lists its own
in its package (components/engines/<engine>/startup_failures.py, `Engine.own_startup_failures`);
`Engine.startup_failures` adds these, the CUDA and NCCL ones every engine shares.

A pattern is a POSIX extended regular expression (`grep -E` on the node) written so that Python's `re`
reads it the same way (tests/test_startup_failures.py runs both over real logs): literal text, `.`,
`[0-9]`, `( | )`, `*`, `+`, `\\.`; no `\\d`, `\\s`, `\\b` or `[[:classes:]]`. Patterns are matched
case-sensitively against one line at a time; the first entry of a list that matches names the cause,
so a list goes from the most specific to the most general.

Sources, as cited below: the engines' source at a tag (file:line, read with git) and users' logs in
GitHub issues, `repo#N` being https://github.com/<repo>/issues/N (their lines are in
tests/fixtures/startup-failures, each issue's URL in its SOURCES.md). Nothing here ran on a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from components.facts.evidence import Sourced, code, observed

# What doctor files a finding under (its `check`): the runbook's troubleshooting rows.
OOM, DTYPE_KERNEL, KV_CAPACITY, DRIVER, STARTUP = "oom", "dtype-kernel", "kv-capacity", "driver", "startup"


@dataclass(frozen=True)
class StartupFailure:
    """One fatal startup error: the line an engine prints, its cause and what to change."""

    id: str
    check: str  # doctor's check name (OOM, DTYPE_KERNEL, ...)
    pattern: str  # POSIX ERE, read alike by Python's re (see the module's docstring)
    cause: str
    fix: str  # may name {pool}, {model} (their stack keys) and {memory_keys} (the engine's memory knobs)
    source: Sourced

    def __post_init__(self) -> None:
        for bad in ("\\d", "\\s", "\\b", "\\w", "[[:", "(?", "\\S", "\\D"):
            if bad in self.pattern:
                raise ValueError(
                    f"startup failure {self.id}: {bad!r} is not POSIX ERE, or Python reads it "
                    "differently; write the characters out"
                )
        re.compile(self.pattern)

    def advice(self, pool: str, model: str, memory_keys: str) -> str:
        """The cause and the fix, the fix naming this pool's and model's stack keys, and the source."""
        fix = self.fix.format(pool=pool, model=model, memory_keys=memory_keys)
        return f"{self.cause}. Fix: {fix} ({self.source})"


def first_failure(text: str, failures: Sequence[StartupFailure]) -> tuple[StartupFailure, str] | None:
    """The first entry (in list order) whose pattern matches a line of `text`, with that line (stripped)."""
    lines = text.splitlines()
    for f in failures:
        compiled = re.compile(f.pattern)
        for line in lines:
            if compiled.search(line):
                return f, line.strip()
    return None


def all_failures(text: str, failures: Sequence[StartupFailure]) -> list[tuple[StartupFailure, str]]:
    """Every entry whose pattern matches a line of `text`, in list order, each with the first such line."""
    out = []
    for f in failures:
        found = first_failure(text, (f,))
        if found:
            out.append(found)
    return out


def any_pattern(failures: Iterable[StartupFailure]) -> str:
    """One ERE matching a line any of `failures` matches (doctor's grep on the node)."""
    return "|".join(f"({f.pattern})" for f in failures)


# --- every engine: CUDA, PyTorch, NCCL ---------------------------------------------------------------

COMMON: tuple[StartupFailure, ...] = (
    StartupFailure(
        "no-kernel-image",
        DTYPE_KERNEL,
        r"no kernel image is available for execution on the device|with CUDA capability sm_[0-9]+ is not "
        r"compatible with the current PyTorch installation|PyTorch no longer supports this GPU because it is too old",
        "the image's PyTorch or CUDA kernels were not built for this GPU (V100 is sm_70: the vLLM 0.9.x and "
        "0.10.0/0.10.1 images, and any cu13 or -ubuntu2404 build, have none)",
        "an image that has sm_70 kernels in pools.{pool}.image (vLLM 0.10.2 to 0.19.x plain tag, LMDeploy "
        "-cu12.8, llama.cpp server-cuda); `make plan` names the tested ones",
        observed(
            "pytorch#147607 (sm_70 removed from torch 2.7.0+cu128); vllm#19185 on V100 with a 0.9.x image, "
            "#16307; torch/cuda/__init__.py _check_capability and _check_cubins (2.7.1, 2.8.0)"
        ),
    ),
    StartupFailure(
        "driver-too-old",
        DRIVER,
        r"CUDA driver version is insufficient for CUDA runtime version|The NVIDIA driver on your system is too "
        r"old|forward compatibility was attempted on non supported HW|the provided PTX was compiled with an "
        r"unsupported toolchain",
        "the node's NVIDIA driver is older than the image's CUDA (a PTX-only build such as llama.cpp's sm_70 "
        "JIT-compiles with the driver, which must know that CUDA)",
        "upgrade the driver on the node (R570 or later for CUDA 12.8 images; `nvidia-smi` shows it), or an "
        "image built for an older CUDA in pools.{pool}.image",
        code(
            "CUDA runtime error strings (cudaErrorInsufficientDriver 35, cudaErrorCompatNotSupportedOnDevice "
            "804, cudaErrorUnsupportedPtxVersion 222); torch/cuda/__init__.py _check_driver"
        ),
    ),
    StartupFailure(
        "cuda-oom",
        OOM,
        r"CUDA out of memory|OutOfMemoryError|cudaMalloc failed: out of memory|CUDA (runtime )?error: out of memory",
        "the GPU ran out of memory while the server loaded (weights, activations or KV cache), or another "
        "process holds GPU memory",
        "lower pools.{pool}.{memory_keys}, or spread the model over more GPUs; `nvidia-smi` on the node shows "
        "memory held by another process",
        observed(
            "torch's CUDA caching allocator (vllm#12529); llama.cpp ggml-cuda.cu:888 (b11312); LMDeploy "
            "TurboMind's allocator (lmdeploy#1459, #3557; from v0.14 `[TM][FATAL]… CUDA error: out of "
            "memory`, src/turbomind/utils/cuda_utils.cc:28 at v0.16.0 [code])"
        ),
    ),
    StartupFailure(
        "nccl-shm",
        STARTUP,
        r"Error while creating shared memory segment",
        "NCCL could not create its shared-memory segment in /dev/shm: the container's /dev/shm is too small",
        "raise pools.{pool}.shmSizeGib",
        code('NCCL src/misc/shmutils.cc: "Error while creating shared memory segment %s (size %zu)"'),
    ),
)
