"""An engine's command line checked by a parser rebuilt from the dump of its real one (components/engines/<engine>/data).

One dump format for every engine: a JSON list of {"opts", "kind", "nargs", "choices", "type"} per option
and {"positional", "nargs"} per positional, as components/engines/lmdeploy/tools/dump_lmdeploy.py writes from
LMDeploy's argparse parser and dump_llamacpp.py from `llama-server --help`. The rebuilt parser refuses
abbreviations (the real ones may accept them; a stack states whole flags) and checks values by type and
choices, so a misspelt flag or an impossible value is found at preview, not at container start.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from components.engines.data import parser_dump


class _ParseError(Exception):
    """argparse's error() raised instead of exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse calls sys.exit otherwise
        raise _ParseError(message)


def _named(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    fn.__name__ = name  # argparse names the type in its error message
    return fn


def _json(value: str) -> Any:
    return json.loads(value)


BASE_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "loads": _named(_json, "json")}
_ACTIONS = {
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreAction": "store",
    "_AppendAction": "append",
    "_CountAction": "count",
}


@lru_cache(maxsize=16)
def _entries(dump: str) -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(parser_dump(dump).read_text()))


def options(dump: str) -> frozenset[str]:
    """Every option string the dumped parser knows."""
    return frozenset(o for e in _entries(dump) for o in e.get("opts", ()))


def build_parser(
    dump: str, prog: str, types: Mapping[str, Callable[[str], Any]] | None = None
) -> argparse.ArgumentParser:
    """The dumped parser, rebuilt: options, actions, nargs, choices and types; every default suppressed."""
    parser = _Parser(prog=prog, add_help=False, allow_abbrev=False, exit_on_error=False)
    known = {**BASE_TYPES, **(types or {})}
    for e in _entries(dump):
        if "positional" in e:
            parser.add_argument(e["positional"], nargs=e["nargs"], default=argparse.SUPPRESS)
            continue
        kind = e["kind"]
        if kind in ("_HelpAction", "_VersionAction"):
            parser.add_argument(*e["opts"], action="store_true", default=argparse.SUPPRESS)
            continue
        action = _ACTIONS.get(kind, "store")
        kwargs: dict[str, Any] = {"action": action, "default": argparse.SUPPRESS}
        if action in ("store", "append"):
            if e.get("nargs") is not None:
                kwargs["nargs"] = e["nargs"]
            if e.get("choices") is not None:
                kwargs["choices"] = e["choices"]
            convert = known.get(e.get("type") or "")
            if convert is not None:
                kwargs["type"] = convert
                if e.get("choices") is not None:
                    kwargs["choices"] = [convert(c) for c in e["choices"]]
        parser.add_argument(*e["opts"], **kwargs)
    return parser


def parse_errors(parser: argparse.ArgumentParser, args: Sequence[str]) -> list[str]:
    """argparse's own complaint about these arguments ([] when it accepts them)."""
    try:
        _, unknown = parser.parse_known_args(list(args))
    except (_ParseError, argparse.ArgumentError) as err:
        return [str(err)]
    if unknown:
        return [f"unrecognized arguments: {' '.join(unknown)}"]
    return []
