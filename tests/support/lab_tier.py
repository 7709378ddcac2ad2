"""What the lab tier's modules share (tests/lab): the lab of a stack file up from nothing on fresh test
hosts, yielded, destroyed and checked, down; the hosts' own docker engines, the client namespace, and
bounded waits."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import hosts, images
from lab.__main__ import debian_mirror, image_refs, real_vllm_images, weights
from lab.config import LAB_DIR, REPO, LabHost, LabStack, load_lab_stack
from lab.config import STATE as STATE_DIR
from lab.rehearse import Rehearsal, StepLog

STACK = REPO / "Pulumi.lab.yaml"


@dataclass
class Lab:
    stack: LabStack
    agent: str
    rehearsal: Rehearsal
    steps: list[StepLog]

    def host(self, node: str) -> LabHost:
        return self.stack.host(node)

    def resource(self, name: str) -> Any:
        return next(r for r in self.rehearsal.resources.values() if r.name == name)

    def state(self, name: str) -> dict[str, Any]:
        return next(s for s in self.rehearsal.state.values() if s["name"] == name)

    def key(self) -> str:
        return json.loads(self.state("gateway-keys")["outputs"]["stdout"])["default"]

    def cacert(self) -> str:
        """The gateway's CA (the stack output gatewayCaCert: what gateway-tls prints) in a file for the client."""
        path = STATE_DIR / "gateway-ca.pem"
        path.write_text(self.state("gateway-tls")["outputs"]["stdout"] + "\n")
        return str(path)


def docker(host: LabHost, *args: str, timeout: float = 120) -> str:
    """The host's own engine, from its console (its socket), for checks out of band."""
    return hosts.sh("docker", "-H", f"unix://{host.dir}/run/docker.sock", *args, timeout=timeout)


def client(*args: str, timeout: float = 120) -> dict[str, Any]:
    """lab/client.py in the client namespace (outside the cluster, reaching only the lab)."""
    out = hosts.sh(
        "nsenter",
        f"--net=/run/netns/{hosts.CLIENT_NS}",
        sys.executable,
        str(LAB_DIR / "client.py"),
        *args,
        timeout=timeout,
    )
    return json.loads(out)


