"""The plan diff past its replace decision, from plans built by hand (no stack planned, each test in
milliseconds): every kind of change -> its service impact (the pools' instances down, added and removed,
the services restarted, reloaded or updated, the weights copied, the GPU hand-overs, the recommendations),
plan.json's diff section and the printed text compared whole, and the leaf differences and short forms
the resources' changes are written with."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.resources.model_weights import ModelWeights
from components.spec import StackSpec
from plan.diff import (
    InputChange,
    ResourceChange,
    _diff_values,
    _gpus,
    _labels,
    _purpose,
    _short,
    _text_change,
    diff_resources,
    keep_previous,
    parse_plan,
    plan_diff,
    previous_plan,
    render_diff,
    service_impact,
    summary,
    summary_line,
)
from plan.harness import UNKNOWN
from tests.conftest import prod_config

C = "docker:index/container:Container"
CMD = "command:remote:Command"
IMG = "docker:index/remoteImage:RemoteImage"
W = ModelWeights.TYPE
GW = "llm-cluster:gateway:Gateway"


def _spec() -> StackSpec:
    config = prod_config()
    config["llm-cluster:pools"]["chat"] |= {"loadTimeoutMinutes": 45, "maxUnavailable": 2}
    return load_stack_config(config, set())


# Built once at import: mutmut's fork server imports this module once, and each mutant's run forks from it.
SPEC = _spec()


@pytest.fixture
def spec() -> StackSpec:
    """The reference stack with chat at loadTimeoutMinutes 45 and maxUnavailable 2 (reasoning: 30 and 1)."""
    assert (SPEC.pools["reasoning"].load_timeout_minutes, SPEC.pools["reasoning"].max_unavailable) == (30, 1)
    return SPEC


def ordered(value: Any) -> Any:
    """Dicts as lists of pairs, so that a comparison also holds their order (the text is printed in it)."""
    if isinstance(value, dict):
        return [(k, ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [ordered(v) for v in value]
    return value


def urn(name: str, type_: str = C) -> str:
    return f"urn:pulumi:s::p::{type_}::{name}"


def res(
    name: str,
    type_: str = C,
    /,
    *,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    parent: str = "",
    deps: list[str] | None = None,
    **inputs: Any,
) -> dict[str, Any]:
    if labels is not None:
        inputs["labels"] = [{"label": f"llm-cluster.{k}", "value": v} for k, v in labels.items()]
    return {
        "urn": urn(name, type_),
        "type": type_,
        "name": name,
        "parent": parent,
        "custom": type_ not in (W, GW),
        "node": node,
        "inputs": inputs,
        "dependencies": deps or [],
        "propertyDependencies": {},
        "options": {},
    }


def server(inst: str, pool: str | None, part: str = "vllm", **extra: Any) -> dict[str, Any]:
    """One container of a serving instance (an instance may have several: a Ray head and its workers)."""
    labels = {"instance": inst} | ({"pool": pool} if pool is not None else {})
    return res(f"{inst}-{part}", labels=labels, image="v1", restart="no", **extra)


def replaced(r: dict[str, Any]) -> dict[str, Any]:
    """The resource with an input its provider replaces on changed (a container's image, a command's triggers)."""
    out = copy.deepcopy(r)
    out["inputs"]["triggers" if r["type"] == CMD else "image" if r["type"] == C else "name"] = "changed"
    return out


def updated(r: dict[str, Any]) -> dict[str, Any]:
    """The resource with an input changed that its provider updates in place."""
    out = copy.deepcopy(r)
    out["inputs"]["create" if r["type"] == CMD else "restart"] = "changed"
    return out


def impact(
    spec: StackSpec, before: list[dict[str, Any]], after: list[dict[str, Any]], stack: str | None = "prod"
) -> dict[str, Any]:
    old = {"resources": copy.deepcopy(before)}
    new = {"resources": copy.deepcopy(after)} | ({"stack": stack} if stack else {})
    return service_impact(diff_resources(old, new), old, new, spec)


def pool(
    before: int,
    after: int,
    *,
    added: list[str] | None = None,
    removed: list[str] | None = None,
    restarted: list[str] | None = None,
    waits: list[str] | None = None,
    minutes: int | None = None,
) -> dict[str, Any]:
    down = len(restarted or []) + len(removed or [])
    return {
        "instancesBefore": before,
        "instancesAfter": after,
        "added": added or [],
        "removed": removed or [],
        "restarted": restarted or [],
        "waitsForWeights": waits or [],
        "downAtOnce": down,
        "servingThroughout": before - down,
        "downForMinutes": minutes,
    }


def rollout(pool_: str, n: int, of: int, limit: int, stack: str = "prod") -> str:
    return (
        f"pool {pool_}: this change restarts {n} of {of} instances at once; roll it out instance by instance instead: "
        f"make rollout STACK={stack} POOL={pool_} (maxUnavailable {limit})"
    )


def blue_green(pool_: str, what: str = "its only instance restarts") -> str:
    return (
        f"pool {pool_}: {what}, so the pool serves nothing while it reloads; a second pool of "
        "the same model (blue/green, see the README) keeps it serving"
    )


# --- pools: which instances go down, for how long, and what is recommended --------------------------------

CHAT = [server(f"chat-{i}", "chat") for i in range(4)]
REASONING = [server("reasoning-0", "reasoning", "ray-head"), server("reasoning-0", "reasoning", "ray-worker")]
REASONING_1 = server("reasoning-1", "reasoning")

# Weights: a component per model, a copy command per node under it; servers depend on their node's copy.
WEIGHTS = res("w", W, model="qwen3")
WEIGHTS_BARE = {**res("w2", W), "inputs": None}  # a component written without inputs: no model to name


def copy_cmd(name: str, parent: str, node: str) -> dict[str, Any]:
    script = f"#!/bin/bash\nset -euo pipefail\n# llm-cluster: copy qwen3 to {node}\nrsync -a src/ dst/\n"
    return res(name, CMD, node=node, parent=parent, create=script, triggers=["h1"])


COPY_03 = copy_cmd("w-gpu-03-copy", urn("w", W), "gpu-03")
COPY_04 = copy_cmd("w-gpu-04-copy", urn("w", W), "gpu-04")
COPY_05 = copy_cmd("w-gpu-05-copy", urn("w", W), "gpu-05")
COPY_BARE = copy_cmd("w2-gpu-06-copy", urn("w2", W), "gpu-06")
NOT_WEIGHTS = copy_cmd("gw-copy", urn("gw", GW), "gpu-01")  # a command under another component
ORPHAN = copy_cmd("orphan-copy", urn("gone", W), "gpu-01")  # its parent is in neither plan


def waiting(r: dict[str, Any], *on: dict[str, Any]) -> dict[str, Any]:
    return {**r, "dependencies": [c["urn"] for c in on]}


# name -> (resources before, resources after, the stack named in the new plan, expected pools, recommendations)
POOLS: dict[str, tuple[list[Any], list[Any], str | None, dict[str, Any], list[str]]] = {
    "nothing changes": (CHAT, CHAT, "prod", {}, []),
    "an instance's container updated in place (no restart)": (
        CHAT,
        [updated(CHAT[0]), *CHAT[1:]],
        "prod",
        {},
        [],
    ),
    "a non-container labelled with an instance is no instance": (
        [res("x", CMD, labels={"instance": "chat-9", "pool": "chat"}, triggers=["a"])],
        [res("x", CMD, labels={"instance": "chat-9", "pool": "chat"}, triggers=["b"])],
        "prod",
        {},
        [],
    ),
    "one of four restarts": (
        CHAT,
        [replaced(CHAT[0]), *CHAT[1:]],
        "prod",
        {"chat": pool(4, 4, restarted=["chat-0"], minutes=45)},
        [],
    ),
    "two of four restart, as many as maxUnavailable 2": (
        CHAT,
        [replaced(CHAT[0]), CHAT[1], replaced(CHAT[2]), CHAT[3]],
        "prod",
        {"chat": pool(4, 4, restarted=["chat-0", "chat-2"], minutes=45)},
        [],
    ),
    "three of four restart, one over maxUnavailable 2": (
        CHAT,
        [replaced(CHAT[0]), replaced(CHAT[1]), replaced(CHAT[2]), CHAT[3]],
        "prod",
        {"chat": pool(4, 4, restarted=["chat-0", "chat-1", "chat-2"], minutes=45)},
        [rollout("chat", 3, 4, 2)],
    ),
    "both instances of a pool at maxUnavailable 1, in a plan without a stack name": (
        [*REASONING, REASONING_1],
        [replaced(REASONING[0]), REASONING[1], replaced(REASONING_1)],
        None,
        {"reasoning": pool(2, 2, restarted=["reasoning-0", "reasoning-1"], minutes=30)},
        [rollout("reasoning", 2, 2, 1, stack="<stack>")],
    ),
    "a Ray worker restarts, its head kept: the instance restarts, once": (
        [*REASONING, REASONING_1],
        [REASONING[0], replaced(REASONING[1]), REASONING_1],
        "prod",
        {"reasoning": pool(2, 2, restarted=["reasoning-0"], minutes=30)},
        [],
    ),
    "a Ray worker added to a kept instance: the instance restarts": (
        [REASONING[0], REASONING_1],
        [*REASONING, REASONING_1],
        "prod",
        {"reasoning": pool(2, 2, restarted=["reasoning-0"], minutes=30)},
        [],
    ),
    "a Ray worker taken from a kept instance: the instance restarts": (
        [*REASONING, REASONING_1],
        [REASONING[0], REASONING_1],
        "prod",
        {"reasoning": pool(2, 2, restarted=["reasoning-0"], minutes=30)},
        [],
    ),
    "a head waiting for a copy, its worker restarting without: the instance waits": (
        [WEIGHTS, *REASONING, REASONING_1],
        [WEIGHTS, waiting(replaced(REASONING[0]), COPY_03), replaced(REASONING[1]), REASONING_1, COPY_03],
        "prod",
        {"reasoning": pool(2, 2, restarted=["reasoning-0"], waits=["w-gpu-03-copy"], minutes=30)},
        [
            "pool reasoning: reasoning-0 goes down when the change starts but serves again only after the weights "
            "copy (w-gpu-03-copy); copy first: pulumi up with a --target for each URN in plan.json diff.weights, "
            "then the whole change"
        ],
    ),
    "a pool's only instance restarts": (
        REASONING,
        [replaced(REASONING[0]), replaced(REASONING[1])],
        "prod",
        {"reasoning": pool(1, 1, restarted=["reasoning-0"], minutes=30)},
        [blue_green("reasoning")],
    ),
    "one instance restarts while the other is removed: none serves": (
        [*REASONING, REASONING_1],
        [replaced(REASONING[0]), REASONING[1]],
        "prod",
        {"reasoning": pool(2, 1, restarted=["reasoning-0"], removed=["reasoning-1"], minutes=30)},
        # Not "its only instance": the pool had two.
        [blue_green("reasoning", "no instance serves throughout (1 restart, 1 removed)")],
    ),
    "an instance removed": (
        CHAT,
        CHAT[:3],
        "prod",
        {"chat": pool(4, 3, removed=["chat-3"])},
        [],
    ),
    "a whole pool removed (nothing restarts, nothing to recommend)": (
        [*CHAT, *REASONING],
        CHAT,
        "prod",
        {"reasoning": pool(1, 0, removed=["reasoning-0"])},
        [],
    ),
    "an instance added": (
        CHAT,
        [*CHAT, server("chat-4", "chat")],
        "prod",
        {"chat": pool(4, 5, added=["chat-4"])},
        [],
    ),
    "a new pool": (
        [],
        [server("fresh-1", "fresh"), server("fresh-0", "fresh")],
        "prod",
        {"fresh": pool(0, 2, added=["fresh-0", "fresh-1"])},
        [],
    ),
    "a pool the stack does not name (no label): its defaults, one at a time and no load timeout": (
        [server("a", None), server("b", None)],
        [replaced(server("a", None)), replaced(server("b", None))],
        "prod",
        {"": pool(2, 2, restarted=["a", "b"])},
        [rollout("", 2, 2, 1)],
    ),
    "two pools, listed by instance name": (
        [*REASONING, *CHAT],
        [replaced(REASONING[0]), REASONING[1], replaced(CHAT[3]), *CHAT[:3]],
        "prod",
        {
            "chat": pool(4, 4, restarted=["chat-3"], minutes=45),
            "reasoning": pool(1, 1, restarted=["reasoning-0"], minutes=30),
        },
        [blue_green("reasoning")],
    ),
    "servers restart after their weights copy": (
        [WEIGHTS, COPY_04, COPY_05, *CHAT],
        [
            WEIGHTS,
            COPY_03,  # created
            replaced(COPY_04),
            updated(COPY_05),  # updated in place: no copy, nothing to wait for
            waiting(replaced(CHAT[0]), COPY_03),
            waiting(replaced(CHAT[1]), COPY_05, COPY_04),
            CHAT[2],
            waiting(updated(CHAT[3]), COPY_03),  # not restarted: waits for nothing
            waiting(server("chat-4", "chat"), COPY_03),  # new: serves once loaded, as every new one
        ],
        "prod",
        {
            "chat": pool(
                4,
                5,
                added=["chat-4"],
                restarted=["chat-0", "chat-1"],
                waits=["w-gpu-03-copy", "w-gpu-04-copy"],
                minutes=45,
            )
        },
        [
            "pool chat: chat-0, chat-1 goes down when the change starts but serves again only after the weights copy "
            "(w-gpu-03-copy, w-gpu-04-copy); copy first: pulumi up with a --target for each URN in plan.json "
            "diff.weights, then the whole change"
        ],
    ),
    "two instances on one node (replicasPerNode 2) waiting for its one copy: the copy named once": (
        [WEIGHTS, *CHAT],
        [WEIGHTS, COPY_03, waiting(replaced(CHAT[0]), COPY_03), waiting(replaced(CHAT[1]), COPY_03), *CHAT[2:]],
        "prod",
        {"chat": pool(4, 4, restarted=["chat-0", "chat-1"], waits=["w-gpu-03-copy"], minutes=45)},
        [
            "pool chat: chat-0, chat-1 goes down when the change starts but serves again only after the weights copy "
            "(w-gpu-03-copy); copy first: pulumi up with a --target for each URN in plan.json diff.weights, then the "
            "whole change"
        ],
    ),
    "a server waiting for two copies, and a removed one for none": (
        [WEIGHTS, waiting(CHAT[0], COPY_03), *CHAT[1:]],
        [WEIGHTS, COPY_04, COPY_03, waiting(replaced(CHAT[1]), COPY_04, COPY_03), *CHAT[2:]],
        "prod",
        {
            "chat": pool(
                4, 3, removed=["chat-0"], restarted=["chat-1"], waits=["w-gpu-03-copy", "w-gpu-04-copy"], minutes=45
            )
        },
        [
            "pool chat: chat-1 goes down when the change starts but serves again only after the weights copy "
            "(w-gpu-03-copy, w-gpu-04-copy); copy first: pulumi up with a --target for each URN in plan.json "
            "diff.weights, then the whole change"
        ],
    ),
}


@pytest.mark.parametrize("case", list(POOLS))
def test_each_change_to_a_pool_and_what_it_recommends(case: str, spec: StackSpec) -> None:
    before, after, stack, pools, recommendations = POOLS[case]
    got = impact(spec, before, after, stack)
    assert ordered(got["pools"]) == ordered(pools)
    assert got["recommendations"] == recommendations
    assert got["services"] == {}


def test_the_weights_each_change_copies(spec: StackSpec) -> None:
    before = [WEIGHTS, WEIGHTS_BARE, COPY_04, COPY_05, res("gw", GW)]
    after = [
        WEIGHTS,
        WEIGHTS_BARE,
        res("gw", GW),
        COPY_03,
        replaced(COPY_04),
        updated(COPY_05),
        COPY_BARE,
        NOT_WEIGHTS,
        ORPHAN,
    ]
    got = impact(spec, before, after)
    assert got["weights"] == [
        {
            "model": "qwen3",
            "resource": "w-gpu-03-copy",
            "urn": COPY_03["urn"],
            "node": "gpu-03",
            "op": "create",
            "does": "copy qwen3 to gpu-03",
        },
        {
            "model": "qwen3",
            "resource": "w-gpu-04-copy",
            "urn": COPY_04["urn"],
            "node": "gpu-04",
            "op": "replace",
            "does": "copy qwen3 to gpu-04",
        },
        {
            "model": None,
            "resource": "w2-gpu-06-copy",
            "urn": COPY_BARE["urn"],
            "node": "gpu-06",
            "op": "create",
            "does": "copy qwen3 to gpu-06",
        },
    ]
    # A deleted copy copies nothing.
    assert impact(spec, [WEIGHTS, COPY_03], [WEIGHTS])["weights"] == []


# --- services outside the pools: restart, reload, update in place -----------------------------------------

NGINX = res(
    "gw-nginx", labels={"role": "gateway"}, parent=urn("gw", GW), deps=[urn("gw-config", CMD)], image="n", restart="no"
)
CONFIG = res("gw-config", CMD, parent=urn("gw", GW), create="write v1", triggers=["t1"])
# Runs after the container (depends on it) to make it re-read what changed.
SIGNAL = res("gw-signal", CMD, parent=urn("gw", GW), deps=[NGINX["urn"]], create="nginx -s reload", triggers=["t1"])
ELSEWHERE = res("mon-config", CMD, parent=urn("mon", GW), create="write v1")  # another component's command
UNRELATED = res("gw-other", CMD, parent=urn("gw", GW), create="x")  # same component, no order with the container
IMAGE = res("gw-image", IMG, parent=urn("gw", GW), name="nginx:1")
NGINX_ON_IMAGE = {**NGINX, "dependencies": [IMAGE["urn"]]}
PROM = res("mon-prometheus", labels={"role": "prometheus"}, image="p", restart="no")
GRAFANA = res("mon-grafana", labels={"role": "grafana"}, image="g", restart="no")
EXPORTER_A = res("exporter-a", labels={"role": "exporter"}, image="e")
EXPORTER_B = res("exporter-b", labels={"role": "exporter"}, image="e")

# name -> (resources before, resources after, expected services)
SERVICES: dict[str, tuple[list[Any], list[Any], dict[str, Any]]] = {
    "the config written before the container updated: reload": (
        [CONFIG, NGINX],
        [updated(CONFIG), NGINX],
        {"gateway": {"reload": ["gw-nginx"]}},
    ),
    "the config replaced (its triggers): reload": (
        [CONFIG, NGINX],
        [replaced(CONFIG), NGINX],
        {"gateway": {"reload": ["gw-nginx"]}},
    ),
    "the config written for the first time, the container reading it from now on: reload": (
        [{**NGINX, "dependencies": []}],
        [CONFIG, NGINX],
        {"gateway": {"reload": ["gw-nginx"]}},
    ),
    "the config deleted: nothing to reload": ([CONFIG, NGINX], [NGINX], {}),
    "a command run after the container changed: reload": (
        [NGINX, SIGNAL],
        [NGINX, updated(SIGNAL)],
        {"gateway": {"reload": ["gw-nginx"]}},
    ),
    "a command of another component changed, though the container depends on it: nothing": (
        [ELSEWHERE, {**NGINX, "dependencies": [ELSEWHERE["urn"]]}],
        [updated(ELSEWHERE), {**NGINX, "dependencies": [ELSEWHERE["urn"]]}],
        {},
    ),
    "a command of the same component, neither before nor after the container: nothing": (
        [UNRELATED, NGINX],
        [updated(UNRELATED), NGINX],
        {},
    ),
    "a replaced image the container depends on, not a command: nothing": (
        [IMAGE, NGINX_ON_IMAGE],
        [replaced(IMAGE), NGINX_ON_IMAGE],
        {},
    ),
    "the container replaced: restart": ([NGINX], [replaced(NGINX)], {"gateway": {"restart": ["gw-nginx"]}}),
    "the container replaced and its config changed: restart": (
        [CONFIG, NGINX],
        [updated(CONFIG), replaced(NGINX)],
        {"gateway": {"restart": ["gw-nginx"]}},
    ),
    "the container created": ([], [NGINX], {"gateway": {"create": ["gw-nginx"]}}),
    "the container deleted": ([NGINX], [], {"gateway": {"delete": ["gw-nginx"]}}),
    "the container updated in place": ([NGINX], [updated(NGINX)], {"gateway": {"update in place": ["gw-nginx"]}}),
    "the container updated in place and its config changed: reload": (
        [CONFIG, NGINX],
        [updated(CONFIG), updated(NGINX)],
        {"gateway": {"reload": ["gw-nginx"]}},
    ),
    "a container without a role: nothing": (
        [res("c", image="a")],
        [replaced(res("c", image="a"))],
        {},
    ),
    "a command labelled with a role: nothing": (
        [res("k", CMD, labels={"role": "gateway"}, triggers=["a"])],
        [replaced(res("k", CMD, labels={"role": "gateway"}, triggers=["a"]))],
        {},
    ),
    "a serving instance's container with a role too: the pool's, not a service": (
        [
            {
                **CHAT[0],
                "inputs": {**CHAT[0]["inputs"], "labels": [*CHAT[0]["inputs"]["labels"], *PROM["inputs"]["labels"]]},
            }
        ],
        [],
        {},
    ),
    "two roles, listed by role": (
        [PROM, GRAFANA],
        [replaced(PROM), replaced(GRAFANA)],
        {"grafana": {"restart": ["mon-grafana"]}, "prometheus": {"restart": ["mon-prometheus"]}},
    ),
    "one role, a container deleted and another created": (
        [EXPORTER_B],
        [EXPORTER_A],
        {"exporter": {"delete": ["exporter-b"], "create": ["exporter-a"]}},
    ),
}


@pytest.mark.parametrize("case", list(SERVICES))
def test_each_change_to_a_service(case: str, spec: StackSpec) -> None:
    before, after, services = SERVICES[case]
    got = impact(spec, before, after)
    assert ordered(got["services"]) == ordered(services)
    assert got["recommendations"] == [] and got["weights"] == []


# --- a new server on GPUs a deleted one still holds ---------------------------------------------------------


def gpu_server(name: str, node: str = "n1", type_: str = C, instance: bool = True, **gpus: Any) -> dict[str, Any]:
    return res(name, type_, labels={"instance": name} if instance else {"role": "exporter"}, node=node, **gpus)


def handover(new: str, *holders: str, node: str = "n1") -> str:
    return (
        f"node {node}: {new} would start while {', '.join(holders)} still holds its GPUs (an up creates new "
        "resources before it deletes removed ones); free the node first: one up with the node out of its old pool, "
        "then the up that gives it to the new one"
    )


ALL = {"gpus": "all"}


def ids(*d: Any) -> dict[str, Any]:
    return {"deviceRequests": [{"deviceIds": list(d)}]}


# name -> (resources before, resources after, expected recommendations)
HANDOVERS: dict[str, tuple[list[Any], list[Any], list[str]]] = {
    "all GPUs, then all GPUs": ([gpu_server("blue", **ALL)], [gpu_server("green", **ALL)], [handover("green", "blue")]),
    "some GPUs, then all": (
        [gpu_server("blue", **ids("0"))],
        [gpu_server("green", **ALL)],
        [handover("green", "blue")],
    ),
    "all GPUs, then some": (
        [gpu_server("blue", **ALL)],
        [gpu_server("green", **ids("3"))],
        [handover("green", "blue")],
    ),
    "overlapping ids, numbers and strings": (
        [gpu_server("blue", **ids(0, 1))],
        [gpu_server("green", **ids("1", "2"))],
        [handover("green", "blue")],
    ),
    "other ids": ([gpu_server("blue", **ids("0", "1"))], [gpu_server("green", **ids("2", "3"))], []),
    "another node": ([gpu_server("blue", **ALL)], [gpu_server("green", node="n2", **ALL)], []),
    "the old one kept": (
        [gpu_server("blue", **ALL)],
        [gpu_server("blue", **ALL), gpu_server("green", **ALL)],
        [],
    ),
    "an exporter deleted (it sees the GPUs, takes no memory)": (
        [gpu_server("blue", instance=False, **ALL)],
        [gpu_server("green", **ALL)],
        [],
    ),
    "a new container without GPUs": ([gpu_server("blue", **ALL)], [gpu_server("green")], []),
    "a new container without GPUs, then one with": (
        [gpu_server("blue", **ALL)],
        [gpu_server("green0"), gpu_server("green", **ALL)],
        [handover("green", "blue")],
    ),
    "a deleted command, not a container": ([gpu_server("blue", type_=CMD, **ALL)], [gpu_server("green", **ALL)], []),
    "a created command, not a container": ([gpu_server("blue", **ALL)], [gpu_server("green", type_=CMD, **ALL)], []),
    "two holders, two new servers": (
        [gpu_server("blue", **ids("0")), gpu_server("blue2", **ids("1"))],
        [gpu_server("green", **ALL), gpu_server("green2", **ids("1"))],
        [handover("green", "blue", "blue2"), handover("green2", "blue2")],
    ),
}


@pytest.mark.parametrize("case", list(HANDOVERS))
def test_a_new_server_on_gpus_a_deleted_one_holds(case: str, spec: StackSpec) -> None:
    before, after, recommendations = HANDOVERS[case]
    assert impact(spec, before, after)["recommendations"] == recommendations


@pytest.mark.parametrize(
    ("inputs", "claims"),
    [
        ({"gpus": "all"}, {"all"}),
        ({"gpus": "all", **ids("0")}, {"all"}),
        ({"gpus": ""}, None),
        ({}, None),
        (ids(0, "1"), {"0", "1"}),
        ({"deviceRequests": [{"deviceIds": ["0"]}, {"deviceIds": ["2"]}]}, {"0", "2"}),
        ({"deviceRequests": [{"driver": "nvidia", "count": -1}]}, {"all"}),
        ({"deviceRequests": [{"deviceIds": []}]}, {"all"}),
        ({"deviceRequests": []}, None),
    ],
)
def test_the_gpus_a_server_claims(inputs: dict[str, Any], claims: set[str] | None) -> None:
    assert _gpus(gpu_server("s", **inputs)) == claims
    # An exporter claims none, whatever it sees.
    assert _gpus(gpu_server("s", instance=False, **inputs)) is None


# --- the pieces the diff is written with --------------------------------------------------------------------


def test_labels_and_purpose_read_what_is_there() -> None:
    assert _labels({"inputs": None}) == {}
    assert _labels({"inputs": {"labels": None}}) == {}
    assert _labels({"inputs": {"labels": [{"label": "a", "value": "1"}, "a=2", {"label": "b"}]}}) == {
        "a": "1",
        "b": None,
    }
    script = "#!/bin/bash\n  # llm-cluster: indented, not it\n# llm-cluster: copy it\n# llm-cluster: second\n"
    assert _purpose({"name": "n", "inputs": {"create": script}}) == "copy it"
    assert _purpose({"name": "n", "inputs": {"create": "  # llm-cluster: indented\nx"}}) == "n"
    assert _purpose({"name": "n", "inputs": {"create": None}}) == "n"
    assert _purpose({"name": "n", "inputs": None}) == "n"


@pytest.mark.parametrize(
    ("value", "short"),
    [
        (None, None),
        ("", ""),
        ("abc", "abc"),
        ("a" * 80, "a" * 80),
        ("a" * 81, "<text, 1 lines>"),
        ("a\nb\nc", "<text, 3 lines>"),
        ("a\n", "<text, 2 lines>"),
        (3, "3"),
        (True, "true"),
        ({"b": 1, "a": [2]}, '{"a": [2], "b": 1}'),
        (["x" * 76], '["' + "x" * 76 + '"]'),  # 80 characters
        (["x" * 77], "<list, 1 items>"),
        ({str(i): i for i in range(20)}, "<dict, 20 items>"),
    ],
)
def test_a_value_as_one_short_line(value: Any, short: str | None) -> None:
    assert _short(value) == short


@pytest.mark.parametrize(
    ("old", "new", "change"),
    [
        ("a\nb\nc", "a\nB\nc\nd\ne", ("<text, 3 lines>", "<text, 5 lines> (-1 +3 lines)")),
        ("a\nb\nc\nd", "a\nd", ("<text, 4 lines>", "<text, 2 lines> (-2 +0 lines)")),
        ("a", "a\nb", ("a", "<text, 2 lines> (-0 +1 lines)")),
        # Past 200 lines difflib would take a line on more than 1 % of them as junk (autojunk): not here.
        (
            "x\n" * 150 + "y\n" * 100,
            "x\n" * 150 + "z\n" + "y\n" * 100,
            ("<text, 251 lines>", "<text, 252 lines> (-0 +1 lines)"),
        ),
    ],
)
def test_a_changed_script_counts_the_lines_gone_and_added(old: str, new: str, change: tuple[str, str]) -> None:
    assert _text_change(old, new, "create") == InputChange("create", *change)


# (old inputs, new inputs) -> [(path, before, after)], as diff_resources compares a resource's inputs
LEAVES: dict[str, tuple[Any, Any, list[tuple[str, str | None, str | None]]]] = {
    "equal": ({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]}, []),
    "unknown after": ({"a": 1}, UNKNOWN, []),
    "unknown before": (UNKNOWN, {"a": 1}, []),
    "an unknown leaf": ({"a": 1, "b": 2}, {"a": UNKNOWN, "b": 3}, [("b", "2", "3")]),
    "keys in the old order, then the new ones": (
        {"z": 1, "a": 2, "gone": 3},
        {"new": 4, "a": 5, "z": 1},
        [("a", "2", "5"), ("gone", "3", None), ("new", None, "4")],
    ),
    "nested dicts": ({"x": {"y": {"z": 1}}}, {"x": {"y": {"z": 2}}}, [("x.y.z", "1", "2")]),
    "a list of objects, same length: item by item": (
        {"l": [{"a": 1}, {"a": 2}]},
        {"l": [{"a": 1}, {"a": 3}]},
        [("l[1].a", "2", "3")],
    ),
    "a list of objects that grew: whole": (
        {"l": [{"a": 1}]},
        {"l": [{"a": 1}, {"a": 2}]},
        [("l", '[{"a": 1}]', '[{"a": 1}, {"a": 2}]')],
    ),
    "a list of objects and values, same length: whole": (
        {"l": [{"a": 1}, 2]},
        {"l": [{"a": 1}, 3]},
        [("l", '[{"a": 1}, 2]', '[{"a": 1}, 3]')],
    ),
    "a list of lists: whole": ({"l": [[1]]}, {"l": [[2]]}, [("l", "[[1]]", "[[2]]")]),
    "values gone and added": ({"l": ["a", "b", 1]}, {"l": ["b", 2, "c"]}, [("l", '["a", 1]', '[2, "c"]')]),
    "values added only": ({"l": ["a"]}, {"l": ["a", "b"]}, [("l", None, '["b"]')]),
    "values gone only": ({"l": ["a", "b"]}, {"l": ["b"]}, [("l", '["a"]', None)]),
    "the same values in another order": ({"l": ["a", "b"]}, {"l": ["b", "a"]}, [("l", "<order>", "<order>")]),
    "a list for a value": ({"l": 1}, {"l": [1]}, [("l", "1", "[1]")]),
    "an object for nothing": ({"d": {"a": 1}}, {}, [("d", '{"a": 1}', None)]),
    "a line": ({"s": "a"}, {"s": "b"}, [("s", "a", "b")]),
    "a script": ({"s": "a\nb"}, {"s": "a\nc"}, [("s", "<text, 2 lines>", "<text, 2 lines> (-1 +1 lines)")]),
    "a line grown into a script": ({"s": "a"}, {"s": "a\nb"}, [("s", "a", "<text, 2 lines> (-0 +1 lines)")]),
    "a script cut to a line": ({"s": "a\nb"}, {"s": "a"}, [("s", "<text, 2 lines>", "a (-1 +0 lines)")]),
    "a long line, not a script": ({"s": "a" * 90}, {"s": "b" * 90}, [("s", "<text, 1 lines>", "<text, 1 lines>")]),
}


@pytest.mark.parametrize("case", list(LEAVES))
def test_the_leaf_differences_of_two_inputs(case: str) -> None:
    old, new, changes = LEAVES[case]
    assert [(c.path, c.before, c.after, c.via) for c in _diff_values(old, new, "")] == [(*c, None) for c in changes]
    # Under a path, every path is under it.
    assert [c.path for c in _diff_values(old, new, "inputs")] == [f"inputs.{p}" for p, _, _ in changes]


def test_the_summary_counts_what_stays() -> None:
    ops = ["create", "update", "update", "replace", "delete", "delete", "delete"]
    changes = [ResourceChange(f"u{i}", C, f"n{i}", op, None, "") for i, op in enumerate(ops)]
    # Deleted resources are not in the new plan: the unchanged are the new plan's others.
    assert summary(changes, 10) == {"create": 1, "update": 2, "replace": 1, "delete": 3, "unchanged": 6}
    assert summary([], 4) == {"create": 0, "update": 0, "replace": 0, "delete": 0, "unchanged": 4}


@pytest.mark.parametrize(
    ("counts", "line"),
    [
        ({"create": 0, "update": 0, "replace": 0, "delete": 0, "unchanged": 5}, "Resources: 5 unchanged"),
        (
            {"create": 0, "update": 2, "replace": 0, "delete": 0, "unchanged": 0},
            "Resources: ~ 2 to update · 0 unchanged",
        ),
        (
            {"create": 1, "update": 2, "replace": 3, "delete": 4, "unchanged": 5},
            "Resources: + 1 to create · ~ 2 to update · +- 3 to replace · - 4 to delete · 5 unchanged",
        ),
    ],
)
def test_the_summary_line_names_only_what_happens(counts: dict[str, int], line: str) -> None:
    assert summary_line(counts) == line


# --- plan.json's diff section -------------------------------------------------------------------------------


def test_the_diff_section_without_a_plan_to_compare(spec: StackSpec) -> None:
    after = {"mode": "preview", "resources": [NGINX]}
    assert plan_diff(None, after, spec, None) == {
        "against": None,
        "note": "no previous plan of this stack: the next plan compares against this one",
    }
    assert plan_diff(None, after, spec, "old/plan.json") == {
        "against": None,
        "note": "old/plan.json is not a plan.json: nothing to compare against",
    }


@pytest.mark.parametrize(("mode_before", "note"), [("preview", None), ("up", True)])
def test_the_diff_section_whole(mode_before: str, note: bool | None, spec: StackSpec) -> None:
    before = {"stack": "prod", "mode": mode_before, "resources": [CONFIG, NGINX, CHAT[0], CHAT[1], EXPORTER_B]}
    after = {
        "stack": "prod",
        "mode": "preview",
        "resources": [updated(CONFIG), NGINX, replaced(CHAT[0]), CHAT[1], EXPORTER_A],
    }
    changes = {
        "config": {
            "urn": CONFIG["urn"],
            "type": CMD,
            "name": "gw-config",
            "op": "update",
            "node": None,
            "parent": urn("gw", GW),
            "changes": [{"path": "create", "before": "write v1", "after": "changed", "via": None}],
            "replace_because": [],
            "replace_source": None,
            "delete_before_replace": False,
            "custom": True,
        },
        "chat-0": {
            "urn": CHAT[0]["urn"],
            "type": C,
            "name": "chat-0-vllm",
            "op": "replace",
            "node": None,
            "parent": "",
            "changes": [{"path": "image", "before": "v1", "after": "changed", "via": None}],
            "replace_because": ["image"],
            "replace_source": "docker provider schema: willReplaceOnChanges",
            "delete_before_replace": False,
            "custom": True,
        },
    }
    created = {**changes["config"], "urn": EXPORTER_A["urn"], "type": C, "name": "exporter-a", "op": "create"}
    deleted = {**changes["config"], "urn": EXPORTER_B["urn"], "type": C, "name": "exporter-b", "op": "delete"}
    for c in (created, deleted):
        c.update(parent="", changes=[])
    expected = {
        "against": "previous/plan.json",
        "summary": {"create": 1, "update": 1, "replace": 1, "delete": 1, "unchanged": 2},
        "resources": [changes["config"], changes["chat-0"], created, deleted],
        "pools": {"chat": pool(2, 2, restarted=["chat-0"], minutes=45)},
        "services": {
            "exporter": {"delete": ["exporter-b"], "create": ["exporter-a"]},
            "gateway": {"reload": ["gw-nginx"]},
        },
        "weights": [],
        "recommendations": [],
    }
    if note:
        expected["note"] = (
            "the previous plan ran in up mode, this one in preview: values known in one and unknown in the other "
            "are not compared"
        )
    assert ordered(plan_diff(before, after, spec, "previous/plan.json")) == ordered(expected)


def test_the_diff_section_against_a_plan_without_resources(spec: StackSpec) -> None:
    # A stack with nothing in it writes no resources key: every resource is created, or deleted.
    nginx = {k: v for k, v in NGINX.items() if k != "parent"}  # written without a parent (at the top)
    full = {"mode": "preview", "resources": [nginx, CHAT[0]]}
    created = plan_diff({"mode": "preview"}, full, spec, "p")
    assert created["summary"] == {"create": 2, "update": 0, "replace": 0, "delete": 0, "unchanged": 0}
    assert created["pools"] == {"chat": pool(0, 1, added=["chat-0"])}
    assert created["services"] == {"gateway": {"create": ["gw-nginx"]}}
    deleted = plan_diff(full, {"mode": "preview"}, spec, "p")
    assert deleted["summary"] == {"create": 0, "update": 0, "replace": 0, "delete": 2, "unchanged": 0}
    assert deleted["pools"] == {"chat": pool(1, 0, removed=["chat-0"])}
    assert deleted["services"] == {"gateway": {"delete": ["gw-nginx"]}}


# --- the diff as printed ------------------------------------------------------------------------------------


def change(name: str, type_: str, op: str, **extra: Any) -> dict[str, Any]:
    return {
        "urn": urn(name, type_),
        "type": type_,
        "name": name,
        "op": op,
        "node": None,
        "parent": "",
        "changes": [],
        "replace_because": [],
        "replace_source": None,
        "delete_before_replace": False,
        "custom": True,
    } | extra


def leaf(path: str, before: str | None = None, after: str | None = None, via: str | None = None) -> dict[str, Any]:
    return {"path": path, "before": before, "after": after, "via": via}


NO_IMPACT = {"pools": {}, "services": {}, "weights": [], "recommendations": []}
COUNTS = {"create": 1, "update": 2, "replace": 2, "delete": 1, "unchanged": 90}
PRINTED = {
    "against": "out/prod/previous/plan.json",
    "note": "the previous plan ran in up mode, this one in preview",
    "resources": [
        change(
            "chat",
            "llm-cluster:index:Pool",
            "update",
            custom=False,
            changes=[leaf("spec.image", "a", "b"), leaf("nodes[0]", "n1", "n2"), leaf("spec.env", via="x")],
        ),
        change("w", W, "create", custom=False),
        change(
            "chat-0-vllm",
            C,
            "replace",
            node="gpu-03",
            changes=[
                leaf("image", "vllm:1", "vllm:2"),
                leaf("envs", via="cfg"),
                leaf("restart", None, "always"),
                leaf("labels[0].value", "a", None),
            ],
            replace_because=["image", "labels"],
            replace_source="docker provider schema: willReplaceOnChanges",
            delete_before_replace=True,
        ),
        change(
            "chat-0-health",
            CMD,
            "replace",
            changes=[leaf("triggers[0]", via="chat-0-vllm")],
            replace_because=["triggers", "replaceWith chat-0-vllm"],
            replace_source="command provider schema: replaceOnChanges",
        ),
        {
            k: v
            for k, v in change(
                "gw-config",
                CMD,
                "update",
                node="gpu-01",
                changes=[leaf("create", "<text, 3 lines>", "<text, 4 lines> (-1 +2 lines)")],
            ).items()
            if k != "custom"
        },
        change("old-image", IMG, "delete", node="gpu-06"),
    ],
    "summary": COUNTS,
    "pools": {
        "chat": pool(
            6,
            5,
            added=["chat-9"],
            removed=["chat-3", "chat-5"],
            restarted=["chat-0", "chat-1"],
            waits=["w-a", "w-b"],
            minutes=45,
        ),
        "reasoning": pool(1, 1, restarted=["reasoning-0"], minutes=30),
        "fresh": pool(0, 2, added=["fresh-0", "fresh-1"]),
    },
    "services": {"exporter": {"create": ["a", "b"], "delete": ["c"]}, "gateway": {"reload": ["gw-nginx"]}},
    "weights": [
        {"model": "qwen3", "resource": "w-a", "urn": "u", "node": "gpu-03", "op": "create", "does": "copy qwen3"},
        {"model": None, "resource": "w-b", "urn": "u", "node": None, "op": "replace", "does": "w-b"},
    ],
    "recommendations": ["first", "second"],
}


def test_the_diff_as_printed_whole() -> None:
    assert render_diff(PRINTED) == [
        "\nChanges against out/prod/previous/plan.json",
        "  note: the previous plan ran in up mode, this one in preview",
        "  ~  update  Pool         chat  (nodes, spec)",
        "  +  create  ModelWeights w",
        "  +- replace Container    chat-0-vllm on gpu-03",
        "        image: vllm:1 → vllm:2 (forces replacement)",
        "        envs: new output of cfg",
        "        restart: ∅ → always",
        "        labels[0].value: a → ∅ (forces replacement)",
        "        replaced because of image, labels: docker provider schema: willReplaceOnChanges; old one deleted first",
        "  +- replace Command      chat-0-health",
        "        triggers[0]: new output of chat-0-vllm (forces replacement)",
        "        replaced because of triggers, replaceWith chat-0-vllm: command provider schema: replaceOnChanges; "
        "new one created first",
        "  ~  update  Command      gw-config on gpu-01",
        "        create: <text, 3 lines> → <text, 4 lines> (-1 +2 lines)",
        "  -  delete  RemoteImage  old-image on gpu-06",
        "  Resources: + 1 to create · ~ 2 to update · +- 2 to replace · - 1 to delete · 90 unchanged",
        "\nService impact",
        "  pool chat: 2 of 6 instances down at once (chat-0, chat-1) for up to 45 min each (loadTimeoutMinutes: "
        "weights load, then /health), after the weights copy (w-a, w-b); removed: chat-3, chat-5; new: chat-9 (serve "
        "once loaded); 2 of 6 serving throughout",
        "  pool reasoning: 1 of 1 instances down at once (reasoning-0) for up to 30 min each (loadTimeoutMinutes: "
        "weights load, then /health); 0 of 1 serving throughout",
        "  pool fresh: new: fresh-0, fresh-1 (serve once loaded)",
        "  exporter: create a, b; delete c",
        "  gateway: reload gw-nginx",
        "  weights qwen3: w-a on gpu-03 (create) — copy qwen3",
        "  weights None: w-b on None (replace) — w-b",
        "  recommended: first",
        "  recommended: second",
    ]


def test_the_diff_as_printed_without_a_plan_to_compare() -> None:
    assert render_diff({"against": None, "note": "no previous plan"}) == ["\nChanges", "  no previous plan"]


@pytest.mark.parametrize("impact_", ["none", "pools", "services", "weights", "recommendations only"])
def test_the_diff_as_printed_says_when_nothing_restarts(impact_: str) -> None:
    diff = {"against": "p", "resources": [], "summary": {**COUNTS, "create": 0, "update": 0, "replace": 0, "delete": 0}}
    diff |= NO_IMPACT
    if impact_ in ("pools", "services", "weights"):
        diff[impact_] = PRINTED[impact_]
    if impact_ == "recommendations only":  # a GPU hand-over may be said with nothing else
        diff["recommendations"] = ["first"]
    lines = render_diff(diff)
    assert lines[:3] == ["\nChanges against p", "  Resources: 90 unchanged", "\nService impact"]
    assert ("  none: no container restarts, nothing reloads" in lines) == (impact_ in ("none", "recommendations only"))
    assert len(lines) == 3 + {"none": 1, "pools": 3, "services": 2, "weights": 2, "recommendations only": 2}[impact_]


# --- the previous plan kept between runs --------------------------------------------------------------------


def test_the_previous_plan_is_read_kept_and_parsed(tmp_path: Path) -> None:
    out = tmp_path / "out" / "prod"
    assert previous_plan(out) is None
    (out / "plan.json").mkdir(parents=True)  # not a file
    assert previous_plan(out) is None
    (out / "plan.json").rmdir()
    (out / "plan.json").write_bytes(b'{"resources": []}')
    assert previous_plan(out) == b'{"resources": []}'

    kept = tmp_path / "fresh" / "prod"  # the plan directory is emptied, then the previous plan kept under it
    assert keep_previous(kept, None) is None and not kept.exists()
    assert keep_previous(kept, b"raw") == str(kept / "previous" / "plan.json")
    assert (kept / "previous" / "plan.json").read_bytes() == b"raw"
    assert keep_previous(kept, b"again") == str(kept / "previous" / "plan.json")  # kept again over it
    assert (kept / "previous" / "plan.json").read_bytes() == b"again"


@pytest.mark.parametrize(
    ("raw", "parsed"),
    [
        (b'{"resources": [{"urn": "u"}], "stack": "prod"}', {"resources": [{"urn": "u"}], "stack": "prod"}),
        (b'{"resources": []}', {"resources": []}),
        (b'{"resources": [', None),
        (b"\xc3(", None),
        (b"[]", None),
        (b"{}", None),
        (b'{"resources": {}}', None),
        (b'{"resources": null}', None),
    ],
)
def test_a_kept_plan_is_a_plan_or_nothing(raw: bytes, parsed: dict[str, Any] | None) -> None:
    assert parse_plan(raw) == parsed
