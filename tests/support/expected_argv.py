"""The reference stack's planned argv and env, written out once as the values the engine tests expect.

Expected values are literals, not computed by the code under test; each engine's tests compare whole lists
and dicts built from these (with the one flag a case changes replaced or appended).
"""

from __future__ import annotations

R1 = "/data/models/DeepSeek-R1-GPTQ-Int4"
QWEN3 = "/data/models/Qwen3-30B-A3B"

# The fabric's variables of a multi-GPU instance on the reference cluster (RoCEv2 on mlx5_0, GID 3, bond0).
REFERENCE_NCCL_ENV = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_IB_HCA": "mlx5_0",
    "NCCL_IB_GID_INDEX": "3",
    "NCCL_SOCKET_IFNAME": "bond0",
    "GLOO_SOCKET_IFNAME": "bond0",
    "NCCL_DEBUG": "WARN",
}

# The reasoning pool's (DeepSeek-R1 GPTQ-Int4, TP 8 x PP 2 on V100) serve flags after its parallel and
# launcher flags.
R1_SERVE_TAIL = [
    "--dtype",
    "half",
    "--max-model-len",
    "8192",
    "--max-num-seqs",
    "32",
    "--gpu-memory-utilization",
    "0.9",
    "--attention-backend",
    "TRITON_ATTN",
    "--quantization",
    "gptq",
    "--enforce-eager",
    "--trust-remote-code",
    "--shutdown-timeout",
    "60",
]
R1_PARALLEL = ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
# Its head on gpu-01 on a Ray cluster, as Pulumi.prod.yaml plans it.
R1_RAY_HEAD_ARGV = [
    "vllm",
    "serve",
    R1,
    "--served-model-name",
    "deepseek-r1",
    R1,
    "--host",
    "192.168.10.11",
    "--port",
    "8000",
    *R1_PARALLEL,
    "--distributed-executor-backend",
    "ray",
    *R1_SERVE_TAIL,
]

# tests.support.engine_stacks.lmdeploy_config's chat pool: gpu-03's replica (TP 8).
LMDEPLOY_CHAT_ARGV = [
    "lmdeploy",
    "serve",
    "api_server",
    QWEN3,
    "--backend",
    "turbomind",
    "--model-name",
    "qwen3-30b-a3b",
    "--server-name",
    "192.168.10.13",
    "--server-port",
    "8000",
    "--tp",
    "8",
    "--dtype",
    "float16",
    "--model-format",
    "hf",
    "--session-len",
    "32768",
    "--max-batch-size",
    "64",
    "--cache-max-entry-count",
    "0.8",
]


def llamacpp_chat_head(port: int) -> list[str]:
    """tests.support.engine_stacks.llamacpp_config's chat pool: gpu-03's server on `port` (one per GPU), up to
    its tail (LLAMACPP_CHAT_TAIL)."""
    return [
        "/app/llama-server",
        "-m",
        f"{QWEN3}/Qwen3-30B-A3B-Q4_K_M.gguf",
        "--alias",
        f"qwen3-30b-a3b,{QWEN3}",
        "--host",
        "192.168.10.13",
        "--port",
        str(port),
        "--n-gpu-layers",
        "999",
        "--split-mode",
        "layer",
        "--ctx-size",
        "32768",
        "--parallel",
        "4",
        "--flash-attn",
        "on",
    ]


# 80 cores shared by the node's 8 servers.
LLAMACPP_CHAT_TAIL = ["--fit", "off", "--jinja", "--metrics", "--threads", "10"]
