"""The lab's engines stack (Pulumi.lab-engines.yaml) on real test hosts: an LMDeploy pool and a llama.cpp pool
behind the gateway, with monitoring, rehearsed from nothing, asked through the gateway, killed, destroyed.

The engines are the lab's stand-ins (tests/lab/test_engine_standins.py runs their programs outside the lab):
LMDeploy 0.16.0's own CLI and metrics around a canned-text engine on gpu-01 (two TP 2 replicas), and the real
llama-server b11312 (a CPU build) serving a tiny random-weight GGUF on gpu-02. One lab at a time: the module
holds /tmp/lab.lock (lab.hosts.lab_lock) from bringing the hosts up to taking them down. Figures (time to up,
recovery of each engine after its main process is killed) go to build/lab/figures.json with an `engines_`
prefix.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import hosts
from lab.config import REPO, LabHost
from lab.rehearse import Rehearsal
from tests.support.lab_tier import (
    Lab,
    _lab,
    assert_bounded,
    client,
    destroy_checked,
    docker,
    healthy,
    http_json,
    wait_until,
)

WHY_NOT = hosts.can_create_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"the lab does not run: {WHY_NOT}")

STACK = REPO / "Pulumi.lab-engines.yaml"
GATEWAY = "https://198.18.0.11:443"
PROMETHEUS = "http://198.18.0.11:9090"
LMDEPLOY_REPLICAS = {
    "lmdeploy-awq-gpu-01-r0": "http://198.18.0.11:8000",
    "lmdeploy-awq-gpu-01-r1": "http://198.18.0.11:8001",
}
LLAMACPP_SERVER = ("llamacpp-gguf-gpu-02", "http://198.18.0.12:8000")


@pytest.fixture(scope="module")
def lab(figures: dict[str, Any]) -> Iterator[Lab]:
    with hosts.lab_lock():
        yield from _lab(figures, STACK, "engines_", _destroy_and_check)


def _destroy_and_check(lab: Lab, figures: dict[str, Any]) -> None:
    destroy_checked(lab, figures, "engines_")
    # Destroy keeps the weights: the GGUF and the LMDeploy model directory.
    assert (lab.host("gpu-02").dir / "data" / "models" / "tiny-llama" / "tiny-llama-f32.gguf").is_file()
    assert (lab.host("gpu-01").dir / "data" / "models" / "Qwen3-32B-AWQ" / "config.json").is_file()


def ask(lab: Lab, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """A request through the gateway from the client namespace, with the stack's generated key."""
    answer = client(
        "request", f"{GATEWAY}{path}", "--key", lab.key(), "--json", json.dumps(body), "--cacert", lab.cacert()
    )
    assert answer["status"] == 200, answer
    return json.loads(answer["body"])


# --- up ---------------------------------------------------------------------------------------------


def test_up_creates_every_resource_and_each_image_passes_its_gate(lab: Lab) -> None:
    created = {s.name for s in lab.steps if s.action == "create"}
    assert created == {r.name for r in lab.rehearsal.resources.values() if r.custom}
    gates = {s.name: s.stdout for s in lab.steps if "-qualify-" in s.name}
    assert sorted(gates) == [
        "gpu-01-qualify-lmdeploy-v0-16-0-cu12-8-check",
        "gpu-02-qualify-llama-cpp-server-cuda-b11312-check",
    ], sorted(gates)
    lmdeploy = gates["gpu-01-qualify-lmdeploy-v0-16-0-cu12-8-check"]
    assert '"check": "turbomind-kernels", "ok": true' in lmdeploy and '"ok": false' not in lmdeploy
    llamacpp = gates["gpu-02-qualify-llama-cpp-server-cuda-b11312-check"]
    assert '"detail": "version: 0.5.0-dev (build 11312, commit 0c1e570)"' in llamacpp and '"ok": false' not in llamacpp


def test_the_gguf_is_where_llama_server_loads_it(lab: Lab) -> None:
    gguf = lab.host("gpu-02").dir / "data" / "models" / "tiny-llama" / "tiny-llama-f32.gguf"
    assert gguf.read_bytes()[:4] == b"GGUF"
    host = lab.host("gpu-02")
    logs = subprocess.run(
        ["docker", "-H", f"unix://{host.dir}/run/docker.sock", "logs", LLAMACPP_SERVER[0]],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
    ).stdout
    assert "load_model: loading model '/data/models/tiny-llama/tiny-llama-f32.gguf'" in logs


