"""vLLM's launch rules called directly on the Launch a ModelServer's props describe, as tables (no pack, no
analyzer): every parallel layout against the node's GPUs and the model's heads, the native launcher on each
image line, swap space and CPU offload against each node's RAM on both sides of each limit, the fit advice's
every fix on both sides of its threshold, the image's kernels and Ray, and the flag errors: exact messages."""

from __future__ import annotations

from typing import Any

import pytest

from components.engines.vllm.launch import Launch, model_server_launch
from components.engines.vllm.rules.capacity import check_fit, fit_fixes
from components.engines.vllm.rules.flags import check_flags
from components.engines.vllm.rules.host_memory import check_host_memory
from components.engines.vllm.rules.image import check_arch, ray_problem
from components.engines.vllm.rules.topology import check_native_launcher, check_parallelism
from tests.support.policies import server

V92 = "vllm/vllm-openai:v0.9.2"
V011 = "vllm/vllm-openai:v0.11.0"
V19 = "vllm/vllm-openai:v0.19.1"
V19_2404 = "vllm/vllm-openai:v0.19.1-ubuntu2404"


def launch(**changes: Any) -> Launch:
    found = model_server_launch(server(**changes))
    assert found is not None
    return found


def layout(
    tp: int | None, pp: int | None, nodes: int = 1, per_node: float | None = 8.0, arch: str = "qwen3-30b-a3b"
) -> Launch:
    """The chat server with --tensor-parallel-size tp and --pipeline-parallel-size pp (None: not given)."""
    add = (["--tensor-parallel-size", str(tp)] if tp is not None else []) + (
        ["--pipeline-parallel-size", str(pp)] if pp is not None else []
    )
    return launch(
        argv_drop=["--tensor-parallel-size"],
        argv_add=add,
        nodes=[f"gpu-{i:02}" for i in range(1, nodes + 1)],
        gpuCount=per_node,
        tensorParallel=None,
        pipelineParallel=None,
        arch=arch,
    )


def too_wide(tp: int, per_node: int, pp: int) -> str:
    return (
        f"--tensor-parallel-size {tp} is more than the {per_node} GPUs of one node: tensor parallelism "
        "all-reduces every layer and must stay inside a node (NVLink/PCIe). Use --tensor-parallel-size "
        f"{per_node} --pipeline-parallel-size {pp} across {pp} nodes."
    )


def spans(tp: int, pp: int, nodes: int, per_node: int) -> str:
    return (
        f"tensor {tp} x pipeline {pp} = {tp * pp} GPUs, but the instance spans {nodes} nodes x {per_node} GPUs = "
        f"{per_node * nodes}: Ray would leave GPUs idle or not find enough. Use --tensor-parallel-size {per_node} "
        f"--pipeline-parallel-size {nodes}."
    )


def stages_inside(pp: int, tp: int) -> str:
    return (
        f"--pipeline-parallel-size {pp} inside one node: pipeline stages belong across nodes (only activations "
        f"cross the network). Use --tensor-parallel-size {tp * pp} instead."
    )


def stage_per_node(pp: int, nodes: int) -> str:
    return (
        f"--pipeline-parallel-size {pp} on an instance of {nodes} nodes: pipeline parallelism is what crosses "
        f"nodes, one stage per node. Use --pipeline-parallel-size {nodes}."
    )


def heads(tp: int, divisors: str, arch: str = "qwen3-30b-a3b", n: int = 32) -> str:
    return (
        f"--tensor-parallel-size {tp}: {arch} has {n} attention heads, not divisible by {tp} "
        f'(vLLM: "Total number of attention heads ({n}) must be divisible by tensor parallel size ({tp})."). '
        f"Use one of: {divisors}."
    )


