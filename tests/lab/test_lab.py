"""The lab tier: the lab stack brought up on real test hosts (lab/), then what the deployment must do there.

One lab per module (building it is the expensive part): the fixture creates the hosts, makes sure the
stand-in images are in the registry mirror (built once per machine), puts the weights on their source
nodes and rehearses the stack's plan. Each test leaves the lab as it found it. At the end the fixture
destroys the stack, checks what destroy removes and keeps, takes the lab down and checks that nothing
is left. Figures (time to up, recovery times, requests lost) go to build/lab/figures.json.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.engines.registry import ENGINES
from lab import hosts
from lab.config import CLIENT_ADDRESS
from lab.config import STATE as STATE_DIR
from lab.rehearse import Rehearsal, RehearsalError, dockerfile_of
from tests.support.lab_tier import (
    STACK,
    Lab,
    _lab,
    client,
    container_log,
    docker,
    healthy,
    http_json,
    main_process,
    start_load,
    wait_until,
)

# The memory keys the readiness gate of the reference stack's chat pool names.
VLLM_MEMORY_KEYS = f"pools.chat.{ENGINES['vllm'].memory_keys}"

# The tier runs wherever the lab can: as root, with the Debian tools .ci/system-deps installs.
WHY_NOT = hosts.can_create_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"the lab does not run: {WHY_NOT}")

GATEWAY = "https://198.18.0.11:443"  # gateway.port 443: TLS with the gateway host's private CA


def _key_rate_limit() -> float:
    import yaml

    keys = yaml.safe_load(STACK.read_text())["config"]["llm-cluster:gateway"]["apiKeys"]
    return float(keys[0]["rateLimit"]["requestsPerSecond"])


# The bounded load: half the key's rate limit, so that what is lost is lost to the stopped replica and
# not refused by the limiter (a 429 counts as lost).
RATE = _key_rate_limit() / 2
PROMETHEUS = "http://198.18.0.11:9090"


def _in_head(lab: Lab, *argv: str) -> subprocess.CompletedProcess | None:
    """A command in the reasoning pool's Ray head container; None when it did not answer within 60 s (a head
    that is restarting, or a Ray call hanging on a busy machine, is "not yet", not a failure)."""
    try:
        return subprocess.run(
            [
                "docker",
                "-H",
                f"unix://{lab.host('gpu-01').dir}/run/docker.sock",
                "exec",
                lab.resource("reasoning-gpu-01-ray-head").inputs["name"],
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return None


def ray_gpus(lab: Lab) -> int:
    """GPUs in `ray status` on the head (what the Ray gate reads); -1 when it did not answer."""
    p = _in_head(lab, "ray", "status", "--address", "198.18.0.11:6379")
    from components.planning.fabric.ray import parse_ray_status

    return int(parse_ray_status(p.stdout).gpus_total) if p is not None else -1


RAY_NODES = (
    "import json, ray; ray.init(address='198.18.0.11:6379', logging_level='ERROR'); "
    "print('lab-nodes', json.dumps([[n['NodeID'], n['NodeManagerAddress'], n['Resources'].get('GPU', 0)] "
    "for n in ray.nodes() if n['Alive']]))"
)


def ray_nodes(lab: Lab) -> list[tuple[str, str, float]]:
    """The Ray cluster's live nodes (id, address, GPUs), as a driver on the head sees them."""
    p = _in_head(lab, "python3", "-c", RAY_NODES)
    if p is None:
        return []
    # Ray's own warnings (lagging heartbeats, …) share stdout: the answer is the line the snippet marks.
    line = next((x for x in p.stdout.splitlines() if x.startswith("lab-nodes ")), None)
    return [tuple(n) for n in json.loads(line.split(" ", 1)[1])] if p.returncode == 0 and line else []


@pytest.fixture(scope="module")
def lab(figures: dict[str, Any]) -> Iterator[Lab]:
    with hosts.lab_lock():
        yield from _lab(figures)


# --- up on fresh hosts --------------------------------------------------------------------------------


def test_up_creates_every_resource_of_the_plan(lab: Lab) -> None:
    created = {s.name for s in lab.steps if s.action == "create"}
    customs = {r.name for r in lab.rehearsal.resources.values() if r.custom}
    assert created == customs


