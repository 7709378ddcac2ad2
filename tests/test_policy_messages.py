"""Policy messages say what to edit: one violation per pool and rule listing its instances, the stack
keys behind every flag and variable named, memory-fit fixes that can work. The real program under
mocks, the real pack (plan.analyze); each test changes one field of the reference stack."""

from __future__ import annotations

from typing import Any

from plan.analyze import Violation, analyze
from policies.pack import POLICIES
from policies.rules.common import name_stack_keys
from tests.conftest import prod_config, run_stack

NS = "llm-cluster:"
DESCRIPTIONS = {p.name: p.description for p in POLICIES}
CHAT_INSTANCES = "pools.chat, 4 instances (chat-gpu-03, chat-gpu-04, chat-gpu-05, chat-gpu-06)"


def violations_of(config: dict[str, Any], policy: str) -> list[Violation]:
    return [v for v in analyze(run_stack(config, preview=True).registrations) if v.policy_name == policy]


def body(v: Violation) -> str:
    """The message without the description the servicer puts first."""
    return v.message.removeprefix(DESCRIPTIONS[v.policy_name] + "\n")


def test_a_fault_of_a_four_instance_pool_is_one_violation_naming_the_instances_and_the_key() -> None:
    config = prod_config()
    config[NS + "models"]["qwen3-30b-a3b"]["dtype"] = "bfloat16"
    found = violations_of(config, "gpu-dtype")
    assert [(v.resource_name, v.enforcement_level) for v in found] == [("chat-gpu-03", "mandatory")]
    assert body(found[0]) == (
        f"{CHAT_INSTANCES}: --dtype bfloat16: bfloat16 needs compute capability 8.0; Tesla V100-SXM2-32GB "
        "(sm_70) has none (vLLM refuses it at startup; vLLM 0.19.0 platforms/cuda.py supported dtypes below sm_80: "
        "fp16, fp32 [read from code]). Instead, set models.qwen3-30b-a3b.dtype: half."
    )


def test_a_flag_from_extra_args_is_named_as_an_extra_args_entry() -> None:
    config = prod_config()
    config[NS + "pools"]["chat"]["vllm"]["extraArgs"] = ["--seed", "7", "--enable-prefix-cache"]
    found = violations_of(config, "vllm-serve-flags")
    assert len(found) == 1
    assert body(found[0]) == (
        f"{CHAT_INSTANCES}: vllm serve (vLLM 0.19.1): unrecognized flag --enable-prefix-cache: not a `vllm serve` "
        "flag in vLLM 0.19.1; did you mean --enable-prefix-caching? Stack keys to edit: pools.chat.vllm.extraArgs[2] (given in "
        "extraArgs: --enable-prefix-cache), pools.chat.vllm.enablePrefixCaching (--enable-prefix-caching)."
    )


def test_a_variable_the_advice_asks_for_is_named_in_the_pools_env() -> None:
    keys = {
        "--max-model-len": "pools.chat.vllm.maxModelLen",
        "*env": "pools.chat.env",
        "NCCL_IB_HCA": "nodes.gpu-03.hca.device",
        "HF_TOKEN": "nccl.extraEnv.HF_TOKEN",
    }
    assert name_stack_keys("Set VLLM_MLA_DISABLE=1, fix NCCL_IB_HCA and HF_TOKEN, lower --max-model-len.", keys) == (
        "Set VLLM_MLA_DISABLE=1, fix NCCL_IB_HCA and HF_TOKEN, lower --max-model-len. Stack keys to edit: "
        "pools.chat.env.VLLM_MLA_DISABLE (VLLM_MLA_DISABLE), nodes.gpu-03.hca.device (NCCL_IB_HCA), "
        "nccl.extraEnv.HF_TOKEN (HF_TOKEN), pools.chat.vllm.maxModelLen (--max-model-len)."
    )
    # A key the message already names is not repeated; a message without flags is left alone.
    assert name_stack_keys("raise pools.chat.vllm.maxModelLen (--max-model-len)", keys) == (
        "raise pools.chat.vllm.maxModelLen (--max-model-len)"
    )
    assert name_stack_keys("no flag here.", keys) == "no flag here."
    # A phrase the keys stand for as written (the pool's image), and a variable the pool sets by its exact name.
    assert name_stack_keys(
        "image vllm/vllm-openai:latest is not pinned; env OPENAI_API_KEY is plain.",
        {"image vllm/vllm-openai:latest": "pools.chat.image", "OPENAI_API_KEY": "pools.chat.env.OPENAI_API_KEY"},
    ) == (
        "image vllm/vllm-openai:latest is not pinned; env OPENAI_API_KEY is plain. Stack keys to edit: "
        "pools.chat.image (image), pools.chat.env.OPENAI_API_KEY (OPENAI_API_KEY)."
    )
    # The capacity planner writes flags without their dashes.
    assert name_stack_keys("lower max-model-len to 14384 or less", keys) == (
        "lower max-model-len to 14384 or less. Stack key to edit: pools.chat.vllm.maxModelLen (max-model-len)."
    )


