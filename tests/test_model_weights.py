"""ModelWeights under Pulumi's mocks: fan-out copy graph, verify, shared mount, present, triggers, pool isolation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from components.resources.config import spec_from_pulumi
from components.resources.gpu_node import GpuNode, GpuNodeArgs
from components.resources.model_weights import ModelWeights, ModelWeightsArgs
from plan.harness import ProgramRun, run_program
from tests.support import content_trigger, script_of

R1 = "/data/models/DeepSeek-R1-GPTQ-Int4"
QWEN = "/data/models/Qwen3-30B-A3B"


def weights_children(run: ProgramRun, component: str) -> dict[str, Any]:
    return {
        r.name[len(component) + 1 :]: r for r in run.registrations if r.parent.endswith(f"ModelWeights::{component}")
    }


def dep_names(urns: list[str]) -> set[str]:
    return {u.rsplit("::", 1)[1] for u in urns}


def test_reference_weights_components_and_commands(prod_run: ProgramRun) -> None:
    comps = {r.name: r.plain_inputs() for r in prod_run.by_type("llm-cluster:weights:ModelWeights")}
    assert comps == {
        "weights-deepseek-r1": {
            "model": "deepseek-r1",
            "path": R1,
            "revision": "1",
            "method": "copy",
            "sourceNode": "gpu-01",
            "nodes": ["gpu-01", "gpu-02"],
        },
        "weights-qwen3-30b-a3b": {
            "model": "qwen3-30b-a3b",
            "path": QWEN,
            "revision": "1",
            "method": "copy",
            "sourceNode": "gpu-03",
            "nodes": ["gpu-03", "gpu-04", "gpu-05", "gpu-06"],
        },
    }
    assert set(weights_children(prod_run, "weights-deepseek-r1")) == {
        "manifest-gpu-01",
        "check-gpu-01",
        "copy-gpu-01-to-gpu-02",
        "verify-gpu-02",
    }
    assert set(weights_children(prod_run, "weights-qwen3-30b-a3b")) == {
        "manifest-gpu-03",
        "check-gpu-03",
        "copy-gpu-03-to-gpu-04",
        "verify-gpu-04",
        "copy-gpu-03-to-gpu-05",
        "verify-gpu-05",
        "copy-gpu-04-to-gpu-06",
        "verify-gpu-06",
    }


def test_fan_out_dependencies(prod_run: ProgramRun) -> None:
    c = weights_children(prod_run, "weights-qwen3-30b-a3b")
    deps = {name: dep_names(r.dependencies) for name, r in c.items()}
    assert deps["manifest-gpu-03"] == {"gpu-03-hosts", "gpu-03-preflight", "gpu-03-firewall", "gpu-03-clock"}
    assert deps["check-gpu-03"] == {
        "gpu-03-hosts",
        "gpu-03-preflight",
        "gpu-03-firewall",
        "gpu-03-clock",
    }  # the source's server waits for this only
    assert deps["copy-gpu-03-to-gpu-04"] == {
        "weights-qwen3-30b-a3b-manifest-gpu-03",
        "gpu-04-hosts",
        "gpu-04-preflight",
        "gpu-04-firewall",
        "gpu-04-clock",
    }
    assert deps["copy-gpu-03-to-gpu-05"] == {
        "weights-qwen3-30b-a3b-manifest-gpu-03",
        "gpu-05-hosts",
        "gpu-05-preflight",
        "gpu-05-firewall",
        "gpu-05-clock",
    }
    # Round 2: gpu-04 serves gpu-06 once its own copy is verified.
    assert deps["copy-gpu-04-to-gpu-06"] == {
        "weights-qwen3-30b-a3b-verify-gpu-04",
        "gpu-06-hosts",
        "gpu-06-preflight",
        "gpu-06-firewall",
        "gpu-06-clock",
    }
    assert deps["verify-gpu-06"] == {"weights-qwen3-30b-a3b-copy-gpu-04-to-gpu-06"}


def test_commands_run_where_they_should(prod_run: ProgramRun) -> None:
    c = weights_children(prod_run, "weights-qwen3-30b-a3b")
    # A failed verify says which copy to replace to send the removed files again.
    assert "weights-qwen3-30b-a3b-copy-gpu-04-to-gpu-06" in c["verify-gpu-06"].plain_inputs()["create"]
    host = lambda name: c[name].plain_inputs()["connection"]["host"]  # noqa: E731
    assert host("manifest-gpu-03") == "192.168.10.13"
    assert host("copy-gpu-04-to-gpu-06") == "192.168.10.14"  # on the serving node
    assert host("verify-gpu-06") == "192.168.10.16"
    copy = c["copy-gpu-04-to-gpu-06"].plain_inputs()
    assert "dst=root@192.168.10.16\n" in copy["create"]
    assert f"manifest={QWEN}/.llm-cluster/expected\n" in copy["create"]  # a target serves its verified manifest
    assert f"manifest={QWEN}/.llm-cluster/manifest\n" in c["copy-gpu-03-to-gpu-04"].plain_inputs()["create"]
    assert "rm -f --" in copy["delete"] and "expected" in copy["delete"]


def test_every_weights_command_triggers_on_its_script_and_revision_and_replaces_delete_first(
    prod_run: ProgramRun,
) -> None:
    for name, r in weights_children(prod_run, "weights-deepseek-r1").items():
        # The path is in the script, so its hash covers it.
        triggers = r.plain_inputs()["triggers"]
        assert triggers == ["1", content_trigger(script_of(r.plain_inputs()["create"]))], name
        assert f"root={R1}\n" in r.plain_inputs()["create"], name
        assert r.options["deleteBeforeReplace"] is True
        assert r.options["replaceOnChanges"] == ["triggers[*]"]
    c = weights_children(prod_run, "weights-deepseek-r1")
    assert c["copy-gpu-01-to-gpu-02"].options["customTimeouts"] == {"create": "6h"}
    assert c["verify-gpu-02"].options["customTimeouts"] == {"create": "3h"}


def test_a_revision_bump_replaces_every_step(config: dict[str, Any], stack_runner: Callable[..., ProgramRun]) -> None:
    config["llm-cluster:models"]["deepseek-r1"]["revision"] = "2"
    run = stack_runner(config)
    assert {r.plain_inputs()["triggers"][0] for r in weights_children(run, "weights-deepseek-r1").values()} == {"2"}
    assert {r.plain_inputs()["triggers"][0] for r in weights_children(run, "weights-qwen3-30b-a3b").values()} == {"1"}


def upstream(run: ProgramRun, urn: str) -> set[str]:
    by_urn = {r.urn: r for r in run.registrations}
    seen: set[str] = set()
    todo = [urn]
    while todo:
        for d in by_urn[todo.pop()].dependencies:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def test_each_model_depends_only_on_its_own_nodes(prod_run: ProgramRun) -> None:
    for comp, nodes in (
        ("weights-deepseek-r1", {"gpu-01", "gpu-02"}),
        ("weights-qwen3-30b-a3b", {"gpu-03", "gpu-04", "gpu-05", "gpu-06"}),
    ):
        for r in weights_children(prod_run, comp).values():
            for u in upstream(prod_run, r.urn):
                name = u.rsplit("::", 1)[1]
                assert (
                    name.startswith(comp)
                    or name.split("-hosts")[0].split("-preflight")[0].split("-firewall")[0].split("-clock")[0] in nodes
                ), (r.name, name)


def test_shared_mount_mounts_on_every_node(config: dict[str, Any], stack_runner: Callable[..., ProgramRun]) -> None:
    config["llm-cluster:models"]["qwen3-30b-a3b"]["source"] = {"sharedMount": "nas:/export/qwen3"}
    run = stack_runner(config)
    c = weights_children(run, "weights-qwen3-30b-a3b")
    assert set(c) == {f"mount-gpu-0{i}" for i in range(3, 7)}
    m = c["mount-gpu-05"].plain_inputs()
    assert f"entry='nas:/export/qwen3 {QWEN} nfs ro,_netdev 0 0'" in m["create"]
    assert 'umount "$root"' in m["delete"]
    assert dep_names(c["mount-gpu-05"].dependencies) == {
        "gpu-05-hosts",
        "gpu-05-preflight",
        "gpu-05-firewall",
        "gpu-05-clock",
    }


def test_present_weights_are_only_checked(config: dict[str, Any], stack_runner: Callable[..., ProgramRun]) -> None:
    config["llm-cluster:models"]["deepseek-r1"]["source"] = {"present": True}
    run = stack_runner(config)
    c = weights_children(run, "weights-deepseek-r1")
    assert set(c) == {"check-gpu-01", "check-gpu-02"}
    assert "delete" not in c["check-gpu-02"].plain_inputs()


def test_a_source_outside_the_pool_serves_it(config: dict[str, Any], stack_runner: Callable[..., ProgramRun]) -> None:
    config["llm-cluster:models"]["qwen3-30b-a3b"]["source"] = {"node": "gpu-01"}
    run = stack_runner(config)
    c = weights_children(run, "weights-qwen3-30b-a3b")
    # 5 holders: 3 rounds (gpu-01 -> 03; 01 -> 04, 03 -> 05; 01 -> 06).
    assert {n for n in c if n.startswith("copy-")} == {
        "copy-gpu-01-to-gpu-03",
        "copy-gpu-01-to-gpu-04",
        "copy-gpu-03-to-gpu-05",
        "copy-gpu-01-to-gpu-06",
    }
    assert "manifest-gpu-01" in c


def test_ready_maps_the_source_to_its_check_and_targets_to_their_verify(config: dict[str, Any]) -> None:
    made: dict[str, ModelWeights] = {}

    def program() -> None:
        spec = spec_from_pulumi()
        nodes = {n: GpuNode(n, GpuNodeArgs(spec, n, [])) for n in ("gpu-03", "gpu-04", "gpu-05", "gpu-06")}
        made["w"] = ModelWeights("w", ModelWeightsArgs(spec, "qwen3-30b-a3b", nodes))

    run_program(program, config, set())
    ready = {node: res._name for node, res in made["w"].ready.items()}  # type: ignore[attr-defined]
    assert ready == {
        "gpu-03": "w-check-gpu-03",
        "gpu-04": "w-verify-gpu-04",
        "gpu-05": "w-verify-gpu-05",
        "gpu-06": "w-verify-gpu-06",
    }


def test_the_source_server_does_not_wait_for_the_manifest(prod_run: ProgramRun) -> None:
    servers = {
        r.name: r
        for r in prod_run.by_type("docker:index/container:Container")
        if r.plain_inputs().get("name", "").startswith("vllm-")
    }

    def on(node: str) -> Any:
        return next(r for r in servers.values() if r.provider.startswith(prod_run.get(f"{node}-docker").urn + "::"))

    source = upstream(prod_run, on("gpu-03").urn)
    assert prod_run.get("weights-qwen3-30b-a3b-manifest-gpu-03").urn not in source
    assert prod_run.get("weights-qwen3-30b-a3b-check-gpu-03").urn in source
    # A target's server waits for its verified copy, which waits for the manifest.
    target = upstream(prod_run, on("gpu-04").urn)
    assert {
        prod_run.get(n).urn for n in ("weights-qwen3-30b-a3b-verify-gpu-04", "weights-qwen3-30b-a3b-manifest-gpu-03")
    } <= target


def test_the_source_must_be_among_the_nodes(config: dict[str, Any]) -> None:
    def program() -> None:
        spec = spec_from_pulumi()
        node = GpuNode("gpu-04", GpuNodeArgs(spec, "gpu-04", []))
        ModelWeights("w", ModelWeightsArgs(spec, "qwen3-30b-a3b", {"gpu-04": node}))

    with pytest.raises(ValueError, match="the source node 'gpu-03' must be among the nodes"):
        run_program(program, config, set())
