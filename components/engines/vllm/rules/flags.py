"""Rule 8: every `vllm serve` flag is real in the pool's vLLM version and has a valid value; the model is
positional. The argv is parsed with the parser dumped from that version (components/engines/<engine>/data; the image's
`serve_args` fact). An image without a dump is not judged here (vllm-image-unknown says so).

The api_server (`python3 -m vllm.entrypoints.openai.api_server`, the vllm/vllm-openai image's ENTRYPOINT)
is read with the same options, its model as `--model` (components.engines.vllm.serve_args)."""

from __future__ import annotations

from typing import Any

from components.engines.vllm.launch import Launch


def check_flags(launch: Launch, config: dict[str, Any]) -> list[str]:
    """One message per parse error of the server's argv, in argparse's (and vLLM's) words, prefixed with the
    program and the vLLM version whose parser read it."""
    if launch.args.version is None:
        return []
    return [f"{launch.args.program} (vLLM {launch.args.version}): {error}" for error in launch.args.errors]
