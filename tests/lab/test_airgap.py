"""The air-gapped lab: the lab stack with `images.airGapped: true` and `images.registry` pointing at a private
registry with auth (lab/airgap.py), brought up whole on hosts that reach nothing beyond the lab, with the
registry mirror stopped, so every image comes from the private registry with the stack's credentials.
Then, on the same hosts, with every image removed and no registry running at all, the same stack with
`images.tarballs`: every image `docker load`ed from tarballs on the hosts.

Part of the lab tier (`make test`), wherever the lab can run; the module takes /tmp/lab.lock itself
(hosts.lab_lock), brings its own lab up and takes it down. Figures go to build/lab/figures.json with the tier's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import airgap, hosts, images
from lab.__main__ import weights
from lab.config import REGISTRY_ADDRESS, REPO, SUBNET, LabStack, load_lab_stack
from lab.dockerapi import DockerAPI, DockerError
from lab.rehearse import CONTAINER, IMAGE, Rehearsal, RehearsalError, StepLog

WHY_NOT = hosts.can_create_namespaces()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"the lab does not run: {WHY_NOT}")

BASE = REPO / "Pulumi.lab.yaml"
NAME = "lab-airgap"


@dataclass
class AirgappedLab:
    stack: LabStack
    path: Path
    agent: str
    rehearsal: Rehearsal
    steps: list[StepLog]
    destroyed: bool = False


def docker(stack: LabStack, node: str, *args: str, timeout: int = 120) -> str:
    return hosts.sh("docker", "-H", f"unix://{stack.host(node).dir}/run/docker.sock", *args, timeout=timeout)


@pytest.fixture(scope="module")
def lab(figures: dict[str, Any]) -> Iterator[AirgappedLab]:
    with hosts.lab_lock():  # one lab per machine (lab/hosts.py): waits for whoever has it
        yield from _lab(figures)


def _lab(figures: dict[str, Any]) -> Iterator[AirgappedLab]:
    base = load_lab_stack(BASE)
    if hosts.lab_namespaces():
        assert hosts.down() == []
    hosts.up(base)
    try:
        path = airgap.airgap_stack(BASE, NAME)
        stack = load_lab_stack(path)
        # The stand-ins under the stack's own names, in the storage both registries read.
        images.ensure(airgap.stack_images(path))
        weights(base)
        airgap.start(NAME)
        airgap.stop_mirror()
        agent = hosts.start_agent()
        r = Rehearsal(path, NAME, agent, log=lambda line: None)
        t0 = time.monotonic()
        steps = r.up()
        figures["airgap_time_to_up_s"] = round(time.monotonic() - t0, 1)
        done = AirgappedLab(stack, path, agent, r, list(steps))
        yield done
        if not done.destroyed:
            r.destroy()
    finally:
        airgap.stop()
        left = hosts.down()
    assert left == [], f"lab-down left behind: {left}"
    assert not airgap.CERTS_D.exists()


def test_the_hosts_have_no_route_beyond_the_lab(lab: AirgappedLab) -> None:
    for h in lab.stack.hosts:
        routes = subprocess.run(["ip", "-n", h.netns, "route", "show"], capture_output=True, text=True).stdout
        # The lab subnet, and docker's own bridge (a build's RUN steps; local to the host): nothing beyond.
        nets = [line.split()[0] for line in routes.splitlines()]
        assert str(SUBNET) in nets and set(nets) <= {str(SUBNET), "172.17.0.0/16"}, (h.node, routes)
        assert "default" not in routes and " via " not in routes, (h.node, routes)


def test_up_succeeds_with_every_image_from_the_private_registry(lab: AirgappedLab) -> None:
    created = {s.name for s in lab.steps if s.action == "create"}
    assert created == {r.name for r in lab.rehearsal.resources.values() if r.custom}
    names = {r.inputs["name"] for r in lab.rehearsal.resources.values() if r.type == IMAGE}
    assert names and all(n.startswith(f"{airgap.REGISTRY}/") for n in names), names
    for h in lab.stack.hosts:
        held = docker(lab.stack, h.node, "images", "--format", "{{.Repository}}:{{.Tag}}").split()
        assert held and all(ref.startswith(f"{airgap.REGISTRY}/") for ref in held), (h.node, held)
    # The smoke test in up asked the gateway once per served name.
    smoke = next(s for s in lab.steps if s.name == "smoke-run")
    assert "smoke test: 4/4 served name(s) answered" in smoke.stdout, smoke.stdout


def test_the_registry_refuses_pulls_without_the_stacks_credentials(lab: AirgappedLab) -> None:
    h = lab.stack.host("gpu-02")
    api = DockerAPI(
        f"ssh://root@{h.address}",
        ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"],
        {**os.environ, "SSH_AUTH_SOCK": lab.agent},
    )
    ref = f"{airgap.REGISTRY}/prom/prometheus:v2.55.1"  # gpu-02 runs no Prometheus: not held there
    try:
        assert api.local_image(ref) is None
        with pytest.raises(DockerError, match="no basic auth credentials|unauthorized"):
            api.pull(ref)
        user, _ = airgap.credentials(NAME)
        with pytest.raises(DockerError, match="unauthorized"):
            api.pull(ref, {"username": user, "password": "wrong", "serveraddress": airgap.REGISTRY})
        user, password = airgap.credentials(NAME)
        assert api.pull(ref, {"username": user, "password": password, "serveraddress": airgap.REGISTRY})
        api.call("DELETE", f"/images/{ref.replace('/', '%2F')}", ok=(200,))
    finally:
        api.close()


def test_a_dockerd_without_the_registrys_ca_stops_preflight_and_dockerd_agrees(lab: AirgappedLab) -> None:
    # The up's preflight passed on every host with the CA in place (the TLS handshake verified). Without it
    # (every lab dockerd reads this certs.d), gpu-02's preflight stops naming the file, and a pull there
    # fails on the certificate exactly as preflight said it would.
    res = next(r for r in lab.rehearsal.resources.values() if r.name == "gpu-02-preflight")
    inputs = res.inputs
    ca = airgap.CERTS_D / "ca.crt"
    held = ca.read_bytes()
    ca.unlink()
    h = lab.stack.host("gpu-02")
    api = DockerAPI(
        f"ssh://root@{h.address}",
        ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"],
        {**os.environ, "SSH_AUTH_SOCK": lab.agent},
    )
    try:
        with pytest.raises(RehearsalError) as failed:
            lab.rehearsal._command(inputs, inputs["create"], inputs["connection"], res.name)
        said = str(failed.value)
        assert "preflight gpu-02: 1 error(s), " in said, said  # warnings: the lab hosts have less RAM than stated
        assert (
            f"ERROR: gpu-02: dockerd does not trust the private registry {airgap.REGISTRY} (images.registry): "
            f"{airgap.CERTS_D}/ holds no CA (*.crt), {airgap.REGISTRY} is not among docker info's Insecure "
            "Registries, and its certificate does not verify against the system CAs (unable to get local issuer "
            "certificate); every pull from it would fail"
        ) in said, said
        assert (
            f"fix: copy the CA that signed {airgap.REGISTRY}'s certificate to {airgap.CERTS_D}/ca.crt on gpu-02" in said
        )
        user, password = airgap.credentials(NAME)
        with pytest.raises(DockerError, match="x509: certificate signed by unknown authority"):
            api.pull(
                f"{airgap.REGISTRY}/prom/prometheus:v2.55.1",
                {"username": user, "password": password, "serveraddress": airgap.REGISTRY},
            )
    finally:
        api.close()
        ca.write_bytes(held)
    ok = lab.rehearsal._command(inputs, inputs["create"], inputs["connection"], res.name)
    assert "preflight gpu-02: 0 error(s)" in ok["stdout"]


def test_serving_containers_run_with_the_hub_and_telemetry_off(lab: AirgappedLab) -> None:
    for node, name in (
        ("gpu-03", "vllm-chat-gpu-03"),
        ("gpu-01", "ray-head-reasoning-gpu-01"),
        ("gpu-02", "ray-worker-reasoning-gpu-01"),
    ):
        env = dict(e.split("=", 1) for e in json.loads(docker(lab.stack, node, "inspect", name))[0]["Config"]["Env"])
        assert {
            k: env.get(k)
            for k in (
                "HF_HUB_OFFLINE",
                "TRANSFORMERS_OFFLINE",
                "VLLM_NO_USAGE_STATS",
                "DO_NOT_TRACK",
                "RAY_USAGE_STATS_ENABLED",
            )
        } == {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }, (node, name)


def test_nothing_but_the_private_registry_serves_images(lab: AirgappedLab) -> None:
    probe = subprocess.run(["curl", "-s", "-o", "/dev/null", "--max-time", "3", f"http://{REGISTRY_ADDRESS}/v2/"])
    assert probe.returncode != 0  # the mirror is down
    containers = [r for r in lab.rehearsal.resources.values() if r.type == CONTAINER]
    assert containers and all(s.action == "create" for s in lab.steps if s.type == "Container")


# --- the same stack from tarballs on the hosts ------------------------------------------------------

TARBALLS = "/data/llm-images"


@pytest.fixture(scope="module")
def tarball_lab(lab: AirgappedLab, figures: dict[str, Any]) -> Iterator[AirgappedLab]:
    t0 = time.monotonic()
    lab.rehearsal.destroy()
    lab.destroyed = True
    figures["airgap_destroy_s"] = round(time.monotonic() - t0, 1)
    path = airgap.airgap_stack(BASE, "lab-tarballs", tarballs=TARBALLS)
    stack = load_lab_stack(path)
    airgap.save_tarballs(path, stack.host("gpu-01"), list(stack.hosts), TARBALLS)
    airgap.stop_registry()  # no registry serves anything now
    for h in stack.hosts:
        held = docker(stack, h.node, "images", "-q").split()
        if held:
            # Removing a host's images writes gigabytes: minutes on a loaded machine (it timed out at 120 s).
            docker(stack, h.node, "rmi", "-f", *sorted(set(held)), timeout=900)
        assert docker(stack, h.node, "images", "-q").strip() == "", h.node
    r = Rehearsal(path, "lab-tarballs", lab.agent, log=lambda line: None)
    t0 = time.monotonic()
    steps = r.up()
    figures["airgap_tarballs_time_to_up_s"] = round(time.monotonic() - t0, 1)
    done = AirgappedLab(stack, path, lab.agent, r, list(steps))
    yield done
    r.destroy()


def test_up_succeeds_from_tarballs_with_no_registry_at_all(tarball_lab: AirgappedLab) -> None:
    lab = tarball_lab
    created = {s.name for s in lab.steps if s.action == "create"}
    assert created == {r.name for r in lab.rehearsal.resources.values() if r.custom}
    loads = [s for s in lab.steps if "-image-load-" in s.name]
    assert len(loads) == len([r for r in lab.rehearsal.resources.values() if r.type == IMAGE]) > 6
    for s in loads:
        assert "Loaded image: " in s.stdout and " loaded in " in s.stdout, (s.name, s.stdout)
    for h in lab.stack.hosts:
        held = docker(lab.stack, h.node, "images", "--format", "{{.Repository}}:{{.Tag}}").split()
        assert held and not any(ref.startswith(f"{airgap.REGISTRY}/") for ref in held), (h.node, held)


def test_a_second_load_skips_and_the_delete_undoes_it(tarball_lab: AirgappedLab) -> None:
    lab = tarball_lab
    res = next(r for r in lab.rehearsal.resources.values() if r.name == "gpu-02-image-load-node-exporter-v1-8-2")
    inputs = res.inputs
    again = lab.rehearsal._command(inputs, inputs["create"], inputs["connection"], res.name)
    assert (
        again["stdout"]
        == f"image-load: prom/node-exporter:v1.8.2 already loaded from {TARBALLS}/prom_node-exporter_v1.8.2.tar"
    )
    # In use by the node-exporter container: the delete leaves it and says so.
    undo = lab.rehearsal._command(inputs, inputs["delete"], inputs["connection"], res.name)
    assert "prom/node-exporter:v1.8.2 is still used by a container; left in place" in undo["stderr"]
    assert docker(lab.stack, "gpu-02", "image", "inspect", "--format", "{{.Id}}", "prom/node-exporter:v1.8.2").strip()
    # The record went with the delete: the next create loads again (and finds the same image).
    reload = lab.rehearsal._command(inputs, inputs["create"], inputs["connection"], res.name)
    assert "Loaded image: prom/node-exporter:v1.8.2" in reload["stdout"]
