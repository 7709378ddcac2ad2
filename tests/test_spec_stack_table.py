"""The whole stack's own rules (components/spec/stack.py) as tables: each cross-section check on both sides,
the refused side with its exact messages naming the stack key, the accepted side next to it; the node
defaults and the RAM/CPU keys each node reads; how the Pulumi config is split into sections and secrets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from components.facts.servers import REFERENCE_SERVER
from components.spec import SpecError, StackSpec
from components.spec.stack import (
    check_gateway,
    check_images,
    check_models,
    check_monitoring_and_ssh,
    check_names_and_nodes,
    check_pools,
    check_ports,
    config_sections,
    secret_in_plain_config,
    validate_sections,
)
from tests.conftest import prod_config
from tests.support import host_key

NS = "llm-cluster:"
Edit = Callable[[dict[str, Any]], Any]
NODES = "nodes are: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06"
POOLS = "pools are: reasoning, chat"
V100 = "Tesla V100-SXM2-32GB"
REF = f"{REFERENCE_SERVER.name}' {REFERENCE_SERVER.memory_gib:g} GiB"


def spec(edit: Edit = lambda s: None, secrets: tuple[str, ...] = ()) -> StackSpec:
    """The reference stack's sections (short names), edited, as the model (its own rules passed)."""
    sections = {k.removeprefix(NS): v for k, v in prod_config().items() if k.startswith(NS)}
    edit(sections)
    return validate_sections(sections, frozenset(secrets))


def said(issues: list[Any]) -> list[str]:
    return [str(i) for i in issues]


def pool(s: dict[str, Any], name: str, **values: Any) -> None:
    s["pools"][name].update(values)


def both(*edits: Edit) -> Edit:
    return lambda s: [e(s) for e in edits]


# --- names, addresses, GPUs, host keys ----------------------------------------------------------------------

NAME_WORDS = (
    "is not allowed as a name: names become container and host names, so lowercase letters, digits and '-' "
    "(a DNS label, at most 63 characters)"
)


def _rename(section: str, old: str, new: str) -> Edit:
    return lambda s: s[section].update({new: s[section].pop(old)})


def _gpus_but(*left: str) -> Edit:
    return lambda s: [s["nodes"][n].update(gpu={"model": V100, "count": 8}) for n in s["nodes"] if n not in left]


def _host_keys_but(*left: str) -> Edit:
    return lambda s: [s["nodes"][n].update(hostKey=host_key(n)) for n in s["nodes"] if n not in left]


@pytest.mark.parametrize(
    ("edit", "issues"),
    [
        (lambda s: None, []),
        (_rename("nodes", "gpu-06", "GPU-06"), [f"nodes.GPU-06: 'GPU-06' {NAME_WORDS}"]),
        (_rename("nodes", "gpu-06", "g" * 63), []),
        (_rename("nodes", "gpu-06", "g" * 64), [f"nodes.{'g' * 64}: {'g' * 64!r} {NAME_WORDS}"]),
        (_rename("pools", "chat", "Chat"), [f"pools.Chat: 'Chat' {NAME_WORDS}"]),
        (_rename("pools", "chat", "chat-2"), []),
        (_rename("models", "deepseek-r1", "DeepSeek"), [f"models.DeepSeek: 'DeepSeek' {NAME_WORDS}"]),
        (_rename("models", "deepseek-r1", "-ds"), [f"models.-ds: '-ds' {NAME_WORDS}"]),
        # Every address once; a repeat names the node that held it last.
        (
            lambda s: s["nodes"]["gpu-02"].update(address="192.168.10.11"),
            ["nodes.gpu-02.address: 192.168.10.11 is already the address of gpu-01"],
        ),
        (
            lambda s: [s["nodes"][n].update(address="192.168.10.11") for n in ("gpu-02", "gpu-03")],
            [
                "nodes.gpu-02.address: 192.168.10.11 is already the address of gpu-01",
                "nodes.gpu-03.address: 192.168.10.11 is already the address of gpu-02",
            ],
        ),
        # The GPU: the node's own or nodeDefaults', one of them.
        (
            both(_gpus_but(), lambda s: s["nodeDefaults"].pop("gpu")),
            [],
        ),
        (
            both(_gpus_but("gpu-04"), lambda s: s["nodeDefaults"].pop("gpu")),
            ["nodes.gpu-04.gpu: required here or in nodeDefaults (model and count)"],
        ),
        # Host keys: every node's, once ssh.hostKeyChecking is true; none needed while it is false.
        (both(lambda s: s["ssh"].update(hostKeyChecking=True), _host_keys_but()), []),
        (
            both(lambda s: s["ssh"].update(hostKeyChecking=True), _host_keys_but("gpu-02", "gpu-05")),
            [
                "nodes.gpu-02.hostKey: required when ssh.hostKeyChecking is true",
                "nodes.gpu-05.hostKey: required when ssh.hostKeyChecking is true",
            ],
        ),
        (lambda s: s["ssh"].update(hostKeyChecking=False), []),
    ],
)
def test_names_addresses_gpus_and_host_keys(edit: Edit, issues: list[str]) -> None:
    assert said(check_names_and_nodes(spec(edit))) == issues