# (tp, pp, nodes, GPUs per node, messages): Qwen3-30B-A3B has 32 attention heads.
LAYOUTS: list[tuple[int | None, int | None, int, float | None, list[str]]] = [
    (8, None, 1, 8.0, []),
    (None, None, 1, 8.0, []),
    # Neither the argv nor the props state TP: one GPU, which fits a one-GPU node.
    (None, None, 1, 1.0, []),
    (2, None, 1, 1.0, [too_wide(2, 1, 2)]),
    # No nodes stated: one.
    (8, None, 0, 8.0, []),
    (8, None, 0, 4.0, [too_wide(8, 4, 2)]),
    (1, 1, 1, 8.0, []),
    (4, 2, 2, 4.0, []),
    (8, 2, 2, 8.0, []),
    (8, 3, 3, 8.0, []),
    # TP one over the node: the whole layout in one message (16 GPUs: two nodes).
    (9, None, 1, 8.0, [too_wide(9, 8, 1), heads(9, "1, 2, 4, 8")]),
    (16, None, 1, 8.0, [too_wide(16, 8, 2)]),
    (16, 2, 4, 8.0, [too_wide(16, 8, 4)]),
    (4, 3, 1, 8.0, ["tensor 4 x pipeline 3 = 12 GPUs, more than the 8 of the node.", stages_inside(3, 4)]),
    (4, 2, 1, 8.0, [stages_inside(2, 4)]),
    (2, 2, 1, 4.0, [stages_inside(2, 2)]),
    (8, None, 2, 8.0, [spans(8, 1, 2, 8), stage_per_node(1, 2)]),
    (4, 2, 2, 8.0, [spans(4, 2, 2, 8)]),
    (2, 4, 2, 4.0, [stage_per_node(4, 2)]),
    (2, 4, 2, 5.0, [spans(2, 4, 2, 5), stage_per_node(4, 2)]),
    (8, 1, 1, 8.0, []),
    (3, None, 1, 8.0, [heads(3, "1, 2, 4, 8")]),
    (3, None, 1, None, [heads(3, "1, 2, 4, 8, 16, 32")]),
    # Without the node's GPU count only the stages and heads are judged.
    (16, 2, 1, None, [stages_inside(2, 16)]),
    (8, 1, 2, None, [stage_per_node(1, 2)]),
]


@pytest.mark.parametrize(("tp", "pp", "nodes", "per_node", "messages"), LAYOUTS)
def test_each_parallel_layout_against_the_nodes_and_heads(
    tp: int | None, pp: int | None, nodes: int, per_node: float | None, messages: list[str]
) -> None:
    assert check_parallelism(layout(tp, pp, nodes, per_node), {}) == messages


@pytest.mark.parametrize(("tp", "pp", "messages"), [(4, 2, [stages_inside(2, 4)]), (6, 1, [heads(6, "1, 2, 4, 8")])])
def test_the_layout_falls_back_to_the_props_when_the_argv_states_none(tp: int, pp: int, messages: list[str]) -> None:
    found = launch(argv_drop=["--tensor-parallel-size"], tensorParallel=float(tp), pipelineParallel=float(pp))
    assert check_parallelism(found, {}) == messages


def test_a_model_outside_the_catalog_has_no_heads_to_divide() -> None:
    assert check_parallelism(layout(3, None, arch="no-such-model"), {}) == []


# The native launcher's flags on each image line (ModelServer: the stack key; a raw argv: the first flag).
NATIVE = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501"]


def native_refusal(image: str, version: str, choice: str, flags: str, cite: str) -> str:
    return (
        f"{choice} starts vLLM's own multi-node launcher ({flags}, --headless on the other nodes), which vLLM "
        f"{version} of pools.chat.image {image} does not have ({cite}): it would exit on an unrecognized argument. "
        f"Keep multiNode: ray on this image, or use one whose vLLM has the launcher: {V19}, {V19_2404}."
    )


@pytest.mark.parametrize(
    ("image", "argv_add", "refused"),
    [
        (V19, NATIVE, False),
        (V19_2404, NATIVE, False),
        (V011, NATIVE, True),
        (V92, NATIVE, True),
        (V011, ["--master-port=29501", "--nnodes", "2", "--nnodes", "2"], True),
        (V011, [], False),
        # --headless alone is data parallel's too: not the launcher.
        (V011, ["--headless"], False),
        ("registry.example/vllm:private", NATIVE, False),
    ],
)
def test_the_native_launcher_only_on_an_image_whose_vllm_has_it(image: str, argv_add: list[str], refused: bool) -> None:
    found = launch(image=image, argv_add=argv_add)
    messages = check_native_launcher(found, {})
    if not refused:
        assert messages == []
        return
    assert found.facts is not None
    flags = [t.partition("=")[0] for t in argv_add if t.startswith("--")]
    want = native_refusal(
        image,
        found.facts.version,
        "pools.chat.vllm.multiNode: native",
        ", ".join(dict.fromkeys(flags)),
        found.facts.cite("native_multi_node"),
    )
    assert messages == [want]


