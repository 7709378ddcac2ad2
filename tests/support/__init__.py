"""What the tests share besides pytest fixtures (those are in tests/conftest.py): no test module imports
from another.

Here: the real tools the tests drive, free loopback ports, and the host scripts' text. Beside it:
- deployed_nginx: the gateway image's own nginx and Lua module, fetched once per machine;
- gateway: the real-nginx gateway harness (fake replicas, NginxGateway, the test stack's keys);
- fake_openai: an OpenAI-compatible server on loopback for the smoke and load tests;
- engine_stacks: the reference stack with its chat pool on LMDeploy or llama.cpp;
- policies: one resource through the policy pack's analyzer, and the stacks the pack refuses;
- plans: a stack planned twice by the CLI;
- schemas: the providers' schemas and a validator of registered resources;
- monitoring: the exporters' metric lists and the metric names of PromQL queries;
- preflight: the recorded node outputs and the preflight script run with fake tools that print them;
- qualification: real wheels from PyPI (cached), the gate script with a stand-in docker, --network none.
- lab_tier: the lab of a stack file up on fresh test hosts and down again, for the lab tier (tests/lab).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

# The Debian package of each tool the tests run (`.ci/system-deps` installs them as root).
DEBIAN_PACKAGE = {
    "promtool": "prometheus",
    "shellcheck": "shellcheck",
    "curl": "curl",
    "bash": "bash",
    "dash": "dash",
    "openssl": "openssl",
    "wrk": "wrk",
    "pgrep": "procps",
    "python3": "python3",
    "nft": "nftables",
    "ip": "iproute2",
    "ss": "iproute2",
    "ib_write_bw": "perftest",
    "chronyc": "chrony",
}


# evalscope's venv for the tests that run `make loadtest` (LOADTEST_VENV=…): cached per machine, made when missing.
LOADTEST_VENV = "/var/cache/llm-cluster/loadtest/venv"


def tool(name: str) -> str:
    """Path of a real tool a test drives; a clear failure (never a skip) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: run `make test` as root "
            f"(Debian: apt-get install -y {DEBIAN_PACKAGE.get(name, name)})"
        )
    return path


@contextlib.contextmanager
def cache_lock(directory: Path) -> Iterator[None]:
    """Hold `directory`'s lock while filling a cache in it: test workers and test runs that start together
    fetch or unpack once, and none reads a half-written file."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on 127.0.0.1 right now (held together, so never the same one twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One free TCP port on 127.0.0.1."""
    return free_ports(1)[0]


def script_of(create: str) -> str:
    """The bash script a Command's `create` hands to bash (node_scripts.bash_command's heredoc)."""
    m = re.fullmatch(r"bash -c \"\$\(cat <<'(\w+)'\n(.*)\n\1\n\)\" llm-cluster", create, re.S)
    assert m, create[:80]
    return m.group(2) + "\n"


def content_trigger(script: str) -> str:
    """The trigger a script must carry: sha256 of exactly its text, 16 hex digits (written out here,
    not imported, so a trigger computed from anything but the script that runs fails)."""
    return hashlib.sha256(script.encode()).hexdigest()[:16]


def host_key(node: str) -> str:
    """A real ed25519 public host key for a node named like the reference's (the lab's own, lab/hostkeys/)."""
    return " ".join((Path(__file__).resolve().parents[2] / "lab" / "hostkeys" / f"{node}.pub").read_text().split()[:2])
