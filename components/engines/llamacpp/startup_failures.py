"""llama.cpp (llama-server)'s own fatal startup errors (the entries and their form: components.facts.startup_failures)."""

from __future__ import annotations

from components.facts.evidence import observed
from components.facts.startup_failures import KV_CAPACITY, STARTUP, StartupFailure

STARTUP_FAILURES: tuple[StartupFailure, ...] = (
    StartupFailure(
        # Before the shared OOM entry: on a GPU this line follows "cudaMalloc failed: out of memory".
        "kv-cache-alloc",
        KV_CAPACITY,
        r"failed to allocate buffer for kv cache",
        "the KV cache of parallel slots x contextPerSlot tokens does not fit beside the weights",
        "lower pools.{pool}.llamacpp.contextPerSlot or parallel, or quantize the KV cache "
        "(pools.{pool}.llamacpp.cacheType: q8_0)",
        observed(
            "llama.cpp b11312 src/llama-kv-cache.cpp:288; seen here from the CPU build of b11312 "
            "(tests/fixtures/startup-failures)"
        ),
    ),
    StartupFailure(
        "gguf-load",
        STARTUP,
        r"failed to load model|error loading model",
        "llama-server could not load the GGUF: missing or unreadable at the path it was given, or an "
        "architecture newer than the image's llama.cpp",
        "the weights of models.{model} on the node (`make plan` prints the path the server reads), or a newer "
        "llama.cpp in pools.{pool}.image",
        observed(
            "llama.cpp b11312 src/llama.cpp:375 and :433, tools/server/server-context.cpp:1086; seen here "
            "from the CPU build of b11312 (tests/fixtures/startup-failures)"
        ),
    ),
)