def test_a_containers_native_launcher_is_named_by_its_first_flag() -> None:
    found = launch(image=V011, argv_add=["--node-rank", "1", "--nnodes", "2"])
    raw = Launch(
        resource="container",
        args=found.args,
        env={},
        gpu_name=None,
        gpu=None,
        image=V011,
        props={"command": ["vllm", "serve", "/m", "--node-rank", "1", "--nnodes", "2"]},
        facts=found.facts,
    )
    assert found.facts is not None
    assert check_native_launcher(raw, {}) == [
        f"--node-rank starts vLLM's own multi-node launcher (--node-rank, --nnodes, --headless on the other "
        f"nodes), which vLLM 0.11.0 of the container's image {V011} does not have "
        f"({found.facts.cite('native_multi_node')}): it would exit on an unrecognized argument. Keep "
        f"multiNode: ray on this image, or use one whose vLLM has the launcher: {V19}, {V19_2404}."
    ]


# -- host memory -------------------------------------------------------------------------------------------


def host(**nodes: tuple[float, int]) -> dict[str, Any]:
    return {
        n: {"memoryGib": ram, "key": f"nodes.{n}.memoryGib", "instances": float(count)}
        for n, (ram, count) in nodes.items()
    }


def too_large_swap(swap: str, gpus: int, total: str, ram: str, node: str, most: int) -> str:
    return (
        f"--swap-space {swap} GiB per GPU x {gpus} GPUs = {total} GiB, more than 0.7 of the {ram} GiB of RAM of node "
        f'{node} (nodes.{node}.memoryGib): vLLM refuses to start ("Too large swap space", vllm/config.py '
        "CacheConfig.verify_with_parallel_config at v0.9.2 (swap space x tensor_parallel_size against 0.7 of "
        f"get_cpu_memory()) [read from code]). At most {most} GiB per GPU fits; the V1 engine does not swap, so 0 "
        "loses nothing there."
    )


def over_ram(
    node: str, ram: str, pin: str, total: str, what: str, gpus: int, each: str, fits: str, also: str = ""
) -> str:
    return (
        f"node {node}{also} has {ram} GiB of RAM (nodes.{node}.memoryGib), but {pin} {total} GiB of it on the host "
        f"({what}, x {gpus} GPUs{each}): the kernel's OOM killer stops a server, or the node swaps. Swap space plus "
        f"CPU offload must stay within {fits} GiB per GPU, or state the node's real RAM."
    )