# --- pools: their model, their nodes, the layout on the nodes' GPUs, the fabric, /dev/shm ----------------


@pytest.mark.parametrize(
    ("edit", "issues"),
    [
        (lambda s: None, []),
        (
            lambda s: pool(s, "chat", model="qwen3"),
            ["pools.chat.model: 'qwen3' is not a model; models are: deepseek-r1, qwen3-30b-a3b"],
        ),
        (
            lambda s: s.update(models={}),
            [
                "pools.reasoning.model: 'deepseek-r1' is not a model; models are: (none)",
                "pools.chat.model: 'qwen3-30b-a3b' is not a model; models are: (none)",
            ],
        ),
        (
            lambda s: pool(s, "chat", nodes=["gpu-03", "gpu-09", "gpu-05", "gpu-06"]),
            [f"pools.chat.nodes[1]: 'gpu-09' is not a node; {NODES}"],
        ),
        # A pool none of whose nodes exists has no layout to check.
        (
            lambda s: pool(s, "chat", nodes=["gpu-07", "gpu-08"]),
            [
                f"pools.chat.nodes[0]: 'gpu-07' is not a node; {NODES}",
                f"pools.chat.nodes[1]: 'gpu-08' is not a node; {NODES}",
            ],
        ),
        (
            both(
                lambda s: pool(s, "reasoning", nodes=["gpu-07", "gpu-08"]),
                lambda s: pool(s, "chat", tensorParallel=4, replicasPerNode=3),
            ),
            [
                f"pools.reasoning.nodes[0]: 'gpu-07' is not a node; {NODES}",
                f"pools.reasoning.nodes[1]: 'gpu-08' is not a node; {NODES}",
                "pools.chat.replicasPerNode: 3 replicas x tensorParallel 4 x pipelineParallel 1 needs more than "
                "the 8 GPUs of a node",
            ],
        ),
        # A node serves one pool: the second pool naming it is told which pool has it.
        (
            lambda s: pool(s, "chat", nodes=["gpu-03", "gpu-04", "gpu-05", "gpu-02"]),
            ["pools.chat.nodes[3]: 'gpu-02' already serves pool 'reasoning'; a node belongs to at most one pool"],
        ),
        (
            both(
                lambda s: s["pools"].update(third={**s["pools"]["chat"], "nodes": ["gpu-06", "gpu-04"]}),
                lambda s: pool(s, "chat", nodes=["gpu-03", "gpu-04", "gpu-05"]),
            ),
            ["pools.third.nodes[1]: 'gpu-04' already serves pool 'chat'; a node belongs to at most one pool"],
        ),
        # The same GPU model and count on every node of a pool.
        (
            lambda s: s["nodes"]["gpu-04"].update(gpu={"model": V100, "count": 4}),
            [
                "pools.chat.nodes: all nodes of a pool need the same GPU model and count; got "
                f"gpu-03=8x{V100}, gpu-04=4x{V100}, gpu-05=8x{V100}, gpu-06=8x{V100}"
            ],
        ),
        (
            lambda s: s["nodes"]["gpu-02"].update(gpu={"model": "Tesla V100-SXM2-16GB", "count": 8}),
            [
                "pools.reasoning.nodes: all nodes of a pool need the same GPU model and count; got "
                f"gpu-01=8x{V100}, gpu-02=8xTesla V100-SXM2-16GB"
            ],
        ),
        (lambda s: s["nodes"]["gpu-06"].update(gpu={"model": V100, "count": 8}), []),
        # A pool of mixed GPUs is not checked further; the next pool is.
        (
            both(
                lambda s: s["nodes"]["gpu-02"].update(gpu={"model": V100, "count": 4}),
                lambda s: pool(s, "chat", tensorParallel=4, replicasPerNode=3),
            ),
            [
                "pools.reasoning.nodes: all nodes of a pool need the same GPU model and count; got "
                f"gpu-01=8x{V100}, gpu-02=4x{V100}",
                "pools.chat.replicasPerNode: 3 replicas x tensorParallel 4 x pipelineParallel 1 needs more than "
                "the 8 GPUs of a node",
            ],
        ),
        # Instances of TP x PP split the pool's nodes whole.
        (
            both(
                lambda s: pool(s, "reasoning", nodes=["gpu-01", "gpu-02", "gpu-06"]),
                lambda s: pool(s, "chat", nodes=["gpu-03", "gpu-04", "gpu-05"]),
            ),
            [
                "pools.reasoning.nodes: 3 nodes do not split into instances of 2 node(s) (tensorParallel 8 x "
                "pipelineParallel 2 on 8 GPUs per node); give a multiple of 2"
            ],
        ),
        # Replicas per node: an instance across nodes is alone on them; on one node they share its GPUs.
        (
            lambda s: pool(s, "reasoning", replicasPerNode=2),
            [
                "pools.reasoning.replicasPerNode: 2 replicas per node, but an instance of tensorParallel 8 x "
                "pipelineParallel 2 spans 2 nodes (each pipeline stage on a node of its own, 8 GPUs per node): an "
                "instance across nodes is the only one on its nodes; give 1"
            ],
        ),
        (lambda s: pool(s, "reasoning", replicasPerNode=1), []),
        (lambda s: pool(s, "chat", tensorParallel=4, replicasPerNode=2), []),
        (
            lambda s: pool(s, "chat", tensorParallel=4, replicasPerNode=3),
            [
                "pools.chat.replicasPerNode: 3 replicas x tensorParallel 4 x pipelineParallel 1 needs more than "
                "the 8 GPUs of a node"
            ],
        ),
        (lambda s: pool(s, "chat", tensorParallel=1, replicasPerNode=8), []),
        (
            lambda s: pool(s, "chat", tensorParallel=8, replicasPerNode=2),
            [
                "pools.chat.replicasPerNode: 2 replicas x tensorParallel 8 x pipelineParallel 1 needs more than "
                "the 8 GPUs of a node"
            ],
        ),
        (
            lambda s: pool(s, "chat", tensorParallel=1, replicasPerNode=9),
            [
                "pools.chat.replicasPerNode: 9 replicas x tensorParallel 1 x pipelineParallel 1 needs more than "
                "the 8 GPUs of a node"
            ],
        ),
        # pipelineParallel > 1 spans nodes (a stage per node), whatever the GPUs it needs.
        (
            lambda s: pool(s, "chat", tensorParallel=1, pipelineParallel=2, replicasPerNode=4),
            [
                "pools.chat.replicasPerNode: 4 replicas per node, but an instance of tensorParallel 1 x "
                "pipelineParallel 2 spans 2 nodes (each pipeline stage on a node of its own, 8 GPUs per node): an "
                "instance across nodes is the only one on its nodes; give 1"
            ],
        ),
        # One replica takes the whole node whatever its width.
        (lambda s: pool(s, "chat", tensorParallel=8, replicasPerNode=1), []),
    ],
)
def test_pools_models_nodes_and_layout(edit: Edit, issues: list[str]) -> None:
    assert said(check_pools(spec(edit))) == issues


