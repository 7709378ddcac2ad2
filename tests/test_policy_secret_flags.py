"""no-plaintext-secrets' readers as tables: which credential flags of an argv hold a literal (both spellings,
every kind of value that is not one), and every place of a remote command it reads (each script step, its
environment)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from components.engines.base import REDACTED
from policies.rules.security import SECRETS_CONFIG, argv_secret_flags, secrets_found

REMOTE_COMMAND = "command:remote:Command"


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["vllm", "serve", "/m", "--api-key", "k123"], ["--api-key"]),
        (["vllm", "serve", "/m", "--api-key=k123"], ["--api-key"]),
        # One per value of a flag that takes several (the finding's list names each flag once).
        (["lmdeploy", "serve", "api_server", "/m", "--api-keys", "a", "b"], ["--api-keys", "--api-keys"]),
        (["llama-server", "-hft", "hf_abc"], ["--hf-token"]),  # llama.cpp's short flag, by the stack keys' name
        (["llama-server", "--hf-token=hf_abc"], ["--hf-token"]),
        # Values that are not the secret itself: a variable, a command substitution, a file, redacted, empty.
        (["vllm", "serve", "--api-key", "$API_KEY"], []),
        (["vllm", "serve", "--api-key=$(cat /etc/llm-cluster/key)"], []),
        (["vllm", "serve", "--api-key", "/run/secrets/key"], []),
        (["vllm", "serve", "--api-key=/run/secrets/key"], []),
        (["vllm", "serve", "--api-key", REDACTED], []),
        (["vllm", "serve", "--api-key="], []),
        # The value is what follows the first `=`: `$X=y` is a variable's text, not the literal `y`.
        (["vllm", "serve", "--api-key=$X=y"], []),
        (["vllm", "serve", "--api-key==k"], ["--api-key"]),
        (["vllm", "serve", "--model", "/m"], []),
    ],
)
def test_credential_flags_with_a_literal_value(argv: list[str], flags: list[str]) -> None:
    assert argv_secret_flags(argv) == flags


@dataclass
class Resource:
    resource_type: str
    props: dict[str, Any]
    urn: str = "urn:pulumi:prod::llm-cluster::command:remote:Command::step"
    name: str = "step"
    opts: Any = None


CONFIG = {"ignoreEnv": SECRETS_CONFIG.properties["ignoreEnv"]["default"]}


def found(**props: Any) -> list[str]:
    return secrets_found(Resource(REMOTE_COMMAND, props), CONFIG)


def credential(where: str) -> list[str]:
    return [
        f"credential in plain text: {where}. Anyone with docker or shell access on the node reads it (docker "
        'inspect, ps, the command log). Read it from a file on the host (NAME__FILE, --api-key "$(cat '
        "/etc/llm-cluster/…)\"), or list a harmless env name in this policy's ignoreEnv."
    ]


@pytest.mark.parametrize(
    ("props", "findings"),
    [
        ({"create": "set -e\nHF_TOKEN=hf_abc huggingface-cli download m"}, credential("script HF_TOKEN=…")),
        ({"create": "true", "update": "export HF_TOKEN=hf_abc"}, credential("script HF_TOKEN=…")),
        ({"create": "true", "delete": "curl -H x --api-key k123 http://n/"}, credential("script --api-key")),
        ({"create": "true", "environment": {"HF_TOKEN": "hf_abc"}}, credential("env HF_TOKEN")),
        ({"create": "true", "environment": {"HF_TOKEN": "$HOME/token"}}, []),
        ({"create": "HF_TOKEN=$(cat /etc/llm-cluster/hf) run", "environment": {"MODEL": "m"}}, []),
    ],
)
def test_every_place_of_a_remote_command_is_read(props: dict[str, Any], findings: list[str]) -> None:
    assert found(**props) == findings
