"""Dump LMDeploy's real `serve api_server` parser (JSON) or its real Prometheus exposition (text).

Not imported by the program: run by hand against a wheel unpacked from PyPI, then commit the output
(components/engines/DATA-SOURCES.md names each file this wrote):
    pip download lmdeploy==0.16.0 --no-deps -d /tmp/lmd && unzip -q /tmp/lmd/*.whl -d /tmp/lmd
    python components/engines/lmdeploy/tools/dump_lmdeploy.py cli /tmp/lmd > components/engines/lmdeploy/data/lmdeploy-0.16.0-api_server-args.json
    # in a scratch venv with prometheus_client, pydantic and numpy (what the exporter itself needs):
    python components/engines/lmdeploy/tools/dump_lmdeploy.py metrics /tmp/lmd > tests/fixtures/engines/lmdeploy-0.16.0-metrics.txt
LMDeploy's own modules (lmdeploy/cli/*.py, the parser registries they read for `choices`,
lmdeploy/metrics/loggers.py) are imported for real; a package the wheel requires (its METADATA
Requires-Dist) that is not installed is stubbed: building the parser or the Prometheus collectors only
imports it, never calls it. The package's own __init__ (the whole serving stack) is skipped.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import re
import sys
import types
from pathlib import Path
from typing import Any

# Import names of required distributions whose module is named otherwise.
IMPORT_NAMES = {"pillow": "PIL", "mmengine-lite": "mmengine", "opencv-python-headless": "cv2", "pyzmq": "zmq",
                "protobuf": "google", "flash-linear-attention": "fla", "apache-tvm-ffi": "tvm_ffi"}
# Modules lmdeploy imports that come with those distributions rather than being required by name.
TRANSITIVE = {"psutil"}
STUBBED: set[str] = set(TRANSITIVE)


def required_imports(root: Path) -> set[str]:
    """Top-level module names of every distribution the wheel's METADATA requires."""
    names = set()
    for meta in root.glob("lmdeploy-*.dist-info/METADATA"):
        for line in meta.read_text().splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                dist = re.split(r"[<>=!;\[ ]", line.split(":", 1)[1].strip())[0].lower()
                names.add(IMPORT_NAMES.get(dist, dist.replace("-", "_")))
    return names


class _StubMeta(type):
    """Attributes of a stub class are stub classes: `torch.nn.Module`, `torch.float16`."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)


def _stub_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    # A decorator (`@REGISTRY.register_module(...)`) hands its target back; anything else gets a stub.
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return _stub_class("result")()


def _stub_class(name: str) -> type:
    """A class that can be subclassed, instantiated, called, and read from, all doing nothing."""
    return _StubMeta(name, (), {"__init__": lambda self, *a, **k: None, "__call__": _stub_call,
                                "__getattr__": lambda self, n: _stub_class(n)()})


class _Anything(types.ModuleType):
    """A stub module: every attribute is a stub class (`from torch import nn`, subclassing, decorators)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(name)


class _StubFinder:
    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        # Last on sys.meta_path: reached only by what no real finder has.
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, _StubLoader(), is_package=True)
        return None


class _StubLoader:
    @staticmethod
    def create_module(spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _Anything(spec.name)
        mod.__path__ = []  # type: ignore[attr-defined]
        return mod

    @staticmethod
    def exec_module(module: types.ModuleType) -> None:
        return None


def _entry(action: argparse.Action) -> dict[str, Any]:
    if not action.option_strings:
        return {"positional": action.dest, "nargs": action.nargs}
    return {
        "opts": list(action.option_strings),
        "kind": type(action).__name__,
        "nargs": action.nargs,
        "choices": None if action.choices is None else [str(c) for c in action.choices],
        "default": repr(action.default),
        "type": getattr(action.type, "__name__", str(action.type)),
        "const": repr(action.const),
    }


def dump(root: Path) -> list[dict[str, Any]]:
    """The api_server subparser's actions, in the order lmdeploy adds them."""
    serve = importlib.import_module("lmdeploy.cli.serve")
    serve.SubCliServe.add_parser_api_server()
    api = serve.SubCliServe.subparsers.choices["api_server"]
    return [_entry(a) for a in api._actions]


def _install_stubs(root: Path) -> None:
    STUBBED.update(required_imports(root))
    if not STUBBED - TRANSITIVE:
        raise SystemExit(f"no lmdeploy-*.dist-info/METADATA under {root}: unzip the whole wheel")
    sys.meta_path.append(_StubFinder)
    # The package __init__ imports the whole serving stack; its modules only need the package path.
    pkg = types.ModuleType("lmdeploy")
    pkg.__path__ = [str(root / "lmdeploy")]  # type: ignore[attr-defined]
    sys.modules["lmdeploy"] = pkg


def metrics_exposition(root: Path) -> str:
    """What lmdeploy's PrometheusStatLogger registers, rendered as /metrics renders it (before any request)."""
    import prometheus_client  # the real client: the exporter's names and types come from it
    loggers = importlib.import_module("lmdeploy.metrics.loggers")
    loggers.PrometheusStatLogger(model_name="qwen3-30b-a3b", max_model_len=32768)
    return prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()


if __name__ == "__main__":
    mode, wheel_root = sys.argv[1], Path(sys.argv[2])
    _install_stubs(wheel_root)
    if mode == "cli":
        print(json.dumps(dump(wheel_root), indent=1))
    elif mode == "metrics":
        print(metrics_exposition(wheel_root), end="")
    else:
        raise SystemExit("usage: dump_lmdeploy.py cli|metrics <unpacked wheel>")
