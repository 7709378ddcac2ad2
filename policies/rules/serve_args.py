"""`vllm serve` argv parsed by an argparse parser rebuilt from vLLM 0.9.2's own (policies/data dump).

The same dump gives the parser of `python3 -m vllm.entrypoints.openai.api_server` (the vllm/vllm-openai
image's ENTRYPOINT): both are built by make_arg_parser + AsyncEngineArgs.add_cli_args, so they take the
same options; the api_server has no `model_tag` positional and takes the model as `--model` (which
`vllm serve` refuses). The few options only `vllm serve` adds (cli/serve.py: --headless,
--data-parallel-start-rank, --api-server-count, --config) are not told apart in the dump and are
accepted for both.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from components.facts.hardware import QUANTIZATION_METHODS

ARGS_DUMP = Path(__file__).resolve().parent.parent / "data" / "vllm-0.9.2-serve-args.json"

# vLLM's own refusal of `--model` (vllm/utils/__init__.py:1475-1481 at v0.9.2).
MODEL_FLAG_MESSAGE = ("With `vllm serve`, you should provide the model as a positional argument or in a "
                      "config file instead of via the `--model` option.")
MISSING_MODEL_MESSAGE = "the model is missing: `vllm serve` takes it as the positional argument (vllm serve /path/to/model …)"
# The programs whose argv is parsed: the CLI, and the module the vllm/vllm-openai image runs.
SERVE = "vllm serve"
API_SERVER = "vllm.entrypoints.openai.api_server"
# EngineArgs' default --model in 0.9.2 (the dump's default), what the api_server loads without --model.
API_SERVER_MISSING_MODEL_MESSAGE = (
    "the model is missing: the api_server takes it as --model /path/to/model (without it vLLM 0.9.2 loads its "
    "default, facebook/opt-125m, from Hugging Face)")


class _ParseError(Exception):
    """argparse's error() raised instead of exiting (unrecognized or required arguments)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse calls sys.exit otherwise
        raise _ParseError(message)


