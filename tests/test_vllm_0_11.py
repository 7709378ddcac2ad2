"""vLLM 0.11.0 (vllm/vllm-openai:v0.11.0), the first V1-only line: its facts come from its wheel (flag list and
quantization capabilities dumped from its own code, re-dumped here and compared byte for byte), and what
differs from 0.19.1 reaches the plan: the attention backend by environment (no --attention-backend yet),
FlexAttention by default below sm_80, VLLM_USE_V1=0 fatal (V0 is gone but the variable is still read)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from components.engines.registry import engine_for
from components.engines.vllm.capacity import pool_capacity
from components.engines.vllm.facts import IMAGES
from components.planning.load import load_stack_config
from components.spec.topology import instances
from plan.analyze import analyze
from tests.conftest import prod_config, run_stack
from tests.support.policies import model_server, server
from tests.support.qualification import CACHE, python_files, unpacked_wheel

ROOT = Path(__file__).resolve().parents[1]
NS = "llm-cluster:"
V011 = "vllm/vllm-openai:v0.11.0"


def chat_on_0_11(config: dict[str, Any]) -> dict[str, Any]:
    config[NS + "pools"]["chat"]["image"] = V011
    return config


def vllm_source(version: str) -> Path:
    """The wheel's Python unpacked (cached under /var/cache/llm-cluster/vllm)."""
    return unpacked_wheel(f"vllm=={version}", CACHE / "vllm" / f"src-{version}", python_files)


@pytest.mark.parametrize("version", ["0.11.0", "0.19.1"])
def test_the_committed_dumps_are_what_the_wheels_own_code_says(version: str, tmp_path: Path) -> None:
    source = vllm_source(version)
    for tool, committed in (
        (
            "dump_vllm_serve_args.py",
            ROOT / "components" / "engines" / "vllm" / "data" / f"vllm-{version}-serve-args.json",
        ),
        (
            "dump_vllm_quantizations.py",
            ROOT / "components" / "engines" / "vllm" / "data" / f"vllm-{version}-quantizations.json",
        ),
    ):
        out = tmp_path / committed.name
        run = subprocess.run(
            [sys.executable, str(ROOT / "components" / "engines" / "vllm" / "tools" / tool), str(source), str(out)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert out.read_text() == committed.read_text(), tool
        assert "stub" not in out.read_text()


def test_the_facts_read_the_quantization_dump() -> None:
    dumped = json.loads((ROOT / "components/engines/vllm/data/vllm-0.11.0-quantizations.json").read_text())["methods"]
    facts = IMAGES[V011].quantizations
    assert {m: q.min_capability for m, q in facts.items()} == dumped
    # Read from 0.11.0's code: no FP8 checkpoint below sm_80 yet (0.19.1 runs fp8 from sm_75 as Marlin).
    assert (facts["fp8"].min_capability, IMAGES["vllm/vllm-openai:v0.19.1"].quantizations["fp8"].min_capability) == (
        80,
        75,
    )
    assert facts["gptq"].moe == "moe_wna16"


def test_the_attention_backend_goes_by_environment_on_0_11(config: dict[str, Any]) -> None:
    spec = load_stack_config(chat_on_0_11(config), set())
    inst = instances(spec, "chat")[0]
    engine = engine_for(spec.pools["chat"])
    argv, env = engine.serve_argv(spec, inst), engine.serve_env(spec, inst, inst.head)
    assert "--attention-backend" not in argv
    assert env["VLLM_ATTENTION_BACKEND"] == "TRITON_ATTN"
    # 0.19.1 takes the flag and gets no variable.
    prod = load_stack_config(prod_config(), set())
    inst = instances(prod, "chat")[0]
    assert "--attention-backend" in engine.serve_argv(prod, inst)
    assert "VLLM_ATTENTION_BACKEND" not in engine.serve_env(prod, inst, inst.head)


def test_0_11_has_no_shutdown_timeout_so_neither_the_flag_nor_a_stop_timeout_is_planned(
    config: dict[str, Any],
) -> None:
    spec = load_stack_config(chat_on_0_11(config), set())
    engine = engine_for(spec.pools["chat"])
    assert "--shutdown-timeout" not in engine.serve_argv(spec, instances(spec, "chat")[0])
    assert engine.stop_timeout_seconds(spec, "chat") is None
    assert not IMAGES[V011].shutdown_timeout_flag and IMAGES["vllm/vllm-openai:v0.19.1"].shutdown_timeout_flag


def test_the_reference_chat_pool_on_0_11_plans_clean() -> None:
    violations = analyze(run_stack(chat_on_0_11(prod_config()), preview=True).registrations)
    assert [v.policy_name for v in violations if v.enforcement_level == "mandatory"] == []


def test_vllm_use_v1_0_is_refused_where_v0_is_gone() -> None:
    props = server(image=V011, env={"VLLM_USE_V1": "0"})
    found = [(p, level, m.split("\n", 1)[1]) for p, level, m in model_server(props) if p == "vllm-v1-engine"]
    assert found == [
        (
            "vllm-v1-engine",
            "mandatory",
            "VLLM_USE_V1=0 selects the V0 engine, which image vllm/vllm-openai:v0.11.0 (vLLM 0.11.0) no "
            "longer has: it stops at startup (vLLM 0.11.0 platforms/cuda.py:386-388: VLLM_USE_V1=0 "
            "reaches 'V0 attention backends have been removed' (RuntimeError) [read from code]). Remove "
            "VLLM_USE_V1 from the container's env (V1 runs on Tesla V100-SXM2-32GB (sm_70) in this "
            "image).",
        )
    ]
    # On 0.9.2 (V0 only below sm_80) the same variable is what V100 needs.
    assert [
        p
        for p, _, _ in model_server(server(image="vllm/vllm-openai:v0.9.2", env={"VLLM_USE_V1": "0"}))
        if p == "vllm-v1-engine"
    ] == []


def test_a_backend_named_by_environment_is_checked_like_the_flag() -> None:
    props = server(image=V011, env={"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"})
    props["argv"] = [a for a in props["argv"] if a not in ("--attention-backend", "TRITON_ATTN")]
    found = [m.split("\n", 1)[1] for p, _, m in model_server(props) if p == "attention-backend"]
    assert found == [
        "VLLM_ATTENTION_BACKEND FLASH_ATTN: needs sm_80 (compute capability 8.0); Tesla V100-SXM2-32GB "
        "(sm_70) has less (its supports_compute_capability in vLLM 0.11.0). On this GPU vLLM picks "
        "FLEX_ATTENTION: set that, or leave the flag out."
    ]


def test_capacity_on_0_11_follows_its_profiler(config: dict[str, Any]) -> None:
    est = pool_capacity(load_stack_config(chat_on_0_11(config), set()), "chat")
    # NCCL before the snapshot (vllm#25359 is in 0.11.0): the start-up check pays the buffers; V1 also logs its
    # lazily connected buffers in the profile run, so the KV budget pays them too. V1's 2048-token budget on
    # a 32 GB GPU.
    assert (est.communicator_in_budget, est.max_num_batched_tokens) == (True, 2048)
    assert est.startup_free_gib is not None