def test_weights_fan_out_by_rsync_and_every_copy_verifies(lab: Lab) -> None:
    for model, source, targets in (
        ("Qwen3-30B-A3B", "gpu-03", ("gpu-04", "gpu-05", "gpu-06")),
        ("DeepSeek-R1-GPTQ-Int4", "gpu-01", ("gpu-02",)),
    ):
        src = lab.host(source).dir / "data" / "models" / model
        files = sorted(p.name for p in src.iterdir() if p.is_file())
        assert "config.json" in files and len(files) == 3
        for node in targets:
            dst = lab.host(node).dir / "data" / "models" / model
            for name in files:
                assert (dst / name).read_bytes() == (src / name).read_bytes(), f"{node}:{name}"
            assert (dst / ".llm-cluster" / "verified").exists(), f"{node} did not verify the manifest"
    # The planned rounds: gpu-04 received the weights before it sent them on to gpu-06.
    order = [s.name for s in lab.steps]
    assert order.index("weights-qwen3-30b-a3b-verify-gpu-04") < order.index(
        "weights-qwen3-30b-a3b-copy-gpu-04-to-gpu-06"
    )
    copy = next(s for s in lab.steps if s.name == "weights-qwen3-30b-a3b-copy-gpu-03-to-gpu-04")
    assert "copying /data/models/Qwen3-30B-A3B from gpu-03 to gpu-04" in copy.stdout


def test_the_hosts_block_is_on_every_host(lab: Lab) -> None:
    for h in lab.stack.hosts:
        text = (h.dir / "etc-hosts").read_text()
        block = text[text.index("# BEGIN llm-cluster") : text.index("# END llm-cluster")]
        assert all(f"{o.address} {o.node}" in block for o in lab.stack.hosts), h.node


@pytest.mark.parametrize(
    "choice, message",
    [
        ({"gpus": 7}, "gpu-05 has 7 GPU(s), the stack expects 8"),
        ({"hca": "down"}, "gpu-05: mlx5_0 port 1 is Down/Disabled, not Active/LinkUp"),
        ({"topo": "pcie"}, "gpu-05: `nvidia-smi topo -m` shows no NVLink between any GPUs"),
    ],
)
def test_preflight_stops_with_a_pointed_message(lab: Lab, choice: dict[str, Any], message: str) -> None:
    host = lab.host("gpu-05")
    before = hosts.set_shims(host, **choice)
    try:
        preflight = lab.resource("gpu-05-preflight")
        inputs = preflight.inputs
        with pytest.raises(RehearsalError) as err:
            lab.rehearsal._command(inputs, inputs["create"], inputs["connection"], preflight.name)
        assert message in str(err.value)
        assert "preflight gpu-05: 1 error(s)" in str(err.value)
    finally:
        hosts.set_shims(host, **before)
    ok = lab.rehearsal._command(inputs, inputs["create"], inputs["connection"], preflight.name)
    assert "preflight gpu-05: 0 error(s)" in ok["stdout"]


# --- Ray, the servers, the gateway, monitoring ----------------------------------------------------


def test_the_ray_worker_joins_across_hosts_and_the_head_serves(lab: Lab) -> None:
    gate = next(s for s in lab.steps if s.name == "reasoning-gpu-01-ray-gate")
    assert "ray: 16/16 GPUs, 2 node(s)" in gate.stdout
    assert ray_gpus(lab) == 16
    log = container_log(lab.host("gpu-01"), lab.resource("reasoning-gpu-01-ray-head").inputs["name"])
    assert "lab-vllm: Ray cluster has 16 GPUs, 2 nodes; the engine needs 16" in log
    assert "lab-vllm: engine worker on 198.18.0.12" in log
    for s in lab.steps:
        if s.name.endswith("-health"):
            assert s.action == "create"
    assert healthy("http://198.18.0.11:8000/health")


@pytest.mark.parametrize(
    "name, pool_hosts",
    [
        ("deepseek-r1", ("gpu-01",)),
        ("/data/models/DeepSeek-R1-GPTQ-Int4", ("gpu-01",)),
        ("qwen3-30b-a3b", ("gpu-03", "gpu-04", "gpu-05", "gpu-06")),
        ("/data/models/Qwen3-30B-A3B", ("gpu-03", "gpu-04", "gpu-05", "gpu-06")),
    ],
)
def test_the_gateway_routes_every_served_name_with_a_key(lab: Lab, name: str, pool_hosts: tuple[str, ...]) -> None:
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}]})
    answer = client(
        "request", f"{GATEWAY}/v1/chat/completions", "--key", lab.key(), "--json", body, "--cacert", lab.cacert()
    )
    assert answer["status"] == 200, answer
    content = json.loads(answer["body"])["choices"][0]["message"]["content"]
    assert content.startswith(f"lab stand-in {name} answers from ")
    assert content.rsplit(" ", 1)[1].split(":")[0] in pool_hosts


