"""Dump each `--quantization` method's minimum compute capability and activation dtypes from vLLM's own code,
without its dependencies.

    python components/engines/vllm/tools/dump_vllm_quantizations.py <unpacked wheel dir> components/engines/vllm/data/vllm-X-quantizations.json

vLLM's Python is imported as it is, with everything not installed stubbed and the platform pinned to the CPU
(the stubs of dump_vllm_serve_args.py); then, for every QUANTIZATION_METHODS entry, the config class's own
get_min_capability() and get_supported_act_dtypes() are called. Output:

  methods     {method: capability as 70 for 7.0, or null where the method is not a CUDA one (a negative value)
              or cannot be asked here}
  act_dtypes  {method: the activation dtypes get_supported_act_dtypes() returns, in its order, as torch names
              them ("float16" for torch.half, "float32" for torch.float)}: what VllmConfig's quantization check
              holds ModelConfig.dtype to at startup
  act_dtypes_source  {method: "path:line" of the `def get_supported_act_dtypes` that answered, in the wheel}
  act_dtypes_by_capability  {method: {capability: dtypes}} for the methods whose answer depends on the GPU,
              asked again with the platform reporting each capability of CAPABILITIES (only where it differs)
  errors      {method: why it could not be asked}

torch is a stub here, so a dtype is read from the stub's name (torch.half -> "torch.half"); a name that is not
a torch dtype is recorded in errors.
"""
from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dump_vllm_serve_args as stubs  # noqa: E402

# torch's dtype attributes as torch itself prints them (repr(torch.half) == "torch.float16").
TORCH_DTYPES = {
    "half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32",
    "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2", "int8": "int8",
}
# The GPUs asked again for a capability-dependent answer (sm_70 .. sm_120).
CAPABILITIES = (70, 75, 80, 86, 89, 90, 100, 120)


def _dtype_name(value: Any) -> str:
    name = getattr(value, "__name__", repr(value))
    if not name.startswith("torch.") or name[len("torch."):] not in TORCH_DTYPES:
        raise ValueError(f"not a torch dtype: {name}")
    return TORCH_DTYPES[name[len("torch."):]]


def _act_dtypes(config_cls: type) -> list[str]:
    """get_supported_act_dtypes() of a config class: a classmethod, or a method whose body reads no state."""
    if isinstance(inspect.getattr_static(config_cls, "get_supported_act_dtypes"), (classmethod, staticmethod)):
        found = config_cls.get_supported_act_dtypes()
    else:
        found = config_cls.get_supported_act_dtypes(config_cls.__new__(config_cls))  # no __init__: no checkpoint
    return [_dtype_name(d) for d in found]


def _source(config_cls: type, root: Path) -> str:
    fn = config_cls.get_supported_act_dtypes
    path = Path(inspect.getsourcefile(fn) or "").resolve()
    lines, start = inspect.getsourcelines(fn)  # from its first decorator: name the `def` line
    return f"{path.relative_to(root)}:{start + next(i for i, t in enumerate(lines) if t.lstrip().startswith('def '))}"


def main(source: str, out: str) -> None:
    sys.modules["regex"] = re  # vLLM imports `regex as re`; the standard module serves its calls here
    sys.path.insert(0, source)
    sys.meta_path.append(stubs._StubFinder())
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    from vllm.platforms.interface import DeviceCapability
    platforms._current_platform = CpuPlatform()  # noqa: SLF001  (no GPU probing)
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config
    root = Path(source).resolve()
    methods: dict[str, int | None] = {}
    act: dict[str, list[str]] = {}
    act_source: dict[str, str] = {}
    errors: dict[str, str] = {}
    for method in QUANTIZATION_METHODS:
        try:
            config_cls = get_quantization_config(method)
            value = config_cls.get_min_capability()
        except Exception as err:  # noqa: BLE001 - a method that cannot be asked here is recorded as such
            methods[method], errors[method] = None, f"{type(err).__name__}: {err}".strip()
            continue
        methods[method] = value if isinstance(value, int) and value >= 0 else None
        try:
            act[method], act_source[method] = _act_dtypes(config_cls), _source(config_cls, root)
        except Exception as err:  # noqa: BLE001
            errors[method] = f"get_supported_act_dtypes: {type(err).__name__}: {err}".strip()
    by_capability: dict[str, dict[str, list[str]]] = {}
    for cap in CAPABILITIES:
        # The platform answers this capability (has_device_capability reads get_device_capability).
        CpuPlatform.get_device_capability = classmethod(  # type: ignore[method-assign,assignment]
            lambda cls, device_id=0, c=cap: DeviceCapability(c // 10, c % 10)
        )
        for method in act:
            found = _act_dtypes(get_quantization_config(method))
            if found != act[method]:
                by_capability.setdefault(method, {})[str(cap)] = found
    with open(out, "w") as f:
        json.dump({"methods": methods, "act_dtypes": act, "act_dtypes_source": act_source,
                   "act_dtypes_by_capability": by_capability, "errors": errors}, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
