"""Each rule through pulumi_policy's analyzer servicer with real AnalyzeRequest messages: a compliant
resource, and the same resource with one field changed, with the exact message."""
from __future__ import annotations

import copy
from typing import Any

import pytest
from google.protobuf import struct_pb2
from pulumi.runtime import proto
from pulumi_policy.policy import _PolicyAnalyzerServicer

from plan.analyze import LEVEL_NAMES, configure_request
from plan.harness import UNKNOWN
from policies.pack import DEFAULT_LEVEL, PACK_NAME, PACK_VERSION, POLICIES

STACK = "urn:pulumi:prod::llm-cluster::"
V100 = "Tesla V100-SXM2-32GB"
DESCRIPTIONS = {p.name: p.description for p in POLICIES}

# The reference cluster's Qwen3-30B-A3B replica, as components.model_server registers it.
CHAT_ARGV = ["vllm", "serve", "/data/models/Qwen3-30B-A3B", "--served-model-name", "qwen3-30b-a3b",
             "--host", "192.168.10.13", "--port", "8000", "--tensor-parallel-size", "8",
             "--distributed-executor-backend", "mp", "--dtype", "half", "--max-model-len", "32768",
             "--max-num-seqs", "128", "--gpu-memory-utilization", "0.9", "--swap-space", "4",
             "--no-enable-prefix-caching", "--no-enable-chunked-prefill"]
CHAT_ENV = {"VLLM_USE_V1": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn", "NCCL_IB_DISABLE": "0",
            "NCCL_IB_HCA": "mlx5_0", "NCCL_IB_GID_INDEX": "3", "NCCL_SOCKET_IFNAME": "bond0",
            "VLLM_HOST_IP": "192.168.10.13"}
CAPACITY = {"fits": True, "reason": "", "max_concurrency": 20.5, "kv_tokens": 671744.0, "weights_gib_per_gpu": 7.1}


def server(**changes: Any) -> dict[str, Any]:
    """ModelServer props of the reference chat replica, with changes (argv_add, argv_drop, env_* too)."""
    props: dict[str, Any] = {
        "pool": "chat", "instance": "chat-gpu-03", "model": "qwen3-30b-a3b", "modelPath": "/data/models/Qwen3-30B-A3B",
        "arch": "qwen3-30b-a3b", "quantization": None, "dtype": "half", "gpuModel": V100, "gpuCount": 8.0,
        "nodes": ["gpu-03"], "tensorParallel": 8.0, "pipelineParallel": 1.0, "image": "vllm/vllm-openai:v0.9.2",
        "argv": list(CHAT_ARGV), "env": dict(CHAT_ENV), "capacity": dict(CAPACITY),
    }
    argv: list[str] = props["argv"]
    for flag in changes.pop("argv_drop", []):
        i = argv.index(flag)
        del argv[i:i + (1 if flag.startswith("--no-") or i + 1 == len(argv) or argv[i + 1].startswith("--") else 2)]
    argv += changes.pop("argv_add", [])
    props.update(changes)
    return props


def set_flag(props: dict[str, Any], flag: str, value: str) -> dict[str, Any]:
    """Replace one flag's value in the props' argv."""
    argv = props["argv"]
    argv[argv.index(flag) + 1] = value
    return props