ONE = "the pool's instance there pins"
TWO = "its 2 instances of the pool pin"
# (image, flags added to the chat server (TP 8), hostMemory, messages): 0.9.2 has --swap-space, 0.19.1
# --kv-offloading-size.
HOST: list[tuple[str, list[str], dict[str, Any], list[str]]] = [
    (V92, [], {}, []),
    (V92, ["--swap-space", "4"], {}, []),
    # 0.7 of 40 GiB is 28: 3.5 x 8 = 28 passes, 3.6 x 8 does not.
    (V92, ["--swap-space", "3.5"], host(**{"gpu-03": (40.0, 1)}), []),
    (
        V92,
        ["--swap-space", "3.6"],
        host(**{"gpu-03": (40.0, 1)}),
        [too_large_swap("3.6", 8, "28.8", "40", "gpu-03", 3)],
    ),
    # The smallest node is judged; of two as small, the first by name.
    (
        V92,
        ["--swap-space", "4"],
        host(**{"gpu-04": (40.0, 0), "gpu-03": (64.0, 0), "gpu-05": (40.0, 0)}),
        [too_large_swap("4", 8, "32", "40", "gpu-04", 3)],
    ),
    # Every instance of the pool on a node: swap and offload per GPU x GPUs x instances against its RAM.
    (V92, ["--cpu-offload-gb", "5"], host(**{"gpu-03": (80.0, 2)}), []),
    (
        V92,
        ["--cpu-offload-gb", "5.5"],
        host(**{"gpu-03": (80.0, 2)}),
        [over_ram("gpu-03", "80", TWO, "88", "--cpu-offload-gb 5.5 GiB per GPU", 8, " each", "5.0")],
    ),
    (V92, ["--cpu-offload-gb", "10"], host(**{"gpu-03": (80.0, 1)}), []),
    (
        V92,
        ["--cpu-offload-gb", "10.5"],
        host(**{"gpu-03": (80.0, 1)}),
        [over_ram("gpu-03", "80", ONE, "84", "--cpu-offload-gb 10.5 GiB per GPU", 8, "", "10.0")],
    ),
    # A node with no instance of the pool is not counted.
    (V92, ["--cpu-offload-gb", "10.5"], host(**{"gpu-03": (80.0, 0)}), []),
    (
        V92,
        ["--swap-space", "2", "--cpu-offload-gb", "9"],
        host(**{"gpu-05": (80.0, 1), "gpu-03": (80.0, 1), "gpu-04": (200.0, 1)}),
        [
            over_ram(
                "gpu-03",
                "80",
                ONE,
                "88",
                "--swap-space 2 + --cpu-offload-gb 9 GiB per GPU",
                8,
                "",
                "10.0",
                " (also gpu-05)",
            )
        ],
    ),
    (
        V19,
        ["--cpu-offload-gb", "1", "--kv-offloading-size", "20"],
        host(**{"gpu-03": (20.0, 1)}),
        [
            over_ram(
                "gpu-03", "20", ONE, "28", "--cpu-offload-gb 1 GiB per GPU + --kv-offloading-size 20 GiB", 8, "", "0.0"
            )
        ],
    ),
    (
        V19,
        ["--kv-offloading-size", "30"],
        host(**{"gpu-03": (20.0, 1)}),
        [over_ram("gpu-03", "20", ONE, "30", "--kv-offloading-size 30 GiB", 8, "", "0.0")],
    ),
    (V19, ["--kv-offloading-size", "20"], host(**{"gpu-03": (20.0, 1)}), []),
    # Swap space alone over both limits: vLLM's own refusal and the node's RAM.
    (
        V92,
        ["--swap-space", "4"],
        host(**{"gpu-03": (30.0, 1)}),
        [
            too_large_swap("4", 8, "32", "30", "gpu-03", 2),
            over_ram("gpu-03", "30", ONE, "32", "--swap-space 4 GiB per GPU", 8, "", "3.8"),
        ],
    ),
    # Three nodes over: the first by name, the others listed.
    (
        V92,
        ["--cpu-offload-gb", "11"],
        host(**{"gpu-06": (80.0, 1), "gpu-04": (80.0, 1), "gpu-05": (80.0, 1), "gpu-03": (100.0, 1)}),
        [
            over_ram(
                "gpu-04", "80", ONE, "88", "--cpu-offload-gb 11 GiB per GPU", 8, "", "10.0", " (also gpu-05, gpu-06)"
            )
        ],
    ),
    # Two instances, a buffer each: (2 x 8 + 8) x 2 = 48 of 64 GiB fits; (3 x 8 + 8) x 2 = 64 of 60 does not,
    # and what is left per GPU is the node's share less the buffer: (60 / 2 - 8) / 8.
    (V19, ["--cpu-offload-gb", "2", "--kv-offloading-size", "8"], host(**{"gpu-03": (64.0, 2)}), []),
    (
        V19,
        ["--cpu-offload-gb", "3", "--kv-offloading-size", "8"],
        host(**{"gpu-03": (60.0, 2)}),
        [
            over_ram(
                "gpu-03",
                "60",
                TWO,
                "64",
                "--cpu-offload-gb 3 GiB per GPU + --kv-offloading-size 8 GiB",
                8,
                " each",
                "2.8",
            )
        ],
    ),
]


@pytest.mark.parametrize(("image", "argv_add", "memory", "messages"), HOST)
def test_swap_and_offload_against_each_nodes_ram(
    image: str, argv_add: list[str], memory: dict[str, Any], messages: list[str]
) -> None:
    found = launch(image=image, argv_drop=["--attention-backend"], argv_add=argv_add, hostMemory=memory)
    assert found.args.errors == ()
    assert check_host_memory(found, {}) == messages