def _human_readable_int(value: str) -> int:
    """vLLM 0.9.2's human_readable_int: 25k = 25000, 25K = 25600 (utils/__init__.py)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}[suffix])
        if "." in number:
            raise ValueError(f"decimals are not allowed with binary suffixes: {value}")
        return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[suffix]
    return int(value)


_human_readable_int.__name__ = "human_readable_int"  # argparse names the type in its error message
_TYPES: dict[str, Any] = {"int": int, "float": float, "human_readable_int": _human_readable_int}


def _choice(value: Any) -> Any:
    return None if value == "None" else value


@lru_cache(maxsize=2)
def serve_parser(program: str = SERVE) -> argparse.ArgumentParser:
    """The `vllm serve` parser of 0.9.2 (or the api_server's: no positional), options from the dump; every
    default suppressed (only what is given)."""
    prog = SERVE if program == SERVE else f"python3 -m {API_SERVER}"
    parser = _Parser(prog=prog, add_help=False, allow_abbrev=False, exit_on_error=False)
    for entry in json.loads(ARGS_DUMP.read_text()):
        if "positional" in entry:
            if program == SERVE:  # the api_server takes no positional: its model is --model
                parser.add_argument(entry["positional"], nargs=entry["nargs"], default=argparse.SUPPRESS)
            continue
        kind, opts = entry["kind"], entry["opts"]
        kw: dict[str, Any] = {"default": argparse.SUPPRESS}
        if kind == "_HelpAction":
            continue
        if kind == "BooleanOptionalAction":
            # The dump lists --x and --no-x; argparse derives the --no- form itself.
            parser.add_argument(*[o for o in opts if not o.startswith("--no-")],
                                action=argparse.BooleanOptionalAction, **kw)
            continue
        if kind == "_StoreTrueAction":
            parser.add_argument(*opts, action="store_true", **kw)
            continue
        kw["action"] = "append" if kind == "_AppendAction" else "store"
        if entry["nargs"] is not None:
            kw["nargs"] = entry["nargs"]
        if entry["type"] in _TYPES:
            kw["type"] = _TYPES[entry["type"]]
        if entry["choices"]:
            # Choices typed like the values argparse compares them with ("None" means the option is optional).
            kw["choices"] = [c for c in (_choice(c) for c in entry["choices"]) if c is not None]
            if kw.get("nargs") == "+":
                kw.pop("choices")  # comma-separated multi-values; vLLM validates them later
        parser.add_argument(*opts, **kw)
    return parser


@lru_cache(maxsize=2)
def _option_strings(program: str = SERVE) -> tuple[str, ...]:
    return tuple(s for a in serve_parser(program)._actions for s in a.option_strings)  # noqa: SLF001


def _normalize(token: str) -> str:
    """vLLM's FlexibleArgumentParser spells `--max_model_len` as `--max-model-len`."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name.replace("_", "-") + eq + value
    return token


def _drop_option(tokens: list[str], option: str) -> list[str]:
    """Remove every occurrence of `option` (with the values after it) so parsing can go on.

    argparse does not say which occurrence failed, and a repeated flag's last value wins anyway.
    """
    names = set(option.split("/"))
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.partition("=")[0] not in names:
            out.append(token)
            continue
        while "=" not in token and i < len(tokens) and not tokens[i].startswith("-"):
            i += 1
    return out if len(out) < len(tokens) else tokens[1:]


@dataclass(frozen=True)
class ServeArgs:
    """What a `vllm serve` argv says: the given options by dest, and every parse error in vLLM's terms."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    program: str = SERVE  # SERVE or API_SERVER: which parser read the argv

    @property
    def model(self) -> str | None:
        """The model served: the positional of `vllm serve`, `--model` of the api_server."""
        return self.values.get("model_tag" if self.program == SERVE else "model")

    def get(self, dest: str, default: Any = None) -> Any:
        """An option's value if given, else `default` (vLLM's default is not assumed)."""
        return self.values.get(dest, default)


def parse_serve(tokens: list[str], program: str = SERVE) -> ServeArgs:
    """Parse the tokens after `vllm serve` (or after `-m vllm.entrypoints.openai.api_server` with program
    API_SERVER); collect every error (not only argparse's first)."""
    parser = serve_parser(program)
    remaining = [_normalize(t) for t in tokens]
    errors: list[str] = []
    namespace, extras = argparse.Namespace(), []
    for _ in range(len(remaining) + 1):
        try:
            namespace, extras = parser.parse_known_args(remaining)
            break
        except argparse.ArgumentError as err:
            errors.append(str(err))
            remaining = _drop_option(remaining, err.argument_name or "")
        except _ParseError as err:
            errors.append(str(err))
            break
    values = vars(namespace)
    previous_unknown = False
    for token in extras:
        if token.startswith("-"):
            name = token.partition("=")[0]
            close = difflib.get_close_matches(name, _option_strings(program), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            errors.append(f"unrecognized flag {name}: not a `{program}` flag in vLLM 0.9.2{hint}")
            previous_unknown = "=" not in token
        elif not previous_unknown:
            errors.append(f"unexpected positional argument {token!r}: " + (
                "`vllm serve` takes one model" if program == SERVE
                else "the api_server takes no positional argument (the model is --model; to run another "
                     "program in the vllm/vllm-openai image, set the container's entrypoints)"))
        else:
            previous_unknown = False  # the value of the unknown flag before it
    if program == API_SERVER:
        if not values.get("model"):
            errors.append(API_SERVER_MISSING_MODEL_MESSAGE)
    elif "model" in values:
        errors.append(MODEL_FLAG_MESSAGE)
    elif not values.get("model_tag"):
        errors.append(MISSING_MODEL_MESSAGE)
    q = values.get("quantization")
    if q is not None and q not in QUANTIZATION_METHODS:
        # argparse has no choices for --quantization; vLLM refuses it only at startup (config.py:951-957).
        errors.append(f"argument --quantization/-q: unknown quantization method {q!r}; vLLM 0.9.2 knows: "
                      + ", ".join(sorted(QUANTIZATION_METHODS)))
    return ServeArgs(values, tuple(errors), program)
