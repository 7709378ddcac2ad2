"""Dump each `--quantization` method's minimum compute capability from vLLM's own code, without its dependencies.

    python components/engines/vllm/tools/dump_vllm_quantizations.py <unpacked wheel dir> components/engines/vllm/data/vllm-X-quantizations.json

vLLM's Python is imported as it is, with everything not installed stubbed and the platform pinned to the CPU
(the stubs of dump_vllm_serve_args.py); then, for every QUANTIZATION_METHODS entry, the config class's own
get_min_capability() is called. Output: {"methods": {method: capability as 70 for 7.0, or null where the
method is not a CUDA one (a negative value) or cannot be asked here}, "errors": {method: why}}.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dump_vllm_serve_args as stubs  # noqa: E402


def main(source: str, out: str) -> None:
    sys.modules["regex"] = re  # vLLM imports `regex as re`; the standard module serves its calls here
    sys.path.insert(0, source)
    sys.meta_path.append(stubs._StubFinder())
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    platforms._current_platform = CpuPlatform()  # noqa: SLF001  (no GPU probing)
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    methods: dict[str, int | None] = {}
    errors: dict[str, str] = {}
    for method in QUANTIZATION_METHODS:
        try:
            value = get_quantization_config(method).get_min_capability()
        except Exception as err:  # noqa: BLE001 - a method that cannot be asked here is recorded as such
            methods[method], errors[method] = None, f"{type(err).__name__}: {err}".strip()
            continue
        methods[method] = value if isinstance(value, int) and value >= 0 else None
    with open(out, "w") as f:
        json.dump({"methods": methods, "errors": errors}, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