def test_memory_fit_proposes_fixes_that_work_and_says_when_utilization_cannot() -> None:
    config = prod_config()
    # Qwen3-30B-A3B fp16 (about 57 GiB of weights) on one V100 of 32 GB per instance.
    config[NS + "pools"]["chat"].update(tensorParallel=1, replicasPerNode=1)
    found = violations_of(config, "memory-fit")
    assert [v.resource_name for v in found] == ["chat-gpu-03"]
    text = body(found[0])
    assert text.startswith(f"{CHAT_INSTANCES}: does not fit: the weights alone need ")
    assert "To fit: spread each instance over 4 GPUs instead of 1" in text
    assert "serve a 4-bit GPTQ checkpoint" in text
    assert "(Raising pools.chat.vllm.gpuMemoryUtilization (a fraction) to 0.95 would not be enough.)" in text
    assert "maxModelLen from" not in text  # no context length makes the weights fit
    assert "raise gpu-memory-utilization" not in text  # the planner's generic advice is replaced


def test_memory_fit_offers_a_shorter_context_when_only_the_kv_cache_is_short() -> None:
    from components.engines.vllm.capacity import pool_capacity
    from components.planning.load import load_stack_config

    config = prod_config()
    config[NS + "pools"]["reasoning"]["vllm"]["maxModelLen"] = 32768  # MLA off: the full per-head KV cache
    tokens = pool_capacity(load_stack_config(config, set()), "reasoning").kv_tokens
    assert 8192 < tokens < 32768
    found = violations_of(config, "memory-fit")
    assert [v.resource_name for v in found] == ["reasoning-gpu-01"]
    assert body(found[0]) == (
        f"pools.reasoning, instance reasoning-gpu-01: does not fit: the KV cache holds {tokens} tokens, fewer than "
        f"max-model-len 32768: vLLM refuses to start. To fit: lower pools.reasoning.vllm.maxModelLen from 32768 to "
        f"{tokens} or less; or spread each instance over 32 GPUs instead of 16 (pools.reasoning.tensorParallel within "
        "a node, pools.reasoning.pipelineParallel across nodes). (Raising pools.reasoning.vllm.gpuMemoryUtilization "
        "(a fraction) to 0.95 would not be enough.)"
    )


def test_the_gateway_without_auth_names_gateway_auth() -> None:
    config = prod_config()
    config[NS + "gateway"].update(auth=False, apiKeys=[])
    found = violations_of(config, "gateway-auth")
    assert [body(v) for v in found] == [
        "gateway.auth is false: every model would be open to anyone who reaches the gateway's port. Set "
        "gateway.auth: true (keys in gateway.apiKeys, or none to have one generated on the host), or, for a lab "
        "only, lower this policy's enforcement level."
    ]


PLAINTEXT_ADVICE = (
    "Anyone with docker or shell access on the node reads it (docker inspect, ps, the command log). Read it from a "
    'file on the host (NAME__FILE, --api-key "$(cat /etc/llm-cluster/…)"), or list a harmless env name in this '
    "policy's ignoreEnv."
)


def test_a_container_rule_reports_once_per_pool_with_its_instances_and_the_key_at_preview() -> None:
    # A stack policy (policies.rules.grouped) through the servicer's AnalyzeStack, as `pulumi preview` runs it.
    config = prod_config()
    config[NS + "pools"]["chat"]["env"] = {"OPENAI_API_KEY": "not-a-real-key"}
    found = violations_of(config, "no-plaintext-secrets")
    assert [(v.resource_name, v.enforcement_level) for v in found] == [("chat-gpu-03-vllm", "mandatory")]
    assert body(found[0]) == (
        f"{CHAT_INSTANCES}: credential in plain text: env OPENAI_API_KEY. {PLAINTEXT_ADVICE} Stack key to edit: "
        "pools.chat.env.OPENAI_API_KEY (OPENAI_API_KEY)."
    )
    assert "not-a-real-key" not in found[0].message


