"""Tested = deployed: the gateway image pins the nginx and njs the real-nginx tests run."""
from __future__ import annotations

import re
import subprocess

from components.planning.gateway_image import (
    BUILD_CONTEXT, CONTEXT_DIR, GATEWAY_IMAGE, TESTED_PACKAGES, dockerfile,
)
from components.planning.topology import images_for_node
from components.spec import StackSpec
from plan.harness import ProgramRun
from tests.conftest import ROOT
from tests.test_gateway_nginx import NJS_MODULE, nginx_binary


def test_the_tests_run_the_nginx_and_njs_the_image_pins() -> None:
    nginx_binary()
    installed = dict(line.split(" ", 1) for line in subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n", *TESTED_PACKAGES],
        capture_output=True, text=True, check=True).stdout.splitlines())
    assert installed == TESTED_PACKAGES, (
        f"the tests run {installed}, the deployed gateway image pins {TESTED_PACKAGES}: update "
        "TESTED_PACKAGES in components/planning/gateway_image.py (a new image tag) or install the pinned versions")
    # The binary and module the tests load are those packages'.
    owner = subprocess.run(["dpkg", "-S", NJS_MODULE], capture_output=True, text=True, check=True).stdout
    assert owner.startswith("libnginx-mod-http-js:")
    version = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True).stderr
    assert re.search(r"nginx/(\S+)", version).group(1) == TESTED_PACKAGES["nginx"].split("-")[0]  # type: ignore[union-attr]


def test_the_committed_dockerfile_is_the_generated_one() -> None:
    assert (CONTEXT_DIR / "Dockerfile").read_text() == dockerfile()
    assert (ROOT / BUILD_CONTEXT) == CONTEXT_DIR
    text = dockerfile()
    for pkg, version in TESTED_PACKAGES.items():
        assert f" {pkg}={version} " in text
    assert GATEWAY_IMAGE == "llm-cluster/gateway:nginx-1.22.1-9-deb12u11-njs-0.7.9-2"


def test_the_gateway_node_builds_the_image_and_never_pulls_it(prod_run: ProgramRun, prod_spec: StackSpec) -> None:
    assert prod_spec.gateway is not None and prod_spec.gateway.image == GATEWAY_IMAGE
    assert GATEWAY_IMAGE not in images_for_node(prod_spec, "gpu-01")
    image = prod_run.get("gateway-image")
    assert image.plain_inputs()["name"] == GATEWAY_IMAGE
    assert image.plain_inputs()["build"] == {"context": BUILD_CONTEXT, "dockerfile": "Dockerfile"}
    assert image.provider.startswith(prod_run.get("gpu-01-docker").urn)
    nginx = prod_run.get("gateway-nginx")
    assert image.urn in nginx.property_dependencies["image"]