def _fabric_on(*nodes: str) -> Edit:
    """The HCA and interface on these nodes only (none in nodeDefaults)."""

    def edit(s: dict[str, Any]) -> None:
        hca = s["nodeDefaults"].pop("hca")
        interface = s["nodeDefaults"].pop("interface")
        for n in nodes:
            s["nodes"][n].update(hca=hca, interface=interface)

    return edit


@pytest.mark.parametrize(
    ("edit", "issues"),
    [
        # Only a pool whose instances span nodes needs the fabric, on each of its nodes.
        (_fabric_on("gpu-01", "gpu-02"), []),
        (
            _fabric_on("gpu-01"),
            [
                "nodes.gpu-02.hca: required (here or in nodeDefaults): pool 'reasoning' spans nodes",
                "nodes.gpu-02.interface: required (here or in nodeDefaults): pool 'reasoning' spans nodes",
            ],
        ),
        (
            _fabric_on(),
            [
                f"nodes.gpu-0{n}.{field}: required (here or in nodeDefaults): pool 'reasoning' spans nodes"
                for n in (1, 2)
                for field in ("hca", "interface")
            ],
        ),
        (
            both(_fabric_on("gpu-01", "gpu-02"), lambda s: s["nodes"]["gpu-02"].pop("interface")),
            ["nodes.gpu-02.interface: required (here or in nodeDefaults): pool 'reasoning' spans nodes"],
        ),
    ],
)
def test_a_pool_across_nodes_needs_their_hca_and_interface(edit: Edit, issues: list[str]) -> None:
    assert said(check_pools(spec(edit))) == issues


