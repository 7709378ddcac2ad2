"""Shared base for the stack model: strict pydantic models and errors that name the key path."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

# Names become container names, hostnames and nginx upstream names: DNS labels.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
NAME_RE = re.compile(NAME_PATTERN)


class Spec(BaseModel):
    """Strict, immutable, camelCase in YAML: unknown keys are refused with the allowed ones listed."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=False, frozen=True, extra="forbid",
        use_attribute_docstrings=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        # pydantic's own "extra_forbidden" does not say what *is* allowed; users need that list.
        if isinstance(data, dict):
            allowed = {f.alias or n for n, f in cls.model_fields.items()}
            unknown = sorted(str(k) for k in data if k not in allowed)
            if unknown:
                raise PydanticCustomError(
                    "unknown_key", "unknown key {quoted}; allowed keys here: {allowed}",
                    {"key": unknown[0], "quoted": repr(unknown[0]), "allowed": ", ".join(sorted(allowed))},
                )
        return data


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
}
# pydantic's words for a wrong container type name its own classes; users wrote YAML.
TYPE_WORDS = {"dict_type": "expected a mapping (key: value lines)", "model_type": "expected a mapping (key: value lines)",
              "model_attributes_type": "expected a mapping (key: value lines)", "list_type": "expected a list (- item lines)"}


def issues_from_validation_error(err: ValidationError, prefix: tuple[Any, ...] = ()) -> list[SpecIssue]:
    """Turn pydantic's errors into SpecIssues with YAML key paths and the offending value."""
    issues = []
    for e in err.errors(include_url=False):
        # pydantic inserts union/function tags ("function-after[...]") into loc; they are not keys.
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and "[" in p and "]" in p))
        msg = e["msg"]
        if e["type"] == "unknown_key":
            loc = loc + (e["ctx"]["key"],)
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif e["type"] == "string_pattern_mismatch" and e.get("ctx", {}).get("pattern") in PATTERN_WORDS:
            msg = f"{e['input']!r} is not allowed: must be {PATTERN_WORDS[e['ctx']['pattern']]}"
        elif e["type"] in TYPE_WORDS:
            msg = f"{e['input']!r} is not allowed: {TYPE_WORDS[e['type']]}"
        elif e["type"] not in ("value_error", "assertion_error"):
            msg = f"{e['input']!r} is not allowed: {msg}"
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        issues.append(SpecIssue(key_path(prefix + loc), msg))
    return issues
