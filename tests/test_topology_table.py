"""Every parallel layout the topology rules cover, each as the instances it plans: which nodes, head, port,
GPUs and launcher each serving instance gets; and every host listener the stack puts on a node."""

from __future__ import annotations

from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from components.spec.topology import (
    affinity_pools,
    host_ports,
    instances,
    launcher_of,
    nodes_per_instance,
    pool_routing,
    resource_suffix,
    weights_nodes,
)
from tests.conftest import prod_config

NS = "llm-cluster:"
CHAT_NODES = ("gpu-03", "gpu-04", "gpu-05", "gpu-06")
# An instance as compared: (name, nodes, port, tensorParallel, pipelineParallel, GPU ids, launcher, master port).
Row = tuple[str, tuple[str, ...], int, int, int, tuple[int, ...] | None, str, int | None]


def chat_spec(gpus: int = 8, vllm: dict[str, Any] | None = None, **pool: Any) -> StackSpec:
    """The reference stack with its chat pool (gpu-03..06) set to a layout, on nodes of `gpus` V100s."""
    config = prod_config()
    chat = config[NS + "pools"]["chat"]
    chat.update(pool)
    chat["vllm"].update(vllm or {})
    for n in CHAT_NODES:
        config[NS + "nodes"][n]["gpu"] = {"model": "Tesla V100-SXM2-32GB", "count": gpus}
    return load_stack_config(config, set())


def rows(spec: StackSpec, pool: str = "chat") -> list[Row]:
    return [
        (i.name, i.nodes, i.port, i.tensor_parallel, i.pipeline_parallel, i.gpu_ids, i.launcher, i.master_port)
        for i in instances(spec, pool)
    ]


def single(tp: int, port: int = 8000) -> list[Row]:
    """One instance per chat node, on all of its GPUs."""
    return [(f"chat-{n}", (n,), port, tp, 1, None, "single", None) for n in CHAT_NODES]


LAYOUTS: list[tuple[str, dict[str, Any], list[Row]]] = [
    ("TP 8 on 8 GPUs: one instance per node", {"tensorParallel": 8}, single(8)),
    ("TP 4 on 8 GPUs, one replica: all GPUs still its own", {"tensorParallel": 4}, single(4)),
    ("TP 8 on 8 GPUs from port 9000", {"tensorParallel": 8, "port": 9000}, single(8, 9000)),
    (
        "TP 2 x 4 replicas per node: ports port+r, GPUs in pairs",
        {"tensorParallel": 2, "replicasPerNode": 4, "port": 9000},
        [
            (f"chat-{n}-r{r}", (n,), 9000 + r, 2, 1, (2 * r, 2 * r + 1), "single", None)
            for n in CHAT_NODES
            for r in range(4)
        ],
    ),
    (
        "TP 1 x 3 replicas per node: three GPUs of eight, the rest unused",
        {"tensorParallel": 1, "replicasPerNode": 3},
        [(f"chat-{n}-r{r}", (n,), 8000 + r, 1, 1, (r,), "single", None) for n in CHAT_NODES for r in range(3)],
    ),
    (
        "TP 2 x 2 replicas per node on 4 GPUs",
        {"gpus": 4, "tensorParallel": 2, "replicasPerNode": 2},
        [
            (f"chat-{n}-r{r}", (n,), 8000 + r, 2, 1, (2 * r, 2 * r + 1), "single", None)
            for n in CHAT_NODES
            for r in range(2)
        ],
    ),
    (
        "TP 4 x PP 2 on 8 GPUs: PP alone makes it span two nodes, on Ray",
        {"tensorParallel": 4, "pipelineParallel": 2},
        [
            ("chat-gpu-03", ("gpu-03", "gpu-04"), 8000, 4, 2, None, "ray", None),
            ("chat-gpu-05", ("gpu-05", "gpu-06"), 8000, 4, 2, None, "ray", None),
        ],
    ),
    (
        "TP 8 x PP 2 on 8 GPUs: two nodes, on Ray",
        {"tensorParallel": 8, "pipelineParallel": 2},
        [
            ("chat-gpu-03", ("gpu-03", "gpu-04"), 8000, 8, 2, None, "ray", None),
            ("chat-gpu-05", ("gpu-05", "gpu-06"), 8000, 8, 2, None, "ray", None),
        ],
    ),
    (
        "TP 16 on 8 GPUs: TP alone spans two nodes",
        {"tensorParallel": 16},
        [
            ("chat-gpu-03", ("gpu-03", "gpu-04"), 8000, 16, 1, None, "ray", None),
            ("chat-gpu-05", ("gpu-05", "gpu-06"), 8000, 16, 1, None, "ray", None),
        ],
    ),
    (
        "TP 12 on 8 GPUs: a part node counts as a whole one",
        {"tensorParallel": 12},
        [
            ("chat-gpu-03", ("gpu-03", "gpu-04"), 8000, 12, 1, None, "ray", None),
            ("chat-gpu-05", ("gpu-05", "gpu-06"), 8000, 12, 1, None, "ray", None),
        ],
    ),
    (
        "TP 8 on 4 GPUs: two nodes",
        {"gpus": 4, "tensorParallel": 8},
        [
            ("chat-gpu-03", ("gpu-03", "gpu-04"), 8000, 8, 1, None, "ray", None),
            ("chat-gpu-05", ("gpu-05", "gpu-06"), 8000, 8, 1, None, "ray", None),
        ],
    ),
    (
        "TP 8 x PP 2 on 4 GPUs: the GPUs, not PP, make it four nodes",
        {"gpus": 4, "tensorParallel": 8, "pipelineParallel": 2},
        [("chat-gpu-03", CHAT_NODES, 8000, 8, 2, None, "ray", None)],
    ),
    (
        "TP 1 x PP 4 on 8 GPUs: four nodes of one GPU each",
        {"tensorParallel": 1, "pipelineParallel": 4},
        [("chat-gpu-03", CHAT_NODES, 8000, 1, 4, None, "ray", None)],
    ),
    (
        "TP 4 x PP 2 on vLLM's own launcher: its master port on the head",
        {"tensorParallel": 4, "pipelineParallel": 2, "vllm": {"multiNode": "native", "masterPort": 29600}},
        [
            ("chat-gpu-03", ("gpu-03", "gpu-04"), 8000, 4, 2, None, "native", 29600),
            ("chat-gpu-05", ("gpu-05", "gpu-06"), 8000, 4, 2, None, "native", 29600),
        ],
    ),
]


