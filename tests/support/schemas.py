"""The providers' published schemas (tests/fixtures/schemas, see SOURCES.md there) and a validator of
registered resources against them: unknown or missing inputs, and wrong types."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plan.harness import ARCHIVE_SIG, ASSET_SIG, SECRET_SIG, SIG, UNKNOWN, ProgramRun

SCHEMA_DIR = Path(__file__).parent.parent / "fixtures" / "schemas"


def load_schemas() -> dict[str, dict[str, Any]]:
    """Package name -> schema; docker gets the three properties SDK 5.2.0 adds to the HEAD schema."""
    command = json.loads((SCHEMA_DIR / "command-1.2.1.schema.json").read_text())
    docker = json.loads((SCHEMA_DIR / "docker-5.2.schema.json").read_text())
    res = docker["resources"]
    res["docker:index/container:Container"]["inputProperties"].setdefault(
        "deviceCgroupRules", {"type": "array", "items": {"type": "string"}}
    )
    for prop in ("owner", "group"):
        docker["types"]["docker:index/ContainerUpload:ContainerUpload"]["properties"].setdefault(
            prop, {"type": "integer"}
        )
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


def check_object(
    value: Any, props: dict[str, Any], required: list[str], pkg: str, path: str, *, provider_config: bool = False
) -> list[str]:
    """Problems of an object value against its properties: unknown keys, missing required keys, types."""
    if not isinstance(value, dict):
        return [f"{path}: expected an object, got {value!r}"]
    problems = [f"{path}.{k}: unknown property (allowed: {', '.join(sorted(props))})" for k in value if k not in props]
    problems += [f"{path}.{k}: required property missing" for k in required if k not in value]
    for k, v in value.items():
        if k in props:
            problems += check_value(v, props[k], pkg, f"{path}.{k}", provider_config=provider_config)
    return problems


def check_value(value: Any, spec: dict[str, Any], pkg: str, path: str, *, provider_config: bool = False) -> list[str]:
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
        t = SCHEMAS[pkg]["types"][ref[len("#/types/") :]]
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
    return [
        r
        for r in run.registrations
        if r.type.split(":")[0] in PACKAGES or r.type in {f"pulumi:providers:{p}" for p in PACKAGES}
    ]


def problems_of(run: ProgramRun) -> list[str]:
    found = []
    for r in provider_resources(run):
        pkg, props, required = resource_schema(r.type)
        found += check_object(
            r.inputs, props, required, pkg, f"{r.type} {r.name}", provider_config=r.type.startswith("pulumi:providers:")
        )
    return found