# --- the gateway --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-32b"])
def test_the_gateway_routes_the_lmdeploy_name_to_its_replicas(lab: Lab, name: str) -> None:
    seen = set()
    for _ in range(4):  # least_conn over the two replicas: both answer in a few requests
        content = ask(lab, "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]})
        text = content["choices"][0]["message"]["content"]
        assert text.startswith(f"lab stand-in {name} answers from gpu-01:800"), text
        seen.add(text.rsplit(":", 1)[1])
    assert seen <= {"8000", "8001"} and seen


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-alias"])
def test_the_gateway_routes_each_llamacpp_name_to_the_real_server(lab: Lab, name: str) -> None:
    answer = ask(lab, "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]})
    assert answer["system_fingerprint"] == "b11312-0c1e570"  # llama-server's own answer
    assert_bounded(answer)
    completion = ask(lab, "/v1/completions", {"model": name, "prompt": "hello"})
    assert_bounded(completion)


def test_the_gguf_path_route_reaches_llama_cpp(lab: Lab) -> None:
    answer = ask(
        lab, "/gguf/v1/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert answer["system_fingerprint"] == "b11312-0c1e570"


def test_the_gateway_refuses_a_request_without_a_key(lab: Lab) -> None:
    body = json.dumps({"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]})
    assert (
        client("request", f"{GATEWAY}/v1/chat/completions", "--json", body, "--cacert", lab.cacert())["status"] == 401
    )


# --- monitoring ---------------------------------------------------------------------------------------


def test_prometheus_scrapes_both_engines_and_no_alert_fires(lab: Lab) -> None:
    def all_up() -> bool:
        targets = http_json(f"{PROMETHEUS}/api/v1/targets")["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    wait_until(all_up, 120, "every Prometheus target up")
    up = http_json(f"{PROMETHEUS}/api/v1/query?query=up")["data"]["result"]
    assert all(r["value"][1] == "1" for r in up), up
    jobs = {r["metric"]["job"] for r in up}
    assert {"node", "dcgm", "lmdeploy", "llamacpp"} <= jobs, jobs
    engines = sorted(
        (r["metric"]["job"], r["metric"]["pool"], r["metric"]["instance"])
        for r in up
        if r["metric"]["job"] in ("lmdeploy", "llamacpp")
    )
    assert engines == [
        ("llamacpp", "gguf", "gguf-gpu-02"),
        ("lmdeploy", "awq", "awq-gpu-01-r0"),
        ("lmdeploy", "awq", "awq-gpu-01-r1"),
    ], engines
    # The engines' own series reach Prometheus under the names monitoring reads (components/facts).
    for series in ("lmdeploy:generation_tokens_total", "llamacpp:tokens_predicted_total"):
        assert http_json(f"{PROMETHEUS}/api/v1/query?query={series}")["data"]["result"], series
    groups = http_json(f"{PROMETHEUS}/api/v1/rules")["data"]["groups"]
    assert sum(len(g["rules"]) for g in groups) > 0
    firing = [a for a in http_json(f"{PROMETHEUS}/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"]
    assert firing == []


def test_a_second_up_runs_nothing(lab: Lab) -> None:
    again = Rehearsal(lab.stack.path, lab.stack.name, lab.agent, log=lambda line: None)
    assert [s.name for s in again.up() if s.action != "same"] == []


# --- self-healing -------------------------------------------------------------------------------------


def main_process(host: LabHost, container: str, binary: str) -> int:
    """The pid of the container's process whose executable is `binary` (not the watchdog's shell)."""
    pid = int(docker(host, "inspect", "-f", "{{.State.Pid}}", container).strip())
    todo = [pid]
    while todo:
        p = todo.pop(0)
        try:
            exe = os.readlink(f"/proc/{p}/exe")
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if binary in (Path(exe).name, *(Path(a.decode()).name for a in argv[1:2])):
            return p
        for task in Path(f"/proc/{p}/task").iterdir():
            todo += [int(c) for c in (task / "children").read_text().split()]
    raise AssertionError(f"no process running {binary!r} in {container} on {host.node}")


def _kill_and_recover(lab: Lab, node: str, container: str, binary: str, url: str) -> float:
    host = lab.host(node)
    restarts = int(docker(host, "inspect", "-f", "{{.RestartCount}}", container))
    hosts.sh("kill", "-KILL", str(main_process(host, container, binary)))
    t0 = time.monotonic()
    wait_until(lambda: not healthy(f"{url}/health"), 60, f"{container} going down")
    wait_until(lambda: healthy(f"{url}/health"), 300, f"{container} healthy again")
    took = time.monotonic() - t0
    assert int(docker(host, "inspect", "-f", "{{.RestartCount}}", container)) == restarts + 1
    return took


def test_a_killed_lmdeploy_server_comes_back_by_itself(lab: Lab, figures: dict[str, Any]) -> None:
    # `lmdeploy` is a python3 program: its process is python3 running /opt/py3/bin/lmdeploy.
    figures["engines_recover_lmdeploy_kill_s"] = round(
        _kill_and_recover(
            lab, "gpu-01", "lmdeploy-awq-gpu-01-r0", "lmdeploy", LMDEPLOY_REPLICAS["lmdeploy-awq-gpu-01-r0"]
        ),
        1,
    )
    answer = ask(lab, "/v1/chat/completions", {"model": "qwen3-32b", "messages": [{"role": "user", "content": "hi"}]})
    assert answer["choices"][0]["message"]["content"].startswith("lab stand-in qwen3-32b answers from gpu-01:800")


def test_a_killed_llama_server_comes_back_by_itself(lab: Lab, figures: dict[str, Any]) -> None:
    figures["engines_recover_llamacpp_kill_s"] = round(
        _kill_and_recover(lab, "gpu-02", LLAMACPP_SERVER[0], "llama-server.cpu", LLAMACPP_SERVER[1]), 1
    )
    answer = ask(lab, "/v1/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]})
    assert answer["system_fingerprint"] == "b11312-0c1e570"
