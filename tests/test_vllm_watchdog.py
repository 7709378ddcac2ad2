"""The vLLM watchdog, run for real with bash against a fake server: it turns a hang into an exit."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.engines.base import WorldCheck, watchdog_script
from tests.support import free_port

# A stand-in for `vllm serve`: /health answers 200 while the flag file says "ok", 503 otherwise;
# it exits with the code written to the flag file as "exit N". Every request is appended to the log
# file as "<path> <status>", so a test can see what the watchdog's own probe (GET /health) was told.
FAKE_VLLM = r"""
import http.server, sys, threading, os
port, flag, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
if sys.argv[4:] == ["deaf"]:  # as vLLM's API server waiting for hung connections: SIGTERM changes nothing
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if open(flag).read().strip() == "ok" else 503
        with open(log, "a") as out:
            out.write(f"{self.path} {code}\n")
        self.send_response(code)
        self.end_headers()
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", port), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
import time
while True:
    state = open(flag).read().strip()
    if state.startswith("exit "):
        os._exit(int(state.split()[1]))
    time.sleep(0.1)
"""
# Upper bounds so a broken watchdog cannot hang the suite; not timing assertions.
BOUND_S = 60
READY_S = 30
# The test's own /health requests carry this query, so the log tells them from the watchdog's probes.
TEST_PROBE = "/health?from=test"


@dataclass
class Watchdog:
    """A running watchdog (bash) supervising the fake server, in its own process group."""

    proc: subprocess.Popen[str]
    flag: Path
    port: int
    log: Path

    def probes(self) -> list[int]:
        """The status of every /health probe the watchdog made so far (not the test's own requests)."""
        text = self.log.read_text() if self.log.exists() else ""
        return [int(code) for path, _, code in (line.partition(" ") for line in text.splitlines()) if path == "/health"]

    def wait_for_health(self) -> None:
        """Poll the fake server's /health until it answers 200 (bounded)."""
        deadline = time.monotonic() + READY_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{TEST_PROBE}", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503
            if self.proc.poll() is not None:
                pytest.fail(f"the watchdog exited ({self.proc.returncode}) before /health answered 200")
            if time.monotonic() > deadline:
                pytest.fail(f"the fake server's /health did not answer 200 within {READY_S}s")
            time.sleep(0.1)

    def wait_for_probes(self, status: int, count: int = 1) -> None:
        """Wait until the watchdog's own probe was answered `status` at least `count` times (bounded)."""
        deadline = time.monotonic() + READY_S
        while self.probes().count(status) < count:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the watchdog exited ({self.proc.returncode}) after probes {self.probes()}, "
                    f"before {count} answered {status}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the watchdog's probe was not answered {status} {count} time(s) within {READY_S}s: {self.probes()}"
                )
            time.sleep(0.1)

    def wait_until_served(self) -> None:
        """The fake answers 200 and the watchdog has seen it healthy at least once (it is in its loop)."""
        self.wait_for_health()
        self.wait_for_probes(200)