@pytest.mark.parametrize(
    ("edit", "issues"),
    [
        # Unset RAM: the reference server's, said as the key that would set it.
        (lambda s: pool(s, "chat", shmSizeGib=380), []),
        (
            lambda s: pool(s, "chat", shmSizeGib=381),
            [
                "pools.chat.shmSizeGib: 381 GiB of /dev/shm per container is more than the 380 GiB of RAM of node "
                f"gpu-03 (nodes.gpu-03.memoryGib, unset: {REF}); at most 380 fits"
            ],
        ),
        # Replicas on a node: each container's /dev/shm counts.
        (lambda s: pool(s, "chat", tensorParallel=4, replicasPerNode=2, shmSizeGib=190), []),
        (
            lambda s: pool(s, "chat", tensorParallel=4, replicasPerNode=2, shmSizeGib=191),
            [
                "pools.chat.shmSizeGib: 191 GiB of /dev/shm per container x 2 replicas is more than the 380 GiB of "
                f"RAM of node gpu-03 (nodes.gpu-03.memoryGib, unset: {REF}); at most 190 fits"
            ],
        ),
        # An instance across nodes has one container per node, even where its replicasPerNode is refused.
        (lambda s: pool(s, "reasoning", shmSizeGib=380), []),
        (
            lambda s: pool(s, "reasoning", shmSizeGib=200, replicasPerNode=2),
            [
                "pools.reasoning.replicasPerNode: 2 replicas per node, but an instance of tensorParallel 8 x "
                "pipelineParallel 2 spans 2 nodes (each pipeline stage on a node of its own, 8 GPUs per node): an "
                "instance across nodes is the only one on its nodes; give 1"
            ],
        ),
        (
            lambda s: pool(s, "reasoning", shmSizeGib=381),
            [
                "pools.reasoning.shmSizeGib: 381 GiB of /dev/shm per container is more than the 380 GiB of RAM of "
                f"node gpu-01 (nodes.gpu-01.memoryGib, unset: {REF}); at most 380 fits"
            ],
        ),
        # The node's own RAM, else nodeDefaults'; the first node short of it is named, once per pool.
        (
            lambda s: s["nodes"]["gpu-05"].update(memoryGib=16),
            [
                "pools.chat.shmSizeGib: 32 GiB of /dev/shm per container is more than the 16 GiB of RAM of node "
                "gpu-05 (nodes.gpu-05.memoryGib); at most 16 fits"
            ],
        ),
        (
            lambda s: s["nodeDefaults"].update(memoryGib=31.5),
            [
                "pools.reasoning.shmSizeGib: 64 GiB of /dev/shm per container is more than the 31.5 GiB of RAM of "
                "node gpu-01 (nodeDefaults.memoryGib); at most 31 fits",
                "pools.chat.shmSizeGib: 32 GiB of /dev/shm per container is more than the 31.5 GiB of RAM of node "
                "gpu-03 (nodeDefaults.memoryGib); at most 31 fits",
            ],
        ),
        (lambda s: s["nodeDefaults"].update(memoryGib=64), []),
        (
            lambda s: [s["nodes"][n].update(memoryGib=16) for n in ("gpu-04", "gpu-05")],
            [
                "pools.chat.shmSizeGib: 32 GiB of /dev/shm per container is more than the 16 GiB of RAM of node "
                "gpu-04 (nodes.gpu-04.memoryGib); at most 16 fits"
            ],
        ),
    ],
)
def test_dev_shm_fits_each_nodes_ram(edit: Edit, issues: list[str]) -> None:
    assert said(check_pools(spec(edit))) == issues


# --- models: the weights' source node, served names once -------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "issues"),
    [
        (lambda s: None, []),
        (
            lambda s: s["models"]["deepseek-r1"].update(source={"node": "gpu-09"}),
            [f"models.deepseek-r1.source.node: 'gpu-09' is not a node; {NODES}"],
        ),
        (lambda s: s["models"]["deepseek-r1"].update(source={"sharedMount": "nfs:/models"}), []),
        (lambda s: s["models"]["deepseek-r1"].update(source={"present": True}), []),
        (
            lambda s: s["models"]["qwen3-30b-a3b"].update(servedNames=["qwen3", "deepseek-r1"]),
            ["models.qwen3-30b-a3b.servedNames[1]: 'deepseek-r1' is already a served name of model 'deepseek-r1'"],
        ),
        (lambda s: s["models"]["qwen3-30b-a3b"].update(servedNames=["qwen3", "deepseek"]), []),
        # A model without servedNames is served by its key: the key is what repeats another model's name.
        (
            both(
                lambda s: s["models"]["qwen3-30b-a3b"].pop("servedNames"),
                lambda s: s["models"]["deepseek-r1"].update(servedNames=["deepseek-r1", "qwen3-30b-a3b"]),
            ),
            [
                "models.qwen3-30b-a3b: 'qwen3-30b-a3b' (the model's key, its served name while servedNames is unset) "
                "is already a served name of model 'deepseek-r1'"
            ],
        ),
    ],
)
def test_models_source_node_and_served_names(edit: Edit, issues: list[str]) -> None:
    assert said(check_models(spec(edit))) == issues


