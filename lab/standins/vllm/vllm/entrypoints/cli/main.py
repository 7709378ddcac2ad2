"""The `vllm` command: only `vllm serve` (the model positional) is part of the stand-in."""

import sys

from vllm.server import run


def main():
    args = sys.argv[1:]
    if not args or args[0] != "serve":
        sys.stderr.write("usage: vllm serve <model> [options]  (llm-cluster lab stand-in: only serve)\n")
        return 2
    return run(args[1:], program="serve")


if __name__ == "__main__":
    sys.exit(main())