def test_host_memory_counts_the_props_tp_when_the_argv_states_none() -> None:
    found = launch(
        image=V92,
        argv_drop=["--tensor-parallel-size", "--attention-backend"],
        argv_add=["--swap-space", "8"],
        tensorParallel=4.0,
        hostMemory=host(**{"gpu-03": (40.0, 0)}),
    )
    assert check_host_memory(found, {}) == [too_large_swap("8", 4, "32", "40", "gpu-03", 7)]


# -- fit advice --------------------------------------------------------------------------------------------

# A V100-32GB pool at 0.9 that does not fit: 14 GiB of weights, 1 GiB activations + 1 non-torch, a 32k context
# at 96 KiB a token (3 GiB a sequence), 1024 tokens of KV cache left.
GIB = 2**30
BASE_CAPACITY: dict[str, Any] = {
    "fits": False,
    "reason": "the KV cache holds 1024 tokens; lower max-model-len to 1024 or less, or add GPUs",
    "gpu_memory_gib": 32.0,
    "gpu_memory_utilization": 0.9,
    "weights_gib_per_gpu": 26.0,
    "activation_gib": 1.0,
    "non_torch_gib": 1.0,
    "kv_bytes_per_token_per_gpu": 96 * 1024,
    "max_model_len": 32768,
    "tp": 1,
    "pp": 1,
    "kv_tokens": 1024,
}
RAISE = "raise pools.chat.vllm.gpuMemoryUtilization (a fraction) from 0.9 to 0.95"
RAISING = "raising pools.chat.vllm.gpuMemoryUtilization (a fraction) to 0.95 would not be enough"
LOWER = "lower pools.chat.vllm.maxModelLen from 32768 to 1024 or less"


def spread(gpus: int, now: int = 1) -> str:
    return (
        f"spread each instance over {gpus} GPUs instead of {now} (pools.chat.tensorParallel within a node, "
        "pools.chat.pipelineParallel across nodes)"
    )


def gptq(weights: float) -> str:
    return (
        f"serve a 4-bit GPTQ checkpoint (models.qwen.quantization: gptq; about {weights * 0.3:.1f} GiB of weights "
        f"per GPU instead of {weights:.1f})"
    )