@pytest.mark.parametrize(("layout", "pool", "expected"), LAYOUTS, ids=[row[0] for row in LAYOUTS])
def test_every_parallel_layout_plans_its_instances(layout: str, pool: dict[str, Any], expected: list[Row]) -> None:
    spec = chat_spec(**pool)
    got = rows(spec)
    assert got == expected, layout
    # Each instance's head is its first node; it spans nodes, on Ray or natively, exactly when it has several.
    for inst in instances(spec, "chat"):
        assert inst.head == inst.nodes[0]
        assert inst.spans_nodes == (len(inst.nodes) > 1)
        assert inst.uses_ray == (len(inst.nodes) > 1 and inst.launcher == "ray")
        assert inst.native_launcher == (len(inst.nodes) > 1 and inst.launcher == "native")


SPANS = [
    # (tensorParallel, pipelineParallel, GPUs per node, nodes per instance)
    (8, 1, 8, 1),
    (4, 1, 8, 1),
    (1, 1, 8, 1),
    (9, 1, 8, 2),
    (16, 1, 8, 2),
    (12, 1, 8, 2),
    (16, 1, 4, 4),
    (4, 2, 8, 2),
    (1, 4, 8, 4),
    (8, 2, 8, 2),
    (8, 2, 4, 4),
    (3, 3, 4, 3),
    (6, 1, 4, 2),
    (16, 2, 8, 4),
]


@pytest.mark.parametrize(("tp", "pp", "gpus", "span"), SPANS)
def test_nodes_per_instance_is_the_gpus_over_a_node_at_least_pp(tp: int, pp: int, gpus: int, span: int) -> None:
    pool = chat_spec(tensorParallel=8).pools["chat"].model_copy(update={"tensor_parallel": tp, "pipeline_parallel": pp})
    assert nodes_per_instance(pool, gpus) == span


