"""Every docker and command resource the program registers validates against the providers' published schemas.

Generic over `run.registrations`, so resources other components add are checked as they land.
Schemas: tests/fixtures/schemas (see SOURCES.md there).
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plan.harness import ARCHIVE_SIG, ASSET_SIG, SECRET_SIG, SIG, UNKNOWN, ProgramRun
from tests.support import host_key

SCHEMA_DIR = Path(__file__).parent / "fixtures" / "schemas"


def load_schemas() -> dict[str, dict[str, Any]]:
    """Package name -> schema; docker gets the three properties SDK 5.2.0 adds to the HEAD schema."""
    command = json.loads((SCHEMA_DIR / "command-1.2.1.schema.json").read_text())
    docker = json.loads((SCHEMA_DIR / "docker-5.2.schema.json").read_text())
    res = docker["resources"]
    res["docker:index/container:Container"]["inputProperties"].setdefault(
        "deviceCgroupRules", {"type": "array", "items": {"type": "string"}})
    for prop in ("owner", "group"):
        docker["types"]["docker:index/ContainerUpload:ContainerUpload"]["properties"].setdefault(
            prop, {"type": "integer"})
    return {"command": command, "docker": docker}


SCHEMAS = load_schemas()
PACKAGES = tuple(SCHEMAS)


def resource_schema(type_token: str) -> tuple[str, dict[str, Any], list[str]]:
    """(package, inputProperties, requiredInputs) of a resource or provider type token."""
    if type_token.startswith("pulumi:providers:"):
        pkg = type_token.split(":")[2]
        spec = SCHEMAS[pkg]["provider"]
    else:
        pkg = type_token.split(":")[0]
        if type_token not in SCHEMAS[pkg]["resources"]:
            raise AssertionError(f"{type_token} is not a resource of the {pkg} schema")
        spec = SCHEMAS[pkg]["resources"][type_token]
    return pkg, spec.get("inputProperties", {}), spec.get("requiredInputs", [])


def check_object(value: Any, props: dict[str, Any], required: list[str], pkg: str, path: str,
                 *, provider_config: bool = False) -> list[str]:
    """Problems of an object value against its properties: unknown keys, missing required keys, types."""
    if not isinstance(value, dict):
        return [f"{path}: expected an object, got {value!r}"]
    problems = [f"{path}.{k}: unknown property (allowed: {', '.join(sorted(props))})"
                for k in value if k not in props]
    problems += [f"{path}.{k}: required property missing" for k in required if k not in value]
    for k, v in value.items():
        if k in props:
            problems += check_value(v, props[k], pkg, f"{path}.{k}", provider_config=provider_config)
    return problems


def check_value(value: Any, spec: dict[str, Any], pkg: str, path: str, *,
                provider_config: bool = False) -> list[str]:
    """Problems of one wire-form value against a Pulumi schema type spec."""
    if value == UNKNOWN:
        return []  # unknown during preview: any type
    if isinstance(value, dict) and value.get(SIG) == SECRET_SIG:
        return check_value(value.get("value"), spec, pkg, path, provider_config=provider_config)
    ref = spec.get("$ref", "")
    if isinstance(value, dict) and value.get(SIG) in (ASSET_SIG, ARCHIVE_SIG):
        kind = "Asset" if value[SIG] == ASSET_SIG else "Archive"
        ok = ref in (f"pulumi.json#/{kind}", "pulumi.json#/Any") or (kind == "Asset" and ref == "pulumi.json#/Archive")
        return [] if ok else [f"{path}: an {kind} where the schema wants {spec}"]
    if "oneOf" in spec:
        results = [check_value(value, s, pkg, path, provider_config=provider_config) for s in spec["oneOf"]]
        return [] if any(not r for r in results) else results[0]
    if ref == "pulumi.json#/Any":
        return []
    if ref.startswith("#/types/"):
        t = SCHEMAS[pkg]["types"][ref[len("#/types/"):]]
        if "enum" in t:
            allowed = [e["value"] for e in t["enum"]]
            return [] if value in allowed else [f"{path}: {value!r} is not one of {allowed}"]
        return check_object(value, t.get("properties", {}), t.get("required", []), pkg, path)
    if ref:
        return [f"{path}: unsupported $ref {ref}"]
    kind = spec.get("type")
    if provider_config and kind != "string" and isinstance(value, str):
        # Provider config travels as strings: non-string values are JSON-encoded (pulumi-docker sshOpts).
        value = json.loads(value)
    checks: dict[str, Callable[[Any], bool]] = {
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        # The protobuf Struct carries every number as a double.
        "integer": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer(),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if kind not in checks:
        return [f"{path}: unsupported schema type {spec}"]
    if not checks[kind](value):
        return [f"{path}: expected {kind}, got {value!r}"]
    if kind == "array":
        return [p for i, v in enumerate(value) for p in check_value(v, spec["items"], pkg, f"{path}[{i}]")]
    if kind == "object" and "additionalProperties" in spec:
        return [p for k, v in value.items() for p in check_value(v, spec["additionalProperties"], pkg, f"{path}.{k}")]
    return []


def provider_resources(run: ProgramRun) -> list[Any]:
    return [r for r in run.registrations
            if r.type.split(":")[0] in PACKAGES or r.type in {f"pulumi:providers:{p}" for p in PACKAGES}]


def problems_of(run: ProgramRun) -> list[str]:
    found = []
    for r in provider_resources(run):
        pkg, props, required = resource_schema(r.type)
        found += check_object(r.inputs, props, required, pkg, f"{r.type} {r.name}",
                              provider_config=r.type.startswith("pulumi:providers:"))
    return found


# --- the validator itself can fail ---------------------------------------------------------------

def test_validator_refuses_unknown_missing_and_mistyped_properties() -> None:
    pkg, props, required = resource_schema("command:remote:Command")
    bad = {"connection": {"host": "h", "port": "22", "agentSocketPath": 1, "bogus": True},
           "create": ["not", "a", "string"], "triggeers": []}
    problems = check_object(bad, props, required, pkg, "cmd")
    connection_props = SCHEMAS["command"]["types"]["command:remote:Connection"]["properties"]
    assert sorted(problems) == sorted([
        "cmd.triggeers: unknown property (allowed: addPreviousOutputInEnv, connection, create, delete, "
        "environment, logging, stdin, triggers, update)",
        "cmd.connection.port: expected number, got '22'",
        "cmd.connection.agentSocketPath: expected string, got 1",
        f"cmd.connection.bogus: unknown property (allowed: {', '.join(sorted(connection_props))})",
        "cmd.create: expected string, got ['not', 'a', 'string']",
    ])
    assert check_object({}, props, required, pkg, "cmd") == ["cmd.connection: required property missing"]
    assert check_object({"connection": {"host": "h"}, "logging": "loud"}, props, required, pkg, "c") == [
        "c.logging: 'loud' is not one of ['stdout', 'stderr', 'stdoutAndStderr', 'none']"]
    with pytest.raises(AssertionError, match="not a resource of the docker schema"):
        resource_schema("docker:index/nope:Nope")


def test_validator_unwraps_secrets_and_accepts_unknowns() -> None:
    pkg, props, required = resource_schema("command:remote:Command")
    value = {"connection": {SIG: SECRET_SIG, "value": {"host": "h", "privateKey": "k"}}, "create": UNKNOWN}
    assert check_object(value, props, required, pkg, "c") == []
    value["connection"]["value"]["port"] = True  # type: ignore[index]
    assert check_object(value, props, required, pkg, "c") == ["c.connection.port: expected number, got True"]


# --- the program's registrations -----------------------------------------------------------------

def test_reference_stack_validates(prod_run: ProgramRun) -> None:
    checked = provider_resources(prod_run)
    types = {r.type for r in checked}
    assert {"pulumi:providers:docker", "command:remote:Command", "docker:index/remoteImage:RemoteImage"} <= types
    assert len(checked) >= 6 + 12 + 8  # providers, hosts + preflight, weights commands
    assert problems_of(prod_run) == []


def test_reference_stack_preview_validates(prod_preview_run: ProgramRun, prod_run: ProgramRun) -> None:
    # The same resources as under `up`, now with unknown computed inputs.
    names = lambda run: sorted(r.name for r in provider_resources(run))  # noqa: E731
    assert names(prod_preview_run) == names(prod_run)
    assert problems_of(prod_preview_run) == []


def test_other_ssh_and_weights_modes_validate(config: dict[str, Any], stack_runner: Callable[..., ProgramRun]) -> None:
    cfg = copy.deepcopy(config)
    cfg["llm-cluster:ssh"] = {"agent": False, "hostKeyChecking": True, "port": 2222}
    cfg["llm-cluster:sshPrivateKey"] = "-----BEGIN OPENSSH PRIVATE KEY-----\nx\n-----END OPENSSH PRIVATE KEY-----\n"
    for node in cfg["llm-cluster:nodes"]:
        cfg["llm-cluster:nodes"][node]["hostKey"] = host_key(node)
    cfg["llm-cluster:models"]["qwen3-30b-a3b"]["source"] = {"sharedMount": "nas:/export/qwen3"}
    cfg["llm-cluster:models"]["deepseek-r1"]["source"] = {"present": True}
    run = stack_runner(cfg, {"llm-cluster:sshPrivateKey"})
    assert len(run.by_type("command:local:Command")) == 18  # per node: key, known_hosts and the clock check
    assert problems_of(run) == []
