"""Dump every option of `vllm serve` from vLLM's own argparse parser, without vLLM's dependency tree.

    python components/engines/vllm/tools/dump_vllm_serve_args.py <unpacked wheel dir> components/engines/vllm/data/vllm-X-serve-args.json

The wheel's Python sources are imported as they are (unpack it: `unzip vllm-X.whl -x '*.so'`); every
module that is not installed (torch, transformers, fastapi, …, and vLLM's compiled extensions) is
replaced by an inert stub that only has to survive being imported, subclassed, called and decorated
with. vLLM's platform is pinned to a CPU stub so nothing probes for a GPU. The parser is then the real
one: `ServeSubcommand().subparser_init()` of vllm/entrypoints/cli/serve.py, i.e. make_arg_parser +
AsyncEngineArgs.add_cli_args, with their option strings, actions, nargs, choices, defaults and types.
Option names, actions and nargs never come from a stub; a default or a choice list could, where vLLM
computes it from a stubbed library, so after dumping check that no value names a stub:
`grep -c stub <dump>` must print 0 (it does for 0.19.1).
"""
from __future__ import annotations

import abc
import argparse
import importlib.abc
import importlib.machinery
import json
import sys
import types
from typing import Any


class _StubMeta(abc.ABCMeta):
    """A class that answers every attribute with another stub class, and can be called, indexed,
    compared, iterated (empty) and used as a decorator or a base class."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__qualname__}.{name}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __len__(cls) -> int:
        return 0

    def __bool__(cls) -> bool:
        return False

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator (one callable argument): hand the function back untouched.
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _StubMeta):
            return args[0]
        if cls.__module__ != "stub":
            return super().__call__(*args, **kwargs)  # a real class built on a stub keeps its own __init__'s arguments
        return super().__call__()

    def register(cls, *args: Any, **kwargs: Any) -> Any:
        # A stubbed registry (transformers' AutoConfig.register(name, cls)), not ABCMeta's virtual subclasses.
        return args[-1] if args else None

    def __mro_entries__(cls, bases: Any) -> Any:
        return (cls,)

    def __new__(mcs, name: str, bases: Any, ns: Any, **kwargs: Any) -> Any:
        return super().__new__(mcs, name, bases, ns)

    def __init__(cls, name: str, bases: Any, ns: Any, **kwargs: Any) -> None:
        super().__init__(name, bases, ns)


class _StubBase(metaclass=_StubMeta):
    def __init_subclass__(cls, **kwargs: Any) -> None:  # msgspec.Struct-style class keywords
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema  # a stubbed type in a pydantic model validates anything
        return core_schema.any_schema()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _stub_class("result")()

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())


def _keep_other(self: Any, other: Any) -> Any:
    return other if isinstance(other, (str, int, float)) else self


def _self(self: Any, *args: Any) -> Any:
    return self


for _op in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
            "__floordiv__", "__mod__", "__pow__", "__and__", "__rand__"):
    setattr(_StubMeta, _op, _keep_other)
    setattr(_StubBase, _op, _keep_other)
for _op in ("__getitem__", "__neg__", "__enter__"):
    setattr(_StubBase, _op, _self)
_StubBase.__exit__ = lambda self, *a: False  # type: ignore[attr-defined]
_StubBase.__int__ = lambda self: 0  # type: ignore[attr-defined]
_StubBase.__index__ = lambda self: 0  # type: ignore[attr-defined]
_StubBase.__float__ = lambda self: 0.0  # type: ignore[attr-defined]
_StubBase.__lt__ = _StubBase.__gt__ = _StubBase.__le__ = _StubBase.__ge__ = lambda self, o: False  # type: ignore


def _stub_class(name: str) -> type:
    return _StubMeta(name, (_StubBase,), {"__module__": "stub"})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


STUBBED: set[str] = set()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: whatever nothing else can import becomes a stub module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in sys.stdlib_module_names:
            return None  # the standard library's optional modules (_winapi, …) stay missing, as try/except expects
        if fullname.split(".")[0] == "vllm" and not fullname.startswith(("vllm._C", "vllm._moe_C", "vllm._rocm_C",
                                                                          "vllm.cumem_allocator", "vllm._flashmla",
                                                                          "vllm.vllm_flash_attn")):
            return None  # vLLM's own Python must be real
        STUBBED.add(fullname.split(".")[0])
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0"
        module.__file__ = f"<stub {spec.name}>"
        return module

    def exec_module(self, module: Any) -> None:
        if module.__name__ == "torch":
            # Request models bound a seed by torch.iinfo(torch.long): pydantic needs real integers there.
            module.iinfo = lambda dtype: types.SimpleNamespace(min=-(2**63), max=2**63 - 1, bits=64)
            module.finfo = lambda dtype: types.SimpleNamespace(min=-3.4e38, max=3.4e38, eps=1.2e-7, bits=32)


def _describe(action: argparse.Action) -> dict[str, Any]:
    if not action.option_strings:
        return {"positional": action.dest, "nargs": action.nargs}
    def text(v: Any) -> str:
        return repr(v) if isinstance(v, str) else str(v)
    kind = getattr(action.type, "__name__", str(action.type))
    # vLLM wraps a type in closures (optional_type(int) -> _optional_type): name the wrapped one too.
    inner = [c.cell_contents for c in (getattr(action.type, "__closure__", None) or ())
             if callable(c.cell_contents) and hasattr(c.cell_contents, "__name__")]
    return {
        "opts": list(action.option_strings), "kind": type(action).__name__, "nargs": action.nargs,
        "choices": [str(c) for c in action.choices] if action.choices is not None else None,
        "default": text(action.default), "type": kind,
        **({"inner_type": inner[0].__name__} if inner else {}),
        "const": text(action.const),
    }


def main(source: str, out: str) -> None:
    sys.path.insert(0, source)
    sys.meta_path.append(_StubFinder())
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform
    platforms._current_platform = CpuPlatform()  # noqa: SLF001  (no GPU probing)
    from vllm.entrypoints.cli.serve import ServeSubcommand
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # before 0.12 it lived in vllm.utils
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]
    root = FlexibleArgumentParser(prog="vllm")
    parser = ServeSubcommand().subparser_init(root.add_subparsers())
    # A file, not stdout: vLLM's logger writes to stdout while it imports.
    with open(out, "w") as f:
        json.dump([_describe(a) for a in parser._actions], f, indent=1)  # noqa: SLF001
        f.write("\n")
    print("stubbed top-level modules: " + ", ".join(sorted(STUBBED)), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