# (changes to the capacity, the fixes): each fix on both sides of its threshold.
FIXES: list[tuple[dict[str, Any], list[str]]] = [
    # room at 0.95: 30.4 - 26 - 2 = 2.4 GiB < 3 GiB a sequence; spread over 2: (26 + 3) / 2 = 14.5 <= 26.8.
    ({}, [RAISING, LOWER, spread(2), gptq(26.0)]),
    # 25.4 GiB of weights: room 3.0 = one sequence exactly.
    ({"weights_gib_per_gpu": 25.4}, [RAISE, LOWER, spread(2), gptq(25.4)]),
    ({"weights_gib_per_gpu": 25.41}, [RAISING, LOWER, spread(2), gptq(25.41)]),
    # Already at 0.95 (or above): nothing to raise.
    ({"gpu_memory_utilization": 0.95}, [LOWER, spread(2), gptq(26.0)]),
    ({"gpu_memory_utilization": 0.949}, [RAISING, LOWER, spread(2), gptq(26.0)]),
    # Fewer than one block (16 tokens) cached: no context to propose.
    ({"kv_tokens": 15}, [RAISING, spread(2), gptq(26.0)]),
    ({"kv_tokens": 16}, [RAISING, LOWER.replace("1024", "16"), spread(2), gptq(26.0)]),
    # A checkpoint already quantized: no GPTQ advice.
    ({"quantization": "awq"}, [RAISING, LOWER, spread(2)]),
    # 4-bit weights (7.8 GiB) leave 28.8 - 7.8 - 2 = 19 GiB: one sequence of 19 GiB fits, of 20 GiB not.
    ({"kv_bytes_per_token_per_gpu": 20 * GIB // 32768}, [RAISING, LOWER, spread(2)]),
    ({"kv_bytes_per_token_per_gpu": 19 * GIB // 32768}, [RAISING, LOWER, spread(2), gptq(26.0)]),
    # Spread: the first of x2, x4, x8 whose share fits; none when even x8 does not.
    ({"weights_gib_per_gpu": 100.0, "kv_bytes_per_token_per_gpu": 0}, [RAISING, LOWER, spread(4)]),
    ({"weights_gib_per_gpu": 200.0, "kv_bytes_per_token_per_gpu": 0}, [RAISING, LOWER, spread(8)]),
    ({"weights_gib_per_gpu": 300.0, "kv_bytes_per_token_per_gpu": 0}, [RAISING, LOWER]),
    # TP x PP of the instance now.
    ({"tp": 2, "pp": 2, "weights_gib_per_gpu": 30.0}, [RAISING, LOWER, spread(8, 4), gptq(30.0)]),
    # Nothing to compute from: no advice.
    ({"gpu_memory_gib": 0}, []),
    ({"max_model_len": 0}, []),
]


@pytest.mark.parametrize(("changes", "fixes"), FIXES)
def test_each_fit_fix_on_both_sides_of_its_threshold(changes: dict[str, Any], fixes: list[str]) -> None:
    assert fit_fixes({**BASE_CAPACITY, **changes}, "chat", "qwen") == fixes


def test_the_fit_message_replaces_the_planners_generic_advice_with_the_checked_fixes() -> None:
    assert check_fit({**BASE_CAPACITY, "fits": True}, "chat", "qwen") == []
    assert check_fit({**BASE_CAPACITY, "fits": None}, "chat", "qwen") == []
    [message] = check_fit(BASE_CAPACITY, "chat", "qwen")
    assert message == (
        "does not fit: the KV cache holds 1024 tokens. To fit: "
        + "; or ".join([LOWER, spread(2), gptq(26.0)])
        + ". (Raising pools.chat.vllm.gpuMemoryUtilization (a fraction) to 0.95 would not be enough.)"
    )
    [message] = check_fit(
        {**BASE_CAPACITY, "reason": "weights: add GPUs (TP/PP) or more", "weights_gib_per_gpu": 25.4}, "chat", "qwen"
    )
    assert message == "does not fit: weights. To fit: " + "; or ".join([RAISE, LOWER, spread(2), gptq(25.4)]) + "."
    [message] = check_fit({"fits": False, "reason": None}, "chat", "qwen")
    assert message == (
        "does not fit: no room for one sequence of max-model-len. No single change of this pool fits it: use GPUs "
        "with more memory, or a smaller model."
    )
    # A capacity figure that is not a number counts as none.
    assert fit_fixes({**BASE_CAPACITY, "gpu_memory_gib": True}, "chat", "qwen") == []
    assert fit_fixes({**BASE_CAPACITY, "gpu_memory_gib": "32"}, "chat", "qwen") == []
    assert check_fit({"fits": False}, "chat", "qwen")[0].startswith(
        "does not fit: no room for one sequence of max-model-len. No single"
    )
    assert fit_fixes({**BASE_CAPACITY, "tp": 0, "pp": 0}, "chat", "qwen") == [RAISING, LOWER, spread(2), gptq(26.0)]


# -- flags and the image ----------------------------------------------------------------------------------


def test_each_flag_error_is_prefixed_with_the_program_and_the_version_that_read_it() -> None:
    assert check_flags(launch(), {}) == []
    assert check_flags(launch(argv_add=["--bogus"], image=V92), {}) == [
        "vllm serve (vLLM 0.9.2): unrecognized flag --attention-backend: not a `vllm serve` flag in vLLM 0.9.2; "
        "did you mean --data-parallel-backend?",
        "vllm serve (vLLM 0.9.2): unrecognized flag --bogus: not a `vllm serve` flag in vLLM 0.9.2; did you mean "
        "--host?",
    ]
    # An image without a parser dump is not judged here.
    assert check_flags(launch(argv_add=["--bogus"], image="registry.example/vllm:private"), {}) == []


def test_the_images_torch_must_have_kernels_for_the_gpu() -> None:
    assert check_arch(launch(image=V19), {}) == []
    assert check_arch(launch(image=V92, gpuModel="NVIDIA A100-SXM4-80GB"), {}) == []
    assert check_arch(launch(image="registry.example/vllm:private"), {}) == []
    assert check_arch(launch(image=V92, gpuModel="no such GPU"), {}) == []
    found = launch(image=V92)
    assert found.facts is not None
    assert check_arch(found, {}) == [
        f"pools.chat.image {V92}: its torch 2.7.0+cu128 is built for sm_75, sm_80, sm_86, sm_90, sm_100, sm_120, "
        'without sm_70, so the first CUDA kernel on Tesla V100-SXM2-32GB (sm_70) fails with "no kernel image is '
        f'available for execution on the device" ({found.facts.cite("torch_arch_list")}). Use an image whose torch '
        f"has sm_70: {V011}, {V19}."
    ]
    # No image of the table runs on a GPU older than sm_70.
    on_75 = launch(image=V19_2404, gpuModel="Tesla T4")
    assert check_arch(on_75, {})[0].endswith(f"has sm_75: {V011}, {V19}, {V92}.")


@pytest.mark.parametrize(
    ("ref", "config", "ok"),
    [
        (V19, [], True),
        ("vllm/vllm-openai:latest", [], True),
        ("registry.example/vllm:1", [], False),
        ("registry.example/vllm:1", ["registry.example/vllm"], True),
        ("registry.example/vllm:1", ["registry.example/vllm:1"], True),
        ("registry.example/vllm:2", ["registry.example/vllm:1"], False),
    ],
)
def test_ray_nodes_need_an_image_with_ray(ref: str, config: list[str], ok: bool) -> None:
    problem = ray_problem(ref, {"rayImages": config})
    if ok:
        assert problem is None
    else:
        assert problem == (
            f"image {ref} is not known to contain Ray and vLLM, which every container of a multi-node instance runs "
            f"(known: vllm/vllm-openai). Use {V19}, or list the image in this policy's rayImages."
        )
    assert ray_problem(None, {"rayImages": []}) == (
        "no image reference to check for Ray: label the container llm-cluster.image=<image ref>."
    )


def test_the_messages_list_every_image_that_would_do_or_say_there_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.engines.vllm.rules import image

    found = launch(image=V92)
    assert found.facts is not None
    # A facts table whose only image lacks the GPU: no way out to name.
    monkeypatch.setattr(image, "IMAGES", {V92: found.facts})
    assert check_arch(found, {})[0].endswith("Use an image whose torch has sm_70: none in the facts table.")
    # Two repositories with Ray: both named, comma-separated.
    monkeypatch.setattr(image, "IMAGES_WITH_RAY", frozenset({"vllm/vllm-openai", "registry.example/vllm-ray"}))
    assert ray_problem("registry.example/other:1", {"rayImages": []}) == (
        "image registry.example/other:1 is not known to contain Ray and vLLM, which every container of a "
        "multi-node instance runs (known: registry.example/vllm-ray, vllm/vllm-openai). Use "
        f"{V19}, or list the image in this policy's rayImages."
    )


def test_a_model_server_whose_argv_names_no_server_has_no_launcher_flags() -> None:
    found = launch(image=V011)
    bare = Launch(
        resource="ModelServer",
        args=found.args,
        env={},
        gpu_name=None,
        gpu=None,
        image=V011,
        props={"pool": "chat", "argv": ["--nnodes", "2"]},
        facts=found.facts,
    )
    assert check_native_launcher(bare, {}) == []


def test_a_model_server_without_a_pool_is_named_by_its_first_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.engines.vllm.rules import topology

    found = launch(image=V011, argv_add=["--nnodes", "2"], pool=None)
    assert found.facts is not None
    message = (
        "--nnodes starts vLLM's own multi-node launcher (--nnodes, --headless on the other nodes), which vLLM "
        f"0.11.0 of the container's image {V011} does not have ({found.facts.cite('native_multi_node')}): it would "
        "exit on an unrecognized argument. Keep multiNode: ray on this image, or use one whose vLLM has the "
        "launcher: "
    )
    assert check_native_launcher(found, {}) == [message + f"{V19}, {V19_2404}."]
    # A facts table without the launcher on any image: none to name.
    monkeypatch.setattr(topology, "known_images", lambda: [found.facts])
    assert check_native_launcher(found, {}) == [message + "none in the facts table."]


@pytest.mark.parametrize(
    ("value", "gib"), [(None, 0.0), (0, 0.0), ("2.5", 2.5), (4, 4.0), (-1, 0.0), ("x", 0.0), ([1], 0.0)]
)
def test_a_memory_flags_value_is_gib_never_below_zero_and_zero_when_unreadable(value: Any, gib: float) -> None:
    from components.engines.vllm.rules.host_memory import _gib

    assert _gib(value) == gib


def test_a_node_whose_instances_are_not_stated_is_not_counted() -> None:
    memory = {"gpu-03": {"memoryGib": 10.0, "key": "nodes.gpu-03.memoryGib"}}
    found = launch(image=V92, argv_drop=["--attention-backend"], argv_add=["--cpu-offload-gb", "5"], hostMemory=memory)
    assert check_host_memory(found, {}) == []


# On a 40 GiB GPU (0.9 and 0.95 of it are exact: 36 and 38 GiB) each threshold is met exactly, where >= and >
# part: one sequence is 3 GiB (32768 tokens at 96 KiB), activations and non-torch memory 2 GiB.
EXACT: list[tuple[dict[str, Any], list[str]]] = [
    # 38 - 33 - 2 = 3: raising to 0.95 holds one sequence exactly.
    ({"weights_gib_per_gpu": 33.0}, [RAISE, LOWER, spread(2), gptq(33.0)]),
    # (65 + 3) / 2 = 34 = 36 - 2: two GPUs hold it exactly.
    ({"weights_gib_per_gpu": 65.0}, [RAISING, LOWER, spread(2), gptq(65.0)]),
    # 36 - 10 x 0.3 - 2 = 31 GiB: a sequence of 31 GiB fits 4-bit weights exactly.
    ({"weights_gib_per_gpu": 10.0, "kv_bytes_per_token_per_gpu": 31 * 32768}, [RAISING, LOWER, spread(2), gptq(10.0)]),
    # Already at 0.95 with room at 0.95: nothing to raise.
    ({"weights_gib_per_gpu": 33.0, "gpu_memory_utilization": 0.95}, [LOWER, spread(2), gptq(33.0)]),
    # (70 + 3) / 2 = 36.5 > 34: four GPUs, not two.
    ({"weights_gib_per_gpu": 70.0}, [RAISING, LOWER, spread(4), gptq(70.0)]),
    # TP 2: (2 x 67 + 2 x 3) / 4 = 35 > 34, so eight GPUs: the weights and the sequence both count per GPU.
    ({"tp": 2, "weights_gib_per_gpu": 67.0}, [RAISING, LOWER, spread(8, 2), gptq(67.0)]),
    # Half a GiB beside activations still holds a model that needs nothing.
    (
        {"weights_gib_per_gpu": 0.0, "kv_bytes_per_token_per_gpu": 0, "activation_gib": 34.5},
        [RAISE, LOWER, spread(2), gptq(0.0)],
    ),
    # Nothing left beside activations (36 - 36 = 0): no spread proposed, however small the model.
    (
        {"weights_gib_per_gpu": 0.0, "kv_bytes_per_token_per_gpu": 0, "activation_gib": 35.0},
        [RAISE, LOWER, gptq(0.0)],
    ),
]


@pytest.mark.parametrize(("changes", "fixes"), EXACT)
def test_each_fit_threshold_met_exactly_counts_as_met(changes: dict[str, Any], fixes: list[str]) -> None:
    assert fit_fixes({**BASE_CAPACITY, "gpu_memory_gib": 40.0, **changes}, "chat", "qwen") == fixes


@pytest.mark.parametrize(
    ("argv_tp", "props_tp", "gpus"),
    [(["--tensor-parallel-size", "4"], 8.0, 4), ([], 2.0, 2), ([], None, 1)],
)
def test_host_memory_counts_the_argvs_tp_else_the_props_else_one(
    argv_tp: list[str], props_tp: float | None, gpus: int
) -> None:
    found = launch(
        image=V92,
        argv_drop=["--tensor-parallel-size", "--attention-backend"],
        argv_add=[*argv_tp, "--cpu-offload-gb", "9"],
        tensorParallel=props_tp,
        hostMemory=host(**{"gpu-03": (8.0, 1)}),
    )
    assert check_host_memory(found, {}) == [
        over_ram("gpu-03", "8", ONE, f"{9 * gpus}", "--cpu-offload-gb 9 GiB per GPU", gpus, "", f"{8 / gpus:.1f}")
    ]
