"""Every credential the program knows, as whole tables rather than an example or two: each shape of
CREDENTIAL_SHAPES, each secret-name suffix of SECRET_ENV, each engine's secret flag — redacted by the plan
and refused by no-plaintext-secrets, so dropping one entry fails a test."""

from __future__ import annotations

import re
from typing import Any

import pytest

from components.engines.base import REDACTED
from components.engines.credentials import CREDENTIAL_SHAPE_PATTERNS, CREDENTIAL_SHAPES, SECRET_ENV
from components.engines.registry import ENGINES, SECRET_FLAG_NAMES, SECRET_FLAGS
from plan.redact import Redactor
from policies.rules.security import secrets_found

# One token of each shape CREDENTIAL_SHAPES lists, in its order (a test below counts them against it).
SHAPES = {
    "Hugging Face": "hf_" + "a1B2c3D4e5" * 3,
    "OpenAI / Anthropic": "sk-proj-" + "Ab3_" * 6,
    "GitHub token": "ghp_" + "x9Y8z7W6v5" * 4,
    "GitHub fine-grained": "github_pat_" + "11ABCDEFG_" * 4,
    "GitLab": "glpat-" + "q1W2e3R4t5" * 2,
    "Slack": "xoxb-" + "1234567890-abc",
    "AWS access key id": "AKIA" + "ABCDEFGHIJKLMNOP",
    "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlLXBhcnQ",
    "PEM private key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
}
# The suffixes SECRET_ENV names a credential by.
SUFFIXES = ("PASSWORD", "PASSWD", "SECRET", "TOKEN", "API_KEY", "APIKEY", "PRIVATE_KEY", "ACCESS_KEY")
SEEN = "not-a-real-credential-42"


class Container:
    """A raw container as the stack policies see it."""

    resource_type = "docker:index/container:Container"
    urn = "urn:pulumi:t::p::docker:index/container:Container::c"
    name = "c"
    opts: Any = None

    def __init__(self, props: dict[str, Any]):
        self.props = props


def refused(props: dict[str, Any]) -> list[str]:
    return secrets_found(Container(props), {"ignoreEnv": []})


def test_the_tables_here_are_whole() -> None:
    # One token per shape, each matched by its own pattern (in order) and by no other.
    assert len(SHAPES) == len(CREDENTIAL_SHAPE_PATTERNS)
    for pattern, token in zip(CREDENTIAL_SHAPE_PATTERNS, SHAPES.values(), strict=True):
        assert [bool(re.search(p, token, re.DOTALL)) for p in CREDENTIAL_SHAPE_PATTERNS].count(True) == 1, token
        assert re.search(pattern, token, re.DOTALL), token
    assert SECRET_ENV.pattern == "(" + "|".join(SUFFIXES) + ")$"


@pytest.mark.parametrize("kind", list(SHAPES))
def test_every_credential_shape_is_masked_wherever_it_appears(kind: str) -> None:
    token = SHAPES[kind]
    text = f"echo starting; curl -H 'X: {token}' http://example.invalid/ # {kind}"
    assert [m.group(0) for m in CREDENTIAL_SHAPES.finditer(text)] == [token]
    masked = Redactor([]).text(text)
    assert token not in masked and REDACTED in masked


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_secret_name_is_refused_as_a_literal_and_masked(suffix: str) -> None:
    name = f"MY_{suffix}"
    assert refused({"envs": [f"{name}={SEEN}"]}) != []
    assert f"env {name}" in refused({"envs": [f"{name}={SEEN}"]})[0]
    # Read from a file (the *_FILE convention) or lower case in another word: not a credential name.
    assert refused({"envs": [f"{name}_FILE=/run/secrets/x"]}) == []
    assert Redactor([]).text(f"export {name}={SEEN}") == f"export {name}={REDACTED}"


@pytest.mark.parametrize(("engine", "flag"), [(e.name, f) for e in ENGINES.values() for f in sorted(e.secret_flags)])
def test_every_engines_secret_flag_is_refused_as_a_literal_and_masked(engine: str, flag: str) -> None:
    assert flag in SECRET_FLAGS
    for argv in (["server", flag, SEEN], ["server", f"{flag}={SEEN}"]):
        [message] = refused({"command": argv})
        # Named by its long name (llama.cpp's -hft as --hf-token: the name the stack keys know).
        assert f"credential in plain text: {SECRET_FLAG_NAMES.get(flag, flag)}" in message, (engine, argv)
    assert SEEN not in Redactor([]).text(f"server {flag} {SEEN} --port 8000")
