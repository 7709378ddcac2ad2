"""Every stack-validation rule: an accepted case and a refused one with its exact message."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from components.spec.topology import instances
from tests.support import host_key

NS = "llm-cluster:"
Mutation = Callable[[dict[str, Any]], None]


def refused(config: dict[str, Any], secret_keys: frozenset[str] = frozenset()) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_stack_config(config, secret_keys)
    return [str(i) for i in err.value.issues]


def section(config: dict[str, Any], name: str) -> Any:
    return config[NS + name]


def test_reference_stack_is_valid(config: dict[str, Any]) -> None:
    spec = load_stack_config(config, set())
    assert list(spec.nodes) == [f"gpu-0{i}" for i in range(1, 7)]
    assert spec.node("gpu-04").hca.gid_index == 3  # filled from nodeDefaults
    assert [i.name for i in instances(spec, "chat")] == [f"chat-gpu-0{i}" for i in range(3, 7)]
    assert instances(spec, "reasoning")[0].nodes == ("gpu-01", "gpu-02")


REFUSED: list[tuple[str, Mutation, list[str]]] = [
    (
        "unknown key lists the allowed ones",
        lambda c: section(c, "pools")["chat"].update(tensorParalel=8),
        [
            "pools.chat.tensorParalel: unknown key 'tensorParalel'; allowed keys here: drainSeconds, engine, env, image, imageFacts, "
            "llamacpp, lmdeploy, loadTimeoutMinutes, maxUnavailable, model, nodes, offline, pipelineParallel, port, qualificationGate, rayClientPort, rayDashboardPort, "
            "rayGateTimeoutSeconds, rayPort, readTimeoutSeconds, replicasPerNode, "
            "restartUnhealthyAfterSeconds, routing, shmSizeGib, tensorParallel, vllm"
        ],
    ),
    (
        "required key missing",
        lambda c: section(c, "pools")["chat"].pop("vllm"),
        ["pools.chat: engine vllm needs its options block `vllm` (e.g. vllm: {maxModelLen: ...})"],
    ),
    (
        "wrong type names the value",
        lambda c: section(c, "pools")["chat"].update(tensorParallel="eight"),
        ["pools.chat.tensorParallel: 'eight' is not allowed: expected a whole number"],
    ),
    (
        "out of range",
        lambda c: section(c, "pools")["chat"]["vllm"].update(gpuMemoryUtilization=1.5),
        ["pools.chat.vllm.gpuMemoryUtilization: 1.5 is not allowed: this is a fraction, 0 < x <= 1"],
    ),
    (
        "patterns are said in words",
        lambda c: section(c, "pools")["chat"].update(env={"bad-name": "x"}),
        [
            "pools.chat.env.bad-name: 'bad-name' is not allowed: must be an environment variable name: letters, "
            "digits and '_', not starting with a digit"
        ],
    ),
    (
        "a scalar where a list belongs",
        lambda c: section(c, "pools")["chat"].update(nodes="gpu-03"),
        ["pools.chat.nodes: 'gpu-03' is not allowed: expected a list (- item lines)"],
    ),
    (
        "a scalar where a mapping belongs names no class",
        lambda c: section(c, "pools").update(chat="x"),
        ["pools.chat: 'x' is not allowed: expected a mapping (key: value lines)"],
    ),
    (
        "a percentage where a fraction belongs",
        lambda c: section(c, "pools")["chat"]["vllm"].update(gpuMemoryUtilization=90),
        ["pools.chat.vllm.gpuMemoryUtilization: 90 is not allowed: this is a fraction, 0 < x <= 1; 90% is 0.9"],
    ),
    (
        "alert ratios are fractions too",
        lambda c: section(c, "monitoring").setdefault("thresholds", {}).update(kvCacheUsageRatio=98),
        ["monitoring.thresholds.kvCacheUsageRatio: 98 is not allowed: this is a fraction, 0 < x <= 1; 98% is 0.98"],
    ),
    (
        "a relative model path",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(path="models/Qwen3-30B-A3B"),
        ["models.qwen3-30b-a3b.path: 'models/Qwen3-30B-A3B' must be an absolute path on the nodes (starting with /)"],
    ),
    (
        "a relative disk path",
        lambda c: section(c, "nodes")["gpu-03"].update(diskPath="data"),
        ["nodes.gpu-03.diskPath: 'data' must be an absolute path on the node (starting with /)"],
    ),
    (
        "a typed flag in extraArgs names its typed key",
        lambda c: section(c, "pools")["chat"]["vllm"].update(
            extraArgs=["--max-model-len", "65536", "--seed", "7", "-tp=4", "--enable_chunked_prefill"]
        ),
        [
            f"pools.chat.vllm.extraArgs[{i}]: {said} is set by the typed key {key}: state it there instead. In "
            "extraArgs it would come after the product's own flag and win in vLLM, while the readiness gates, the "
            "gateway, the capacity plan and the policies keep using the typed value"
            for i, said, key in (
                (0, "'--max-model-len'", "pools.chat.vllm.maxModelLen"),
                (4, "'-tp=4' (that is --tensor-parallel-size)", "pools.chat.tensorParallel"),
                (
                    5,
                    "'--enable_chunked_prefill' (that is --enable-chunked-prefill)",
                    "pools.chat.vllm.enableChunkedPrefill",
                ),
            )
        ],
    ),
    (
        "the port and host are the product's",
        lambda c: section(c, "pools")["chat"]["vllm"].update(extraArgs=["--port=9000", "--host", "0.0.0.0"]),
        [
            f"pools.chat.vllm.extraArgs[{i}]: {said} is set by the typed key {key}: state it there instead. In "
            "extraArgs it would come after the product's own flag and win in vLLM, while the readiness gates, the "
            "gateway, the capacity plan and the policies keep using the typed value"
            for i, said, key in ((0, "'--port=9000'", "pools.chat.port"), (1, "'--host'", "nodes.<node>.address"))
        ],
    ),
    (
        "port out of range",
        lambda c: section(c, "gateway").update(port=70000),
        ["gateway.port: 70000 is not allowed: must be at most 65535"],
    ),
    (
        "invalid address",
        lambda c: section(c, "nodes")["gpu-03"].update(address="192.168.10.300"),
        ["nodes.gpu-03.address: '192.168.10.300' is not an IPv4 address"],
    ),
    (
        "IPv6 addresses are refused by name",
        lambda c: section(c, "nodes")["gpu-03"].update(address="fd00::13"),
        [
            "nodes.gpu-03.address: 'fd00::13': IPv6 cluster addresses are not supported yet; give the node's "
            "IPv4 address"
        ],
    ),
    (
        "an IPv6 SSH address too",
        lambda c: section(c, "nodes")["gpu-03"].update(sshAddress="fd00::13"),
        [
            "nodes.gpu-03.sshAddress: 'fd00::13': IPv6 cluster addresses are not supported yet; give the node's "
            "IPv4 address"
        ],
    ),
    (
        "the SSH user is a POSIX user name",
        lambda c: section(c, "ssh").update(user="root\n$(reboot)"),
        [
            "ssh.user: 'root\\n$(reboot)' is not a POSIX user name (letters, digits, '.', '_', '-', not starting "
            "with '-', at most 32 characters)"
        ],
    ),
    (
        "a shared mount is server:/path of safe characters",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(source={"sharedMount": "nas:/export/$(id)\n#"}),
        [
            "models.qwen3-30b-a3b.source.sharedMount: 'nas:/export/$(id)\\n#' is not an NFS share server:/path "
            "(a host name or IPv4 address, then an absolute path of letters, digits and . _ + / -)"
        ],
    ),
    (
        "duplicate address",
        lambda c: section(c, "nodes")["gpu-02"].update(address="192.168.10.11"),
        ["nodes.gpu-02.address: 192.168.10.11 is already the address of gpu-01"],
    ),
    (
        "unknown GPU model",
        lambda c: section(c, "nodes")["gpu-06"].update(gpu={"model": "Tesla V100", "count": 8}),
        [
            "nodes.gpu-06.gpu.model: unknown GPU model 'Tesla V100'; known: NVIDIA A10, NVIDIA A100 80GB PCIe, "
            "NVIDIA A100-PCIE-40GB, NVIDIA A100-SXM4-40GB, NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3, "
            "NVIDIA H100 PCIe, NVIDIA H200, NVIDIA L40S, Tesla T4, Tesla V100-PCIE-16GB, Tesla V100-PCIE-32GB, "
            "Tesla V100-SXM2-16GB, Tesla V100-SXM2-32GB"
        ],
    ),
    (
        "pool model must exist",
        lambda c: section(c, "pools")["chat"].update(model="qwen3-32b"),
        ["pools.chat.model: 'qwen3-32b' is not a model; models are: deepseek-r1, qwen3-30b-a3b"],
    ),
    (
        "pool node must exist",
        lambda c: section(c, "pools")["reasoning"]["nodes"].__setitem__(1, "gpu-09"),
        ["pools.reasoning.nodes[1]: 'gpu-09' is not a node; nodes are: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06"],
    ),
    (
        "a node serves one pool",
        lambda c: section(c, "pools")["chat"]["nodes"].append("gpu-02"),
        ["pools.chat.nodes[4]: 'gpu-02' already serves pool 'reasoning'; a node belongs to at most one pool"],
    ),
    (
        "a node listed twice",
        lambda c: section(c, "pools")["chat"]["nodes"].append("gpu-03"),
        ["pools.chat.nodes: node 'gpu-03' is listed twice"],
    ),
    (
        "nodes must split into instances",
        lambda c: (
            section(c, "pools")["reasoning"].update(nodes=["gpu-01", "gpu-02", "gpu-03"])
            or section(c, "pools")["chat"].update(nodes=["gpu-04", "gpu-05", "gpu-06"])
        ),
        [
            "pools.reasoning.nodes: 3 nodes do not split into instances of 2 node(s) (tensorParallel 8 x "
            "pipelineParallel 2 on 8 GPUs per node); give a multiple of 2"
        ],
    ),
    (
        "one GPU model per pool",
        lambda c: section(c, "nodes")["gpu-02"].update(gpu={"model": "Tesla V100-SXM2-16GB", "count": 8}),
        [
            "pools.reasoning.nodes: all nodes of a pool need the same GPU model and count; got "
            "gpu-01=8xTesla V100-SXM2-32GB, gpu-02=8xTesla V100-SXM2-16GB"
        ],
    ),
    (
        "replicas per node must fit the node",
        lambda c: section(c, "pools")["chat"].update(tensorParallel=4, replicasPerNode=3),
        [
            "pools.chat.replicasPerNode: 3 replicas x tensorParallel 4 x pipelineParallel 1 needs more than "
            "the 8 GPUs of a node"
        ],
    ),
    (
        "RoCE needs a GID index",
        lambda c: section(c, "nodeDefaults")["hca"].pop("gidIndex"),
        ["nodeDefaults.hca: gidIndex is required for RoCE (linkLayer: ethernet); RoCEv2 is usually 3"],
    ),
    (
        "multi-node pools need an HCA",
        lambda c: section(c, "nodeDefaults").pop("hca"),
        [
            "nodes.gpu-01.hca: required (here or in nodeDefaults): pool 'reasoning' spans nodes",
            "nodes.gpu-02.hca: required (here or in nodeDefaults): pool 'reasoning' spans nodes",
        ],
    ),
    (
        "weights come from exactly one source",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(source={"node": "gpu-03", "present": True}),
        ["models.qwen3-30b-a3b.source: state exactly one of node, sharedMount, present (got ['node', 'present'])"],
    ),
    (
        "weights source node must exist",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(source={"node": "gpu-07"}),
        [
            "models.qwen3-30b-a3b.source.node: 'gpu-07' is not a node; nodes are: gpu-01, gpu-02, gpu-03, "
            "gpu-04, gpu-05, gpu-06"
        ],
    ),
    (
        "architecture from the catalog or a config.json, not both",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(configJson="/tmp/config.json"),
        ["models.qwen3-30b-a3b: state exactly one of arch (a catalog name) or configJson (a path)"],
    ),
    (
        "quantization must be a vLLM method",
        lambda c: section(c, "models")["deepseek-r1"].update(quantization="gptq-int4"),
        [
            "models.deepseek-r1.quantization: unknown quantization 'gptq-int4'; the known engine versions know: aqlm, "
            "auto-round, awq, awq_marlin, bitblas, bitsandbytes, compressed-tensors, cpu_awq, deepspeedfp, experts_int8, "
            "fbgemm_fp8, fp8, fp_quant, gguf, gptq, gptq_bitblas, gptq_marlin, gptq_marlin_24, hqq, inc, ipex, marlin, "
            "modelopt, modelopt_fp4, modelopt_mixed, modelopt_mxfp8, moe_wna16, mxfp4, mxfp8, neuron_quant, petit_nvfp4, "
            "ptpc_fp8, qqq, quark, rtn, torchao, tpu_int8"
        ],
    ),
    (
        "served names are unique across models",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(servedNames=["deepseek-r1"]),
        ["models.qwen3-30b-a3b.servedNames[0]: 'deepseek-r1' is already a served name of model 'deepseek-r1'"],
    ),
    (
        "names are DNS labels",
        lambda c: (
            section(c, "pools").__setitem__("Chat_Pool", section(c, "pools").pop("chat"))
            or section(c, "gateway").update(defaultPool="Chat_Pool")
        ),
        [
            "pools.Chat_Pool: 'Chat_Pool' is not allowed as a name: names become container and host names, so "
            "lowercase letters, digits and '-' (a DNS label, at most 63 characters)"
        ],
    ),
    (
        "a capitalised pool name carries its section",
        lambda c: (
            section(c, "pools").__setitem__("Chat", section(c, "pools").pop("chat"))
            or section(c, "gateway").update(defaultPool="Chat")
        ),
        [
            "pools.Chat: 'Chat' is not allowed as a name: names become container and host names, so "
            "lowercase letters, digits and '-' (a DNS label, at most 63 characters)"
        ],
    ),
    (
        "gateway node must exist",
        lambda c: section(c, "gateway").update(node="mgmt-01"),
        ["gateway.node: 'mgmt-01' is not a node; nodes are: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06"],
    ),
    (
        "gateway default pool must exist",
        lambda c: section(c, "gateway").update(defaultPool="fast"),
        ["gateway.defaultPool: 'fast' is not a pool; pools are: reasoning, chat"],
    ),
    (
        "path routes name pools",
        lambda c: section(c, "gateway").update(pathRoutes={"/smart/v1/": "smart"}),
        ["gateway.pathRoutes./smart/v1/: 'smart' is not a pool; pools are: reasoning, chat"],
    ),
    (
        "path routes end in /v1/",
        lambda c: section(c, "gateway").update(pathRoutes={"/smart/": "reasoning"}),
        ["gateway.pathRoutes: path route '/smart/' must start with / and end with /v1/ (e.g. /smart/v1/)"],
    ),
    (
        "aliases do not shadow served names",
        lambda c: section(c, "gateway").update(aliases={"qwen3-30b-a3b": "reasoning"}),
        ["gateway.aliases.qwen3-30b-a3b: 'qwen3-30b-a3b' is already a served name of model 'qwen3-30b-a3b'"],
    ),
    (
        "API key ids are unique",
        lambda c: section(c, "gateway")["apiKeys"].append({"id": "default"}),
        ["gateway.apiKeys[1].id: 'default' is used by another key"],
    ),
    (
        "API key allowlists name served models",
        lambda c: section(c, "gateway")["apiKeys"].append({"id": "team-a", "models": ["gpt-4"]}),
        [
            "gateway.apiKeys[1].models[0]: 'gpt-4' names no served model, alias or pool; allowed: "
            "/data/models/DeepSeek-R1-GPTQ-Int4, /data/models/Qwen3-30B-A3B, chat, deepseek-r1, qwen3-30b-a3b, reasoning"
        ],
    ),
    (
        "monitoring node must exist",
        lambda c: section(c, "monitoring").update(node="gpu-7"),
        ["monitoring.node: 'gpu-7' is not a node; nodes are: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06"],
    ),
    (
        "ports do not collide on a node",
        lambda c: section(c, "gateway").update(port=8000),
        ["gateway.port: port 8000 on gpu-01 is already taken by pools.reasoning.port"],
    ),
    (
        "exporter ports do not collide with vLLM",
        lambda c: section(c, "monitoring").update(nodeExporter={"image": "prom/node-exporter:v1.8.2", "port": 8000}),
        [
            "monitoring.nodeExporter.port: port 8000 on gpu-01 is already taken by pools.reasoning.port",
            "monitoring.nodeExporter.port: port 8000 on gpu-03 is already taken by pools.chat.port",
            "monitoring.nodeExporter.port: port 8000 on gpu-04 is already taken by pools.chat.port",
            "monitoring.nodeExporter.port: port 8000 on gpu-05 is already taken by pools.chat.port",
            "monitoring.nodeExporter.port: port 8000 on gpu-06 is already taken by pools.chat.port",
        ],
    ),
    (
        "host key checking needs host keys",
        lambda c: section(c, "ssh").update(hostKeyChecking=True),
        [f"nodes.gpu-0{i}.hostKey: required when ssh.hostKeyChecking is true" for i in range(1, 7)],
    ),
    (
        "the nodes must be reachable somehow",
        lambda c: section(c, "ssh").update(agent=False),
        [
            "ssh.agent: is false but neither ssh.keyPath nor the secret sshPrivateKey is given: the nodes could not "
            "be reached; use the agent, a key file, or the secret key"
        ],
    ),
    (
        "alertmanager needs its receivers secret",
        lambda c: section(c, "monitoring").update(alertmanager={"image": "prom/alertmanager:v0.27.0", "port": 9093}),
        [
            "monitoring.alertmanager: needs the secret alertmanagerConfig holding alertmanager.yml "
            "(pulumi config set --secret alertmanagerConfig < alertmanager.yml)"
        ],
    ),
    (
        "unknown config key",
        lambda c: c.update({NS + "pool": {}}),
        [
            "llm-cluster:pool: unknown config key; allowed: llm-cluster:ssh, llm-cluster:nodeDefaults, llm-cluster:nodes, "
            "llm-cluster:nccl, llm-cluster:models, llm-cluster:pools, llm-cluster:gateway, llm-cluster:monitoring, "
            "llm-cluster:firewall, llm-cluster:preflight, llm-cluster:images, llm-cluster:alertmanagerConfig, "
            "llm-cluster:gatewayApiKeys, llm-cluster:gatewayTlsCert, llm-cluster:gatewayTlsKey, llm-cluster:grafanaAdminPassword, "
            "llm-cluster:registryPassword, llm-cluster:registryUsername, llm-cluster:sshPrivateKey, "
            "llm-cluster:sshPrivateKeyPassword"
        ],
    ),
    (
        "secrets must be secret",
        lambda c: c.update({NS + "sshPrivateKey": "-----BEGIN OPENSSH PRIVATE KEY-----"}),
        [
            "llm-cluster:sshPrivateKey: must be a secret: set it with `pulumi config set --secret sshPrivateKey` "
            "(SSH private key (PEM/OpenSSH) used for every node)"
        ],
    ),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in REFUSED], ids=[n for n, _, _ in REFUSED])
def test_refused_with_key_path_and_what_is_allowed(
    config: dict[str, Any], mutate: Mutation, expected: list[str]
) -> None:
    mutate(config)
    assert refused(config) == expected


def test_tls_secrets_come_in_pairs(config: dict[str, Any]) -> None:
    config[NS + "gatewayTlsCert"] = "[secret]"
    assert refused(config, frozenset({NS + "gatewayTlsCert"})) == [
        "gateway.tls: the secret gatewayTlsCert is set without its pair: set both gatewayTlsCert and gatewayTlsKey "
        "(pulumi config set --secret gatewayTlsCert < cert.pem), or neither to have a certificate made on the "
        "gateway host"
    ]


def test_pools_sharing_a_model_are_refused_where_the_gateway_cannot_honour_them(config: dict[str, Any]) -> None:
    pools = section(config, "pools")
    pools["canary"] = {**pools["chat"], "nodes": ["gpu-06"]}
    pools["chat"]["nodes"] = ["gpu-03", "gpu-04", "gpu-05"]
    load_stack_config(config, set())  # two pools of one model: fine, traffic is split
    section(config, "gateway").update(poolWeights={"chat": 0, "canary": 0, "reasoning": 2})
    pools["canary"]["vllm"] = {**pools["chat"]["vllm"], "maxModelLen": 8192}
    section(config, "gateway")["apiKeys"].append({"id": "team", "models": ["canary"]})
    assert refused(config) == [
        "gateway.poolWeights.reasoning: pool 'reasoning' is the only pool serving model 'deepseek-r1': a weight "
        "splits a model's traffic between pools that serve it",
        "gateway.poolWeights: every pool serving model 'qwen3-30b-a3b' (chat, canary) has weight 0: its requests "
        "would find no replica",
        "pools.canary: pools chat, canary serve model 'qwen3-30b-a3b' behind one name but accept different context "
        "lengths (chat: 32768, canary: 8192): the same request would pass or fail by where it lands; give them one "
        "context length (pools.chat.vllm.maxModelLen, pools.canary.vllm.maxModelLen)",
        "gateway.apiKeys[1].models[0]: pool 'canary' shares model 'qwen3-30b-a3b' with chat: a key cannot be held "
        "to one of them; name the model ('qwen3-30b-a3b') instead",
    ]


def test_without_auth_a_key_secret_is_refused(config: dict[str, Any]) -> None:
    section(config, "gateway").update(auth=False, apiKeys=[])
    config[NS + "gatewayApiKeys"] = '{"default": "sk-1"}'
    assert refused(config, frozenset({NS + "gatewayApiKeys"})) == [
        "gateway.auth: is false but the secret gatewayApiKeys is set: the keys would never be checked; "
        "remove the secret (pulumi config rm gatewayApiKeys) or set auth: true"
    ]
    del config[NS + "gatewayApiKeys"]
    load_stack_config(config, set())


# Each accepted variant and what the validated spec must then hold: accepted means kept, not dropped
# or defaulted away.
ACCEPTED: list[tuple[str, Mutation, Callable[[StackSpec], object]]] = [
    (
        "two TP4 replicas per node",
        lambda c: section(c, "pools")["chat"].update(tensorParallel=4, replicasPerNode=2),
        lambda s: (s.pools["chat"].tensor_parallel, s.pools["chat"].replicas_per_node) == (4, 2),
    ),
    (
        "InfiniBand needs no GID index",
        lambda c: section(c, "nodeDefaults").update(hca={"device": "mlx5_0", "linkLayer": "infiniband"}),
        lambda s: (
            {(h.link_layer, h.gid_index) for n in s.nodes for h in [s.node(n).hca] if h} == {("infiniband", None)}
        ),
    ),
    (
        "a shared mount as weights source",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(source={"sharedMount": "nas:/export/models"}),
        lambda s: s.models["qwen3-30b-a3b"].source.shared_mount == "nas:/export/models",
    ),
    (
        "a shared mount on an IPv4 server",
        lambda c: section(c, "models")["qwen3-30b-a3b"].update(
            source={"sharedMount": "10.0.0.5:/srv/nfs/Qwen3-30B_A3B.v2"}
        ),
        lambda s: s.models["qwen3-30b-a3b"].source.shared_mount == "10.0.0.5:/srv/nfs/Qwen3-30B_A3B.v2",
    ),
    (
        "a non-root SSH user",
        lambda c: section(c, "ssh").update(user="svc-llm.ops_1"),
        lambda s: s.ssh.user == "svc-llm.ops_1",
    ),
    (
        "an SSH host name",
        lambda c: section(c, "nodes")["gpu-03"].update(sshAddress="gpu-03.mgmt.example.com"),
        lambda s: (s.nodes["gpu-03"].ssh_address, s.nodes["gpu-04"].ssh_address) == ("gpu-03.mgmt.example.com", None),
    ),
    (
        "host keys given with checking on",
        lambda c: (
            section(c, "ssh").update(hostKeyChecking=True)
            or [n.update(hostKey=host_key(name)) for name, n in section(c, "nodes").items()]
        ),
        lambda s: (
            s.ssh.host_key_checking
            and {name: n.host_key for name, n in s.nodes.items()} == {name: host_key(name) for name in s.nodes}
        ),
    ),
    (
        "a key file instead of the agent",
        lambda c: section(c, "ssh").update(agent=False, keyPath="~/.ssh/id_ed25519"),
        lambda s: (s.ssh.agent, s.ssh.key_path) == (False, "~/.ssh/id_ed25519"),
    ),
    (
        "an alias to a pool",
        lambda c: section(c, "gateway").update(aliases={"gpt-4o": "chat"}),
        lambda s: s.gateway is not None and s.gateway.aliases == {"gpt-4o": "chat"},
    ),
    (
        "a key limited to a pool",
        lambda c: section(c, "gateway")["apiKeys"].append({"id": "team-a", "models": ["chat"]}),
        lambda s: (
            s.gateway is not None and (s.gateway.api_keys[-1].id, s.gateway.api_keys[-1].models) == ("team-a", ["chat"])
        ),
    ),
    (
        "a TP=16 instance spans two nodes (the policy pack judges it)",
        lambda c: section(c, "pools")["reasoning"].update(tensorParallel=16, pipelineParallel=1),
        lambda s: (s.pools["reasoning"].tensor_parallel, s.pools["reasoning"].pipeline_parallel) == (16, 1),
    ),
]


@pytest.mark.parametrize("mutate,holds", [(m, h) for _, m, h in ACCEPTED], ids=[n for n, _, _ in ACCEPTED])
def test_accepted_variants_are_kept_as_given(
    config: dict[str, Any], mutate: Mutation, holds: Callable[[StackSpec], object]
) -> None:
    assert not holds(load_stack_config(config, set())), "the reference stack already holds it: the case proves nothing"
    mutate(config)
    assert holds(load_stack_config(config, set()))


def test_secret_keys_are_accepted_when_secret(config: dict[str, Any]) -> None:
    config[NS + "gatewayApiKeys"] = '{"default": "sk-1"}'
    spec = load_stack_config(config, {NS + "gatewayApiKeys"})
    assert spec.secrets == frozenset({"gatewayApiKeys"})
    assert "sk-1" not in spec.model_dump_json()


def test_two_replicas_per_node_get_their_own_gpus_and_ports(config: dict[str, Any]) -> None:
    section(config, "pools")["chat"].update(tensorParallel=4, replicasPerNode=2)
    chat = instances(load_stack_config(config, set()), "chat")
    assert [(i.name, i.port, i.gpu_ids) for i in chat[:2]] == [
        ("chat-gpu-03-r0", 8000, (0, 1, 2, 3)),
        ("chat-gpu-03-r1", 8001, (4, 5, 6, 7)),
    ]


def test_all_issues_are_reported_at_once(config: dict[str, Any]) -> None:
    section(config, "pools")["reasoning"]["nodes"][1] = "gpu-09"
    section(config, "gateway").update(node="mgmt")
    assert refused(config) == [
        "pools.reasoning.nodes[1]: 'gpu-09' is not a node; nodes are: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06",
        "gateway.node: 'mgmt' is not a node; nodes are: gpu-01, gpu-02, gpu-03, gpu-04, gpu-05, gpu-06",
    ]


def test_a_section_stated_as_a_secret_says_so(config: dict[str, Any]) -> None:
    # `pulumi config set --secret ssh …`: the value is a ciphertext; it was refused as "not valid JSON".
    config[NS + "ssh"] = "plan-secret-0123456789abcdef"
    assert refused(config, frozenset({NS + "ssh"})) == [
        "llm-cluster:ssh: a secret is not allowed here: ssh is plain config, stated in the stack file (secrets are "
        "only llm-cluster:sshPrivateKey, llm-cluster:sshPrivateKeyPassword, llm-cluster:gatewayApiKeys, "
        "llm-cluster:gatewayTlsCert, llm-cluster:gatewayTlsKey, llm-cluster:grafanaAdminPassword, "
        "llm-cluster:alertmanagerConfig, llm-cluster:registryUsername, llm-cluster:registryPassword)"
    ]


@pytest.mark.parametrize("text", ["root", ""])
def test_a_section_stated_as_text_says_a_mapping_belongs_there(config: dict[str, Any], text: str) -> None:
    # `llm-cluster:ssh: root`: the text was parsed as JSON and refused with json's words ("Expecting value").
    config[NS + "ssh"] = text
    assert refused(config) == [f"ssh: {text!r} is not allowed: expected a mapping (key: value lines)"]


def test_a_section_the_engine_hands_over_as_json_text_is_read(config: dict[str, Any]) -> None:
    config[NS + "ssh"] = '{"user": "ops", "agent": true}'
    assert load_stack_config(config, set()).ssh.user == "ops"


def test_every_pattern_of_the_spec_is_said_in_words() -> None:
    # A pattern without words reached the user as pydantic's "String should match pattern '^[A-Za-z0-9._+-]…'"
    # (llamacpp.ggufFile, imageFacts.version).
    import typing

    from pydantic import BaseModel

    from components.spec.base import PATTERN_WORDS

    found: dict[str, str] = {}

    def walk(model: type[BaseModel], where: str, seen: set[type]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            stack = [field.annotation, *field.metadata]
            while stack:
                item = stack.pop()
                pattern = getattr(item, "pattern", None)
                if isinstance(pattern, str):
                    found.setdefault(pattern, f"{where}.{field.alias or name}")
                if isinstance(item, type) and issubclass(item, BaseModel):
                    walk(item, f"{where}.{field.alias or name}", seen)
                stack += [*typing.get_args(item), *getattr(item, "__metadata__", ())]

    walk(StackSpec, "", set())
    assert found, "the walk found no pattern: it proves nothing"
    assert {k: v for k, v in found.items() if k not in PATTERN_WORDS} == {}