@pytest.fixture
def watchdogs(tmp_path: Path) -> Iterator[Callable[..., Watchdog]]:
    """Start watchdogs; teardown kills each one's process group (bash and the fake server), also when an
    assertion failed half-way."""
    started: list[subprocess.Popen[str]] = []

    def start(
        state: str,
        *,
        load_timeout_s: int = 30,
        unhealthy_after_s: int = 2,
        world: WorldCheck | None = None,
        deaf: bool = False,
    ) -> Watchdog:
        port = free_port()
        flag = tmp_path / "flag"
        flag.write_text(state)
        log = tmp_path / "requests.log"
        fake = tmp_path / "fake_vllm.py"
        fake.write_text(FAKE_VLLM)
        script = tmp_path / "vllm-watchdog.sh"
        script.write_text(
            watchdog_script(
                f"http://127.0.0.1:{port}/health",
                load_timeout_s=load_timeout_s,
                unhealthy_after_s=unhealthy_after_s,
                interval_s=1,
                world=world,
                give_up_grace_s=2,
            )
        )
        proc = subprocess.Popen(
            [
                "bash",
                str(script),
                sys.executable,
                str(fake),
                str(port),
                str(flag),
                str(log),
                *(["deaf"] if deaf else []),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append(proc)
        return Watchdog(proc, flag, port, log)

    try:
        yield start
    finally:
        for proc in started:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the group is gone: the watchdog and its server ended
            proc.communicate(timeout=BOUND_S)


def _fake_running(tmp_path: Path) -> bool:
    return subprocess.run(["pgrep", "-f", str(tmp_path / "fake_vllm.py")], capture_output=True).returncode == 0


def test_script_is_shellcheck_clean() -> None:
    for after, world in ((300, None), (0, None), (300, WorldCheck(29501, ("10.0.0.2", "10.0.0.3")))):
        text = watchdog_script("http://10.0.0.1:8000/health", load_timeout_s=1800, unhealthy_after_s=after, world=world)
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
        lint = subprocess.run(["shellcheck", "-s", "bash", "-"], input=text, text=True, capture_output=True)
        assert lint.returncode == 0, lint.stdout


def test_a_server_that_hangs_after_serving_is_stopped_so_docker_restarts_it(
    tmp_path: Path, watchdogs: Callable[..., Watchdog]
) -> None:
    w = watchdogs("ok")
    w.wait_until_served()  # healthy at least once, as the watchdog saw it
    assert w.proc.poll() is None
    w.flag.write_text("hang")
    _, err = w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 70
    assert "unhealthy for" in err and "after serving; stopping vLLM so docker restarts it" in err
    assert not _fake_running(tmp_path)  # vLLM was stopped, not left behind


def test_a_server_that_never_loads_is_stopped_after_the_load_timeout(
    tmp_path: Path, watchdogs: Callable[..., Watchdog]
) -> None:
    w = watchdogs("loading", load_timeout_s=3)
    _, err = w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 70
    assert "not healthy 3s after start; stopping vLLM so docker restarts it" in err
    assert not _fake_running(tmp_path)


def test_unhealthy_while_loading_is_not_a_hang(watchdogs: Callable[..., Watchdog]) -> None:
    w = watchdogs("loading", load_timeout_s=30, unhealthy_after_s=1)
    # Four unhealthy probes, one a second: the watchdog judged the third (>= 2 s after the first, well past
    # unhealthy_after) before it made the fourth, and went on: loading is judged by the load timeout only.
    w.wait_for_probes(503, count=4)
    assert w.proc.poll() is None
    w.flag.write_text("exit 0")
    w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 0


def test_vllm_exit_status_is_passed_on(watchdogs: Callable[..., Watchdog]) -> None:
    # unhealthy_after well above the probe interval: the probe that finds the exited server gone must not
    # read as "unhealthy after serving" (that limit is the hang test's business).
    w = watchdogs("ok", unhealthy_after_s=30)
    w.wait_until_served()
    w.flag.write_text("exit 3")
    w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 3


def test_docker_stop_reaches_vllm(tmp_path: Path, watchdogs: Callable[..., Watchdog]) -> None:
    w = watchdogs("ok")
    w.wait_until_served()  # the watchdog is in its loop: its TERM trap is set, the server runs
    w.proc.send_signal(signal.SIGTERM)
    w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 143
    assert not _fake_running(tmp_path)


def test_zero_turns_the_watchdog_off(tmp_path: Path) -> None:
    script = tmp_path / "w.sh"
    script.write_text(watchdog_script("http://127.0.0.1:9/health", load_timeout_s=1, unhealthy_after_s=0))
    done = subprocess.run(["bash", str(script), "sh", "-c", "exit 5"], capture_output=True, timeout=BOUND_S)
    assert done.returncode == 5


# --- the world check (a node of an instance on vLLM's own launcher): the other node's rendezvous connections ---


class Rendezvous:
    """A listener on a free loopback port (rank 0's store) and client connections to it (the other node's ranks)."""

    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen()
        self.port = self.server.getsockname()[1]
        self.links: list[tuple[socket.socket, socket.socket]] = []

    def join(self) -> None:
        client = socket.create_connection(("127.0.0.1", self.port))
        accepted, _ = self.server.accept()
        self.links.append((client, accepted))

    def leave(self, i: int) -> None:
        for s in self.links.pop(i):
            s.close()

    def close(self) -> None:
        while self.links:
            self.leave(0)
        self.server.close()


@pytest.fixture
def rendezvous() -> Iterator[Rendezvous]:
    r = Rendezvous()
    try:
        yield r
    finally:
        r.close()


def test_a_rank_of_another_node_leaving_stops_vllm_though_it_stays_healthy(
    tmp_path: Path, watchdogs: Callable[..., Watchdog], rendezvous: Rendezvous
) -> None:
    rendezvous.join()
    rendezvous.join()  # two ranks on the other node
    w = watchdogs("ok", unhealthy_after_s=300, world=WorldCheck(rendezvous.port, ("127.0.0.1",)))
    w.wait_until_served()
    w.wait_for_probes(200, 3)  # the world recorded, checked again since: nothing closed
    assert w.proc.poll() is None
    rendezvous.join()  # a connection that was not there when vLLM first served changes nothing
    rendezvous.leave(2)
    w.wait_for_probes(200, 5)
    assert w.proc.poll() is None
    rendezvous.leave(0)  # one rank of the other node dies; the server still answers /health
    _, err = w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 70
    assert (
        f"watchdog: a connection with 127.0.0.1 on port {rendezvous.port} closed (a node of this instance died" in err
    )
    assert "stopping vLLM so docker restarts it and the instance forms again" in err
    assert not _fake_running(tmp_path)


def test_a_rejoined_node_does_not_hide_the_world_it_left(
    tmp_path: Path, watchdogs: Callable[..., Watchdog], rendezvous: Rendezvous
) -> None:
    rendezvous.join()
    w = watchdogs("ok", unhealthy_after_s=300, world=WorldCheck(rendezvous.port, ("127.0.0.1",)))
    w.wait_until_served()
    w.wait_for_probes(200, 2)
    rendezvous.leave(0)
    rendezvous.join()  # the restarted node's new launcher, connected to the old world's store at once
    _, err = w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 70 and "closed (a node of this instance died or restarted" in err


def test_a_node_that_connects_after_vllm_served_is_said_then_watched(
    watchdogs: Callable[..., Watchdog], rendezvous: Rendezvous
) -> None:
    """A worker restarted while the old world still serves connects only later (or never): said once, then
    watched from when it connects."""
    w = watchdogs("ok", unhealthy_after_s=300, world=WorldCheck(rendezvous.port, ("127.0.0.1",)))
    w.wait_until_served()
    w.wait_for_probes(200, 3)
    assert w.proc.poll() is None
    rendezvous.join()
    w.wait_for_probes(200, 6)  # recorded, and still open
    assert w.proc.poll() is None
    rendezvous.leave(0)
    _, err = w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 70
    said = (
        f"watchdog: no connection with 127.0.0.1 on port {rendezvous.port} while vLLM serves: a restart of that "
        "node goes unnoticed here until one opens"
    )
    assert err.count(said) == 1 and "a connection with 127.0.0.1 on port" in err


def test_a_node_whose_rendezvous_dies_before_vllm_serves_stops_vllm(
    tmp_path: Path, watchdogs: Callable[..., Watchdog], rendezvous: Rendezvous
) -> None:
    """A worker restarted while the head it joins is going down connects to that head's rendezvous, which then
    dies under it: both sides would wait for each other until the load timeout (seen in the lab)."""
    w = watchdogs(
        "loading", load_timeout_s=300, unhealthy_after_s=300, world=WorldCheck(rendezvous.port, ("127.0.0.1",))
    )
    rendezvous.join()
    w.wait_for_probes(503, 3)  # not serving yet; the connection seen
    assert w.proc.poll() is None
    rendezvous.leave(0)
    _, err = w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 70
    assert (
        f"watchdog: every connection with 127.0.0.1 on port {rendezvous.port} closed (its vLLM ended, or the one "
        "this node had joined); stopping vLLM so docker restarts it and the instance forms again"
    ) in err
    assert not _fake_running(tmp_path)


def test_no_connection_yet_before_vllm_serves_is_waited_for(
    watchdogs: Callable[..., Watchdog], rendezvous: Rendezvous
) -> None:
    """The other node not connected yet (still starting) is no reason to stop."""
    w = watchdogs(
        "loading", load_timeout_s=300, unhealthy_after_s=300, world=WorldCheck(rendezvous.port, ("127.0.0.1",))
    )
    w.wait_for_probes(503, 4)
    assert w.proc.poll() is None


def test_a_server_deaf_to_sigterm_is_killed_when_the_watchdog_gives_up(
    tmp_path: Path, watchdogs: Callable[..., Watchdog]
) -> None:
    """vLLM's API server, stopped while the gateway holds requests hung on a dead engine, waits for them (seen in
    the lab with a TP x PP instance whose worker died): the watchdog's own stop kills it after its grace."""
    w = watchdogs("ok", deaf=True)
    w.wait_until_served()
    w.flag.write_text("hang")
    _, err = w.proc.communicate(timeout=BOUND_S)
    assert w.proc.returncode == 70 and "after serving; stopping vLLM so docker restarts it" in err
    assert not _fake_running(tmp_path)
