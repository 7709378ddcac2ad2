"""The estimate every engine but vLLM reports (components/engines/estimate.py) as tables: the class each pool's
error is read from and its words, the kind of pool, and the JSON plan.json and the memory-fit rules read, whole."""

from __future__ import annotations

import pytest

from components.engines.estimate import EngineEstimate, class_kv_error, pool_kind

BY_CLASS = {("turbomind", "tp1", "dense"): 0.02, ("turbomind", "tp>=2", "moe"): 0.041}


@pytest.mark.parametrize(
    ("cls", "kwargs", "said"),
    [
        (("turbomind", "tp1", "dense"), {}, (0.02, "TurboMind · TP1 · dense, measured on its logs")),
        (("turbomind", "tp>=2", "moe"), {}, (0.041, "TurboMind · TP>=2 · MoE, measured on its logs")),
        (
            ("turbomind", "tp1", "moe"),
            {},
            (0.035, "TurboMind · TP1 · MoE: too few logs, the widest error measured"),
        ),
        (
            ("turbomind", "tp>=2", "mla"),
            {"widest_how": "no log compared"},
            (0.035, "TurboMind · TP>=2 · MLA: no log compared"),
        ),
        (
            ("turbomind", "tp1", "dense"),
            {"widest_how": "no log compared"},
            (0.02, "TurboMind · TP1 · dense, measured on its logs"),
        ),
    ],
)
def test_a_class_takes_its_measured_error_or_the_widest_in_the_engines_words(
    cls: tuple[str, str, str], kwargs: dict[str, str], said: tuple[float, str]
) -> None:
    assert class_kv_error(cls, BY_CLASS, 0.035, engine="TurboMind", **kwargs) == said


@pytest.mark.parametrize(
    ("uses_mla", "is_moe", "kind"),
    [(False, False, "dense"), (False, True, "moe"), (True, False, "mla"), (True, True, "mla")],
)
def test_the_kind_of_pool_is_mla_first_then_moe(uses_mla: bool, is_moe: bool, kind: str) -> None:
    assert pool_kind(uses_mla=uses_mla, is_moe=is_moe) == kind


def test_the_estimate_as_json_is_whole_rounded_and_says_no_mla() -> None:
    est = EngineEstimate(
        engine="lmdeploy",
        model="m",
        gpu_memory_gib=31.123456,
        tp=2,
        max_model_len=8192,
        weights_gib_per_gpu=7.000049,
        weights_gib_total=14.00007,
        kv_bytes_per_token_per_gpu=65536.0,
        kv_cache_gib_per_gpu=20.123456,
        kv_tokens=329728,
        max_concurrency=40.249999,
        rule_of_thumb_gib_total=18.76543,
        fits=False,
        reason="r",
        advice="a",
        notes=("n1", "n2"),
        extra={"cache_max_entry_count": 0.812345, "session_len": 8192, "kv_error_class": "c"},
    )
    assert est.to_dict() == {
        "engine": "lmdeploy",
        "model": "m",
        "gpu_memory_gib": 31.1235,
        "tp": 2,
        "max_model_len": 8192,
        "weights_gib_per_gpu": 7.0,
        "weights_gib_total": 14.0001,
        "kv_bytes_per_token_per_gpu": 65536.0,
        "kv_cache_gib_per_gpu": 20.1235,
        "kv_tokens": 329728,
        "max_concurrency": 40.25,
        "rule_of_thumb_gib_total": 18.7654,
        "fits": False,
        "reason": "r",
        "advice": "a",
        "notes": ["n1", "n2"],
        "uses_mla": False,
        "mla_enabled": False,
        "cache_max_entry_count": 0.8123,
        "session_len": 8192,
        "kv_error_class": "c",
    }


def test_an_estimate_without_notes_or_extra_keys() -> None:
    d = EngineEstimate(
        engine="llama.cpp",
        model="m",
        gpu_memory_gib=16.0,
        tp=1,
        max_model_len=4096,
        weights_gib_per_gpu=4.0,
        weights_gib_total=4.0,
        kv_bytes_per_token_per_gpu=1024.0,
        kv_cache_gib_per_gpu=8.0,
        kv_tokens=8192,
        max_concurrency=2.0,
        rule_of_thumb_gib_total=4.8,
        fits=True,
        reason="",
        advice="",
    ).to_dict()
    assert (d["notes"], d["uses_mla"], d["mla_enabled"], len(d)) == ([], False, False, 18)