def test_the_gateway_runs_the_default_image_built_on_its_host(lab: Lab) -> None:
    from components.planning.gateway.image import GATEWAY_IMAGE, TESTED_PACKAGES
    from lab import debmirror

    gpu01 = lab.host("gpu-01")
    build = lab.resource("gateway-image")
    assert build.inputs["name"] == GATEWAY_IMAGE and build.inputs["build"]
    step = next(s for s in lab.steps if s.name == "gateway-image")
    assert step.action == "create"
    built = lab.state("gateway-image")["outputs"]
    # Built on gpu-01's engine from the stand-in base its engine pulled through the lab's registry mirror.
    base = debmirror.parse_dockerfile(dockerfile_of(build.inputs["build"]).read_text()).base
    assert "org.llm-cluster.lab.standin" in docker(gpu01, "image", "inspect", "-f", "{{json .Config.Labels}}", base)
    # The gateway container runs that image, with exactly the pinned nginx and Lua module packages.
    container = lab.resource("gateway-nginx").inputs["name"]
    assert docker(gpu01, "inspect", "-f", "{{.Image}}", container).strip() == built["imageId"]
    fmt = "${Package}=${Version}\n"
    installed = docker(gpu01, "exec", container, "dpkg-query", "-W", "-f", fmt, *TESTED_PACKAGES).split()
    assert sorted(installed) == sorted(f"{p}={v}" for p, v in TESTED_PACKAGES.items())
    # apt in the build read the lab's Debian mirror (Debian's signed indexes: no --allow-unauthenticated
    # anywhere) and fetched every pinned package from it, from gpu-01's address.
    assert f"{debmirror.MIRROR_URL}/debian-security trixie-security InRelease" in built["buildLog"]
    served = (STATE_DIR / "debian-mirror.log").read_text()
    for p, v in TESTED_PACKAGES.items():
        # The pool's file name has no epoch (libnginx-mod-http-lua_0.10.28-2_…); apt quotes `+`.
        deb = f"/{p}_{v.split(':', 1)[-1].replace('+', '%2b')}_".lower()
        assert any(
            line.startswith(gpu01.address) and deb in line.lower() and '" 200 ' in line for line in served.splitlines()
        ), (deb, served[-2000:])


def test_the_gateway_refuses_a_request_without_a_key(lab: Lab) -> None:
    body = json.dumps({"model": "qwen3-30b-a3b", "messages": [{"role": "user", "content": "hi"}]})
    ca = lab.cacert()
    assert client("request", f"{GATEWAY}/v1/chat/completions", "--json", body, "--cacert", ca)["status"] == 401
    assert (
        client("request", f"{GATEWAY}/v1/chat/completions", "--key", "sk-wrong", "--json", body, "--cacert", ca)[
            "status"
        ]
        == 401
    )


def test_the_client_namespace_is_outside_the_cluster(lab: Lab) -> None:
    routes = hosts.sh("ip", "-n", hosts.CLIENT_NS, "route", "show")
    assert routes.split() == [
        "198.18.0.0/24",
        "dev",
        "bond0",
        "proto",
        "kernel",
        "scope",
        "link",
        "src",
        CLIENT_ADDRESS,
    ]