def test_served_names_default_to_the_model_key() -> None:
    s = spec(lambda s: s["models"]["qwen3-30b-a3b"].pop("servedNames"))
    assert s.served_names("qwen3-30b-a3b") == ["qwen3-30b-a3b"]
    assert s.served_names("deepseek-r1") == ["deepseek-r1", "/data/models/DeepSeek-R1-GPTQ-Int4"]


# --- the gateway's references and secrets ------------------------------------------------------------------


def gw(**values: Any) -> Edit:
    return lambda s: s["gateway"].update(values)


@pytest.mark.parametrize(
    ("edit", "secrets", "issues"),
    [
        (lambda s: None, (), []),
        (gw(node="gpu-09"), (), [f"gateway.node: 'gpu-09' is not a node; {NODES}"]),
        (gw(defaultPool="chatty"), (), [f"gateway.defaultPool: 'chatty' is not a pool; {POOLS}"]),
        (
            gw(pathRoutes={"/smart/v1/": "reasoning", "/fast/v1/": "fast"}),
            (),
            [f"gateway.pathRoutes./fast/v1/: 'fast' is not a pool; {POOLS}"],
        ),
        (gw(aliases={"smart": "reasoning"}), (), []),
        (gw(aliases={"smart": "smarter"}), (), [f"gateway.aliases.smart: 'smarter' is not a pool; {POOLS}"]),
        (
            gw(aliases={"qwen3-30b-a3b": "chat"}),
            (),
            ["gateway.aliases.qwen3-30b-a3b: 'qwen3-30b-a3b' is already a served name of model 'qwen3-30b-a3b'"],
        ),
        (
            gw(apiKeys=[{"id": "a"}, {"id": "b"}, {"id": "a"}, {"id": "b"}]),
            (),
            ["gateway.apiKeys[2].id: 'a' is used by another key", "gateway.apiKeys[3].id: 'b' is used by another key"],
        ),
        # A key's models: served names, pools and aliases.
        (
            gw(aliases={"smart": "reasoning"}, apiKeys=[{"id": "a", "models": ["deepseek-r1", "chat", "smart"]}]),
            (),
            [],
        ),
        (
            gw(apiKeys=[{"id": "a", "models": ["deepseek-r1", "qwen"]}]),
            (),
            [
                "gateway.apiKeys[0].models[1]: 'qwen' names no served model, alias or pool; allowed: "
                "/data/models/DeepSeek-R1-GPTQ-Int4, /data/models/Qwen3-30B-A3B, chat, deepseek-r1, qwen3-30b-a3b, "
                "reasoning"
            ],
        ),
        (
            gw(aliases={"smart": "reasoning"}, apiKeys=[{"id": "a", "models": ["smarter"]}]),
            (),
            [
                "gateway.apiKeys[0].models[0]: 'smarter' names no served model, alias or pool; allowed: "
                "/data/models/DeepSeek-R1-GPTQ-Int4, /data/models/Qwen3-30B-A3B, chat, deepseek-r1, qwen3-30b-a3b, "
                "reasoning, smart"
            ],
        ),
        # auth and its keys' secret.
        (gw(auth=False, apiKeys=[]), (), []),
        (gw(apiKeys=[]), ("gatewayApiKeys",), []),
        (
            gw(auth=False, apiKeys=[]),
            ("gatewayApiKeys",),
            [
                "gateway.auth: is false but the secret gatewayApiKeys is set: the keys would never be checked; "
                "remove the secret (pulumi config rm gatewayApiKeys) or set auth: true"
            ],
        ),
        # TLS: both secrets or neither, and only with tls: true.
        (lambda s: None, ("gatewayTlsCert", "gatewayTlsKey"), []),
        *(
            (
                lambda s: None,
                (secret,),
                [
                    f"gateway.tls: the secret {secret} is set without its pair: set both gatewayTlsCert and "
                    "gatewayTlsKey (pulumi config set --secret gatewayTlsCert < cert.pem), or neither to have a "
                    "certificate made on the gateway host"
                ],
            )
            for secret in ("gatewayTlsCert", "gatewayTlsKey")
        ),
        (gw(tls=False, port=80), (), []),
        (
            gw(tls=False, port=80),
            ("gatewayTlsCert", "gatewayTlsKey"),
            [
                "gateway.tls: is false but the secrets gatewayTlsCert/gatewayTlsKey are set: set tls: true or remove them"
            ],
        ),
        (
            gw(tls=False, port=80),
            ("gatewayTlsKey",),
            [
                "gateway.tls: the secret gatewayTlsKey is set without its pair: set both gatewayTlsCert and "
                "gatewayTlsKey (pulumi config set --secret gatewayTlsCert < cert.pem), or neither to have a "
                "certificate made on the gateway host",
                "gateway.tls: is false but the secrets gatewayTlsCert/gatewayTlsKey are set: set tls: true or remove "
                "them",
            ],
        ),
        # The HTTP port that redirects to HTTPS: with TLS, and not the gateway's own port.
        (gw(httpRedirectPort=80), (), []),
        (
            gw(tls=False, port=8080, httpRedirectPort=80),
            (),
            ["gateway.httpRedirectPort: redirects to HTTPS, which needs tls: true"],
        ),
        (
            gw(httpRedirectPort=443),
            (),
            ["gateway.httpRedirectPort: is the gateway's own port 443; pick another or leave it unset"],
        ),
        (
            gw(tls=False, port=80, httpRedirectPort=80),
            (),
            [
                "gateway.httpRedirectPort: redirects to HTTPS, which needs tls: true",
                "gateway.httpRedirectPort: is the gateway's own port 80; pick another or leave it unset",
            ],
        ),
        (lambda s: s.pop("gateway"), ("gatewayTlsCert", "gatewayApiKeys"), []),
    ],
)
def test_gateway_references_and_secrets(edit: Edit, secrets: tuple[str, ...], issues: list[str]) -> None:
    assert said(check_gateway(spec(edit, secrets))) == issues


