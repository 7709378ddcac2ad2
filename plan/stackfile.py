"""Read `Pulumi.<stack>.yaml` as the Pulumi CLI would hand it to the program, with no passphrase."""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from components.engines.base import REDACTED
from components.engines.credentials import CREDENTIAL_SHAPES
from components.planning.load import load_stack_config
from components.spec import NAMESPACE, SECTIONS, SpecError, SpecIssue, StackSpec
from components.spec.stack import secret_in_plain_config


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: YAML would silently keep the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (list, dict)):  # `? [a, b]` or `[a]: …`: unhashable, a TypeError further down
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a key must be a name, not a {'list' if isinstance(key, list) else 'mapping'}",
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (the second one would silently win)", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_STACK_NAME = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9_.-]+$")

_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True)
class StackFile:
    """A stack's config: plain values, and the secure ones replaced by opaque placeholders."""

    name: str
    path: Path
    config: dict[str, Any]
    secret_keys: frozenset[str]
    secret_values: dict[str, str]  # full key -> the placeholder standing in for the encrypted value


# What secret_placeholder makes: find it anywhere and the plan has leaked that secret.
SECRET_MARKER = re.compile(r"plan-secret-[0-9a-f]{16}")


def secret_placeholder(stack: str, key: str) -> str:
    """A unique marker for one secret: if it ever shows up in plaintext, the plan has leaked it."""
    digest = hashlib.sha256(f"{stack}/{key}".encode()).hexdigest()[:16]
    return f"plan-secret-{digest}"


def _placeholder_value(stack: str, key: str, config: dict[str, Any]) -> str:
    """A placeholder of the shape the program parses (the gateway keys are a JSON object)."""
    marker = secret_placeholder(stack, key)
    if key == f"{NAMESPACE}:gatewayApiKeys":
        ids = [
            k.get("id") for k in (config.get(f"{NAMESPACE}:gateway") or {}).get("apiKeys", []) if isinstance(k, dict)
        ] or ["default"]
        return "{" + ", ".join(f'"{i}": "{marker}-{n}"' for n, i in enumerate(ids)) + "}"
    if key == f"{NAMESPACE}:sshPrivateKey":
        return f"-----BEGIN OPENSSH PRIVATE KEY-----\n{marker}\n-----END OPENSSH PRIVATE KEY-----\n"
    return marker


def load_stack_file(path: Path, name: str | None = None) -> StackFile:
    """Parse a stack file; raise SpecError (never a traceback) when it cannot be read."""
    name = name if name is not None else path.name.removeprefix("Pulumi.").removesuffix(".yaml")
    if not _STACK_NAME.match(name):
        # The name becomes build/plan/<name>/, which the plan empties first: never '', '..' or a path.
        raise SpecError(
            [SpecIssue(str(path), f"stack name {name!r} must be letters, digits, '-', '_' or '.' (Pulumi.<name>.yaml)")]
        )
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 (SafeLoader subclass)
    except FileNotFoundError:
        raise SpecError([SpecIssue(str(path), "stack file not found")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError([SpecIssue(str(path), f"cannot be read as UTF-8 text: {e}")]) from None
    except yaml.YAMLError as e:
        raise SpecError([SpecIssue(str(path), f"is not valid YAML: {e}")]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("config", {}), dict):
        raise SpecError([SpecIssue(f"{path}", "must be a mapping with a `config:` mapping")])
    misplaced = sorted(str(k) for k in doc if ":" in str(k) or str(k) in SECTIONS)
    if misplaced:  # the config keys written at the top of the file, without `config:` above them
        raise SpecError(
            [
                SpecIssue(
                    f"{path}",
                    f"the top-level key {misplaced[0]!r} is not allowed: config keys go "
                    "under `config:`, indented below it",
                )
            ]
        )
    raw: dict[str, Any] = doc.get("config") or {}
    odd = [k for k in raw if not isinstance(k, str)]
    if odd:
        raise SpecError([SpecIssue(f"config.{odd[0]!r}", "config keys are strings like llm-cluster:nodes")])
    config: dict[str, Any] = {}
    secret_keys: set[str] = set()
    secrets: dict[str, str] = {}
    for key, value in raw.items():
        # Pulumi lets stack files drop the project prefix for the project's own keys.
        full = key if ":" in key else f"{NAMESPACE}:{key}"
        if isinstance(value, dict) and set(value) == {"secure"}:
            secret_keys.add(full)
            continue
        config[full] = value
    nested = [
        issue
        for full, value in config.items()
        if full.startswith(f"{NAMESPACE}:")
        for issue in _nested_secrets(full[len(NAMESPACE) + 1 :], full[len(NAMESPACE) + 1 :], value)
    ]
    if nested:
        raise SpecError(nested)
    for full in sorted(secret_keys):
        secrets[full] = _placeholder_value(name, full, config)
        config[full] = secrets[full]
    return StackFile(name, path, config, frozenset(secret_keys), secrets)


def _nested_secrets(section: str, at: str, value: Any) -> list[SpecIssue]:
    """Each `secure:` value inside a section (`pulumi config set --secret --path`): the program would hand it
    on in clear (a container's env, a file), so it is refused, saying where secrets go."""
    if isinstance(value, dict) and set(value) == {"secure"}:
        return [secret_in_plain_config(at, section)]
    if isinstance(value, dict):
        return [i for k, v in value.items() for i in _nested_secrets(section, f"{at}.{k}", v)]
    if isinstance(value, list):
        return [i for n, v in enumerate(value) for i in _nested_secrets(section, f"{at}[{n}]", v)]
    return []


def load_spec(path: Path, name: str | None = None) -> tuple[StackFile, StackSpec] | None:
    """The stack file and its validated spec; None after saying on stderr why the stack is invalid, one
    issue a line, with anything shaped like a credential redacted (the message may quote a value)."""
    try:
        stack = load_stack_file(path, name)
        return stack, load_stack_config(stack.config, stack.secret_keys)
    except SpecError as err:
        say_invalid(path, err)
        return None


def say_invalid(path: Path, err: SpecError) -> None:
    """Say on stderr why the stack is invalid: one issue a line, anything shaped like a credential redacted."""
    print(f"invalid stack config {path}:", file=sys.stderr)
    for issue in err.issues:
        print(f"  {CREDENTIAL_SHAPES.sub(REDACTED, str(issue))}", file=sys.stderr)
