"""Helpers the real-tool tests share: the tools they drive, and free loopback ports."""
from __future__ import annotations

import shutil
import socket

import pytest

# The Debian package of each tool the tests run (`.ci/system-deps` installs them as root).
DEBIAN_PACKAGE = {
    "nginx": "nginx-light libnginx-mod-http-js", "promtool": "prometheus", "shellcheck": "shellcheck",
    "curl": "curl", "bash": "bash", "dash": "dash", "openssl": "openssl", "wrk": "wrk", "pgrep": "procps",
    "python3": "python3", "nft": "nftables", "ip": "iproute2", "ib_write_bw": "perftest", "chronyc": "chrony",
}


def tool(name: str) -> str:
    """Path of a real tool a test drives; a clear failure (never a skip) when it is missing."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run `make test` as root "
                    f"(Debian: apt-get install -y {DEBIAN_PACKAGE.get(name, name)})")
    return path


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
