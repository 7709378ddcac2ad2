"""vLLM's memory model (components/engines/vllm/memory.py) as tables: each term of the budget on both sides of
every default and boundary (activation peak, default batch and sequence counts, communicators), the class of
error each pool takes, the input refusals and the verdicts with their whole messages, and whole estimates of
small models whose figures follow from vLLM's formula by hand."""

from __future__ import annotations

import math

import pytest

from components.engines.vllm import memory
from components.engines.vllm.memory import (
    KV_ERROR_TERMS,
    CapacityEstimate,
    activation_peak_bytes,
    communicator_gib,
    default_max_num_batched_tokens,
    default_max_num_seqs,
    estimate,
    kv_error_class,
    kv_estimate_error,
    pessimistic_end,
    pipeline_neighbours,
)
from components.engines.weights import GIB, stage_weight_bytes
from components.facts.models import ModelArch

# Small architectures whose terms are worked out by hand below.
DENSE = ModelArch(
    name="tiny",
    hf_id="",
    model_type="llama",
    num_layers=4,
    hidden_size=1024,
    num_attention_heads=8,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=32000,
    intermediate_size=4096,
)
MOE = ModelArch(
    name="tiny-moe",
    hf_id="",
    model_type="qwen3_moe",
    num_layers=4,
    hidden_size=1024,
    num_attention_heads=8,
    num_kv_heads=4,
    head_dim=128,
    vocab_size=32000,
    intermediate_size=4096,
    num_experts=16,
    experts_per_token=2,
    moe_intermediate_size=512,
)
MLA = ModelArch(
    name="tiny-mla",
    hf_id="",
    model_type="deepseek_v3",
    num_layers=4,
    hidden_size=1024,
    num_attention_heads=8,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=32000,
    intermediate_size=4096,
    kv_lora_rank=512,
    q_lora_rank=0,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
)
MOE_DENSE_FIRST = ModelArch(**{**MOE.__dict__, "name": "tiny-moe-k3", "first_k_dense_replace": 3})
TIED = ModelArch(**{**DENSE.__dict__, "name": "tiny-tied", "tie_word_embeddings": True})
MLA_MOE = ModelArch(**{**MLA.__dict__, "name": "tiny-mla-moe", "num_experts": 16, "experts_per_token": 2})


# --- the range's pessimistic end and the class each pool takes -------------------------------------------


@pytest.mark.parametrize(("value", "error", "low"), [(1000, 0.035, 965.0), (10, 0.0, 10.0), (8.0, 0.5, 4.0)])
def test_the_pessimistic_end_takes_the_error_off_the_value(value: float, error: float, low: float) -> None:
    assert pessimistic_end(value, error) == pytest.approx(low, rel=1e-12)


@pytest.mark.parametrize(
    ("arch", "tp", "v1", "cls"),
    [
        (DENSE, 1, False, ("v0", "tp1", "dense")),
        (DENSE, 2, False, ("v0", "tp>=2", "dense")),
        (DENSE, 8, True, ("v1", "tp>=2", "dense")),
        (DENSE, 1, True, ("v1", "tp1", "dense")),
        (MOE, 1, True, ("v1", "tp1", "moe")),
        (MOE, 4, False, ("v0", "tp>=2", "moe")),
        (MLA, 1, False, ("v0", "tp1", "mla")),
        # DeepSeek's MoE models are classed by their attention.
        (MLA_MOE, 2, True, ("v1", "tp>=2", "mla")),
    ],
)
def test_each_pool_falls_in_the_class_of_its_line_tp_and_kind(
    arch: ModelArch, tp: int, v1: bool, cls: tuple[str, str, str]
) -> None:
    assert kv_error_class(arch, tp=tp, v1_engine=v1) == cls


@pytest.mark.parametrize(
    ("cls", "error", "how"),
    [
        (("v1", "tp1", "dense"), 0.02, "V1 · TP1 · dense, measured on its logs"),
        (("v1", "tp>=2", "dense"), 0.02, "V1 · TP>=2 · dense, measured on its logs"),
        (("v0", "tp1", "dense"), 0.035, "V0 · TP1 · dense: too few logs, the widest error measured"),
        (("v1", "tp1", "moe"), 0.035, "V1 · TP1 · MoE: too few logs, the widest error measured"),
        (("v0", "tp>=2", "mla"), 0.035, "V0 · TP>=2 · MLA: too few logs, the widest error measured"),
    ],
)
def test_each_class_takes_its_measured_error_or_the_widest(cls: tuple[str, str, str], error: float, how: str) -> None:
    assert kv_estimate_error(cls) == (error, how)


