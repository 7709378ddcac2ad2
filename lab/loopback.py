"""A network namespace whose only link is `lo`: where Ray and the engines run outside the lab's hosts.

Ray reaches for the cloud-metadata address when it starts and an engine binds the host's primary address
unless told otherwise; inside such a namespace neither can leave this machine. `Namespace` creates one
(checking it has no route but loopback's), lists and stops what runs in it, and removes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# Every namespace made here is named vx-<name>, so leftovers are found by prefix.
NS_PREFIX = "vx-"


class NamespaceError(RuntimeError):
    pass


def ip(*argv: str) -> str:
    p = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30)
    if p.returncode:
        raise NamespaceError(f"ip {' '.join(argv)} failed: {p.stderr.strip()}")
    return p.stdout


def namespaces_unavailable() -> str | None:
    """None when this process can make network namespaces; else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"{NS_PREFIX}probe-{os.getpid()}"
    try:
        p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    except FileNotFoundError:
        return "ip (iproute2) is missing"
    if p.returncode:
        return f"cannot create a network namespace here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Namespace:
    """`vx-<name>`: a network namespace whose only link is `lo` (up) and which has no route but loopback's."""

    name: str

    @property
    def ns(self) -> str:
        return NS_PREFIX + self.name

    def create(self) -> Namespace:
        if self.ns in ip("netns", "list").split():
            self.delete()
        ip("netns", "add", self.ns)
        ip("-n", self.ns, "link", "set", "lo", "up")
        left = self.outside_routes()
        if left:
            raise NamespaceError(f"{self.ns} has routes beyond loopback: {left}")
        return self

    def links(self) -> list[str]:
        return [line.split(":")[1].strip() for line in ip("-n", self.ns, "-o", "link", "show").splitlines()]

    def outside_routes(self) -> list[str]:
        """Every route of the namespace (IPv4 and IPv6, all tables) that is not on `lo`."""
        routes = ip("-n", self.ns, "route", "show", "table", "all").splitlines()
        routes += ip("-n", self.ns, "-6", "route", "show", "table", "all").splitlines()
        return [r for r in routes if r.strip() and " dev lo" not in r]

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def delete(self) -> None:
        """Stop whatever still runs in it (SIGTERM, then SIGKILL), then remove it."""
        stop_processes(self.pids(), grace=15)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def __enter__(self) -> Namespace:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.delete()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def stop_processes(pids: list[int], grace: float) -> None:
    """SIGTERM to each, SIGKILL after `grace` seconds to those still running."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
