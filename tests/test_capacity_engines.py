"""The other engines' capacity against their real start-up logs (bench/capacity_accuracy.py), the range each
class of pool carries, and how the plan and the memory-fit-margin rule use it (issue 35)."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest

from components.engines.estimate import KV_ERROR_FLOOR, KV_ERROR_MIN_LOGS, KV_ERROR_UNMEASURED
from components.engines.llamacpp import engine as llamacpp
from components.engines.lmdeploy import engine as lmdeploy
from components.engines.lmdeploy.facts import DEFAULT_IMAGE, lmdeploy_image
from components.facts.models import MODELS
from tests.support.policies import model_server, only, server

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("capacity_accuracy", ROOT / "bench" / "capacity_accuracy.py")
assert _spec and _spec.loader
accuracy = sys.modules.get("capacity_accuracy") or importlib.util.module_from_spec(_spec)
if "capacity_accuracy" not in sys.modules:
    sys.modules["capacity_accuracy"] = accuracy  # dataclasses look their module up while building
    _spec.loader.exec_module(accuracy)

CASES = accuracy.load_engine_cases()


def test_each_log_names_its_source_model_and_settings() -> None:
    names = [c.name for c in CASES]
    assert sum(n.startswith("llamacpp.") for n in names) == 5 and all(c.engine == "llamacpp" for c in CASES)
    sources = (ROOT / "tests/fixtures/engine-startup-logs/SOURCES.md").read_text()
    for case in CASES:
        # A public file pinned to its commit, or a pull request's thread.
        assert re.match(r"https://github\.com/[\w.-]+/[\w.-]+/(blob/[0-9a-f]{40}/|pull/\d+)", case.source), case.name
        assert case.name in sources
        assert {"n_ctx", "parallel", "cache_type", "flash_attention", "split_mode", "gpus"} <= set(case.settings)


def test_llama_cpp_kv_buffer_is_planned_to_the_mebibyte_for_full_attention_models() -> None:
    # Mistral-7B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 128 KiB a token, 256 MiB at 2048.
    dense = [c for c in CASES if c.arch.model_type == "mistral"]
    assert [(c.settings["n_ctx"], c.logged_kv_mib) for c in dense] == [(2048, 256.0), (32768, 4096.0)]
    assert all(accuracy.engine_kv_error(c) == 0.0 for c in dense)


def test_sliding_window_layers_make_the_llama_cpp_estimate_err_on_the_safe_side() -> None:
    # gpt-oss-20b: llama.cpp caches its 12 sliding-window layers for 768 cells only; the planner caches all 24
    # for the whole context, so it plans about twice the buffer (pessimistic, never optimistic).
    oss = [c for c in CASES if c.arch.model_type == "gpt_oss"]
    assert len(oss) == 3
    for case in oss:
        full = 12 * int(case.settings["n_ctx"]) * 2 * 8 * 64 * 2 / 2**20
        assert case.logged_kv_mib == full + 12 * 768 * 2 * 8 * 64 * 2 / 2**20
        assert -50 < accuracy.engine_kv_error(case) < -45


def test_each_llama_cpp_class_range_covers_the_logs_of_its_class() -> None:
    classes = accuracy.engine_pool_classes(CASES)
    worst_of_all = max(max([0.0, *e]) for e in classes.values()) / 100
    assert llamacpp.KV_ERROR_WIDEST == max(KV_ERROR_FLOOR, round(worst_of_all + 0.0005, 3))
    assert set(llamacpp.KV_ERROR_BY_CLASS) <= set(classes)
    for cls, errors in classes.items():
        worst = max([0.0, *errors]) / 100
        error, how = llamacpp.kv_estimate_error(cls)
        assert error >= worst, cls
        if len(errors) >= KV_ERROR_MIN_LOGS:
            assert cls in llamacpp.KV_ERROR_BY_CLASS and error == max(KV_ERROR_FLOOR, round(worst + 0.0005, 3))
            assert how.endswith("measured on its logs")
        else:
            assert cls not in llamacpp.KV_ERROR_BY_CLASS and error == llamacpp.KV_ERROR_WIDEST
            assert how.endswith("too few logs, the widest error measured")


def test_turbomind_without_a_comparable_log_takes_the_widest_error_measured_on_any_engine() -> None:
    assert not list(accuracy.ENGINE_LOG_DIR.glob("lmdeploy.*.log")) and lmdeploy.KV_ERROR_BY_CLASS == {}
    # The widest error measured on any engine's logs: vLLM's (tests/test_capacity.py), wider than llama.cpp's.
    assert KV_ERROR_UNMEASURED >= llamacpp.KV_ERROR_WIDEST
    assert lmdeploy.kv_estimate_error(("turbomind", "tp>=2", "moe")) == (
        KV_ERROR_UNMEASURED,
        "TurboMind · TP>=2 · MoE: no public TurboMind log to compare, the widest error measured on any engine's logs",
    )


def test_the_bench_prints_each_log_and_a_line_per_engine_before_the_line_for_scripts(capsys) -> None:
    accuracy.main()
    out = capsys.readouterr().out.rstrip("\n").splitlines()
    assert re.fullmatch(r"v1 logs \d+ \(tp>=2 \d+\): kv median \d+\.\d%, worst optimistic \d+\.\d%", out[-1])
    assert re.fullmatch(r"llamacpp logs 5: kv buffer median \d+\.\d%, worst optimistic 0\.0%", out[-3])
    assert out[-2].startswith("lmdeploy (TurboMind) logs 0: no public log states its settings, GPU and block")
    for case in CASES:
        assert any(line.startswith(case.name[:78]) for line in out), case.name


def _llama(gpu_gib: float, ctx: int = 32768, parallel: int = 1) -> dict[str, object]:
    """Qwen3-32B (dense, 64 layers) from a 19.8 GB GGUF on one GPU, `parallel` slots of `ctx`."""
    return llamacpp.llamacpp_estimate(
        llamacpp.shape_from_arch(MODELS["qwen3-32b"], 19.8e9),
        gpu_gib,
        gpus=1,
        split_mode="layer",
        ctx_per_slot=ctx,
        parallel=parallel,
        cache_type="f16",
        flash_attention=True,
    ).to_dict()


def _boundary(est: dict[str, object]) -> float:
    """The GPU memory (GiB) at which the pessimistic end's KV buffer just fits."""
    kv = float(est["kv_cache_gib_per_gpu"])  # type: ignore[arg-type]
    need = float(est["weights_gib_per_gpu"]) + kv + float(est["compute_gib_per_gpu"]) + llamacpp.RESERVED_GIB  # type: ignore[arg-type]
    return need + kv * float(est["kv_estimate_error"])  # type: ignore[arg-type]