def analyze(type_: str, name: str, props: dict[str, Any], *, parent_type: str | None = None,
            config: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """(policy, level, message) for one AnalyzeRequest through a freshly configured servicer."""
    servicer = _PolicyAnalyzerServicer(PACK_NAME, PACK_VERSION, list(POLICIES), DEFAULT_LEVEL)
    servicer.Configure(configure_request(config), None)
    chain = f"{parent_type}${type_}" if parent_type else type_
    s = struct_pb2.Struct()
    s.update(props)
    request = proto.AnalyzeRequest(urn=f"{STACK}{chain}::{name}", type=type_, name=name, properties=s)
    response = servicer.Analyze(request, None)
    return [(d.policyName, LEVEL_NAMES[d.enforcementLevel], d.message) for d in response.diagnostics]


def model_server(props: dict[str, Any], **kw: Any) -> list[tuple[str, str, str]]:
    return analyze("llm-cluster:vllm:ModelServer", "chat-gpu-03", props, **kw)


def only(policy: str, message: str, level: str = "mandatory") -> list[tuple[str, str, str]]:
    """The one diagnostic expected: the servicer prefixes the policy's description."""
    return [(policy, level, f"{DESCRIPTIONS[policy]}\n{message}")]


def of(policy: str, diagnostics: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [d for d in diagnostics if d[0] == policy]


def test_reference_chat_replica_is_clean() -> None:
    assert model_server(server()) == []


# --- rule 1: dtype -----------------------------------------------------------------------------

def test_bfloat16_on_v100_is_refused_with_half_as_the_way_out() -> None:
    got = model_server(set_flag(server(), "--dtype", "bfloat16"))
    assert got == only("gpu-dtype", "--dtype bfloat16: bfloat16 needs compute capability 8.0; Tesla "
                       "V100-SXM2-32GB (sm_70) has none (vLLM 0.9.2 refuses it at startup). Use --dtype half "
                       "(the stack's model dtype: half).")


def test_bfloat16_on_a100_is_fine() -> None:
    props = set_flag(server(gpuModel="NVIDIA A100-SXM4-80GB", env={}), "--dtype", "bfloat16")
    assert of("gpu-dtype", model_server(props)) == []


def test_float32_by_accident_is_refused_unless_configured() -> None:
    props = set_flag(server(), "--dtype", "float")
    assert of("gpu-dtype", model_server(props)) == only(
        "gpu-dtype", "--dtype float: float32 doubles the weights' memory and runs without tensor cores on Tesla "
        "V100-SXM2-32GB (sm_70). Use --dtype half, or set allowFloat32 in this policy's config if meant.")
    assert model_server(props, config={"gpu-dtype": {"allowFloat32": True}}) == []


# --- rule 2: VLLM_USE_V1 -----------------------------------------------------------------------

def test_v1_engine_unset_is_refused_on_v100() -> None:
    env = {k: v for k, v in CHAT_ENV.items() if k != "VLLM_USE_V1"}
    assert model_server(server(env=env)) == only(
        "vllm-v1-engine", "VLLM_USE_V1 is unset (vLLM 0.9.2 reads unset as 1): the V1 engine needs compute "
        "capability 8.0 and Tesla V100-SXM2-32GB (sm_70) has less (VLLM_USE_V1=1 raises NotImplementedError). "
        "Set VLLM_USE_V1=0 in the container's env.")


def test_v1_engine_one_is_refused_on_v100_and_fine_on_h100() -> None:
    env = {**CHAT_ENV, "VLLM_USE_V1": "1"}
    assert [d[0] for d in model_server(server(env=env))] == ["vllm-v1-engine"]
    assert "is '1'" in model_server(server(env=env))[0][2]
    assert model_server(server(env=env, gpuModel="NVIDIA H100 80GB HBM3")) == []


# --- rule 3: quantization ----------------------------------------------------------------------

def test_awq_checkpoint_on_v100_names_gptq_and_lmdeploy() -> None:
    assert model_server(server(quantization="awq")) == only(
        "gpu-quantization", "the checkpoint's quantization awq: vLLM 0.9.2 needs sm_75 (compute capability 7.5) "
        "for awq; Tesla V100-SXM2-32GB (sm_70) has less (\"Minimum capability: 75. Current capability: 70.\"). "
        "Instead, serve a GPTQ checkpoint of the model (--quantization gptq), or serve the AWQ checkpoint with "
        "LMDeploy (TurboMind runs AWQ on sm_70).")


def test_gptq_marlin_flag_on_v100_points_to_plain_gptq() -> None:
    got = model_server(server(quantization="gptq", argv_add=["--quantization", "gptq_marlin"]))
    assert got == only(
        "gpu-quantization", "--quantization gptq_marlin: vLLM 0.9.2 needs sm_80 (compute capability 8.0) for "
        "gptq_marlin; Tesla V100-SXM2-32GB (sm_70) has less (\"Minimum capability: 80. Current capability: 70.\"). "
        "Instead, use --quantization gptq (or leave it unset: vLLM picks plain gptq itself below sm_80).")


def test_gptq_and_awq_on_their_gpus_are_fine() -> None:
    assert model_server(server(quantization="gptq", argv_add=["--quantization", "gptq"])) == []
    assert of("gpu-quantization", model_server(server(quantization="awq", gpuModel="Tesla T4"))) == []


# --- rule 4: FP8 -------------------------------------------------------------------------------

def test_fp8_kv_cache_on_v100_is_refused() -> None:
    assert model_server(server(argv_add=["--kv-cache-dtype", "fp8"])) == only(
        "gpu-fp8", "--kv-cache-dtype fp8: Tesla V100-SXM2-32GB (sm_70) has no FP8 support; vLLM 0.9.2's Triton "
        "prefill kernels cannot cast the cache to fp8 there. Use --kv-cache-dtype auto (float16 cache) and lower "
        "--max-model-len or --max-num-seqs if the cache does not fit.")


def test_fp8_checkpoint_on_v100_is_one_fp8_violation_not_two() -> None:
    assert model_server(server(quantization="fp8")) == only(
        "gpu-fp8", "the checkpoint's quantization fp8: FP8 weights need sm_80 (compute capability 8.0) in vLLM "
        "0.9.2 and Tesla V100-SXM2-32GB (sm_70) has no FP8 units. Serve an fp16 or GPTQ checkpoint of the model "
        "instead (--quantization gptq).")
    assert model_server(server(quantization="fp8", gpuModel="NVIDIA H100 80GB HBM3", env={})) == []


# --- rule 5: chunked prefill and prefix caching ------------------------------------------------

WHY = ("vLLM 0.9.2's Triton prefix-prefill kernel asserts on Tesla V100-SXM2-32GB (sm_70) (\"mma -> mma layout "
       "conversion is only supported on Ampere\"; issues #2729, #3687, #8024)")


def test_prefix_caching_on_v100_is_refused() -> None:
    props = server(argv_drop=["--no-enable-prefix-caching"], argv_add=["--enable-prefix-caching"])
    assert model_server(props) == only("gpu-chunked-prefill-prefix-caching",
                                       f"--enable-prefix-caching: {WHY}. Remove it (enablePrefixCaching: false).")


def test_max_model_len_above_32k_turns_chunked_prefill_on_by_itself() -> None:
    props = set_flag(server(argv_drop=["--no-enable-chunked-prefill"]), "--max-model-len", "40960")
    assert model_server(props) == only(
        "gpu-chunked-prefill-prefix-caching",
        f"--max-model-len 40960: above 32768 vLLM 0.9.2 turns chunked prefill on by itself; {WHY}. Set "
        "--max-model-len <= 32768 or pass --no-enable-chunked-prefill.")
    # The explicit --no- form is the way out; 32K (binary suffix) is exactly 32768.
    assert model_server(set_flag(server(), "--max-model-len", "40960")) == []
    assert model_server(set_flag(server(argv_drop=["--no-enable-chunked-prefill"]), "--max-model-len", "32K")) == []


def test_unset_max_model_len_is_refused_on_v100() -> None:
    props = server(argv_drop=["--no-enable-chunked-prefill", "--max-model-len"])
    assert [d[2].split("\n")[1][:40] for d in model_server(props)] == ["--max-model-len is unset: vLLM takes the"]


# --- rule 6: image -----------------------------------------------------------------------------

def test_a_v1_only_vllm_image_on_v100_is_refused() -> None:
    assert model_server(server(image="vllm/vllm-openai:v0.10.1")) == only(
        "vllm-image", "image vllm/vllm-openai:v0.10.1: Tesla V100-SXM2-32GB (sm_70) needs vLLM's V0 engine, and "
        "this pack's facts and flag table are for vllm/vllm-openai:v0.9.2, the last line whose V0 engine runs "
        "Volta (later lines are V1-only, which needs sm_80). Use vllm/vllm-openai:v0.9.2, or list a tested build "
        "of it in this policy's voltaImages.")
    assert model_server(server(image="docker.io/vllm/vllm-openai:v0.9.2@sha256:abc")) == []
    assert model_server(server(image="registry.local/vllm:0.9.2"),
                        config={"vllm-image": {"voltaImages": ["registry.local/vllm:0.9.2"]}}) == []


def test_ray_cluster_image_without_ray_is_refused() -> None:
    props = {"pool": "reasoning", "instance": "reasoning-gpu-01", "nodes": ["gpu-01", "gpu-02"], "head": "gpu-01",
             "wantGpus": 16.0, "image": "vllm/vllm-openai:v0.9.2", "rayPort": 6379.0}
    assert analyze("llm-cluster:ray:RayCluster", "reasoning-gpu-01", props) == []
    got = analyze("llm-cluster:ray:RayCluster", "reasoning-gpu-01", {**props, "image": "nvcr.io/nvidia/pytorch:24.05"})
    assert got == only("vllm-image", "image nvcr.io/nvidia/pytorch:24.05 is not known to contain Ray, which every "
                       "container of a multi-node instance runs (known: rayproject/ray, rayproject/ray-ml, "
                       "vllm/vllm-openai). Use vllm/vllm-openai:v0.9.2, or list the image in this policy's rayImages.")


# --- rule 7: topology --------------------------------------------------------------------------

def test_tensor_parallel_16_on_8_gpu_nodes_gets_the_tp8_pp2_layout() -> None:
    props = set_flag(server(nodes=["gpu-03", "gpu-04"], tensorParallel=16.0), "--tensor-parallel-size", "16")
    assert of("parallelism", model_server(props)) == only(
        "parallelism", "--tensor-parallel-size 16 is more than the 8 GPUs of one node: tensor parallelism "
        "all-reduces every layer and must stay inside a node (NVLink/PCIe). Use --tensor-parallel-size 8 "
        "--pipeline-parallel-size 2 across 2 nodes.")


def test_pipeline_parallel_inside_one_node_is_refused() -> None:
    props = set_flag(server(), "--tensor-parallel-size", "4") | {"pipelineParallel": 2.0}
    props["argv"] += ["--pipeline-parallel-size", "2"]
    assert model_server(props) == only(
        "parallelism", "--pipeline-parallel-size 2 inside one node: pipeline stages belong across nodes (only "
        "activations cross the network). Use --tensor-parallel-size 8 instead.")


def test_tp_times_pp_must_fill_the_nodes_spanned() -> None:
    props = server(nodes=["gpu-01", "gpu-02"], argv_add=["--pipeline-parallel-size", "2"])
    props = set_flag(props, "--tensor-parallel-size", "4")
    assert of("parallelism", model_server(props)) == only(
        "parallelism", "tensor 4 x pipeline 2 = 8 GPUs, but the instance spans 2 nodes x 8 GPUs = 16: Ray would "
        "leave GPUs idle or not find enough. Use --tensor-parallel-size 8 --pipeline-parallel-size 2.")


def test_attention_heads_must_divide_by_tp() -> None:
    props = set_flag(server(arch="deepseek-r1-distill-qwen-32b"), "--tensor-parallel-size", "3")
    assert of("parallelism", model_server(props)) == only(
        "parallelism", "--tensor-parallel-size 3: deepseek-r1-distill-qwen-32b has 40 attention heads, not "
        "divisible by 3 (vLLM: \"Total number of attention heads (40) must be divisible by tensor parallel size "
        "(3).\"). Use one of: 1, 2, 4, 5, 8.")


RAY_WORKER = {
    "name": "ray-worker", "networkMode": "host", "entrypoints": ["ray"],
    "command": ["start", "--block", "--address=192.168.10.11:6379", "--node-ip-address=192.168.10.12"],
    "envs": [f"{k}={v}" for k, v in CHAT_ENV.items()],
    "labels": [{"label": "llm-cluster.role", "value": "ray-worker"},
               {"label": "llm-cluster.gpu-model", "value": V100},
               {"label": "llm-cluster.image", "value": "vllm/vllm-openai:v0.9.2"}],
    "image": UNKNOWN,
}
CONTAINER = "docker:index/container:Container"


def ray_worker(**changes: Any) -> list[tuple[str, str, str]]:
    props = {**copy.deepcopy(RAY_WORKER), **changes}
    return analyze(CONTAINER, "reasoning-gpu-01-ray-worker-gpu-02", props, parent_type="llm-cluster:ray:RayCluster")


def test_ray_worker_of_the_reference_is_clean_even_with_an_unknown_image_id() -> None:
    assert ray_worker() == []


def test_ray_worker_without_the_roce_gid_index_is_refused() -> None:
    envs = [e for e in RAY_WORKER["envs"] if not e.startswith("NCCL_IB_GID_INDEX=")]
    assert ray_worker(envs=envs) == only(
        "multi-node-network", "NCCL_IB_GID_INDEX not set in this container's env: Ray's executor passes only vLLM's "
        "own variables to workers, so each container needs the NCCL ones itself, or NCCL falls back to the wrong "
        "interface or TCP (RoCE needs the GID index, usually 3). Set them from the node's hca and interface.")
    assert of("multi-node-network", ray_worker(envs=envs, labels=RAY_WORKER["labels"] + [
        {"label": "llm-cluster.link-layer", "value": "infiniband"}])) == []


def test_ray_worker_on_a_bridge_network_is_refused() -> None:
    assert ray_worker(networkMode="bridge") == only(
        "multi-node-network", "networkMode is bridge: Ray and NCCL need the node's own addresses and high ports "
        "(VLLM_HOST_IP, RDMA). Set network_mode=\"host\".")


# --- rule 8: flags -----------------------------------------------------------------------------

def flag_errors(*extra: str, drop: tuple[str, ...] = ()) -> list[str]:
    got = model_server(server(argv_add=list(extra), argv_drop=list(drop)))
    return [d[2].split("\n", 1)[1] for d in got if d[0] == "vllm-serve-flags"]


def test_model_flag_gets_vllms_own_refusal() -> None:
    props = server()
    props["argv"] = ["vllm", "serve", "--model", "/data/models/Qwen3-30B-A3B"] + props["argv"][3:]
    assert of("vllm-serve-flags", model_server(props)) == only(
        "vllm-serve-flags", "vllm serve: With `vllm serve`, you should provide the model as a positional argument "
        "or in a config file instead of via the `--model` option.")


def test_unknown_flag_suggests_the_real_one() -> None:
    assert flag_errors("--enable-prefix-cache") == [
        "vllm serve: unrecognized flag --enable-prefix-cache: not a `vllm serve` flag in vLLM 0.9.2; did you mean "
        "--enable-prefix-caching?"]


def test_every_bad_value_is_reported_not_only_the_first() -> None:
    assert flag_errors("--block-size", "48", "--quantization", "int4", "--max-num-seqs", "many",
                       "--enable-chunked-prefill=False") == [
        "vllm serve: argument --block-size: invalid choice: 48 (choose from 1, 8, 16, 32, 64, 128)",
        "vllm serve: argument --max-num-seqs: invalid int value: 'many'",
        "vllm serve: argument --enable-chunked-prefill/--no-enable-chunked-prefill: ignored explicit argument 'False'",
        "vllm serve: argument --quantization/-q: unknown quantization method 'int4'; vLLM 0.9.2 knows: aqlm, "
        "auto-round, awq, awq_marlin, bitblas, bitsandbytes, compressed-tensors, deepspeedfp, experts_int8, fbgemm_fp8, "
        "fp8, gguf, gptq, gptq_bitblas, gptq_marlin, gptq_marlin_24, hqq, ipex, marlin, modelopt, modelopt_fp4, "
        "moe_wna16, neuron_quant, ptpc_fp8, qqq, quark, rtn, torchao, tpu_int8"]


def test_underscore_spelling_and_aliases_are_real_flags() -> None:
    assert flag_errors("--max_num_batched_tokens", "8192", "-q", "gptq", "--no-enable-prefix-caching") == []


# --- rule 9: security --------------------------------------------------------------------------

GATEWAY_PROPS = {"node": "gpu-01", "port": 80.0, "authRequired": True, "apiKeyIds": ["default"],
                 "keySource": "generated", "tls": False, "routes": {}, "pathRoutes": {}, "exposedPaths": []}


def test_gateway_without_keys_is_refused() -> None:
    gateway = "llm-cluster:gateway:Gateway"
    assert analyze(gateway, "gateway", GATEWAY_PROPS) == []
    assert analyze(gateway, "gateway", {**GATEWAY_PROPS, "authRequired": False}) == only(
        "gateway-auth", "authRequired is false: every model would be open to anyone who reaches the gateway's port. "
        "Keep API keys on (state gateway.apiKeys, or leave it empty to have a key generated on the host).")


PLAINTEXT = ("Anyone with docker or shell access on the node reads it (docker inspect, ps, the command log). Read it "
             "from a file on the host (NAME__FILE, --api-key \"$(cat /etc/llm-cluster/…)\"), or list a harmless env "
             "name in this policy's ignoreEnv.")


def test_literal_api_key_and_token_in_a_container_are_refused() -> None:
    props = {"networkMode": "host", "entrypoints": ["vllm"],
             "command": CHAT_ARGV[1:] + ["--api-key", "sk-live-123"],
             "envs": ["HF_TOKEN=hf_abc", "VLLM_USE_V1=0", "GF_SECURITY_ADMIN_PASSWORD__FILE=/run/secrets/pw"],
             "labels": [{"label": "llm-cluster.role", "value": "vllm"}]}
    got = analyze(CONTAINER, "chat-gpu-03-vllm", props, parent_type="llm-cluster:vllm:ModelServer")
    assert got == only("no-plaintext-secrets", f"credential in plain text: env HF_TOKEN, --api-key. {PLAINTEXT}")
    props["envs"] = ["HF_TOKEN=hf_abc", "VLLM_USE_V1=0"]
    props["command"] = CHAT_ARGV[1:]
    assert analyze(CONTAINER, "c", props, parent_type="llm-cluster:vllm:ModelServer",
                   config={"no-plaintext-secrets": {"ignoreEnv": ["HF_TOKEN"]}}) == []


def test_secret_assignment_in_a_remote_script_is_refused() -> None:
    props = {"connection": {"host": "192.168.10.11"}, "create": 'set -euo pipefail\nKEY="$(openssl rand -hex 16)"\n'}
    assert analyze("command:remote:Command", "keys", props) == []
    props["create"] += "export OPENAI_API_KEY=sk-abc\n"
    assert analyze("command:remote:Command", "keys", props) == only(
        "no-plaintext-secrets", f"credential in plain text: script OPENAI_API_KEY=…. {PLAINTEXT}")


def test_vllm_on_the_host_network_must_bind_the_cluster_address() -> None:
    props = {"networkMode": "host", "entrypoints": ["vllm"], "command": CHAT_ARGV[1:],
             "labels": [{"label": "llm-cluster.role", "value": "vllm"}]}
    assert analyze(CONTAINER, "v", props, parent_type="llm-cluster:vllm:ModelServer") == []
    props["command"] = [t for t in CHAT_ARGV[1:] if t not in ("--host", "192.168.10.13")]
    assert analyze(CONTAINER, "v", props, parent_type="llm-cluster:vllm:ModelServer") == only(
        "internal-ports", "vllm serve --host (unset) on the host network listens on every interface of the node, "
        "and /v1, /metrics and /health answer without a key there (only the gateway checks keys). Pass --host "
        "<the node's cluster address>.")


def test_published_internal_port_and_open_ray_dashboard_are_refused() -> None:
    props = {"networkMode": "bridge", "entrypoints": ["ray"], "command": ["start", "--head", "--block"],
             "labels": [{"label": "llm-cluster.role", "value": "prometheus"}],
             "ports": [{"internal": 9090.0, "external": 9090.0, "ip": "127.0.0.1"}]}
    assert of("internal-ports", analyze(CONTAINER, "p", props, parent_type="llm-cluster:monitoring:Monitoring")) == []
    props["ports"] = [{"internal": 9090.0, "external": 9090.0}]
    props["command"] += ["--dashboard-host=0.0.0.0"]
    got = of("internal-ports", analyze(CONTAINER, "p", props, parent_type="llm-cluster:monitoring:Monitoring"))
    assert [d[2].split("\n")[1] for d in got] == [
        "port 9090 of a prometheus container is published on every interface: vLLM, Ray and metrics ports serve "
        "without authentication. Publish it on the node's cluster address (ports[].ip) or drop it and let the "
        "gateway/Prometheus reach it over the cluster network.",
        "ray start --dashboard-host=0.0.0.0 opens Ray's dashboard (job submission = code execution) on every "
        "interface. Bind it to the node's cluster address or leave it on 127.0.0.1."]


# --- rule 10: MLA ------------------------------------------------------------------------------

def test_mla_on_v100_is_advisory_and_silenced_by_vllm_mla_disable() -> None:
    props = server(arch="deepseek-r1", quantization="gptq")
    assert of("mla-attention", model_server(props)) == only(
        "mla-attention", "deepseek_v3 uses MLA attention: vLLM 0.9.2 picks TRITON_MLA on V0, but its prefill calls "
        "FlashAttention-2, which needs compute capability 8.0; on Tesla V100-SXM2-32GB (sm_70) it is likely to fail "
        "(inferred from vLLM's code, not tested). Set VLLM_MLA_DISABLE=1 in the pool's env (vLLM then keeps the full "
        "per-head KV cache: check the capacity plan), or serve it on sm_80+.", level="advisory")
    props["env"]["VLLM_MLA_DISABLE"] = "1"
    assert of("mla-attention", model_server(props)) == []


# --- rule 11: memory ---------------------------------------------------------------------------

def test_model_that_does_not_fit_is_mandatory() -> None:
    capacity = {**CAPACITY, "fits": False, "max_concurrency": 0.0,
                "reason": "weights need 41.8 GiB per GPU, more than the 29.4 GiB usable"}
    assert model_server(server(capacity=capacity)) == only(
        "memory-fit", "does not fit: weights need 41.8 GiB per GPU, more than the 29.4 GiB usable. Lower "
        "--max-model-len, raise --gpu-memory-utilization, quantize the weights (GPTQ), or spread the model over "
        "more GPUs (tensor/pipeline parallel).")


def test_low_concurrency_is_advisory_with_a_configurable_threshold() -> None:
    props = server(capacity={**CAPACITY, "max_concurrency": 2.5, "kv_tokens": 81920.0})
    assert model_server(props) == only(
        "memory-headroom", "only 2.5 sequences of max-model-len fit in the KV cache at once (81920 tokens), below "
        "minConcurrency 4: requests queue or get preempted under load. Lower --max-model-len, or add GPUs to the "
        "instance.", level="advisory")
    assert model_server(props, config={"memory-headroom": {"minConcurrency": 2}}) == []


# --- raw containers, preview and config -------------------------------------------------------

def raw_vllm(**changes: Any) -> dict[str, Any]:
    env = {**CHAT_ENV}
    return {"networkMode": "host", "entrypoints": ["vllm"], "command": CHAT_ARGV[1:],
            "envs": [f"{k}={v}" for k, v in env.items()],
            "labels": [{"label": "llm-cluster.role", "value": "vllm"},
                       {"label": "llm-cluster.gpu-model", "value": V100},
                       {"label": "llm-cluster.image", "value": "vllm/vllm-openai:v0.9.2"}], **changes}


def test_a_raw_vllm_container_is_checked_but_a_component_child_is_left_to_its_modelserver() -> None:
    props = raw_vllm()
    props["command"] = [t if t != "half" else "bfloat16" for t in props["command"]]
    expected = only("gpu-dtype", "--dtype bfloat16: bfloat16 needs compute capability 8.0; Tesla V100-SXM2-32GB "
                    "(sm_70) has none (vLLM 0.9.2 refuses it at startup). Use --dtype half (the stack's model "
                    "dtype: half).")
    assert analyze(CONTAINER, "mine", props) == expected
    assert analyze(CONTAINER, "mine", props, parent_type="llm-cluster:vllm:ModelServer") == []


def test_unknown_argv_at_preview_is_an_advisory_cant_run() -> None:
    got = model_server(server(argv=UNKNOWN))
    assert {d[1] for d in got} == {"advisory"}
    assert got[0][2].startswith("can't run policy 'gpu-dtype' from policy pack 'llm-cluster-hardware@v0.1.0' "
                                "during preview")


def test_levels_are_configurable_per_policy_and_for_all() -> None:
    props = set_flag(server(), "--dtype", "bfloat16")
    assert model_server(props, config={"gpu-dtype": "disabled"}) == []
    assert [d[1] for d in model_server(props, config={"all": "advisory"})] == ["advisory"]
    assert [d[1] for d in model_server(props, config={"all": "advisory", "gpu-dtype": {
        "enforcementLevel": "mandatory"}})] == ["mandatory"]


@pytest.mark.parametrize("config, message", [
    ({"gpu-dtyp": "mandatory"}, "unknown policy 'gpu-dtyp'; policies: gpu-dtype,"),
    ({"gpu-dtype": "strict"}, "gpu-dtype: enforcement level 'strict' is not one of advisory, mandatory, remediate, disabled"),
    ({"gpu-dtype": {"allowFloat32": "yes"}}, "gpu-dtype.allowFloat32: 'yes' is not of type 'boolean'"),
    ({"memory-headroom": {"minConcurency": 2}}, "memory-headroom: Additional properties are not allowed "
                                                "('minConcurency' was unexpected)"),
])
def test_policy_config_is_checked_against_the_schemas(config: dict[str, Any], message: str) -> None:
    from plan.analyze import PolicyConfigError
    with pytest.raises(PolicyConfigError) as err:
        configure_request(config)
    assert str(err.value).startswith(message)
