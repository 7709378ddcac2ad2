"""llm-cluster lab stand-in for vLLM (not vLLM): the real image's command line, endpoints and metric names.

`vllm serve` and `python3 -m vllm.entrypoints.openai.api_server` parse their argv with a parser rebuilt
from the real parser dump of this image's vLLM version (serve-args.json beside this file), refuse what
that version refuses (unknown flags, bad values, --model with `vllm serve`, a missing model, an unknown
quantization), check the model directory, join the Ray cluster when the executor is Ray (and refuse to
start with fewer GPUs than tensor x pipeline parallel), then serve the OpenAI API with canned text.
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "version.json")) as _f:
    _facts = json.load(_f)
__version__ = _facts["version"]