# --- monitoring's node, SSH's credentials, the registry's secrets, host ports ----------------------------


@pytest.mark.parametrize(
    ("edit", "secrets", "issues"),
    [
        (lambda s: None, (), []),
        (
            lambda s: s["monitoring"].update(node="gpu-09"),
            (),
            [f"monitoring.node: 'gpu-09' is not a node; {NODES}"],
        ),
        (lambda s: s.pop("monitoring"), (), []),
        # Some way to log in: the agent, a key file, or the secret key.
        (
            lambda s: s["ssh"].update(agent=False),
            (),
            [
                "ssh.agent: is false but neither ssh.keyPath nor the secret sshPrivateKey is given: the nodes could "
                "not be reached; use the agent, a key file, or the secret key"
            ],
        ),
        (lambda s: s["ssh"].update(agent=False, keyPath="~/.ssh/id_ed25519"), (), []),
        (lambda s: s["ssh"].update(agent=False), ("sshPrivateKey",), []),
        (lambda s: s["ssh"].update(agent=True), (), []),
    ],
)
def test_monitoring_node_and_ssh_credentials(edit: Edit, secrets: tuple[str, ...], issues: list[str]) -> None:
    assert said(check_monitoring_and_ssh(spec(edit, secrets))) == issues


def registry(s: dict[str, Any]) -> None:
    s["images"] = {"registry": "registry.local:5000"}


@pytest.mark.parametrize(
    ("edit", "secrets", "issues"),
    [
        (lambda s: None, (), []),
        (registry, (), []),
        (registry, ("registryUsername", "registryPassword"), []),
        *(
            (
                lambda s: None,
                (secret,),
                [
                    f"images.registry: the secret {secret} is set but no registry is: state images.registry "
                    f"(host[:port][/prefix]) or remove the secret (pulumi config rm {secret})"
                ],
            )
            for secret in ("registryUsername", "registryPassword")
        ),
        (
            lambda s: None,
            ("registryUsername", "registryPassword"),
            [
                "images.registry: the secret registryPassword and registryUsername is set but no registry is: state "
                "images.registry (host[:port][/prefix]) or remove the secret (pulumi config rm registryPassword)"
            ],
        ),
        *(
            (
                registry,
                (given,),
                [
                    f"images.registry: the secret {given} is set without {missing}: set both (pulumi config set "
                    f"--secret {missing}), or neither for a registry without auth"
                ],
            )
            for given, missing in (("registryUsername", "registryPassword"), ("registryPassword", "registryUsername"))
        ),
    ],
)
def test_registry_credentials(edit: Edit, secrets: tuple[str, ...], issues: list[str]) -> None:
    assert said(check_images(spec(edit, secrets))) == issues


@pytest.mark.parametrize(
    ("edit", "issues"),
    [
        (lambda s: None, []),
        # The gateway shares gpu-01 with the reasoning pool's head: its ports come after the pools'.
        (
            gw(metricsPort=8000),
            ["gateway.metricsPort: port 8000 on gpu-01 is already taken by pools.reasoning.port"],
        ),
        (gw(metricsPort=8001), []),
        # The same port on two nodes is two listeners.
        (lambda s: pool(s, "chat", port=6379), []),
        (
            lambda s: pool(s, "reasoning", rayDashboardPort=6379),
            ["pools.reasoning.rayDashboardPort: port 6379 on gpu-01 is already taken by pools.reasoning.rayPort"],
        ),
        (
            gw(port=8000, metricsPort=8000),
            [
                "gateway.port: port 8000 on gpu-01 is already taken by pools.reasoning.port",
                "gateway.metricsPort: port 8000 on gpu-01 is already taken by pools.reasoning.port",
            ],
        ),
    ],
)
def test_each_host_listener_has_its_own_port(edit: Edit, issues: list[str]) -> None:
    assert said(check_ports(spec(edit))) == issues


