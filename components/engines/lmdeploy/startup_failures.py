"""LMDeploy (TurboMind)'s own fatal startup errors (the entries and their form: components.facts.startup_failures)."""

from __future__ import annotations

from components.facts.evidence import observed
from components.facts.startup_failures import DTYPE_KERNEL, StartupFailure

STARTUP_FAILURES: tuple[StartupFailure, ...] = (
    StartupFailure(
        "turbomind-kernel-missing",
        DTYPE_KERNEL,
        r"No decoding kernel found|No attention kernel found|No feasible kernel found for the problem",
        "TurboMind has no kernel for this model's shapes on this GPU (on V100: head dim 256 decoding, whose "
        "3-stage kernel needs more than sm_70's 96 KB of shared memory)",
        "a model whose attention TurboMind runs on sm_70 (head dim 128) in pools.{pool}.model, a newer "
        "LMDeploy in pools.{pool}.image (lmdeploy PR #4412), or pools.{pool}.engine: vllm",
        observed(
            "lmdeploy#4408 (Tesla V100-SXM2-32GB, Qwen3.5); TM_CHECK in src/turbomind/kernels/attention/"
            "decoding.cu:36, attention.cu:25, gemm.cu:341 at v0.16.0 [code]"
        ),
    ),
)
