"""Every docker and command resource the program registers validates against the providers' published schemas.

Generic over `run.registrations`, so resources other components add are checked as they land.
Schemas: tests/fixtures/schemas (see SOURCES.md there); the validator: tests/support/schemas.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from plan.harness import SECRET_SIG, SIG, UNKNOWN, ProgramRun
from tests.support import host_key
from tests.support.schemas import SCHEMAS, check_object, problems_of, provider_resources, resource_schema

# --- the validator itself can fail ---------------------------------------------------------------


def test_validator_refuses_unknown_missing_and_mistyped_properties() -> None:
    pkg, props, required = resource_schema("command:remote:Command")
    bad = {
        "connection": {"host": "h", "port": "22", "agentSocketPath": 1, "bogus": True},
        "create": ["not", "a", "string"],
        "triggeers": [],
    }
    problems = check_object(bad, props, required, pkg, "cmd")
    connection_props = SCHEMAS["command"]["types"]["command:remote:Connection"]["properties"]
    assert sorted(problems) == sorted(
        [
            "cmd.triggeers: unknown property (allowed: addPreviousOutputInEnv, connection, create, delete, "
            "environment, logging, stdin, triggers, update)",
            "cmd.connection.port: expected number, got '22'",
            "cmd.connection.agentSocketPath: expected string, got 1",
            f"cmd.connection.bogus: unknown property (allowed: {', '.join(sorted(connection_props))})",
            "cmd.create: expected string, got ['not', 'a', 'string']",
        ]
    )
    assert check_object({}, props, required, pkg, "cmd") == ["cmd.connection: required property missing"]
    assert check_object({"connection": {"host": "h"}, "logging": "loud"}, props, required, pkg, "c") == [
        "c.logging: 'loud' is not one of ['stdout', 'stderr', 'stdoutAndStderr', 'none']"
    ]
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
