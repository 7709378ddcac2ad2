"""`vllm serve` argv parsed by an argparse parser rebuilt from the pool's vLLM version's own (one dump per
version in components/engines/<engine>/data; which one is the image's `serve_args` fact).

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
from typing import Any

from components.engines.data import parser_dump
from components.engines.vllm.facts import DEFAULT_IMAGE, ImageFacts, image_facts

# What an argv is read with when its image has no facts or no dump: the default image's parser, so the
# other rules can still read its values (the flag rule then says it cannot judge the flags).
_FALLBACK = image_facts(DEFAULT_IMAGE)
assert _FALLBACK is not None and _FALLBACK.serve_args is not None

# vLLM's own refusal of `--model` (vllm/utils/__init__.py:1475-1481 at v0.9.2).
MODEL_FLAG_MESSAGE = (
    "With `vllm serve`, you should provide the model as a positional argument or in a "
    "config file instead of via the `--model` option."
)
MISSING_MODEL_MESSAGE = (
    "the model is missing: `vllm serve` takes it as the positional argument (vllm serve /path/to/model …)"
)
# The programs whose argv is parsed: the CLI, and the module the vllm/vllm-openai image runs.
SERVE = "vllm serve"
API_SERVER = "vllm.entrypoints.openai.api_server"
# EngineArgs' default --model (the dump's default), what the api_server loads without --model.
API_SERVER_MISSING_MODEL_MESSAGE = (
    "the model is missing: the api_server takes it as --model /path/to/model (without it vLLM {version} loads "
    "its default, {default}, from Hugging Face)"
)


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


def _human_readable_int_or_auto(value: str) -> int:
    """vLLM 0.19's --max-model-len type: -1 or auto (the model's own length), else human_readable_int."""
    return -1 if value.strip() in ("-1", "auto", "AUTO", "Auto") else _human_readable_int(value)


_human_readable_int_or_auto.__name__ = "human_readable_int_or_auto"
_TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "human_readable_int": _human_readable_int,
    "human_readable_int_or_auto": _human_readable_int_or_auto,
}


def _optional(inner: Any) -> Any:
    """vLLM's optional_type(inner): '' or 'None' is None, anything else goes through inner."""

    def convert(value: str) -> Any:
        return None if value in ("", "None") else inner(value)

    convert.__name__ = inner.__name__  # argparse says "invalid int value", as vLLM's parser does
    return convert


def _entry_type(entry: dict[str, Any]) -> Any:
    """The converter of a dumped option: its type, or the type its optional_type wraps."""
    if entry["type"] == "_optional_type" and entry.get("inner_type") in _TYPES:
        return _optional(_TYPES[entry["inner_type"]])
    return _TYPES.get(entry["type"])


def _choice(value: Any) -> Any:
    return None if value == "None" else value


def dump_entries(dump: str) -> list[dict[str, Any]]:
    """The entries of one parser dump in components/engines/<engine>/data."""
    return json.loads(parser_dump(dump).read_text())


@lru_cache(maxsize=8)
def serve_parser(program: str = SERVE, dump: str = _FALLBACK.serve_args) -> argparse.ArgumentParser:
    """The `vllm serve` parser of one version (or the api_server's: no positional), options from its dump;
    every default suppressed (only what is given)."""
    prog = SERVE if program == SERVE else f"python3 -m {API_SERVER}"
    parser = _Parser(prog=prog, add_help=False, allow_abbrev=False, exit_on_error=False)
    for entry in dump_entries(dump):
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
            parser.add_argument(
                *[o for o in opts if not o.startswith("--no-")], action=argparse.BooleanOptionalAction, **kw
            )
            continue
        if kind == "_StoreTrueAction":
            parser.add_argument(*opts, action="store_true", **kw)
            continue
        kw["action"] = "append" if kind == "_AppendAction" else "store"
        if entry["nargs"] is not None:
            kw["nargs"] = entry["nargs"]
        if _entry_type(entry) is not None:
            kw["type"] = _entry_type(entry)
        if entry["choices"]:
            # Choices typed like the values argparse compares them with: "None" among them is vLLM's
            # optional_type, which reads the word None as None (`--device None` on 0.9.2 is accepted).
            kw["choices"] = [_choice(c) for c in entry["choices"]]
            if None in kw["choices"]:
                kw["type"] = _optional(kw.get("type", str))
            if kw.get("nargs") == "+":
                kw.pop("choices")  # comma-separated multi-values; vLLM validates them later
        parser.add_argument(*opts, **kw)
    return parser


