"""`python3 -m vllm.entrypoints.openai.api_server` (the image's ENTRYPOINT): the model is --model."""

import sys

from vllm.server import run

if __name__ == "__main__":
    sys.exit(run(sys.argv[1:], program="api_server"))
