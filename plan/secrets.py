"""Find secret values that escaped their Pulumi secret envelope anywhere in what the program registered."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from plan.harness import SECRET_SIG, SIG, ProgramRun, Registration
from plan.stackfile import SECRET_MARKER


@dataclass(frozen=True)
class Leak:
    """A secret's value found in plaintext: where, and which secret."""

    urn: str
    path: str
    secret_key: str


def _walk_plain(value: Any, path: str) -> Iterable[tuple[str, str]]:
    """Yield (path, string) for every string outside a secret envelope."""
    if isinstance(value, dict):
        if value.get(SIG) == SECRET_SIG:
            return
        for k, v in value.items():
            yield from _walk_plain(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk_plain(v, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def _markers(secret_values: Mapping[str, str]) -> dict[str, str]:
    """marker -> secret key; JSON-shaped placeholders embed the marker in each of their values."""
    return {m: key for key, value in secret_values.items() for m in SECRET_MARKER.findall(value)}


def find_leaks(registrations: list[Registration], secret_values: Mapping[str, str]) -> list[Leak]:
    """Every place a stack secret appears in a resource's inputs or outputs without the secret flag."""
    markers = _markers(secret_values)
    leaks = []
    for r in registrations:
        for section, data in (("inputs", r.inputs), ("outputs", r.outputs)):
            for path, text in _walk_plain(data, section):
                for marker, key in markers.items():
                    if marker in text:
                        leaks.append(Leak(r.urn, path, key))
    return leaks


def text_leaks(text: str, secret_values: Mapping[str, str]) -> list[str]:
    """Secret keys whose value appears in a piece of output text (the printed plan, plan.json)."""
    return sorted({key for marker, key in _markers(secret_values).items() if marker in text})


def unmarked_outputs(run: ProgramRun) -> list[Leak]:
    """Commands whose stdout is a secret the host made, but which do not mark it secret: the engine
    would keep it in plaintext in the state and show it in `pulumi stack export`."""
    leaks = []
    by_urn = {r.urn: r for r in run.registrations}
    for key in run.generated_secrets():
        urn, prop = key.rsplit(".", 1)
        if prop not in by_urn[urn].options.get("additionalSecretOutputs", []):
            leaks.append(Leak(urn, f"outputs.{prop} (not in additional_secret_outputs)", key))
    return leaks