def test_a_llama_cpp_server_whose_buffer_fits_only_at_the_central_estimate_holds_less_at_the_pessimistic_end() -> None:
    probe = _llama(80.0)
    assert probe["kv_estimate_error"] == KV_ERROR_FLOOR and probe["kv_tokens_required"] == 32768
    assert probe["kv_error_class"] == "llama.cpp · TP1 · dense: too few logs, the widest error measured"
    edge = _boundary(probe)
    roomy, tight = _llama(edge + 1e-6), _llama(edge - 0.01)
    assert roomy["fits"] and roomy["kv_tokens_low"] == 32768 and roomy["max_concurrency_low"] == 1.0
    assert tight["fits"] and 32000 < tight["kv_tokens_low"] < 32768  # type: ignore[operator]
    assert tight["max_concurrency_low"] == pytest.approx(tight["kv_tokens_low"] / 32768, abs=1e-4)  # type: ignore[operator]
    assert roomy["kv_cache_gib_per_gpu_high"] == pytest.approx(roomy["kv_cache_gib_per_gpu"] * 1.02, abs=1e-4)  # type: ignore[operator]


def test_memory_fit_margin_warns_a_llama_cpp_server_that_may_not_allocate_its_context() -> None:
    # Two slots of 16384: llama-server must allocate -c 32768 at start, not one slot's 16384.
    edge = _boundary(_llama(80.0, 16384, 2))
    roomy = _llama(edge + 1e-6, 16384, 2)
    assert [d for d in model_server(server(capacity=roomy)) if d[0] == "memory-fit-margin"] == []
    tight = _llama(edge - 0.01, 16384, 2)
    assert tight["max_model_len"] == 16384 and 16384 < tight["kv_tokens_low"] < 32768  # type: ignore[operator]
    low = tight["kv_tokens_low"]
    got = [d for d in model_server(server(capacity=tight)) if d[0] == "memory-fit-margin"]
    assert got == only(
        "memory-fit-margin",
        f"fits at the central estimate (32768 KV tokens for the 32768 it allocates at start) but not at its "
        f"pessimistic end ({low}: the KV estimate has erred up to 2.0% on the optimistic side against real start-up "
        "logs of its class, llama.cpp · TP1 · dense: too few logs, the widest error measured, "
        f"bench/capacity_accuracy.py), so the engine may refuse to start for want of {32768 - low} tokens of KV "  # type: ignore[operator]
        "cache. The uncertain terms are the KV buffer (n_ctx x layers x K/V row bytes) and, beside it, the compute "
        "buffer; the engine's first start-up log settles it (its KV cache line, which doctor compares with the "
        "plan). Leave room: lower the context per slot (llamacpp.contextPerSlot), or raise the memory the engine "
        "may use.",
        level="advisory",
    )


def test_turbomind_capacity_carries_its_range() -> None:
    image = lmdeploy_image(DEFAULT_IMAGE)
    assert image is not None
    est = lmdeploy.turbomind_estimate(
        MODELS["qwen3-32b"],
        image,
        80.0,
        tp=1,
        model_format="hf",
        group_size=128,
        quant_policy=0,
        session_len=32768,
        max_batch_size=64,
        cache_max_entry_count=0.8,
        cache_block_seq_len=64,
        max_prefill_token_num=8192,
    ).to_dict()
    kv = int(est["kv_tokens"])  # type: ignore[call-overload]
    assert est["kv_estimate_error"] == KV_ERROR_UNMEASURED and est["kv_tokens_required"] == 32768
    assert est["kv_tokens_low"] == math.floor(kv * (1 - KV_ERROR_UNMEASURED))
    assert est["kv_cache_gib_per_gpu_low"] == pytest.approx(est["kv_cache_gib_per_gpu"] * 0.965, abs=1e-4)  # type: ignore[operator]
    assert est["max_concurrency_low"] == pytest.approx(kv * 0.965 / 32768, abs=1e-4)
