"""Command-line capacity estimator: weights, KV cache and concurrency per GPU for one pool of the default engine
(vLLM), from the memory model the plan sizes pools with.

    python -m ops.capacity --model deepseek-r1 --gpu "Tesla V100-SXM2-32GB" --tp 8 --pp 2 \
        --gpu-memory-utilization 0.92 --dtype half --quantization gptq --max-model-len 16384 \
        --max-num-seqs 32 --no-mla [--json]

--model takes a catalog name (components/facts/models.py) or the path of a config.json. Exit
status: 0 when the pool fits, 1 when it does not, 2 on bad input (a message, no traceback).
The options are the engine's own (`Engine.capacity_cli`, in its package).
"""

from __future__ import annotations

import sys

from components.engines.registry import default_engine
from plan.cli import run as run_cli

PROG = "python -m ops.capacity"


def main(argv: list[str] | None = None) -> int:
    """Entry point: print the estimate; 0 fits, 1 does not fit, 2 bad input."""
    return default_engine().capacity_cli(sys.argv[1:] if argv is None else argv, PROG)


if __name__ == "__main__":
    run_cli(main)
