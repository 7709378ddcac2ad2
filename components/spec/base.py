"""Shared base for the stack model: strict pydantic models and errors that name the key path."""

from __future__ import annotations

import datetime
import math
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import annotated_types
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

# Names become container names, hostnames and nginx upstream names: DNS labels.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
NAME_RE = re.compile(NAME_PATTERN)


class Spec(BaseModel):
    """Strict, immutable, camelCase in YAML: unknown keys are refused with the allowed ones listed."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=False,
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        # YAML's .nan and .inf are floats: no size, count, rate or timeout of a stack is one.
        allow_inf_nan=False,
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        return known_keys_only(data, cls._allowed_keys)

    @classmethod
    def _allowed_keys(cls) -> set[str]:
        """The keys this model takes (YAML names)."""
        return {f.alias or n for n, f in cls.model_fields.items()}

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        return scalar_checked(value, cls.model_fields.get(info.field_name or ""))


def known_keys_only(data: Any, allowed_keys: Callable[[], set[str]]) -> Any:
    """A mapping whose keys are all allowed; else refused naming the first unknown one and every allowed one
    (pydantic's own "extra_forbidden" does not say what *is* allowed; users need that list)."""
    if isinstance(data, dict):
        allowed = allowed_keys()
        unknown = sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise PydanticCustomError(
                "unknown_key",
                "unknown key {quoted}; allowed keys here: {allowed}",
                {"key": unknown[0], "quoted": repr(unknown[0]), "allowed": ", ".join(sorted(allowed))},
            )
    return data


def scalar_checked(value: Any, field: FieldInfo | None) -> Any:
    """A field's value before pydantic reads it. pydantic's lax mode reads `true` as 1 and `1` as true: in YAML
    both are typos for the other type. A number without a bound of its own is bound by MAX_NUMBER."""
    kind = scalar_kind(field.annotation) if field is not None else None
    if kind == "number" and isinstance(value, bool):
        raise PydanticCustomError("bool_for_number", "expected a number, not true/false")
    if kind == "bool" and isinstance(value, (int, float)) and not isinstance(value, bool):
        raise PydanticCustomError("number_for_bool", "expected true or false, not a number")
    if (
        kind == "number"
        and isinstance(value, (int, float))
        and math.isfinite(value)
        and value > MAX_NUMBER
        and not any(isinstance(m, (annotated_types.Le, annotated_types.Lt)) for m in field.metadata)  # type: ignore[union-attr]
    ):
        # A count, size, rate or time with no bound of its own: 1e18 minutes wraps in bash's arithmetic, is
        # past a Go duration's 292 years (Docker's start_period), 1e18 r/s is no rate nginx parses -- long
        # after the plan said it was fine.
        raise PydanticCustomError("less_than_equal", "must be at most {le}", {"le": MAX_NUMBER})
    return value


# The largest number a key without a bound of its own takes (a signed 32-bit int): beyond any count,
# size in GiB, rate, length in tokens or time a stack states, within what every tool it reaches parses.
MAX_NUMBER = 2**31 - 1


def scalar_kind(annotation: Any) -> str | None:
    """'number' for an int/float field (optional too), 'bool' for a bool one, None for anything else."""
    if annotation is bool:
        return "bool"
    if annotation in (int, float):
        return "number"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        kinds = {scalar_kind(a) for a in typing.get_args(annotation) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else None
    return None


@dataclass(frozen=True)
class SpecIssue:
    """One problem in a stack config: where (key path), and what is wrong and allowed."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class SpecError(Exception):
    """The stack config is invalid; carries every issue found, each with its key path."""

    def __init__(self, issues: list[SpecIssue]):
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


def key_path(loc: tuple[Any, ...]) -> str:
    """('pools', 'reasoning', 'nodes', 1) -> 'pools.reasoning.nodes[1]'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


# What a pattern means, for messages: people edit YAML, not regular expressions.
PATTERN_WORDS: dict[str, str] = {
    NAME_PATTERN: "lowercase letters, digits and '-' (a DNS label, at most 63 characters)",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "an environment variable name: letters, digits and '_', not starting with a digit",
    r"^[A-Za-z0-9_]+$": "a device name: letters, digits and '_' (as ibstat lists it, e.g. mlx5_0)",
    r"^[A-Za-z0-9_.:-]+$": "an interface name: letters, digits and . _ : - (as `ip link` lists it, e.g. bond0)",
    r"^\d+(\.\d+){0,2}$": "a version: one to three numbers separated by dots, e.g. 535.104",
    r"^[A-Z][A-Z0-9_]*$": "an upper-case name: letters, digits and '_', e.g. TRITON_ATTN",
    r"^\d+\.\d+(\.\d+)?([a-z0-9.+-]*)$": "a version: two or three numbers separated by dots, then any lower-case "
    "suffix, e.g. 0.19.1 or 0.11.0rc1",
    r"^[A-Za-z0-9-]{1,64}$": "an HTTP header name: letters, digits and '-', at most 64 characters, e.g. X-Session-Id",
    r"^[A-Za-z0-9._+-][A-Za-z0-9._+/-]*\.gguf$": "a .gguf file name inside the model's path: letters, digits, "
    "and . _ + - / (not starting with /), ending in .gguf",
}
# pydantic's words for a wrong container type name its own classes; users wrote YAML.
TYPE_WORDS = {
    "dict_type": "expected a mapping (key: value lines)",
    "model_type": "expected a mapping (key: value lines)",
    "model_attributes_type": "expected a mapping (key: value lines)",
    "list_type": "expected a list (- item lines)",
}


# pydantic's words for a wrong scalar, in the words of someone editing YAML ({…} from the error's context).
VALUE_WORDS = {
    "int_parsing": "expected a whole number",
    "int_type": "expected a whole number",
    "int_from_float": "expected a whole number, not a fraction",
    "int_parsing_size": "expected a whole number, not one this large",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "finite_number": "expected a finite number (.nan and .inf are not)",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "string_type": "expected text",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "string_too_short": "must not be empty",
    "too_short": "needs at least {min_length} item(s)",
    "too_long": "takes at most {max_length} item(s)",
    "string_too_long": "must be at most {max_length} characters",
    "tuple_type": "expected a list",
}


def _number(value: Any) -> Any:
    """0.0 -> 0 in messages; other values as they are."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def shown(value: Any) -> str:
    """A value as YAML writes it, for messages: true, null, 'text', 8."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()  # YAML reads 2026-01-01 as a date: say it as written, not datetime.date(…)
    return repr(value)


def issues_from_validation_error(err: ValidationError, prefix: tuple[Any, ...] = ()) -> list[SpecIssue]:
    """Turn pydantic's errors into SpecIssues with YAML key paths and the offending value."""
    issues = []
    for e in err.errors(include_url=False):
        ctx = e.get("ctx") or {}
        # pydantic inserts union/function tags ("function-after[...]") into loc; they are not keys.
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and "[" in p and "]" in p))
        msg = e["msg"]
        if e["type"] == "unknown_key":
            loc = loc + (e["ctx"]["key"],)
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] == "string_pattern_mismatch":
            # Every pattern of the spec has its words (tests/test_spec.py checks); a regex is the last resort.
            words = PATTERN_WORDS.get(ctx.get("pattern"), f"text matching the pattern {ctx.get('pattern')}")
            msg = f"{e['input']!r} is not allowed: must be {words}"
        elif e["type"] in TYPE_WORDS:
            msg = f"{shown(e['input'])} is not allowed: {TYPE_WORDS[e['type']]}"
        elif e["type"] == "too_short" and ctx.get("min_length") == 1:
            msg = f"{shown(e['input'])} is not allowed: must not be empty"
        elif e["type"] in VALUE_WORDS:
            words = VALUE_WORDS[e["type"]].format(**{k: _number(v) for k, v in ctx.items()})
            msg = f"{shown(e['input'])} is not allowed: {words}"
        elif e["type"] == "literal_error" and "expected" in ctx:
            msg = f"{shown(e['input'])} is not allowed: must be one of {ctx['expected'].replace(' or ', ', ')}"
            same = [
                x
                for x in re.findall(r"'([^']*)'", ctx["expected"])
                if isinstance(e["input"], str) and x.lower() == e["input"].strip().lower()
            ]
            msg += f" (did you mean {same[0]!r}?)" if same else ""
        elif e["type"] not in ("value_error", "assertion_error"):
            msg = f"{shown(e['input'])} is not allowed: {msg}"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        issues.append(SpecIssue(key_path(prefix + loc), msg))
    return issues
