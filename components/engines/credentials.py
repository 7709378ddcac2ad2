"""What a credential looks like wherever the program writes one (argv, env, scripts, messages): the policy
pack refuses a literal one and the offline plan redacts it, from these same patterns."""

from __future__ import annotations

import re

from components.engines.base import REDACTED
from components.engines.registry import SECRET_FLAGS

# Env names that carry credentials by convention; *_FILE variants point at a file and are fine.
SECRET_ENV = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|APIKEY|PRIVATE_KEY|ACCESS_KEY)$", re.IGNORECASE)
# `NAME=value` or `--api-key value` in a script with a literal value (not $VAR, $(…), a path, a quote of
# one or the plan's mask); a name after `-` is a flag's (--hf-token=…), which SCRIPT_FLAG and the
# server's parse read. A flag's value also as the next item of a JSON list (`"--api-key", "…"`).
SCRIPT_ASSIGN = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=(['\"]?)([^\s'\"$`/][^\s'\"]*)")
SCRIPT_FLAG = re.compile(
    r"(?<![\w-])("
    + "|".join(map(re.escape, sorted(SECRET_FLAGS, key=len, reverse=True)))
    + r")(?:[= ]+|\"\s*,\s*\")(['\"]?)(?!"
    + re.escape(REDACTED)
    + r")([^\s'\"$`/-][^\s'\"]*)"
)
# Tokens recognisable by their shape, wherever they appear.
CREDENTIAL_SHAPE_PATTERNS = (
    r"\bhf_[A-Za-z0-9]{20,}",  # Hugging Face
    r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic
    r"\bgh[pousr]_[A-Za-z0-9]{30,}",
    r"\bgithub_pat_[A-Za-z0-9_]{30,}",  # GitHub
    r"\bglpat-[A-Za-z0-9_-]{20,}",  # GitLab
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",  # Slack
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key id
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",  # JWT
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----",  # PEM / OpenSSH keys
)
CREDENTIAL_SHAPES = re.compile("|".join(CREDENTIAL_SHAPE_PATTERNS), re.DOTALL)