@lru_cache(maxsize=8)
def _option_strings(program: str, dump: str) -> tuple[str, ...]:
    return tuple(s for a in serve_parser(program, dump)._actions for s in a.option_strings)  # noqa: SLF001


def _default_model(dump: str) -> str:
    """EngineArgs' default --model (every dump has one: EngineArgs defines it)."""
    return next(str(e["default"]).strip("'") for e in dump_entries(dump) if "--model" in e.get("opts", ()))


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
    dropping = False  # the values after a dropped `--option` (not after `--option=value`)
    for token in tokens:
        if token.partition("=")[0] in names:
            dropping = "=" not in token
        elif not (dropping and not token.startswith("-")):
            dropping = False
            out.append(token)
    return out if len(out) < len(tokens) else tokens[1:]


@dataclass(frozen=True)
class ServeArgs:
    """What a `vllm serve` argv says: the given options by dest, and every parse error in vLLM's terms."""

    values: dict[str, Any] = field(default_factory=dict)
    errors: tuple[str, ...] = ()
    program: str = SERVE  # SERVE or API_SERVER: which parser read the argv
    version: str | None = None  # the vLLM version whose parser read it; None: no parser of the image's own

    @property
    def model(self) -> str | None:
        """The model served: the positional of `vllm serve`, `--model` of the api_server."""
        if self.program == SERVE:  # vLLM from 0.10 moves `vllm serve --model X` to the positional
            return self.values.get("model_tag") or self.values.get("model")
        return self.values.get("model")

    def get(self, dest: str, default: Any = None) -> Any:
        """An option's value if given, else `default` (vLLM's default is not assumed)."""
        return self.values.get(dest, default)


def parse_serve(tokens: list[str], program: str = SERVE, facts: ImageFacts | None = None) -> ServeArgs:
    """Parse the tokens after `vllm serve` (or after `-m vllm.entrypoints.openai.api_server` with program
    API_SERVER) with the parser of the image's vLLM version; collect every error (not only argparse's first).

    Without facts (or a dump) for the image, the default image's parser reads the values and `version` is
    None: the errors are then that parser's, which the flag rule does not report as the image's."""
    own = facts if facts is not None and facts.serve_args else None
    reader = own or _FALLBACK
    dump, version = reader.serve_args or "", reader.version
    parser = serve_parser(program, dump)
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
            close = difflib.get_close_matches(name, _option_strings(program, dump), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            errors.append(f"unrecognized flag {name}: not a `{program}` flag in vLLM {version}{hint}")
            previous_unknown = "=" not in token
        elif not previous_unknown:
            errors.append(
                f"unexpected positional argument {token!r}: "
                + (
                    "`vllm serve` takes one model"
                    if program == SERVE
                    else "the api_server takes no positional argument (the model is --model; to run another "
                    "program in the vllm/vllm-openai image, set the container's entrypoints)"
                )
            )
        else:
            previous_unknown = False  # the value of the unknown flag before it
    if program == API_SERVER:
        if not values.get("model"):
            errors.append(API_SERVER_MISSING_MODEL_MESSAGE.format(version=version, default=_default_model(dump)))
    elif "model" in values and reader.serve_refuses_model_flag:
        errors.append(MODEL_FLAG_MESSAGE)
    elif "model" in values and values.get("model_tag"):
        errors.append(
            f"both a positional model ({values['model_tag']}) and --model {values['model']}: vLLM "
            f"{version} moves --model to the positional, and its parser then refuses the second model"
        )
    elif not values.get("model_tag") and "model" not in values:
        errors.append(MISSING_MODEL_MESSAGE)
    q = values.get("quantization")
    if q is not None and q not in reader.quantizations:
        # argparse has no choices for --quantization; vLLM refuses it only at startup (0.9.2 config.py:951-957).
        errors.append(
            f"argument --quantization/-q: unknown quantization method {q!r}; vLLM {version} knows: "
            + ", ".join(sorted(reader.quantizations))
        )
    return ServeArgs(values, tuple(errors), program, version if own else None)
