"""Credentials never printed back: every value `no-plaintext-secrets` flags, and anything shaped like a
credential, is replaced by "[redacted]" in everything the plan prints or writes, and listed by where it is.

The policy refuses a literal credential in env, argv or a script; the plan still shows the resource it
refuses, and that listing (stdout, plan.txt, plan.json, the generated scripts, SARIF, JUnit) is what CI
uploads. So the values are found where the rule looks (the same names, flags and script patterns:
policies.rules.security) plus by shape (Hugging Face, OpenAI, GitHub, GitLab, Slack and AWS tokens, JWTs,
PEM private keys), and replaced wherever they occur. Pulumi secrets are masked before this ("[secret]").
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from components.engines.base import REDACTED, secret_positions
from components.engines.credentials import CREDENTIAL_SHAPES, SCRIPT_ASSIGN, SCRIPT_FLAG, SECRET_ENV
from components.engines.registry import SECRET_FLAGS
from plan.harness import SECRET_MARK, Registration

# A flagged value this short is redacted only where it sits (NAME=…, --api-key …), not everywhere.
MIN_GLOBAL = 6
_ASSIGN = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=(['\"]?)([^\s'\"]+)")
_FLAG_VALUE = re.compile(r"(" + "|".join(map(re.escape, SECRET_FLAGS)) + r")([= ]+)(['\"]?)([^\s'\"]+)")


@dataclass(frozen=True)
class Redaction:
    """One credential found: the resources, where in them, and why it counts as one."""

    resource: str  # the resources' names, comma-separated
    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path} ({self.why}) in {self.resource}"


def _literal(value: str) -> bool:
    return bool(value) and value != SECRET_MARK and not value.startswith(("$", "/", REDACTED))


# Maps whose keys are environment variable names (a ModelServer's env, a Command's environment).
ENV_MAPS = ("env", "environment", "extraEnv")


def _walk(value: Any, path: str) -> Iterable[tuple[str, Any, Any]]:
    """(path, value, the list or dict holding it) for every string."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _walk(v, f"{path}.{k}") if not isinstance(v, str) else [(f"{path}.{k}", v, value)]
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]") if not isinstance(v, str) else [(f"{path}[{i}]", v, value)]


def _flag_values(holder: list[Any]) -> dict[int, str]:
    """Index -> flag for every credential a secret flag is given in a list of argv words."""
    words = [v if isinstance(v, str) else "" for v in holder]
    return dict(secret_positions(words, SECRET_FLAGS))


def _found_in(text: str, path: str, holder: Any) -> Iterable[tuple[str, str]]:
    """(value, why) for each credential in one string of a resource's inputs."""
    parent, _, key = path.rpartition(".")
    if isinstance(holder, dict) and parent.rsplit(".", 1)[-1] in ENV_MAPS and SECRET_ENV.search(key) and _literal(text):
        yield text, f"env {key}"
    name, eq, value = text.partition("=")
    if eq and SECRET_ENV.search(name) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and _literal(value):
        yield value, f"env {name}"
    if isinstance(holder, list) and path.endswith("]"):
        index = int(path.rsplit("[", 1)[1][:-1])
        flag = _flag_values(holder).get(index)
        if flag is not None and not text.startswith(f"{flag}=") and _literal(text):
            yield text, f"flag {flag}"
    for flag in SECRET_FLAGS:
        if text.startswith(flag + "=") and _literal(text[len(flag) + 1 :]):
            yield text[len(flag) + 1 :], f"flag {flag}"
    if "\n" in text or " " in text:  # a script or shell snippet: the rule's own patterns
        for m in SCRIPT_ASSIGN.finditer(text):
            if SECRET_ENV.search(m.group(1)) and _literal(m.group(3)):
                yield m.group(3), f"script assignment {m.group(1)}"
        for m in SCRIPT_FLAG.finditer(text):
            yield m.group(3), f"script flag {m.group(1)}"
    for m in CREDENTIAL_SHAPES.finditer(text):
        yield m.group(0), "shaped like a credential"


class Redactor:
    """The credentials of one plan, and the one way every output is cleaned of them."""

    def __init__(self, registrations: Iterable[Registration]):
        self.values: set[str] = set()
        found: dict[tuple[str, str], str] = {}  # (resource, path) -> why: one reason per place
        for r in registrations:
            for section, data in (("inputs", r.display_inputs()), ("outputs", r.outputs)):
                for path, text, holder in _walk(data, section):
                    for value, why in _found_in(text, path, holder):
                        self.values.add(value)
                        found.setdefault((r.name, path), why)
        # One line per place and reason, listing the resources (a pool's instances share their places).
        by_place: dict[tuple[str, str], list[str]] = {}
        for (resource, path), why in found.items():
            by_place.setdefault((path, why), []).append(resource)
        self.redactions = [Redaction(", ".join(resources), path, why) for (path, why), resources in by_place.items()]
        # Longest first, so a value inside another is not left half-replaced.
        self._global = sorted((v for v in self.values if len(v) >= MIN_GLOBAL), key=len, reverse=True)

    def text(self, text: str) -> str:
        """A string with every credential replaced: known values anywhere, contexts, shapes."""
        for value in self._global:
            text = text.replace(value, REDACTED)
        text = _ASSIGN.sub(
            lambda m: (
                f"{m.group(1)}={m.group(2)}{REDACTED}"
                if SECRET_ENV.search(m.group(1)) and _literal(m.group(3))
                else m.group(0)
            ),
            text,
        )
        text = _FLAG_VALUE.sub(
            lambda m: f"{m.group(1)}{m.group(2)}{m.group(3)}{REDACTED}" if _literal(m.group(4)) else m.group(0), text
        )
        return CREDENTIAL_SHAPES.sub(REDACTED, text)

    def data(self, value: Any, key: str = "", parent: str = "") -> Any:
        """A JSON document with every credential replaced (env maps by their key, flag values in lists)."""
        if isinstance(value, dict):
            return {k: self.data(v, str(k), key) for k, v in value.items()}
        if isinstance(value, list):
            flags = _flag_values(value)
            out = []
            for i, v in enumerate(value):
                after_flag = i in flags and isinstance(v, str) and not v.startswith(f"{flags[i]}=") and _literal(v)
                out.append(REDACTED if after_flag else self.data(v))
            return out
        if isinstance(value, str):
            if parent in ENV_MAPS and SECRET_ENV.search(key) and _literal(value):
                return REDACTED
            return self.text(value)
        return value

    def leftovers(self, outputs: Iterable[str]) -> list[str]:
        """Where a known credential still appears (a bug in redaction): nothing must be written then."""
        return sorted({v[:4] + "…" for text in outputs for v in self._global if v in text})