# --- what each node reads from itself or nodeDefaults --------------------------------------------------------


FILLED = ("gpu", "hca", "interface", "driverMinVersion", "diskPath", "minFreeDiskGib", "memoryGib", "cpuCores")
DEFAULTS = {
    "gpu": {"model": V100, "count": 8},
    "hca": {"device": "mlx5_0", "port": 1, "linkLayer": "ethernet", "gidIndex": 3, "rateGbps": 200},
    "interface": "bond0",
    "driverMinVersion": "560.28.03",
    "diskPath": "/data",
    "minFreeDiskGib": 100,
    "memoryGib": 512.0,
    "cpuCores": 96,
}
OWN = {
    "gpu": {"model": V100, "count": 8},
    "hca": {"device": "mlx5_1", "port": 2, "linkLayer": "infiniband", "rateGbps": 400},
    "interface": "eth1",
    "driverMinVersion": "570",
    "diskPath": "/scratch",
    "minFreeDiskGib": 7,
    "memoryGib": 256.0,
    "cpuCores": 48,
}


def _node_keys(s: StackSpec, name: str) -> dict[str, Any]:
    dumped = s.node(name).model_dump(by_alias=True, exclude_none=True)
    return {k: dumped[k] for k in FILLED if k in dumped}


def test_a_node_takes_each_default_it_does_not_state() -> None:
    def edit(s: dict[str, Any]) -> None:
        s["nodeDefaults"] = dict(DEFAULTS)
        s["nodes"]["gpu-06"].update(OWN)
        s["nodes"]["gpu-05"].update(interface="eth5", cpuCores=8)

    s = spec(edit)
    hca = {"minWriteBandwidthGbps": None} | DEFAULTS["hca"]
    assert _node_keys(s, "gpu-01") == {**DEFAULTS, "hca": {k: v for k, v in hca.items() if v is not None}}
    assert _node_keys(s, "gpu-06") == OWN
    assert _node_keys(s, "gpu-05") == {**_node_keys(s, "gpu-01"), "interface": "eth5", "cpuCores": 8}
    assert s.node("gpu-05").address == "192.168.10.15"  # the node's own keys stay
    assert s.nodes["gpu-05"].gpu is None  # the stated node itself is not changed


@pytest.mark.parametrize(
    ("own", "default", "memory", "cpus"),
    [
        (
            {},
            {},
            (380.0, f"nodes.gpu-02.memoryGib, unset: {REF}"),
            (80, f"nodes.gpu-02.cpuCores, unset: {REFERENCE_SERVER.name}' 80"),
        ),
        ({}, {"memoryGib": 64, "cpuCores": 16}, (64.0, "nodeDefaults.memoryGib"), (16, "nodeDefaults.cpuCores")),
        (
            {"memoryGib": 128, "cpuCores": 32},
            {"memoryGib": 64, "cpuCores": 16},
            (128.0, "nodes.gpu-02.memoryGib"),
            (32, "nodes.gpu-02.cpuCores"),
        ),
        ({"memoryGib": 0.5, "cpuCores": 1}, {}, (0.5, "nodes.gpu-02.memoryGib"), (1, "nodes.gpu-02.cpuCores")),
    ],
)
def test_a_nodes_ram_and_cpus_with_the_key_that_sets_them(
    own: dict[str, Any], default: dict[str, Any], memory: tuple[float, str], cpus: tuple[int, str]
) -> None:
    s = spec(both(lambda s: s["nodes"]["gpu-02"].update(own), lambda s: s["nodeDefaults"].update(default)))
    assert s.node_memory("gpu-02") == memory
    assert isinstance(s.node_memory("gpu-02")[0], float)
    assert s.node_cpus("gpu-02") == cpus


# --- the Pulumi config: sections, secrets, namespaces --------------------------------------------------------

SECRETS = (
    "alertmanagerConfig, gatewayApiKeys, gatewayTlsCert, gatewayTlsKey, grafanaAdminPassword, registryPassword, "
    "registryUsername, sshPrivateKey, sshPrivateKeyPassword"
)
# SECRET_KEYS' own order, as the refusal of a secret in plain config lists them.
SECRET_ORDER = (
    "sshPrivateKey",
    "sshPrivateKeyPassword",
    "gatewayApiKeys",
    "gatewayTlsCert",
    "gatewayTlsKey",
    "grafanaAdminPassword",
    "alertmanagerConfig",
    "registryUsername",
    "registryPassword",
)