def container_log(host: LabHost, container: str) -> str:
    """`docker logs` of a container on the host's own engine, stdout and stderr."""
    p = subprocess.run(
        ["docker", "-H", f"unix://{host.dir}/run/docker.sock", "logs", container],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return p.stdout + p.stderr


def main_process(host: LabHost, container: str, program: str) -> int:
    """The pid of the container's process that runs `program` (a python3 program: `vllm serve`, `ray start`),
    not docker's init nor the shell of a wrapper such as the vLLM watchdog, whose command lines hold it too."""
    pid = int(docker(host, "inspect", "-f", "{{.State.Pid}}", container).strip())
    todo = [pid]
    while todo:
        p = todo.pop(0)
        argv = Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if Path(argv[0]).name.startswith("python") and program in " ".join(Path(a).name for a in argv[1:3]):
            return p
        for task in Path(f"/proc/{p}/task").iterdir():
            todo += [int(c) for c in (task / "children").read_text().split()]
    raise AssertionError(f"no python3 process running {program!r} in {container} on {host.node}")


def start_load(
    lab: Lab, gateway: str, path: str, model: str, seconds: float, concurrency: int, rate: float, timeout: float = 30
) -> subprocess.Popen:
    """lab/client.py's bounded load through the gateway from the client namespace (its JSON on stdout)."""
    return subprocess.Popen(
        [
            "nsenter",
            f"--net=/run/netns/{hosts.CLIENT_NS}",
            sys.executable,
            str(LAB_DIR / "client.py"),
            "load",
            f"{gateway}{path}",
            "--key",
            lab.key(),
            "--model",
            model,
            "--seconds",
            str(seconds),
            "--concurrency",
            str(concurrency),
            "--rate",
            str(rate),
            "--timeout",
            str(timeout),
            "--cacert",
            lab.cacert(),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.status == 200
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str, state: Callable[[], str] | None = None) -> float:
    """Seconds until `check()` holds; fails naming `what` after `timeout` (with `state()`, what was seen)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"{what}: not within {timeout:.0f}s" + (f"\n{state()}" if state else ""))
        time.sleep(0.5)
    return time.monotonic() - t0


def _lab(
    figures: dict[str, Any],
    path: Path = STACK,
    prefix: str = "",
    destroy_and_check: Callable[[Lab, dict[str, Any]], None] | None = None,
) -> Iterator[Lab]:
    """The lab of stack file `path`: up from nothing, yielded, destroyed and checked, down; figures named
    with `prefix` (another stack's module, e.g. test_lab_engines.py, passes its own and its destroy check)."""
    stack = load_lab_stack(path)
    if hosts.lab_namespaces():
        left = hosts.down()  # the tier owns this machine's lab: a lab left by an earlier run goes first
        assert left == [], left
    t0 = time.monotonic()
    hosts.up(stack)
    try:
        t_hosts = time.monotonic() - t0
        images.ensure(image_refs(stack))
        real_vllm_images(stack)  # the real-engine image on the hosts that pull it (a stack with lab:realVllm)
        t_images = time.monotonic() - t0 - t_hosts
        t2 = time.monotonic()
        debian_mirror(stack)  # what the gateway image's build installs (recorded once per machine)
        figures[prefix + "debian_mirror_ready_s"] = round(time.monotonic() - t2, 1)
        weights(stack)
        agent = hosts.start_agent()
        r = Rehearsal(stack.path, stack.name, agent, log=lambda line: None)
        t1 = time.monotonic()
        steps = r.up()
        figures[prefix + "time_to_up_s"] = round(time.monotonic() - t1, 1)
        figures[prefix + "hosts_up_s"] = round(t_hosts, 1)
        figures[prefix + "images_ready_s"] = round(t_images, 1)
        figures[prefix + "pull_retries"] = len(r.retries)
        yield Lab(stack, agent, r, list(steps))
        (destroy_and_check or _destroy_and_check)(Lab(stack, agent, r, []), figures)
    finally:
        _keep_logs()
        left = hosts.down()
    assert left == [], f"make lab-down left behind: {left}"


LOGS = REPO / "build" / "lab" / "logs"


def _keep_logs() -> None:
    """The lab's own logs (dockerd, sshd, host init, registry) kept in build/lab/logs: down removes them."""
    shutil.rmtree(LOGS, ignore_errors=True)
    for log in STATE_DIR.glob("*.log"):
        LOGS.mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, LOGS / log.name)
    for log in STATE_DIR.glob("hosts/*/*.log"):
        (LOGS / log.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy2(log, LOGS / log.parent.name / log.name)


def destroy_checked(lab: Lab, figures: dict[str, Any], prefix: str = "") -> None:
    """Destroy the stack (timed) and check that no container and no hosts block is left on any host."""
    t0 = time.monotonic()
    lab.rehearsal.destroy()
    figures[prefix + "destroy_s"] = round(time.monotonic() - t0, 1)
    for h in lab.stack.hosts:
        assert docker(h, "ps", "-aq").strip() == "", f"containers left on {h.node} after destroy"
        assert "# BEGIN llm-cluster" not in (h.dir / "etc-hosts").read_text(), h.node


def _destroy_and_check(lab: Lab, figures: dict[str, Any]) -> None:
    destroy_checked(lab, figures)
    assert not (lab.host("gpu-01").dir / "etc-llm-cluster" / "gateway").exists(), "gateway keys kept"
    # Destroy keeps the weights: they take hours to copy back on a real cluster.
    for node in ("gpu-02", "gpu-04", "gpu-05", "gpu-06"):
        models = lab.host(node).dir / "data" / "models"
        assert any(models.glob("*/config.json")), f"weights removed on {node}"


def assert_bounded(answer: dict[str, Any]) -> None:
    """The answer stopped at the pool's --n-predict 16 (a random model rarely samples its end token first:
    then it stopped earlier, on "stop"); without the bound it would run on to the slot's 256 tokens."""
    tokens, reason = answer["usage"]["completion_tokens"], answer["choices"][0]["finish_reason"]
    assert (0 < tokens <= 16) and reason == ("length" if tokens == 16 else "stop"), (tokens, reason)