def test_a_container_rule_names_which_containers_of_an_instance_have_each_finding() -> None:
    config = prod_config()
    config[NS + "pools"]["reasoning"]["vllm"]["extraArgs"] = ["--api-key", "k"]  # vLLM runs on the Ray head only
    config[NS + "nccl"] = {**config.get(NS + "nccl", {}), "extraEnv": {"WANDB_API_KEY": "w"}}
    found = {
        v.resource_name: body(v)
        for v in violations_of(config, "no-plaintext-secrets")
        if v.resource_type == "docker:index/container:Container"
    }
    assert sorted(found) == ["chat-gpu-03-vllm", "reasoning-gpu-01-ray-head"]
    assert found["reasoning-gpu-01-ray-head"] == (
        "pools.reasoning, instance reasoning-gpu-01: in reasoning-gpu-01-ray-head: credential in plain text: env "
        "WANDB_API_KEY, --api-key; in reasoning-gpu-01-ray-worker-gpu-02: credential in plain text: env "
        f"WANDB_API_KEY. {PLAINTEXT_ADVICE} Stack keys to edit: nccl.extraEnv.WANDB_API_KEY (WANDB_API_KEY), "
        "pools.reasoning.vllm.extraArgs[0] (given in extraArgs: --api-key)."
    )


def test_containers_of_no_pool_report_on_their_own_resource() -> None:
    config = prod_config()
    config[NS + "monitoring"]["nodeExporter"] = {"image": "prom/node-exporter:latest", "port": 9100}
    found = violations_of(config, "pinned-images")
    assert sorted(v.resource_name for v in found) == [f"monitoring-gpu-0{i}-node-exporter" for i in range(1, 7)]
    assert {body(v) for v in found} == {
        "image prom/node-exporter:latest is not pinned (tag latest moves to new builds): each node pulls whatever "
        "the tag points to that day, so nodes drift apart and a replaced node can come back with another version. "
        "Pin a version tag (prom/node-exporter:<version>) or a digest (prom/node-exporter@sha256:<digest>)."
    }


def test_cpu_offload_beyond_the_nodes_ram_is_refused_with_what_fits() -> None:
    config = prod_config()
    config[NS + "pools"]["chat"]["vllm"]["extraArgs"] = ["--cpu-offload-gb", "48"]
    found = violations_of(config, "host-memory")
    assert [v.resource_name for v in found] == ["chat-gpu-03"]
    assert body(found[0]) == (
        f"{CHAT_INSTANCES}: node gpu-03 (also gpu-04, gpu-05, gpu-06) has 380 GiB of RAM (nodes.gpu-03.memoryGib, "
        "unset: the reference cluster's GPU servers' 380 GiB), but the pool's instance there pins 384 GiB of it on "
        "the host (--cpu-offload-gb 48 GiB per GPU, x 8 GPUs): the kernel's OOM killer stops a server, or the node "
        "swaps. Swap space plus CPU offload must stay within 47.5 GiB per GPU, or state the node's real RAM. Stack "
        "key to edit: pools.chat.vllm.extraArgs[0] (given in extraArgs: --cpu-offload-gb)."
    )
    # 47 GiB per GPU fits the reference server; a node stated smaller does not.
    config[NS + "pools"]["chat"]["vllm"]["extraArgs"] = ["--cpu-offload-gb", "47"]
    assert violations_of(config, "host-memory") == []
    config[NS + "nodes"]["gpu-05"]["memoryGib"] = 256
    found = violations_of(config, "host-memory")
    assert "node gpu-05 has 256 GiB of RAM (nodes.gpu-05.memoryGib), but the pool's instance there pins 376 GiB" in (
        body(found[0])
    )


def test_swap_space_above_seven_tenths_of_the_ram_gets_vllms_own_refusal() -> None:
    config = prod_config()
    # The 0.9.2 line has --swap-space (0.19 has none); other rules refuse that image on V100 for other reasons.
    config[NS + "pools"]["chat"]["image"] = "vllm/vllm-openai:v0.9.2"
    assert violations_of(config, "host-memory") == []  # its default, 4 GiB x 8 GPUs, is 32 of 380 GiB
    config[NS + "pools"]["chat"]["vllm"]["swapSpaceGib"] = 40
    found = violations_of(config, "host-memory")
    assert [body(v) for v in found] == [
        f"{CHAT_INSTANCES}: --swap-space 40 GiB per GPU x 8 GPUs = 320 GiB, more than 0.7 of the 380 GiB of RAM of "
        "node gpu-03 (nodes.gpu-03.memoryGib, unset: the reference cluster's GPU servers' 380 GiB): vLLM refuses to "
        'start ("Too large swap space", vllm/config.py CacheConfig.verify_with_parallel_config at v0.9.2 (swap '
        "space x tensor_parallel_size against 0.7 of get_cpu_memory()) [read from code]). At most 33 GiB per GPU "
        "fits; the V1 engine does not swap, so 0 loses nothing there. Stack key to edit: "
        "pools.chat.vllm.swapSpaceGib (--swap-space)."
    ]