def test_launcher_of_each_engine_and_one_not_deployed() -> None:
    spec = chat_spec(tensorParallel=4, pipelineParallel=2, vllm={"multiNode": "native", "masterPort": 29600})
    native = launcher_of(spec.pools["chat"])
    assert (native.kind, native.port, native.port_key) == ("native", 29600, "vllm.masterPort")
    assert launcher_of(spec.pools["reasoning"]).kind == "ray"
    # An engine the project knows by name only has no launcher: its pool is refused, never started across nodes.
    assert launcher_of(spec.pools["chat"].model_copy(update={"engine": "sglang"})).kind == "none"


def test_host_ports_lists_every_listener_with_its_stack_key() -> None:
    config = prod_config()
    chat = config[NS + "pools"]["chat"]
    chat.update(tensorParallel=4, pipelineParallel=2, port=9000)
    chat["vllm"].update(multiNode="native", masterPort=29600)
    reasoning = config[NS + "pools"]["reasoning"]
    reasoning.update(rayPort=6400, rayDashboardPort=8300, rayClientPort=10100, port=8100)
    config[NS + "gateway"].update(port=8443, metricsPort=9146, httpRedirectPort=8080)
    config[NS + "monitoring"].update(
        dcgmExporter={"image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", "port": 9401},
        nodeExporter={"image": "prom/node-exporter:v1.8.2", "port": 9101},
        prometheus={"image": "prom/prometheus:v2.55.1", "port": 9091},
        grafana={"image": "grafana/grafana:11.3.0", "port": 3001},
        alertmanager={"image": "prom/alertmanager:v0.27.0", "port": 9093},
    )
    config[NS + "alertmanagerConfig"] = "route: {receiver: x}\nreceivers: [{name: x}]\n"
    spec = load_stack_config(config, {NS + "alertmanagerConfig"})
    exporters = [
        (n, port, key)
        for n in ("gpu-01", "gpu-02", *CHAT_NODES)
        for port, key in ((9401, "monitoring.dcgmExporter.port"), (9101, "monitoring.nodeExporter.port"))
    ]
    assert host_ports(spec) == [
        ("gpu-01", 8100, "pools.reasoning.port"),
        ("gpu-01", 6400, "pools.reasoning.rayPort"),
        ("gpu-01", 8300, "pools.reasoning.rayDashboardPort"),
        ("gpu-01", 10100, "pools.reasoning.rayClientPort"),
        ("gpu-03", 9000, "pools.chat.port"),
        ("gpu-03", 29600, "pools.chat.vllm.masterPort"),
        ("gpu-05", 9000, "pools.chat.port"),
        ("gpu-05", 29600, "pools.chat.vllm.masterPort"),
        ("gpu-01", 8443, "gateway.port"),
        ("gpu-01", 9146, "gateway.metricsPort"),
        ("gpu-01", 8080, "gateway.httpRedirectPort"),
        *exporters,
        ("gpu-01", 9091, "monitoring.prometheus.port"),
        ("gpu-01", 3001, "monitoring.grafana.port"),
        ("gpu-01", 9093, "monitoring.alertmanager.port"),
    ]


def test_host_ports_of_replicas_without_gateway_or_monitoring() -> None:
    config = prod_config()
    config[NS + "pools"]["chat"].update(tensorParallel=4, replicasPerNode=2)
    del config[NS + "gateway"], config[NS + "monitoring"]
    spec = load_stack_config(config, set())
    assert host_ports(spec) == [
        ("gpu-01", 8000, "pools.reasoning.port"),
        ("gpu-01", 6379, "pools.reasoning.rayPort"),
        ("gpu-01", 8265, "pools.reasoning.rayDashboardPort"),
        ("gpu-01", 10001, "pools.reasoning.rayClientPort"),
        *[(n, 8000 + r, "pools.chat.port") for n in CHAT_NODES for r in range(2)],
    ]


@pytest.mark.parametrize(
    ("text", "suffix"),
    [
        ("vllm/vllm-openai:v0.9.2", "vllm-openai-v0-9-2"),
        ("/data/models/Qwen3-30B-A3B/", "qwen3-30b-a3b"),
        ("/data/models/DeepSeek-R1-GPTQ-Int4", "deepseek-r1-gptq-int4"),
        ("ghcr.io/ggml-org/llama.cpp:server-cuda-b11312", "llama-cpp-server-cuda-b11312"),
        ("-weights_v2.", "weights-v2"),
        ("/data/models/Mixtral-8x7B-MAX", "mixtral-8x7b-max"),  # an X the trailing-slash strip must keep
        ("plain", "plain"),
    ],
)
def test_resource_suffix(text: str, suffix: str) -> None:
    assert resource_suffix(text) == suffix