# --- the activation peak --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "tp", "act", "batched", "seqs", "v1", "peak"),
    [
        # Dense, the forward pass wins: (2048 x 4 x 1024 + 2048 x 3 x 4096 / 2) x 2 bytes.
        (DENSE, 2, 2, 2048, 4, False, (2048 * 4 * 1024 + 2048 * 3 * 4096 // 2) * 2),
        (DENSE, 1, 2, 2048, 4, False, (2048 * 4 * 1024 + 2048 * 3 * 4096) * 2),
        (DENSE, 2, 4, 2048, 4, True, (2048 * 4 * 1024 + 2048 * 3 * 4096 // 2) * 4),
        # Dense, the sampler wins: 38 bytes per logit on V0; 39 and the hidden states on V1.
        (DENSE, 2, 2, 2048, 256, False, 256 * 32000 * 38),
        (DENSE, 2, 2, 2048, 256, True, 256 * 32000 * 39 + 2048 * 1024 * 2),
        (DENSE, 2, 4, 2048, 256, True, 256 * 32000 * 39 + 2048 * 1024 * 4),
        # MoE: each routed copy holds 3 x moe_intermediate / TP + hidden, for up to 32768 tokens at once.
        (MOE, 2, 2, 4096, 1, False, (4096 * 4 * 1024 + 4096 * 2 * (3 * 512 // 2 + 1024)) * 2),
        (MOE, 1, 2, 40000, 1, False, (40000 * 4 * 1024 + 32768 * 2 * (3 * 512 + 1024)) * 2),
        (MOE, 1, 2, 32768, 1, True, (32768 * 4 * 1024 + 32768 * 2 * (3 * 512 + 1024)) * 2),
    ],
)
def test_the_activation_peak_is_the_larger_of_the_forward_pass_and_the_sampler(
    arch: ModelArch, tp: int, act: int, batched: int, seqs: int, v1: bool, peak: int
) -> None:
    got = activation_peak_bytes(
        arch, tp=tp, act_bytes=act, max_num_batched_tokens=batched, max_num_seqs=seqs, v1_engine=v1
    )
    assert got == peak


def test_the_activation_peak_is_v0s_unless_told() -> None:
    assert activation_peak_bytes(DENSE, tp=2, act_bytes=2, max_num_batched_tokens=2048, max_num_seqs=256) == (
        256 * 32000 * 38
    )


# --- vLLM's defaults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("v1", "name", "gib", "seqs"),
    [
        (True, "NVIDIA H100 80GB HBM3", 78.37, 1024),
        (True, "NVIDIA H100 80GB HBM3", 70.0, 1024),
        (True, "NVIDIA H100 80GB HBM3", 69.99, 256),
        (True, "NVIDIA A100-SXM4-80GB", 78.72, 256),
        (True, "nvidia a100 80gb pcie", 78.72, 256),
        (True, "", 80.0, 1024),
        (False, "NVIDIA H100 80GB HBM3", 78.37, 256),
        (False, "", 0.0, 256),
    ],
)
def test_the_default_sequence_count_is_1024_only_on_v1_and_large_gpus_but_a100s(
    v1: bool, name: str, gib: float, seqs: int
) -> None:
    assert default_max_num_seqs(v1_engine=v1, gpu_name=name, gpu_memory_gib=gib) == seqs


def test_the_default_sequence_count_without_arguments_is_v0s() -> None:
    assert default_max_num_seqs() == 256
    assert default_max_num_seqs(gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=78.37) == 256


@pytest.mark.parametrize(
    ("max_len", "v1", "name", "gib", "chunked", "batched"),
    [
        # V0: the whole context in one batch, at least 2048.
        (32768, False, "NVIDIA H100 80GB HBM3", 78.37, None, 32768),
        (2049, False, "", 0.0, True, 2049),
        (2047, False, "", 0.0, False, 2048),
        # V1, chunked (its default, or said): 8192 on >= 70 GiB GPUs but A100s, else 2048.
        (32768, True, "NVIDIA H100 80GB HBM3", 78.37, None, 8192),
        (32768, True, "NVIDIA H100 80GB HBM3", 70.0, True, 8192),
        (32768, True, "NVIDIA H100 80GB HBM3", 69.99, None, 2048),
        (32768, True, "NVIDIA A100-SXM4-80GB", 78.72, None, 2048),
        (32768, True, "nvidia a100 80gb pcie", 78.72, True, 2048),
        (1024, True, "NVIDIA L40S", 44.42, None, 2048),
        # V1 without chunked prefill: a prompt fits one batch, so the larger of the context and the budget.
        (32768, True, "NVIDIA H100 80GB HBM3", 78.37, False, 32768),
        (4096, True, "NVIDIA H100 80GB HBM3", 78.37, False, 8192),
        (4096, True, "NVIDIA L40S", 44.42, False, 4096),
        (1024, True, "NVIDIA L40S", 44.42, False, 2048),
    ],
)
def test_the_default_batch_budget_per_line_gpu_and_chunked_prefill(
    max_len: int, v1: bool, name: str, gib: float, chunked: bool | None, batched: int
) -> None:
    assert (
        default_max_num_batched_tokens(
            max_len, v1_engine=v1, gpu_name=name, gpu_memory_gib=gib, chunked_prefill=chunked
        )
        == batched
    )


def test_the_default_batch_budget_without_arguments_is_v0s() -> None:
    assert default_max_num_batched_tokens(100) == 2048
    assert default_max_num_batched_tokens(4096) == 4096


# --- the communicators ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("pp", "neighbours"), [(1, 0), (2, 1), (3, 2), (4, 2), (8, 2)])
def test_a_stage_talks_to_one_neighbour_at_either_end_and_two_inside(pp: int, neighbours: int) -> None:
    assert pipeline_neighbours(pp) == neighbours


@pytest.mark.parametrize(
    ("tp", "pp", "nvls", "v1", "p2p", "gib"),
    [
        (1, 1, False, False, True, 0.0),
        (2, 1, False, False, True, 0.25),
        (4, 1, False, False, True, 0.75),
        (1, 2, False, False, True, 0.25),
        (2, 3, False, False, True, 0.75),
        (8, 2, True, False, True, 8 * 0.32),
        (2, 1, True, False, True, 0.32),
        # V1 at TP >= 2 between GPUs that reach each other peer to peer: at least 2 GiB.
        (2, 1, False, True, True, 2.0),
        (8, 2, True, True, True, 8 * 0.32),
        (8, 1, False, True, True, 2.0),
        (2, 1, False, True, False, 0.25),
        (1, 2, False, True, True, 0.25),
        (1, 1, False, True, True, 0.0),
    ],
)
def test_the_communicators_grow_with_the_peers(tp: int, pp: int, nvls: bool, v1: bool, p2p: bool, gib: float) -> None:
    assert communicator_gib(tp, pp, nvls=nvls, v1_engine=v1, p2p=p2p) == pytest.approx(gib, rel=1e-12)


def test_the_communicators_default_to_v0_without_nvls() -> None:
    assert communicator_gib(2, 1) == 0.25
    assert communicator_gib(2, 1, v1_engine=True) == 2.0


# --- the inputs vLLM would refuse ------------------------------------------------------------------------

GOOD = dict(tp=2, pp=1, gpu_memory_utilization=0.9, dtype="float16", max_model_len=1024, max_num_seqs=8)


@pytest.mark.parametrize(
    ("gib", "changes", "message"),
    [
        (0, {}, "GPU memory must be positive, got 0"),
        (-1.5, {}, "GPU memory must be positive, got -1.5"),
        (16, {"tp": 0}, "tensor and pipeline parallel sizes must be >= 1, got tp=0 pp=1"),
        (16, {"pp": 0}, "tensor and pipeline parallel sizes must be >= 1, got tp=2 pp=0"),
        (16, {"tp": 3}, "tiny has 8 attention heads, not divisible by tensor parallel size 3"),
        (16, {"gpu_memory_utilization": 0}, "gpu-memory-utilization must be in (0, 1], got 0"),
        (16, {"gpu_memory_utilization": 1.01}, "gpu-memory-utilization must be in (0, 1], got 1.01"),
        (16, {"dtype": "int8"}, "dtype 'int8' is not one of float16, bfloat16, float32"),
        (16, {"kv_cache_dtype": "int4"}, "kv-cache-dtype 'int4' is not one of "),
        (16, {"max_model_len": 0}, "max-model-len, max-num-seqs and block-size must be >= 1"),
        (16, {"max_num_seqs": 0}, "max-model-len, max-num-seqs and block-size must be >= 1"),
        (16, {"block_size": 0}, "max-model-len, max-num-seqs and block-size must be >= 1"),
    ],
)
def test_each_input_vllm_would_refuse_is_refused_with_its_message(gib: float, changes: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        estimate(DENSE, gib, **{**GOOD, **changes})
    assert str(err.value).startswith(message)
    if message.startswith("kv-cache-dtype"):
        assert str(err.value) == message + ", ".join(memory.KV_CACHE_DTYPES)


@pytest.mark.parametrize(
    ("gib", "changes"),
    [
        (0.5, {}),
        (16, {"tp": 1}),
        (16, {"tp": 8}),
        (16, {"pp": 4}),
        (16, {"gpu_memory_utilization": 1}),
        (16, {"gpu_memory_utilization": 0.01}),
        (16, {"dtype": "bfloat16"}),
        (16, {"dtype": "float32"}),
        (16, {"kv_cache_dtype": "fp8"}),
        (16, {"max_model_len": 1, "max_num_seqs": 1, "block_size": 1}),
    ],
)
def test_the_inputs_at_each_bound_are_taken(gib: float, changes: dict) -> None:
    assert estimate(DENSE, gib, **{**GOOD, **changes}).model == "tiny"


# --- whole estimates, by hand ---------------------------------------------------------------------------


def by_hand(
    arch: ModelArch,
    gib: float,
    *,
    tp: int,
    pp: int,
    util: float,
    act: int,
    linear: float,
    peak: float,
    comm_gib: float,
    comm_in: bool,
    base_gib: float,
    kv_per_token_layer: int,
    block: int,
    mla: bool,
    max_len: int,
) -> dict[str, object]:
    """vLLM's budget for one GPU of each stage: utilization x memory less weights, activation peak and
    non-torch memory, in blocks of `block` tokens; the stage with the fewest blocks sets the pool's."""
    n_stage = [arch.num_layers // pp] * pp
    for i in range(2, arch.num_layers % pp + 2):
        n_stage[-i] += 1
    budget = gib * GIB * util
    non_torch = base_gib * GIB + (comm_gib * GIB if comm_in else 0.0)
    weights, free, blocks = [], [], []
    start = 0
    for rank, n in enumerate(n_stage):
        w = stage_weight_bytes(
            arch,
            start,
            start + n,
            tp=tp,
            pp=pp,
            first=rank == 0,
            last=rank == pp - 1,
            act_bytes=act,
            linear_bytes=linear,
            mla_enabled=mla,
        )
        weights.append(w)
        free.append(budget - w - peak - non_torch)
        blocks.append(max(0, math.floor(free[-1] / (block * kv_per_token_layer * n))))
        start += n
    worst = blocks.index(min(blocks))
    return {
        "layers_per_stage": tuple(n_stage),
        "weights_gib_per_gpu": max(weights) / GIB,
        "weights_gib_per_stage": tuple(w / GIB for w in weights),
        "weights_gib_total": sum(weights) * tp / GIB,
        "kv_bytes_per_token_per_gpu": kv_per_token_layer * n_stage[worst],
        "activation_gib": peak / GIB,
        "non_torch_gib": non_torch / GIB,
        "communicator_gib": comm_gib,
        "communicator_in_budget": comm_in,
        "kv_cache_gib_per_gpu": max(0.0, free[worst]) / GIB,
        "gpu_blocks": blocks[worst],
        "kv_tokens": blocks[worst] * block,
        "max_concurrency": blocks[worst] * block / max_len,
    }


FLOATS = (
    "weights_gib_per_gpu",
    "weights_gib_total",
    "activation_gib",
    "non_torch_gib",
    "communicator_gib",
    "kv_cache_gib_per_gpu",
    "max_concurrency",
)


def assert_by_hand(est: CapacityEstimate, expected: dict[str, object]) -> None:
    got = {k: getattr(est, k) for k in expected}
    for k in FLOATS:
        assert got[k] == pytest.approx(expected[k], rel=1e-9, abs=1e-12), k
    assert got["weights_gib_per_stage"] == pytest.approx(expected["weights_gib_per_stage"], rel=1e-12)
    rest = {k: v for k, v in got.items() if k not in FLOATS and k != "weights_gib_per_stage"}
    assert rest == {k: v for k, v in expected.items() if k not in FLOATS and k != "weights_gib_per_stage"}


MLA_NOTE = "MLA on: needs FlashAttention-2 (sm_80+); on V100 set VLLM_MLA_DISABLE=1 and plan with MLA off"
V0_DENSE = "V0 · TP>=2 · dense: too few logs, the widest error measured"

# (estimate's arguments, by_hand's terms, the rest of the estimate)
WHOLE = [
    pytest.param(
        (DENSE, 16),
        dict(tp=2, pp=2, gpu_memory_utilization=0.9, dtype="float16", max_model_len=1024, max_num_seqs=8),
        # 2048 batched (V0: at least 2048); one TP peer and one pipeline neighbour; 2 x 4 heads x 128 x 2 bytes.
        dict(
            act=2,
            linear=2.0,
            peak=(2048 * 4 * 1024 + 2048 * 3 * 4096 // 2) * 2,
            comm_gib=0.5,
            comm_in=True,
            base_gib=0.05,
            kv_per_token_layer=2048,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            rot_bytes=2,
            mla_enabled=False,
            notes=(),
            startup_free_gib=None,
            error=(0.035, V0_DENSE),
        ),
        id="dense-v0-tp2-pp2",
    ),
    pytest.param(
        (MOE, 24),
        dict(
            tp=4,
            pp=1,
            gpu_memory_utilization=0.85,
            dtype="bfloat16",
            kv_cache_dtype="fp8",
            block_size=32,
            max_model_len=4096,
            max_num_seqs=64,
            max_num_batched_tokens=40000,
        ),
        # 32768 tokens through the experts at once; 3 TP peers; one KV head per rank at one byte.
        dict(
            act=2,
            linear=2.0,
            peak=(40000 * 4 * 1024 + 32768 * 2 * (3 * 512 // 4 + 1024)) * 2,
            comm_gib=0.75,
            comm_in=True,
            base_gib=0.05,
            kv_per_token_layer=256,
            block=32,
            mla=True,
        ),
        dict(
            max_num_seqs=64,
            max_num_batched_tokens=40000,
            rot_bytes=2,
            mla_enabled=False,
            notes=(),
            startup_free_gib=None,
            error=(0.035, "V0 · TP>=2 · MoE: too few logs, the widest error measured"),
        ),
        id="moe-v0-tp4-fp8kv",
    ),
    pytest.param(
        (MLA, 40),
        dict(tp=2, pp=3, gpu_memory_utilization=0.5, dtype="float32", max_model_len=512, max_num_seqs=16, nvls=True),
        # Stages of 1, 2 and 1 layers; NVLS: 0.32 GiB for the TP peer and each of the middle's two neighbours.
        dict(
            act=4,
            linear=4.0,
            peak=(2048 * 4 * 1024 + 2048 * 3 * 4096 // 2) * 4,
            comm_gib=0.96,
            comm_in=True,
            base_gib=0.05,
            kv_per_token_layer=(512 + 64) * 4,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=16,
            max_num_batched_tokens=2048,
            rot_bytes=4,
            mla_enabled=True,
            notes=(MLA_NOTE,),
            startup_free_gib=None,
            error=(0.035, "V0 · TP>=2 · MLA: too few logs, the widest error measured"),
        ),
        id="mla-v0-tp2-pp3-nvls",
    ),
    pytest.param(
        (MLA, 16),
        dict(
            tp=2,
            pp=1,
            gpu_memory_utilization=0.9,
            dtype="float16",
            quantization="gptq",
            max_model_len=2048,
            max_num_seqs=4,
            mla_enabled=False,
        ),
        # MLA off: full K and V per head, V padded to the qk head size; int4 + scales and zeros per 128.
        dict(
            act=2,
            linear=0.5 + 2.5 / 128,
            peak=(2048 * 4 * 1024 + 2048 * 3 * 4096 // 2) * 2,
            comm_gib=0.25,
            comm_in=True,
            base_gib=0.05,
            kv_per_token_layer=2 * 4 * (128 + 64) * 2,
            block=16,
            mla=False,
        ),
        dict(
            max_num_seqs=4,
            max_num_batched_tokens=2048,
            rot_bytes=0.5,
            mla_enabled=False,
            notes=(),
            startup_free_gib=None,
            error=(0.035, "V0 · TP>=2 · MLA: too few logs, the widest error measured"),
        ),
        id="mla-off-gptq",
    ),
    pytest.param(
        (DENSE, 78.37),
        dict(
            tp=1,
            pp=1,
            gpu_memory_utilization=0.9,
            dtype="bfloat16",
            quantization="fp8",
            quant_bits=8,
            max_model_len=8192,
            v1_engine=True,
            gpu_name="NVIDIA H100 80GB HBM3",
        ),
        # V1's defaults on a large GPU: 1024 sequences, 8192 batched; the sampler outweighs the forward pass.
        dict(
            act=2,
            linear=1.0,
            peak=1024 * 32000 * 39 + 8192 * 1024 * 2,
            comm_gib=0.0,
            comm_in=True,
            base_gib=0.15,
            kv_per_token_layer=2 * 8 * 128 * 2,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=1024,
            max_num_batched_tokens=8192,
            rot_bytes=1,
            mla_enabled=False,
            notes=(
                "only 551.9 sequences of max-model-len fit at once, below max-num-seqs 1024: long requests will "
                "queue or be preempted",
            ),
            startup_free_gib=None,
            error=(0.02, "V1 · TP1 · dense, measured on its logs"),
        ),
        id="dense-v1-h100-fp8",
    ),
    pytest.param(
        (DENSE, 24),
        dict(
            tp=2,
            pp=1,
            gpu_memory_utilization=0.9,
            dtype="float16",
            quantization="awq",
            quant_bits=8,
            group_size=64,
            max_model_len=4096,
            max_num_seqs=32,
            v1_engine=True,
            p2p=False,
        ),
        # V1 without peer-to-peer GPUs: no all-reduce floor, one TP peer's communicators.
        # 8 bits + (fp16 scale + 8-bit zero) per 64 weights; V1's sampler over 32 rows just outweighs the forward.
        dict(
            act=2,
            linear=1 + (2 + 1) / 64,
            peak=32 * 32000 * 39 + 2048 * 1024 * 2,
            comm_gib=0.25,
            comm_in=True,
            base_gib=0.15,
            kv_per_token_layer=2048,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=32,
            max_num_batched_tokens=2048,
            rot_bytes=1,
            mla_enabled=False,
            notes=(),
            startup_free_gib=None,
            error=(0.02, "V1 · TP>=2 · dense, measured on its logs"),
        ),
        id="dense-v1-pcie-awq8",
    ),
    pytest.param(
        (DENSE, 40),
        dict(
            tp=2,
            pp=1,
            gpu_memory_utilization=0.8,
            dtype="float16",
            max_model_len=4096,
            max_num_seqs=32,
            nccl_in_budget=False,
        ),
        # V0 on an image that starts NCCL before its baseline: the communicators stay out of the budget.
        dict(
            act=2,
            linear=2.0,
            peak=(4096 * 4 * 1024 + 4096 * 3 * 4096 // 2) * 2,
            comm_gib=0.25,
            comm_in=False,
            base_gib=0.05,
            kv_per_token_layer=2048,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=32,
            max_num_batched_tokens=4096,
            rot_bytes=2,
            mla_enabled=False,
            notes=(),
            startup_free_gib=40 - 0.5 - 0.25,
            error=(0.035, V0_DENSE),
        ),
        id="dense-v0-nccl-outside",
    ),
    pytest.param(
        (DENSE, 24),
        dict(
            tp=2, pp=1, gpu_memory_utilization=0.9, dtype="float16", max_model_len=4096, max_num_seqs=8, v1_engine=True
        ),
        # V1 at TP 2 between GPUs taken to reach each other peer to peer (unless told): the 2 GiB floor.
        dict(
            act=2,
            linear=2.0,
            peak=(2048 * 4 * 1024 + 2048 * 3 * 4096 // 2) * 2,
            comm_gib=2.0,
            comm_in=True,
            base_gib=0.15,
            kv_per_token_layer=2048,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            rot_bytes=2,
            mla_enabled=False,
            notes=(),
            startup_free_gib=None,
            error=(0.02, "V1 · TP>=2 · dense, measured on its logs"),
        ),
        id="dense-v1-tp2-p2p-by-default",
    ),
    pytest.param(
        (MOE_DENSE_FIRST, 24),
        dict(tp=1, pp=3, gpu_memory_utilization=0.9, dtype="float16", max_model_len=4096, max_num_seqs=8),
        # Stages of layers [0], [1, 2] and [3]: only the last is MoE (the first three keep a dense MLP).
        dict(
            act=2,
            linear=2.0,
            peak=(4096 * 4 * 1024 + 4096 * 2 * (3 * 512 + 1024)) * 2,
            comm_gib=0.5,
            comm_in=True,
            base_gib=0.05,
            kv_per_token_layer=2 * 4 * 128 * 2,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=8,
            max_num_batched_tokens=4096,
            rot_bytes=2,
            mla_enabled=False,
            notes=(),
            startup_free_gib=None,
            error=(0.035, "V0 · TP1 · MoE: too few logs, the widest error measured"),
        ),
        id="moe-dense-first-layers-pp3",
    ),
    pytest.param(
        (TIED, 16),
        dict(tp=1, pp=1, gpu_memory_utilization=0.9, dtype="float16", max_model_len=1024, max_num_seqs=8),
        # A tied LM head on one stage shares the embedding.
        dict(
            act=2,
            linear=2.0,
            peak=(2048 * 4 * 1024 + 2048 * 3 * 4096) * 2,
            comm_gib=0.0,
            comm_in=True,
            base_gib=0.05,
            kv_per_token_layer=2 * 8 * 128 * 2,
            block=16,
            mla=True,
        ),
        dict(
            max_num_seqs=8,
            max_num_batched_tokens=2048,
            rot_bytes=2,
            mla_enabled=False,
            notes=(),
            startup_free_gib=None,
            error=(0.035, "V0 · TP1 · dense: too few logs, the widest error measured"),
        ),
        id="tied-head-pp1",
    ),
]


@pytest.mark.parametrize(("where", "kwargs", "terms", "rest"), WHOLE)
def test_a_whole_estimate_follows_vllms_formula(where: tuple, kwargs: dict, terms: dict, rest: dict) -> None:
    arch, gib = where
    est = estimate(arch, gib, **kwargs)
    assert_by_hand(
        est,
        by_hand(
            arch,
            gib,
            tp=kwargs["tp"],
            pp=kwargs["pp"],
            util=kwargs["gpu_memory_utilization"],
            max_len=kwargs["max_model_len"],
            **terms,
        ),
    )
    assert est.fits and (est.reason, est.advice) == ("", "")
    assert (est.model, est.gpu_memory_gib, est.tp, est.pp, est.gpu_memory_utilization) == (
        arch.name,
        gib,
        kwargs["tp"],
        kwargs["pp"],
        kwargs["gpu_memory_utilization"],
    )
    assert (est.dtype, est.quantization, est.kv_cache_dtype, est.max_model_len) == (
        kwargs["dtype"],
        kwargs.get("quantization"),
        kwargs.get("kv_cache_dtype", "auto"),
        kwargs["max_model_len"],
    )
    assert (est.uses_mla, est.mla_enabled) == (arch.uses_mla, rest["mla_enabled"])
    assert (est.max_num_seqs, est.max_num_batched_tokens) == (rest["max_num_seqs"], rest["max_num_batched_tokens"])
    assert est.notes == rest["notes"]
    assert est.startup_free_gib == (
        None if rest["startup_free_gib"] is None else pytest.approx(rest["startup_free_gib"])
    )
    assert (est.kv_estimate_error, est.kv_error_class) == rest["error"]
    assert est.kv_error_terms == KV_ERROR_TERMS
    # The runbooks' rule of thumb: parameters x bytes per parameter x 1.2, whole pool.
    assert est.rule_of_thumb_gib_total == pytest.approx(
        memory.model_params(arch) * rest["rot_bytes"] * 1.2 / GIB, rel=1e-12
    )


# --- the verdicts, each on both sides of its boundary ------------------------------------------------------

TINY_GPU = dict(tp=1, pp=1, gpu_memory_utilization=1, dtype="float16", max_num_seqs=8, max_num_batched_tokens=2048)


def test_weights_over_the_gpus_share_refuse_the_pool_naming_both() -> None:
    from components.facts.models import model_arch

    est = estimate(model_arch("qwen3-32b"), 16, **{**GOOD, "tp": 1})
    assert (est.fits, est.reason, est.advice, est.notes) == (
        False,
        "the weights alone need 61.0 GiB per GPU, more than the 16.0 GiB x 0.90 = 14.4 GiB per GPU: add GPUs "
        "(TP/PP), quantize, or raise gpu-memory-utilization",
        "",
        (),
    )
    assert (est.gpu_blocks, est.kv_tokens, est.kv_cache_gib_per_gpu, est.max_concurrency) == (0, 0, 0.0, 0.0)


def test_weights_exactly_the_share_leave_nothing_and_a_byte_more_share_leaves_no_kv_cache() -> None:
    weights = estimate(DENSE, 16, max_model_len=16, **TINY_GPU).weights_gib_per_gpu * GIB  # 265308160 bytes
    assert weights == 265308160
    exactly = estimate(DENSE, weights / GIB, max_model_len=16, **TINY_GPU)
    assert exactly.reason.startswith("the weights alone need 0.2 GiB per GPU, more than the 0.2 GiB x 1.00 = ")
    over = estimate(DENSE, (weights + 1) / GIB, max_model_len=16, **TINY_GPU)
    assert over.reason.startswith("weights 0.2 GiB + activations 0.1 GiB + non-torch 0.1 GiB leave no KV cache")


def test_no_room_for_the_kv_cache_names_each_term() -> None:
    from components.facts.models import model_arch

    est = estimate(
        model_arch("qwen3-32b"), 16, **{**GOOD, "tp": 8, "max_model_len": 8192, "max_num_batched_tokens": 131072}
    )
    assert (est.fits, est.reason, est.notes) == (
        False,
        "weights 7.6 GiB + activations 7.3 GiB + non-torch 1.8 GiB leave no KV cache in the 16.0 GiB x 0.90 = "
        "14.4 GiB per GPU: vLLM stops with 'No available memory for the cache blocks'",
        (),
    )
    # No negative cache: the free memory is below zero, the cache and its blocks are none.
    assert (est.gpu_blocks, est.kv_tokens, est.kv_cache_gib_per_gpu) == (0, 0, 0.0)


@pytest.mark.parametrize(
    ("max_len", "fits", "reason", "notes"),
    [
        # 0.4 GiB holds 165 blocks of 16 tokens: 2640.
        (
            2640,
            True,
            "",
            (
                "only 1.0 sequences of max-model-len fit at once, below max-num-seqs 8: long requests "
                "will queue or be preempted",
            ),
        ),
        (
            2641,
            False,
            "the KV cache holds 2640 tokens, fewer than max-model-len 2641: vLLM refuses to start; lower "
            "max-model-len to 2640 or less, or add GPUs",
            (),
        ),
        # Exactly max-num-seqs sequences fit: no note; fewer: the note.
        (330, True, "", ()),
        (
            336,
            True,
            "",
            (
                "only 7.9 sequences of max-model-len fit at once, below max-num-seqs 8: long requests "
                "will queue or be preempted",
            ),
        ),
    ],
)
def test_the_kv_cache_against_max_model_len_and_max_num_seqs(
    max_len: int, fits: bool, reason: str, notes: tuple[str, ...]
) -> None:
    est = estimate(DENSE, 0.4, max_model_len=max_len, **TINY_GPU)
    assert (est.kv_tokens, est.gpu_blocks, est.fits, est.reason, est.notes) == (2640, 165, fits, reason, notes)


# --- the start-up check of images that start NCCL before their baseline -----------------------------------

STARTUP = dict(tp=2, pp=1, dtype="float16", max_model_len=4096, max_num_seqs=8, nccl_in_budget=False)
SPARE_NOTE = (
    "only {} GiB per GPU to spare when vLLM checks its request at start (NCCL/all-reduce buffers estimated at "
    "0.25 GiB): if it refuses with 'Free memory on device ... on startup', lower gpu-memory-utilization"
)


@pytest.mark.parametrize(
    ("util", "fits", "notes"),
    [
        # 16 GiB less the CUDA context (0.5) and one peer's buffers (0.25): 15.25 free, 0.953125 x 16.
        (0.953125, True, (SPARE_NOTE.format("0.00"),)),
        (0.93, True, (SPARE_NOTE.format("0.37"),)),
        # Exactly half a GiB to spare (0.921875 x 16 = 14.75): no note.
        (0.921875, True, ()),
        (0.9, True, ()),
    ],
)
def test_what_is_free_at_start_against_the_request(util: float, fits: bool, notes: tuple[str, ...]) -> None:
    est = estimate(DENSE, 16, gpu_memory_utilization=util, **STARTUP)
    assert (est.fits, est.reason, est.advice, est.notes, est.startup_free_gib) == (fits, "", "", notes, 15.25)


@pytest.mark.parametrize(
    ("gib", "util", "reason", "advice"),
    [
        (
            16,
            0.96,
            "about 15.25 GiB per GPU is free when vLLM sizes its request (16.00 GiB less the CUDA context, 0.5 GiB, "
            "and NCCL/all-reduce buffers for 1 peers, 0.25 GiB), less than gpu-memory-utilization 0.96 x 16.00 = "
            "15.36 GiB: vLLM stops with 'Free memory on device ... on startup is less than desired GPU memory "
            "utilization'",
            "lower gpu-memory-utilization from 0.96 to 0.95 or less",
        ),
        (
            0.6,
            0.9,
            "about -0.15 GiB per GPU is free when vLLM sizes its request (0.60 GiB less the CUDA context, 0.5 GiB, "
            "and NCCL/all-reduce buffers for 1 peers, 0.25 GiB), less than gpu-memory-utilization 0.90 x 0.60 = "
            "0.54 GiB: vLLM stops with 'Free memory on device ... on startup is less than desired GPU memory "
            "utilization'",
            "lower gpu-memory-utilization from 0.9 to 0.00 or less",
        ),
    ],
)
def test_less_free_at_start_than_the_request_is_vllms_refusal(
    gib: float, util: float, reason: str, advice: str
) -> None:
    est = estimate(DENSE, gib, gpu_memory_utilization=util, **STARTUP)
    assert (est.fits, est.reason, est.advice, est.notes) == (False, reason, advice, ())


def test_the_start_up_refusal_counts_the_pipeline_neighbours_and_nvls() -> None:
    est = estimate(DENSE, 16, **{**STARTUP, "tp": 4, "pp": 3, "gpu_memory_utilization": 0.95, "nvls": True})
    # 3 TP peers and the middle stage's two neighbours at 0.32 GiB: 1.60 GiB; 16 - 0.5 - 1.6 = 13.9 free.
    assert est.reason.startswith(
        "about 13.90 GiB per GPU is free when vLLM sizes its request (16.00 GiB less the CUDA context, 0.5 GiB, "
        "and NCCL/all-reduce buffers for 5 peers, 1.60 GiB), less than gpu-memory-utilization 0.95 x 16.00 = "
        "15.20 GiB"
    )
    assert est.advice == "lower gpu-memory-utilization from 0.95 to 0.86 or less"


def test_a_pool_refused_for_its_weights_gets_no_start_up_note() -> None:
    from components.facts.models import model_arch

    # 0.3 GiB to spare at start, but the weights do not fit: the verdict alone is said.
    est = estimate(model_arch("qwen3-32b"), 16, **{**STARTUP, "gpu_memory_utilization": 0.934375})
    assert est.reason.startswith("the weights alone need 30.5 GiB per GPU") and est.notes == ()


# --- vLLM's defaults inside the estimate ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu_name", "gib", "chunked", "seqs", "batched"),
    [
        ("NVIDIA H100 80GB HBM3", 78.37, None, 1024, 8192),
        ("NVIDIA H100 80GB HBM3", 78.37, False, 1024, 16384),
        ("NVIDIA A100-SXM4-80GB", 78.72, None, 256, 2048),
        ("NVIDIA A100-SXM4-80GB", 78.72, False, 256, 16384),
    ],
)
def test_the_estimate_takes_v1s_defaults_for_the_gpu_and_chunked_prefill(
    gpu_name: str, gib: float, chunked: bool | None, seqs: int, batched: int
) -> None:
    est = estimate(
        DENSE,
        gib,
        tp=1,
        pp=1,
        gpu_memory_utilization=0.9,
        dtype="float16",
        max_model_len=16384,
        v1_engine=True,
        gpu_name=gpu_name,
        chunked_prefill=chunked,
    )
    assert (est.max_num_seqs, est.max_num_batched_tokens) == (seqs, batched)


def test_the_estimate_takes_v0s_defaults_unless_told() -> None:
    est = estimate(
        DENSE,
        78.37,
        tp=1,
        pp=1,
        gpu_memory_utilization=0.9,
        dtype="float16",
        max_model_len=16384,
        gpu_name="NVIDIA H100 80GB HBM3",
    )
    assert (est.max_num_seqs, est.max_num_batched_tokens, est.non_torch_gib) == (256, 16384, 0.05)
    assert (est.communicator_gib, est.communicator_in_budget, est.startup_free_gib) == (0.0, True, None)


# --- plan.json's form -----------------------------------------------------------------------------------


def test_the_estimate_as_json_rounds_every_float_to_four_places_and_lists_its_tuples() -> None:
    est = CapacityEstimate(
        model="m",
        gpu_memory_gib=31.123456,
        tp=2,
        pp=2,
        gpu_memory_utilization=0.912345,
        dtype="float16",
        quantization=None,
        kv_cache_dtype="auto",
        uses_mla=True,
        mla_enabled=False,
        max_model_len=4096,
        max_num_seqs=8,
        max_num_batched_tokens=4096,
        layers_per_stage=(31, 30),
        weights_gib_per_gpu=21.000049,
        weights_gib_total=330.12346,
        kv_bytes_per_token_per_gpu=34560,
        activation_gib=0.55557,
        non_torch_gib=0.3,
        kv_cache_gib_per_gpu=5.00007,
        gpu_blocks=100,
        kv_tokens=1600,
        max_concurrency=0.390625,
        fits=False,
        reason="r",
        rule_of_thumb_gib_total=400.00004,
        notes=("a", "b"),
        communicator_gib=1.75,
        communicator_in_budget=False,
        startup_free_gib=12.345678,
        advice="x",
        weights_gib_per_stage=(21.12346, 20.99996),
        kv_estimate_error=0.035,
        kv_error_class="c",
    )
    assert est.to_dict() == {
        "model": "m",
        "gpu_memory_gib": 31.1235,
        "tp": 2,
        "pp": 2,
        "gpu_memory_utilization": 0.9123,
        "dtype": "float16",
        "quantization": None,
        "kv_cache_dtype": "auto",
        "uses_mla": True,
        "mla_enabled": False,
        "max_model_len": 4096,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 4096,
        "layers_per_stage": [31, 30],
        "weights_gib_per_gpu": 21.0,
        "weights_gib_total": 330.1235,
        "kv_bytes_per_token_per_gpu": 34560,
        "activation_gib": 0.5556,
        "non_torch_gib": 0.3,
        "kv_cache_gib_per_gpu": 5.0001,
        "gpu_blocks": 100,
        "kv_tokens": 1600,
        "max_concurrency": 0.3906,
        "fits": False,
        "reason": "r",
        "rule_of_thumb_gib_total": 400.0,
        "notes": ["a", "b"],
        "communicator_gib": 1.75,
        "communicator_in_budget": False,
        "startup_free_gib": 12.3457,
        "advice": "x",
        "weights_gib_per_stage": [21.1235, 21.0],
        "kv_estimate_error": 0.035,
        "kv_error_class": "c",
        "kv_error_terms": KV_ERROR_TERMS,
    }


# A model small enough that vLLM's budget can be exactly its terms: the non-torch base (0.05 GiB, not a whole
# number of bytes) adds to the weights and activations without rounding below 64 MiB.
MICRO = ModelArch(
    name="micro",
    hf_id="",
    model_type="llama",
    num_layers=1,
    hidden_size=64,
    num_attention_heads=1,
    num_kv_heads=1,
    head_dim=64,
    vocab_size=1024,
    intermediate_size=128,
)
MICRO_GPU = dict(
    tp=1, pp=1, gpu_memory_utilization=1, dtype="float16", max_model_len=16, max_num_seqs=1, max_num_batched_tokens=16
)


def test_a_kv_cache_of_exactly_nothing_is_no_kv_cache_and_a_sliver_is_no_block() -> None:
    first = estimate(MICRO, 1, **MICRO_GPU)
    weights, activation = first.weights_gib_per_gpu * GIB, first.activation_gib * GIB
    assert (weights, activation) == (344448, 38912)
    exact = (weights + activation + 0.05 * GIB) / GIB
    est = estimate(MICRO, exact, **MICRO_GPU)
    assert (est.kv_cache_gib_per_gpu, est.gpu_blocks) == (0.0, 0)
    assert est.reason.startswith("weights 0.0 GiB + activations 0.0 GiB + non-torch 0.1 GiB leave no KV cache")
    sliver = estimate(MICRO, math.nextafter(exact * GIB, math.inf) / GIB, **MICRO_GPU)
    assert 0 < sliver.kv_cache_gib_per_gpu * GIB < 1 and sliver.gpu_blocks == 0
    assert sliver.reason == (
        "the KV cache holds 0 tokens, fewer than max-model-len 16: vLLM refuses to start; lower max-model-len to 0 "
        "or less, or add GPUs"
    )


def test_the_start_up_note_comes_after_the_models_own() -> None:
    est = estimate(MLA, 16, gpu_memory_utilization=0.953125, **STARTUP)
    assert est.notes == (MLA_NOTE, SPARE_NOTE.format("0.00"))