def test_config_sections_and_secret_names() -> None:
    config = {
        "docker:host": "ssh://x",  # another namespace's own key: not this project's, and the next keys still read
        NS + "nodes": '{"gpu-01": {"address": "192.168.10.11"}}',  # the engine hands structured values as JSON
        NS + "ssh": "not json {",  # left as written, for the section's model to refuse
        NS + "pools": {"chat": {}},
        NS + "sshPrivateKey": "[secret]",
        NS + "gatewayApiKeys": "[secret]",
        "other:thing": 1,
    }
    sections, secrets = config_sections(config, {NS + "sshPrivateKey", NS + "gatewayApiKeys"})
    assert sections == {"nodes": {"gpu-01": {"address": "192.168.10.11"}}, "ssh": "not json {", "pools": {"chat": {}}}
    assert secrets == frozenset({"sshPrivateKey", "gatewayApiKeys"})


@pytest.mark.parametrize(
    ("config", "secret_keys", "issues"),
    [
        (
            {NS + "pool": {}},
            set(),
            [
                f"{NS}pool: unknown config key; allowed: {NS}ssh, {NS}nodeDefaults, {NS}nodes, {NS}nccl, {NS}models, "
                f"{NS}pools, {NS}gateway, {NS}monitoring, {NS}firewall, {NS}preflight, {NS}images, "
                + ", ".join(NS + k for k in SECRETS.split(", "))
            ],
        ),
        *(
            (
                {f"{namespace}:{key}": {}},
                set(),
                [
                    f"{namespace}:{key}: the namespace {namespace!r} is not allowed: this project reads {NS}{key} (its "
                    "namespace is the project name, llm-cluster)"
                ],
            )
            for namespace, key in (
                ("llm", "nodes"),
                ("llm-clusters", "images"),
                ("docker", "sshPrivateKey"),
                ("org:llm-cluster", "pools"),
            )
        ),
        ({"docker:host": "x", "docker:registryAuth": "y", "nodes": {}}, set(), []),
        *(
            (
                {NS + key: "x"},
                set(),
                [f"{NS}{key}: must be a secret: set it with `pulumi config set --secret {key}` ({words})"],
            )
            for key, words in (
                ("sshPrivateKey", "SSH private key (PEM/OpenSSH) used for every node"),
                ("gatewayApiKeys", 'JSON object {"<key id>": "<api key>"} for the gateway'),
                ("registryPassword", "password or token for images.registry"),
            )
        ),
        ({NS + "gatewayApiKeys": "x"}, {NS + "gatewayApiKeys"}, []),
        *(
            (
                {NS + key: "[secret]"},
                {NS + key},
                [
                    f"{NS}{key}: a secret is not allowed here: {key} is plain config, stated in the stack file "
                    f"(secrets are only {', '.join(NS + k for k in SECRET_ORDER)})"
                ],
            )
            for key in ("pools", "images")
        ),
    ],
)
def test_config_keys_refused(config: dict[str, Any], secret_keys: set[str], issues: list[str]) -> None:
    if not issues:
        config_sections(config, secret_keys)
        return
    with pytest.raises(SpecError) as err:
        config_sections(config, secret_keys)
    assert said(err.value.issues) == issues


def test_a_secret_inside_a_plain_section_names_where() -> None:
    assert str(secret_in_plain_config("pools.chat.env.TOKEN", "pools")) == (
        "pools.chat.env.TOKEN: a secret is not allowed here: pools is plain config, stated in the stack file "
        f"(secrets are only {', '.join(NS + k for k in SECRET_ORDER)})"
    )


def test_every_config_key_issue_is_reported_at_once() -> None:
    config = {"docker:host": "x", NS + "pools": "[secret]", NS + "pool": {}, NS + "sshPrivateKey": "x", "llm:nodes": {}}
    with pytest.raises(SpecError) as err:
        config_sections(config, {NS + "pools"})
    assert [i.path for i in err.value.issues] == [NS + "pools", NS + "pool", NS + "sshPrivateKey", "llm:nodes"]


def test_the_models_own_refusals_come_as_a_spec_error_with_the_secrets_kept() -> None:
    sections = {k.removeprefix(NS): v for k, v in prod_config().items() if k.startswith(NS)}
    assert validate_sections(sections, frozenset({"sshPrivateKey"})).secrets == frozenset({"sshPrivateKey"})
    sections["nodes"]["gpu-01"]["address"] = "gpu-01.local"
    with pytest.raises(SpecError) as err:
        validate_sections(sections)
    assert said(err.value.issues) == ["nodes.gpu-01.address: 'gpu-01.local' is not an IPv4 address"]