def test_weights_nodes_source_first_then_the_pools_nodes_once() -> None:
    config = prod_config()
    models = config[NS + "models"]
    models["qwen3-30b-a3b"]["source"] = {"node": "gpu-05"}
    spec = load_stack_config(config, set())
    assert weights_nodes(spec, "qwen3-30b-a3b") == ["gpu-05", "gpu-03", "gpu-04", "gpu-06"]
    assert weights_nodes(spec, "deepseek-r1") == ["gpu-01", "gpu-02"]
    # Weights already on every node: the pools' own nodes, in order.
    models["qwen3-30b-a3b"]["source"] = {"present": True}
    spec = load_stack_config(config, set())
    assert weights_nodes(spec, "qwen3-30b-a3b") == list(CHAT_NODES)


def test_routing_and_affinity_pools() -> None:
    config = prod_config()
    spec = load_stack_config(config, set())
    assert [pool_routing(spec, p) for p in spec.pools] == ["prefix", "prefix"]
    # The reasoning pool is one instance: nothing to keep affinity between.
    assert affinity_pools(spec) == ["chat"]
    config[NS + "pools"]["chat"]["routing"] = "least_conn"
    config[NS + "pools"]["reasoning"]["routing"] = "prefix"
    spec = load_stack_config(config, set())
    assert [pool_routing(spec, p) for p in spec.pools] == ["prefix", "least_conn"]
    assert affinity_pools(spec) == []
    config[NS + "pools"]["reasoning"]["nodes"] = ["gpu-01", "gpu-02"]
    config[NS + "pools"]["chat"]["routing"] = None
    config[NS + "gateway"]["routing"] = {"policy": "least_conn"}
    spec = load_stack_config(config, set())
    assert [pool_routing(spec, p) for p in spec.pools] == ["prefix", "least_conn"]
    # Two instances are enough to choose from; one is not.
    config[NS + "pools"]["chat"].update(routing="prefix", tensorParallel=16)
    spec = load_stack_config(config, set())
    assert len(instances(spec, "chat")) == 2
    assert affinity_pools(spec) == ["chat"]
    del config[NS + "gateway"]
    assert affinity_pools(load_stack_config(config, set())) == []


