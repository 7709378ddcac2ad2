"""Rule 13: what vLLM's own argument validation refuses at startup, across flags, as a stack can reach it.

vLLM checks these after parsing, when it builds its configs, and exits before loading a weight:
- ModelConfig: max_model_len above the model's context window (its config.json length key, scaled by
  rope_scaling; VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets it through with a warning),
  --disable-sliding-window on a rope-scaled model (NotImplementedError), and --quantization against the
  checkpoint's quantization_config (_verify_quantization; a stack that leaves it unset is told too, since
  vLLM then loads the checkpoint's method while the plan assumes unquantized weights);
- ParallelConfig: data x tensor x pipeline parallel ranks beyond the GPUs the server has;
- SchedulerConfig: max_num_batched_tokens below max_model_len with chunked prefill off, below
  max_num_seqs; partial prefills without chunked prefill, a long-prefill threshold above
  max_model_len, max_long_partial_prefills outside [1, max_num_partial_prefills]; num_lookahead_slots
  < 0, num_scheduler_steps < 1 (the V0 lines).
Source: vllm/config.py at v0.9.2 (ModelConfig._get_and_verify_max_len, SchedulerConfig.__post_init__ /
_verify_args); the same checks stand in vllm/config/scheduler.py and model.py of the 0.10–0.19 lines.
Where the lines differ is whether chunked prefill is on when unset: always on the V1 engine, only above
32768 tokens on V0 (EngineArgs._set_default_args_v0): read from the pool's image facts
(components.engines.vllm.facts: its engine line per GPU, VLLM_USE_V1 where it is read, the V0 threshold).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.engines.containers import image_parts
from components.engines.judged import number
from components.engines.vllm.launch import Launch

# The line whose V0 engine the pack's reference stack runs; an image without a version tag is read as it.
REFERENCE_VERSION = (0, 9)
DEFAULT_MAX_NUM_SEQS = 256
# V0 turns chunked prefill on above this max_model_len (0.9.2 arg_utils.py:1510-1539), for images without facts.
V0_CHUNKED_PREFILL_AUTO_ABOVE = 32768
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def engine_version(image: str | None) -> tuple[int, int]:
    """(major, minor) of vLLM in an image from its tag (`vllm/vllm-openai:v0.19.1` -> (0, 19))."""
    tag = image_parts(image)[1] if image else None
    match = _VERSION.match(tag or "")
    return (int(match.group(1)), int(match.group(2))) if match else REFERENCE_VERSION


def runs_v1(launch: Launch) -> bool:
    """Whether the server runs vLLM's V1 engine: the image's facts on this GPU (VLLM_USE_V1=0 keeps a line
    that still has V0 on it); an image without facts is read by its tag (V1 only from 0.10)."""
    facts = launch.facts
    if facts is not None:
        return facts.runs_v1(launch.capability or 0) and not (
            facts.reads_vllm_use_v1 and launch.env.get("VLLM_USE_V1") == "0"
        )
    if engine_version(launch.image) >= (0, 10):
        return True
    return launch.env.get("VLLM_USE_V1") != "0" and (launch.capability or 0) >= 80


def chunked_prefill(launch: Launch, max_model_len: int | None) -> tuple[bool, str]:
    """Whether chunked prefill is on, and why (the flag, or the engine's default for this image)."""
    given = launch.args.get("enable_chunked_prefill")
    if given is not None:
        return bool(given), ("--enable-chunked-prefill" if given else "--no-enable-chunked-prefill")
    if runs_v1(launch):
        return True, "the V1 engine's default"
    auto = (launch.facts.chunked_prefill_auto_above if launch.facts else None) or V0_CHUNKED_PREFILL_AUTO_ABOVE
    on = max_model_len is not None and max_model_len > auto
    return on, f"the V0 engine's default for --max-model-len {'above' if on else 'up to'} {auto}"


def _int(launch: Launch, dest: str) -> int | None:
    return number(launch.args.get(dest))


def check_context(launch: Launch) -> list[str]:
    """max_model_len against the model's context window (ModelServer prop contextWindow)."""
    window = launch.props.get("contextWindow")
    length = _int(launch, "max_model_len")
    if not isinstance(window, Mapping) or (limit := number(window.get("tokens"))) is None:
        return []
    why = str(window.get("derivedFrom") or "")
    out = []
    if length is not None and length > limit and launch.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") not in ("1", "true"):
        out.append(
            f"--max-model-len {length} is longer than the model's context window of {limit} tokens ({why} in "
            f'its config.json): vLLM refuses it at startup ("User-specified max_model_len ({length}) is '
            f'greater than the derived max_model_len"). Use --max-model-len {limit} or less.'
        )
    if launch.args.get("disable_sliding_window") and window.get("ropeScaled"):
        out.append(
            "--disable-sliding-window on a model with rope_scaling: vLLM raises NotImplementedError "
            '("Disabling sliding window is not supported for models with rope_scaling"). Remove the flag.'
        )
    return out


# --quantization values vLLM accepts for a checkpoint of another method: the method's own override
# (override_quantization_method of gptq_marlin, awq_marlin, moe_wna16, gptq_bitblas, ...; vllm/model_executor/
# layers/quantization at v0.9.2), which swaps in the faster kernel for a compatible checkpoint.
COMPATIBLE_QUANTIZATION: dict[str, frozenset[str]] = {
    "gptq": frozenset({"gptq", "gptq_marlin", "gptq_marlin_24", "marlin", "gptq_bitblas", "moe_wna16"}),
    "awq": frozenset({"awq", "awq_marlin", "moe_wna16"}),
}


def check_checkpoint_quantization(launch: Launch) -> list[str]:
    """--quantization against the checkpoint's quantization_config (configJson models: ModelServer prop)."""
    checkpoint = launch.props.get("checkpointQuantization")
    if not checkpoint:
        return []
    given = launch.args.get("quantization")
    model = launch.props.get("model") or "<model>"
    if given is None:
        return [
            f"the checkpoint's config.json is quantized with {checkpoint}, but models.{model}.quantization is "
            f"unset: vLLM loads it as {checkpoint} anyway, while the capacity plan and the hardware rules take "
            f"it for {launch.props.get('dtype') or 'fp16'} weights. State quantization: {checkpoint} (and its "
            "quantBits and groupSize)."
        ]
    if given != checkpoint and given not in COMPATIBLE_QUANTIZATION.get(checkpoint, frozenset({checkpoint})):
        return [
            f"--quantization {given} does not match the checkpoint's config.json ({checkpoint}): vLLM refuses "
            f'it ("Quantization method specified in the model config ({checkpoint}) does not match the '
            f'quantization method specified in the `quantization` argument ({given})."). Use --quantization '
            f"{checkpoint}, or a checkpoint quantized with {given}."
        ]
    return []


def check_scheduler(launch: Launch) -> list[str]:
    """SchedulerConfig's cross-field checks on the flags given."""
    length = _int(launch, "max_model_len")
    if length is None:
        window = launch.props.get("contextWindow")
        length = number(window.get("tokens")) if isinstance(window, Mapping) else None
    seqs = _int(launch, "max_num_seqs")
    batched = _int(launch, "max_num_batched_tokens")
    chunked, why = chunked_prefill(launch, length)
    out = []
    if batched is not None and length is not None and batched < length and not chunked:
        out.append(
            f"--max-num-batched-tokens {batched} is smaller than --max-model-len {length} with chunked "
            f'prefill off ({why}): vLLM refuses it ("max_num_batched_tokens ({batched}) is smaller than '
            f'max_model_len ({length})"), since a prompt must fit one batch. Raise --max-num-batched-tokens '
            f"to {length} or more, or lower --max-model-len."
        )
    # Unset, --max-num-seqs is 256 on the GPUs this pack knows (0.9.2's default; V1's for GPUs under 70 GiB).
    shown = seqs if seqs is not None else DEFAULT_MAX_NUM_SEQS
    if batched is not None and batched < shown:
        out.append(
            f"--max-num-batched-tokens {batched} is smaller than --max-num-seqs {shown}"
            f"{'' if seqs is not None else ' (its default)'}: vLLM refuses it "
            f'("max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs '
            f'({shown})"), every running sequence needs a token per step. Raise --max-num-batched-tokens '
            f"to {shown} or more, or lower --max-num-seqs."
        )
    partial = _int(launch, "max_num_partial_prefills")
    long_partial = _int(launch, "max_long_partial_prefills")
    threshold = _int(launch, "long_prefill_token_threshold")
    if partial is not None and partial < 1:
        out.append(f"--max-num-partial-prefills {partial}: vLLM needs 1 or more.")
    if partial is not None and partial > 1 and not chunked:
        out.append(
            f"--max-num-partial-prefills {partial} with chunked prefill off ({why}): vLLM refuses it "
            '("Chunked prefill must be enabled to set max_num_partial_prefills > 1."). Pass '
            "--enable-chunked-prefill or drop the flag."
        )
    if partial is not None and partial > 1 and threshold is not None and length is not None and threshold > length:
        out.append(
            f"--long-prefill-token-threshold {threshold} is above --max-model-len {length}: vLLM refuses it. "
            f"Use {length} or less."
        )
    if long_partial is not None and not 1 <= long_partial <= (partial or 1):
        out.append(
            f"--max-long-partial-prefills {long_partial} must be between 1 and --max-num-partial-prefills "
            f"({partial or 1}), as vLLM checks."
        )
    for dest, flag, low in (
        ("num_lookahead_slots", "--num-lookahead-slots", 0),
        ("num_scheduler_steps", "--num-scheduler-steps", 1),
    ):
        value = _int(launch, dest)
        if value is not None and value < low:
            out.append(f"{flag} {value}: vLLM needs {low} or more.")
    return out


def check_world_size(launch: Launch) -> list[str]:
    """--data-parallel-size multiplies the GPUs a server takes: data x tensor x pipeline must fit its nodes."""
    dp = _int(launch, "data_parallel_size")
    per_node = launch.gpus_per_node
    if dp is None or dp <= 1 or per_node is None:
        return []
    tp = _int(launch, "tensor_parallel_size") or 1
    pp = _int(launch, "pipeline_parallel_size") or 1
    have = per_node * (len(launch.nodes) or 1)
    if dp * tp * pp <= have:
        return []
    return [
        f"--data-parallel-size {dp} x --tensor-parallel-size {tp} x --pipeline-parallel-size {pp} = "
        f"{dp * tp * pp} GPUs, but the server has {have}: vLLM cannot place its ranks and stops at startup. "
        "Serve more copies as more instances of the pool (its nodes, replicasPerNode) rather than "
        "--data-parallel-size."
    ]


def check_engine_args(launch: Launch, config: dict[str, Any]) -> list[str]:
    """Every cross-field refusal of vLLM's config validation this launch would meet."""
    return (
        check_context(launch)
        + check_checkpoint_quantization(launch)
        + check_scheduler(launch)
        + check_world_size(launch)
    )