def test_prometheus_scrapes_every_target_and_no_alert_fires(lab: Lab) -> None:
    def all_up() -> bool:
        targets = http_json(f"{PROMETHEUS}/api/v1/targets")["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    wait_until(all_up, 90, "every Prometheus target up")
    up = http_json(f"{PROMETHEUS}/api/v1/query?query=up")["data"]["result"]
    jobs = {r["metric"]["job"] for r in up}
    assert all(r["value"][1] == "1" for r in up) and {"node", "dcgm", "vllm"} <= jobs, up
    groups = http_json(f"{PROMETHEUS}/api/v1/rules")["data"]["groups"]
    assert sum(len(g["rules"]) for g in groups) > 0
    firing = [a for a in http_json(f"{PROMETHEUS}/api/v1/alerts")["data"]["alerts"] if a["state"] == "firing"]
    assert firing == []
    assert http_json("http://198.18.0.11:3000/api/health")["database"] == "ok"


def test_a_second_up_runs_nothing(lab: Lab) -> None:
    again = Rehearsal(lab.stack.path, lab.stack.name, lab.agent, log=lambda line: None)
    steps = again.up()
    assert [s.name for s in steps if s.action != "same"] == []
    assert len(steps) == len(lab.steps)


# --- self-healing and load ------------------------------------------------------------------------


def test_a_killed_ray_worker_rejoins_by_itself(lab: Lab, figures: dict[str, Any]) -> None:
    host = lab.host("gpu-02")
    name = lab.resource("reasoning-gpu-01-ray-worker-gpu-02").inputs["name"]
    restarts = int(docker(host, "inspect", "-f", "{{.RestartCount}}", name))
    before = {n[0] for n in ray_nodes(lab) if n[1] == host.address}
    assert len(before) == 1, ray_nodes(lab)
    head = "http://198.18.0.11:8000/health"
    head_name = lab.resource("reasoning-gpu-01-ray-head").inputs["name"]

    def chain() -> str:
        """Where the chain stands: both containers' state and the ends of their logs."""
        out = []
        for h, c in ((lab.host("gpu-01"), head_name), (host, name)):
            out.append(
                f"--- {c} on {h.node}: "
                + docker(h, "inspect", "-f", "{{.State.Status}} restarts={{.RestartCount}}", c).strip()
            )
            out += container_log(h, c).splitlines()[-15:]
        return "\n".join(out + [f"--- Ray nodes: {ray_nodes(lab)}"])

    hosts.sh("kill", "-KILL", str(main_process(host, name, "ray start")))
    t0 = time.monotonic()
    wait_until(
        lambda: int(docker(host, "inspect", "-f", "{{.RestartCount}}", name)) > restarts,
        120,
        "docker restarting the Ray worker",
        chain,
    )
    # As vLLM's engine does, the stand-in's ends with one of its Ray workers once Ray declares it dead
    # (its GCS health checks); the head's watchdog exits, docker restarts the head (a new Ray cluster),
    # the worker leaves the old one (Ray's GCS reconnect timeout) and joins it, the head serves again.
    wait_until(lambda: not healthy(head), 180, "the reasoning engine ending with its Ray worker", chain)
    figures["reasoning_engine_ended_after_worker_kill_s"] = round(time.monotonic() - t0, 1)

    def rejoined() -> bool:
        # A new raylet of gpu-02 (another node id) is in the cluster, the dead one is not, 16 GPUs alive.
        nodes = ray_nodes(lab)
        ids = {n[0] for n in nodes if n[1] == host.address}
        return bool(ids) and not ids & before and sum(n[2] for n in nodes) == 16

    wait_until(rejoined, 300, "gpu-02 back in the Ray cluster as a new node, 16 GPUs alive", chain)
    wait_until(lambda: healthy(head), 300, "the reasoning pool serving again", chain)
    figures["recover_ray_worker_kill_s"] = round(time.monotonic() - t0, 1)
    head_log = container_log(lab.host("gpu-01"), head_name)
    assert "ERROR lab-vllm: the Ray worker on 198.18.0.12 died (ActorDiedError" in head_log
    body = json.dumps({"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}]})
    answer = client(
        "request", f"{GATEWAY}/v1/chat/completions", "--key", lab.key(), "--json", body, "--cacert", lab.cacert()
    )
    assert answer["status"] == 200, answer
    # `ray status` (what the Ray gate and the llm_ray_gpus metric read) counts the dead raylet's GPUs
    # until the autoscaler drops it (24 GPUs were seen): it settles on 16.
    wait_until(lambda: ray_gpus(lab) == 16, 120, "ray status back to 16 GPUs", chain)
    figures["ray_status_settled_after_worker_kill_s"] = round(time.monotonic() - t0, 1)


def test_a_killed_chat_replica_comes_back_by_itself(lab: Lab, figures: dict[str, Any]) -> None:
    host = lab.host("gpu-04")
    hosts.sh("kill", "-KILL", str(main_process(host, lab.resource("chat-gpu-04-vllm").inputs["name"], "vllm serve")))
    t0 = time.monotonic()
    wait_until(lambda: not healthy("http://198.18.0.14:8000/health"), 30, "the replica going down")
    wait_until(lambda: healthy("http://198.18.0.14:8000/health"), 300, "the chat replica healthy again")
    figures["recover_chat_replica_kill_s"] = round(time.monotonic() - t0, 1)


def test_a_restarted_docker_engine_brings_its_containers_back(lab: Lab, figures: dict[str, Any]) -> None:
    host = lab.host("gpu-06")
    t0 = time.monotonic()
    hosts.restart_dockerd(host)
    wait_until(lambda: healthy("http://198.18.0.16:8000/health"), 300, "gpu-06's replica after the engine restart")
    wait_until(lambda: healthy("http://198.18.0.16:9100/metrics"), 120, "gpu-06's node-exporter")
    figures["recover_dockerd_restart_s"] = round(time.monotonic() - t0, 1)


def test_the_readiness_gate_stops_at_the_first_death_of_a_server_that_prints_a_known_error(
    lab: Lab, tmp_path: Path, figures: dict[str, Any]
) -> None:
    """The gate as the program renders it, against a host's real docker: a container of the chat image that
    prints vLLM's MLA refusal and exits, which docker restarts, stops the gate with that line and its fix at
    its first death after the gate began (docker's restart count, `docker logs --since`), not at its timeout."""
    from components.engines.base import health_gate_script, startup_failure_advice
    from components.engines.registry import ENGINES

    host = lab.host("gpu-03")
    image = docker(host, "inspect", "-f", "{{.Config.Image}}", lab.resource("chat-gpu-03-vllm").inputs["name"]).strip()
    name, line = "llm-cluster-doomed-standin", "RuntimeError: FlashAttention only supports Ampere GPUs or newer."
    # Printed 3 s after each start: the first run's line may predate the gate, the next run's cannot.
    docker(
        host,
        "run",
        "-d",
        "--name",
        name,
        "--restart",
        "unless-stopped",
        "--network",
        "none",
        "--entrypoint",
        "sh",
        image,
        "-c",
        f"sleep 3; echo '{line}' >&2; exit 1",
    )
    try:
        wrapper = tmp_path / "bin" / "docker"
        wrapper.parent.mkdir()
        wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("docker")} -H "unix://{host.dir}/run/docker.sock" "$@"\n')
        wrapper.chmod(0o755)
        script = tmp_path / "gate.sh"
        script.write_text(
            health_gate_script(
                "http://127.0.0.1:9/health",
                300,
                name,
                server="vllm",
                memory_keys=VLLM_MEMORY_KEYS,
                interval_s=1,
                failures=startup_failure_advice(ENGINES["vllm"], "chat", "qwen3-30b-a3b"),
            )
        )
        t0 = time.monotonic()
        done = subprocess.run(
            ["bash", str(script)],
            capture_output=True,
            text=True,
            timeout=200,
            env={"PATH": f"{wrapper.parent}:/usr/bin:/bin"},
        )
        took = time.monotonic() - t0
        assert done.returncode == 1, done.stderr
        first, cause = done.stderr.splitlines()[:2]
        assert re.fullmatch(rf"vllm: {name} died at startup \(\d+x since the gate began\): {re.escape(line)}", first)
        assert cause.startswith("Cause: MLA") and "VLLM_MLA_DISABLE=1 in pools.chat.env" in cause
        assert took < 120, f"{took:.0f}s: the gate waited for more than the server's deaths"
        figures["gate_stops_on_known_startup_error_s"] = round(took, 1)
    finally:
        docker(host, "rm", "-f", name)


def test_stopping_a_chat_replica_under_load_loses_no_request(lab: Lab, figures: dict[str, Any]) -> None:
    host = lab.host("gpu-05")
    replica = lab.resource("chat-gpu-05-vllm").inputs["name"]
    seconds = 12.0
    load = start_load(lab, GATEWAY, "/v1/chat/completions", "qwen3-30b-a3b", seconds, 4, RATE)
    try:
        time.sleep(seconds / 3)
        docker(host, "stop", "-t", "30", replica)
        out, _ = load.communicate(timeout=120)
    finally:
        docker(host, "start", replica)
    result = json.loads(out)
    figures["load_requests_ok"] = result["ok"]
    figures["load_requests_lost_stopping_a_replica"] = result["failed"]
    figures["load_rate_per_s"] = RATE
    figures["load_answered_by_the_stopped_replica"] = result["by_host"].get(f"{host.node}:8000", 0)
    assert result["ok"] > seconds * RATE * 0.8, result
    # Every replica served, the stopped one too (before its stop, and what it had in flight).
    assert {f"gpu-0{i}:8000" for i in (3, 4, 5, 6)} <= set(result["by_host"]), result["by_host"]
    assert result["failed"] == 0, result["errors"]
    wait_until(lambda: healthy("http://198.18.0.15:8000/health"), 300, "gpu-05's replica after docker start")