GPUS_OF_A_NODE = "needs more than the 8 GPUs of a node"
# The layout rules of the pools (components.spec.stack.check_pools), both sides of each:
# (layout, chat pool keys, RAM of each chat node or None, the issues; [] = accepted).
LAYOUT_RULES: list[tuple[str, dict[str, Any], float | None, list[str]]] = [
    ("4 nodes in instances of 2", {"tensorParallel": 16}, None, []),
    (
        "3 nodes in instances of 2",
        {"tensorParallel": 16, "nodes": ["gpu-03", "gpu-04", "gpu-05"]},
        None,
        [
            "pools.chat.nodes: 3 nodes do not split into instances of 2 node(s) (tensorParallel 16 x "
            "pipelineParallel 1 on 8 GPUs per node); give a multiple of 2"
        ],
    ),
    (
        "4 nodes in instances of 4 (PP 4)",
        {"tensorParallel": 1, "pipelineParallel": 4},
        None,
        [],
    ),
    (
        "2 nodes in instances of 4 (PP 4)",
        {"tensorParallel": 1, "pipelineParallel": 4, "nodes": ["gpu-03", "gpu-04"]},
        None,
        [
            "pools.chat.nodes: 2 nodes do not split into instances of 4 node(s) (tensorParallel 1 x "
            "pipelineParallel 4 on 8 GPUs per node); give a multiple of 4"
        ],
    ),
    ("4 replicas x TP 2: 8 GPUs of 8", {"tensorParallel": 2, "replicasPerNode": 4}, None, []),
    ("2 replicas x TP 4: 8 GPUs of 8", {"tensorParallel": 4, "replicasPerNode": 2}, None, []),
    (
        "5 replicas x TP 2: 10 GPUs of 8",
        {"tensorParallel": 2, "replicasPerNode": 5},
        None,
        [f"pools.chat.replicasPerNode: 5 replicas x tensorParallel 2 x pipelineParallel 1 {GPUS_OF_A_NODE}"],
    ),
    (
        "3 replicas x TP 3: 9 GPUs of 8",
        {"tensorParallel": 3, "replicasPerNode": 3},
        None,
        [f"pools.chat.replicasPerNode: 3 replicas x tensorParallel 3 x pipelineParallel 1 {GPUS_OF_A_NODE}"],
    ),
    (
        "2 replicas of an instance spanning nodes",
        {"tensorParallel": 4, "pipelineParallel": 2, "replicasPerNode": 2},
        None,
        [
            "pools.chat.replicasPerNode: 2 replicas per node, but an instance of tensorParallel 4 x pipelineParallel 2 "
            "spans 2 nodes (each pipeline stage on a node of its own, 8 GPUs per node): an instance across nodes is "
            "the only one on its nodes; give 1"
        ],
    ),
    (
        "2 replicas of a 2-GPU instance spanning nodes (PP 2): fits by GPUs, refused by span",
        {"tensorParallel": 1, "pipelineParallel": 2, "replicasPerNode": 2},
        None,
        [
            "pools.chat.replicasPerNode: 2 replicas per node, but an instance of tensorParallel 1 x pipelineParallel 2 "
            "spans 2 nodes (each pipeline stage on a node of its own, 8 GPUs per node): an instance across nodes is "
            "the only one on its nodes; give 1"
        ],
    ),
    ("64 GiB of /dev/shm on 64 GiB of RAM", {"shmSizeGib": 64}, 64, []),
    (
        "65 GiB of /dev/shm on 64 GiB of RAM",
        {"shmSizeGib": 65},
        64,
        [
            "pools.chat.shmSizeGib: 65 GiB of /dev/shm per container is more than the 64 GiB of RAM of node gpu-03 "
            "(nodes.gpu-03.memoryGib); at most 64 fits"
        ],
    ),
    (
        "2 replicas x 32 GiB of /dev/shm on 64 GiB",
        {"shmSizeGib": 32, "tensorParallel": 4, "replicasPerNode": 2},
        64,
        [],
    ),
    (
        "2 replicas x 33 GiB of /dev/shm on 64 GiB",
        {"shmSizeGib": 33, "tensorParallel": 4, "replicasPerNode": 2},
        64,
        [
            "pools.chat.shmSizeGib: 33 GiB of /dev/shm per container x 2 replicas is more than the 64 GiB of RAM of "
            "node gpu-03 (nodes.gpu-03.memoryGib); at most 32 fits"
        ],
    ),
    # An instance across nodes has one container per node: its /dev/shm is not multiplied.
    ("64 GiB of /dev/shm across nodes on 64 GiB", {"shmSizeGib": 64, "tensorParallel": 16}, 64, []),
]


@pytest.mark.parametrize(("layout", "pool", "ram", "issues"), LAYOUT_RULES, ids=[r[0] for r in LAYOUT_RULES])
def test_layout_rules_on_both_sides(layout: str, pool: dict[str, Any], ram: float | None, issues: list[str]) -> None:
    config = prod_config()
    config[NS + "pools"]["chat"].update(pool)
    if ram is not None:
        for n in CHAT_NODES:
            config[NS + "nodes"][n]["memoryGib"] = ram
    if not issues:
        assert load_stack_config(config, set()).pools["chat"].nodes == pool.get("nodes", list(CHAT_NODES)), layout
        return
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    assert [str(i) for i in err.value.issues] == issues, layout


@pytest.mark.parametrize("field", ["hca", "interface"])
@pytest.mark.parametrize("tensor_parallel", [8, 16])
def test_nodes_of_an_instance_spanning_nodes_need_an_hca_and_an_interface(field: str, tensor_parallel: int) -> None:
    config = prod_config()
    defaults = config[NS + "nodeDefaults"]
    for n in ("gpu-01", "gpu-02"):  # the reasoning pool spans nodes: its nodes keep theirs
        config[NS + "nodes"][n][field] = defaults[field]
    del defaults[field]
    config[NS + "pools"]["chat"]["tensorParallel"] = tensor_parallel
    if tensor_parallel == 8:  # one node per instance: neither is needed
        assert getattr(load_stack_config(config, set()).node("gpu-03"), field) is None
        return
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    assert [str(i) for i in err.value.issues] == [
        f"nodes.{n}.{field}: required (here or in nodeDefaults): pool 'chat' spans nodes" for n in CHAT_NODES
    ]
