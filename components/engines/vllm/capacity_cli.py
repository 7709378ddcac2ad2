"""vLLM's capacity estimator as a command line, run by `python -m ops.capacity` (usage there): weights, KV
cache and concurrency per GPU for one vLLM pool, from the memory model the plan sizes pools with (memory.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from components.engines.vllm.facts import DEFAULT_IMAGE, IMAGES, KV_CACHE_DTYPES, image_facts
from components.engines.vllm.memory import CapacityEstimate, estimate, pessimistic_end
from components.facts.hardware import DTYPE_ALIASES, gpu
from components.facts.models import MODELS, ModelArch, arch_from_config_json, model_arch, quantization_from_config_json

DESCRIPTION = "Command-line capacity estimator: weights, KV cache and concurrency per GPU for one vLLM pool."


class UsageError(Exception):
    """Bad command-line input, reported as one line and exit status 2."""


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    p.add_argument("--list", action="store_true", help="list the catalog models and exit")
    p.add_argument("--model", help=f"catalog name ({', '.join(sorted(MODELS))}) or path to a config.json")
    mem = p.add_mutually_exclusive_group()
    mem.add_argument("--gpu", help="GPU model as nvidia-smi names it, e.g. 'Tesla V100-SXM2-32GB'")
    mem.add_argument("--gpu-memory-gib", type=float, help="GPU memory in GiB")
    p.add_argument("--tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pp", "--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument(
        "--dtype",
        default="half",
        choices=sorted(DTYPE_ALIASES),
        help="as vllm serve takes it; auto means float16 (the V100 answer)",
    )
    p.add_argument(
        "--quantization",
        help="gptq, awq, moe_wna16, bitsandbytes, fp8, ... (default: the config.json's, or none)",
    )
    p.add_argument("--quant-bits", type=int, help="weight bits for gptq/awq, 2..8 (default: the config.json's, or 4)")
    p.add_argument(
        "--group-size",
        type=int,
        help="quantization group size, -1 for per-channel (default: the config.json's, or 128)",
    )
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-mla", action="store_true", help="plan as with VLLM_MLA_DISABLE=1 (needed on V100)")
    p.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help=f"serving image whose profiler and engine line set the budget (default {DEFAULT_IMAGE}; "
        f"known: {', '.join(sorted(IMAGES))})",
    )
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    return p


def _load_model(spec: str) -> tuple[ModelArch, tuple[str, int, int] | None]:
    """The architecture (and the checkpoint's own quantization, if any) for --model."""
    if spec in MODELS:
        return model_arch(spec), None
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UsageError(
            f"--model {spec!r} is neither a catalog model ({', '.join(sorted(MODELS))}) nor an existing config.json"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read {path}: {e}") from None
    try:
        return arch_from_config_json(data, path.parent.name or path.stem), quantization_from_config_json(data)
    except (KeyError, ValueError, TypeError) as e:
        raise UsageError(str(e)) from None


def run(argv: list[str], prog: str) -> tuple[CapacityEstimate, dict[str, object]]:
    """Parse argv and return the estimate plus the GPU it was made for."""
    args = _parser(prog).parse_args(argv)
    missing = [
        flag
        for flag, value in (
            ("--model", args.model),
            ("--max-model-len", args.max_model_len),
            ("--gpu or --gpu-memory-gib", args.gpu or args.gpu_memory_gib),
        )
        if value is None
    ]
    if missing:
        raise UsageError(f"missing {', '.join(missing)}")
    # Only None is "not given": 0 is a value, and out of range.
    if args.quant_bits is not None and not 2 <= args.quant_bits <= 8:
        raise UsageError(f"--quant-bits {args.quant_bits}: weight bits must be between 2 and 8")
    if args.group_size is not None and args.group_size != -1 and args.group_size < 1:
        raise UsageError(f"--group-size {args.group_size}: must be -1 (one group per output channel) or at least 1")
    arch, checkpoint_quant = _load_model(args.model)
    # The image's profiler decides where NCCL's buffers count; its engine line on the GPU picks the
    # default batch budget, as the plan's pool capacity does.
    facts = image_facts(args.image)
    if facts is None:
        raise UsageError(f"--image {args.image}: not in the facts table; known: {', '.join(sorted(IMAGES))}")
    v1_engine, nvls = False, False
    if args.gpu is not None:
        try:
            g = gpu(args.gpu)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None
        memory, gpu_name, nvls = g.visible_memory_gib, args.gpu, g.nvls
        v1_engine = facts.batch_budget == "v1" and facts.runs_v1(g.capability)
    else:
        memory, gpu_name = args.gpu_memory_gib, None
    dtype = DTYPE_ALIASES[args.dtype]
    dtype = "float16" if dtype == "auto" else dtype
    method, bits, group = checkpoint_quant or (None, 4, 128)
    quantization = args.quantization.lower() if args.quantization else method
    try:
        est = estimate(
            arch,
            memory,
            tp=args.tp,
            pp=args.pp,
            gpu_memory_utilization=args.gpu_memory_utilization,
            dtype=dtype,
            quantization=quantization,
            quant_bits=bits if args.quant_bits is None else args.quant_bits,
            group_size=group if args.group_size is None else args.group_size,
            kv_cache_dtype=args.kv_cache_dtype,
            max_model_len=args.max_model_len,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            block_size=args.block_size,
            mla_enabled=not args.no_mla,
            v1_engine=v1_engine,
            gpu_name=gpu_name or "",
            nccl_in_budget=facts.nccl_in_budget,
            nvls=nvls,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    return est, {"gpu": gpu_name, "json": args.json}


def render_text(est: CapacityEstimate, gpu_name: str | None = None) -> str:
    """The estimate as a short human-readable report."""
    where = f"{gpu_name} ({est.gpu_memory_gib:.2f} GiB)" if gpu_name else f"{est.gpu_memory_gib:.2f} GiB GPUs"
    quant = est.quantization or "none"
    mla = f", MLA {'on' if est.mla_enabled else 'off'}" if est.uses_mla else ""
    lines = [
        f"{est.model} on {where}, TP={est.tp} PP={est.pp}, {est.dtype}, quantization {quant}, "
        f"KV cache {est.kv_cache_dtype}{mla}",
        f"  layers per stage        {'/'.join(map(str, est.layers_per_stage))}",
        f"  weights per GPU         {est.weights_gib_per_gpu:8.2f} GiB  (whole model {est.weights_gib_total:.1f} GiB)",
        f"  activation peak         {est.activation_gib:8.2f} GiB  (max-num-batched-tokens {est.max_num_batched_tokens})",
        f"  non-torch               {est.non_torch_gib:8.2f} GiB  (NCCL/all-reduce {est.communicator_gib:.2f} GiB, "
        f"{'inside' if est.communicator_in_budget else 'outside'} the budget)",
        f"  KV cache per GPU        {est.kv_cache_gib_per_gpu:8.2f} GiB  ({est.kv_bytes_per_token_per_gpu} bytes/token)",
        f"  KV tokens               {est.kv_tokens:8d}      ({est.gpu_blocks} blocks)",
        f"  max concurrency         {est.max_concurrency:8.2f} x    at {est.max_model_len} tokens per request",
        f"  pessimistic end         {math.floor(pessimistic_end(est.kv_tokens, est.kv_estimate_error)):8d}      "
        f"KV tokens, {pessimistic_end(est.max_concurrency, est.kv_estimate_error):.2f} x (class {est.kv_error_class}: "
        f"{est.kv_estimate_error:.1%} optimistic at worst)",
        f"  rule of thumb           {est.rule_of_thumb_gib_total:8.1f} GiB  (params x bytes x 1.2, whole pool)",
        f"  fits                    {'yes' if est.fits else 'NO: ' + est.reason}",
    ]
    if est.startup_free_gib is not None:
        lines.insert(
            -1,
            f"  free at start           {est.startup_free_gib:8.2f} GiB  (vLLM requests "
            f"{est.gpu_memory_gib * est.gpu_memory_utilization:.2f} GiB)",
        )
    lines += [f"  note: {n}" for n in est.notes]
    return "\n".join(lines)


def main(argv: list[str], prog: str) -> int:
    """Print the estimate; 0 fits, 1 does not fit, 2 bad input."""
    if "--list" in argv:
        for name, arch in sorted(MODELS.items()):
            print(f"{name:<30} {arch.hf_id}")
        return 0
    try:
        est, ctx = run(argv, prog)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse already printed its message
        return 0 if e.code == 0 else 2
    if ctx["json"]:
        print(json.dumps({"gpu": ctx["gpu"], **est.to_dict()}, indent=2))
    else:
        print(render_text(est, ctx["gpu"]))  # type: ignore[arg-type]
    return 0 if est.fits else 1
