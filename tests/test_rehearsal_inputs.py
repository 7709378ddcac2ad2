"""The lab's rehearsal maps every docker:Container input the program registers (it stops on an unmapped
one, so a new input such as stopTimeout must reach the Docker API the way the provider sends it)."""

from __future__ import annotations

from lab.rehearse import container_body
from plan.harness import ProgramRun

CONTAINER = "docker:index/container:Container"


def test_every_container_input_of_the_reference_stack_maps_to_the_docker_api(prod_run: ProgramRun) -> None:
    containers = prod_run.by_type(CONTAINER)
    assert containers
    for r in containers:
        container_body(r.inputs)  # raises naming the input without a mapping


def test_a_vllm_server_stops_after_its_drain(prod_run: ProgramRun) -> None:
    chat = prod_run.get("chat-gpu-03-vllm")
    assert chat.inputs["stopTimeout"] == 90
    assert container_body(chat.inputs)["StopTimeout"] == 90
