"""The README's engines x GPU generations table is the one the facts build, and says what the spec decides."""

from __future__ import annotations

import re
from pathlib import Path

from components.engines.matrix import rows
from components.facts.engine_matrix import GENERATIONS, markdown

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_table_is_generated_from_the_facts() -> None:
    text = README.read_text()
    found = re.search(r"<!-- engine-matrix:[^\n]*-->\n(.*?)<!-- /engine-matrix -->", text, re.S)
    assert found, "README lost its engine-matrix block"
    assert found.group(1) == markdown(rows())


def test_cells_match_the_facts_and_carry_evidence() -> None:
    table = {name: cells for name, cells in rows()}
    volta = [g for g, _ in GENERATIONS].index("Volta sm_70")
    assert str(table["LMDeploy TurboMind `openmmlab/lmdeploy:v0.16.0-cu12.8`"][volta]) == "deployed [read from code]"
    assert str(table["LMDeploy TurboMind `openmmlab/lmdeploy:v0.16.0-cu13.0`"][volta]) == "no [read from code]"
    assert (
        str(table["llama.cpp `ghcr.io/ggml-org/llama.cpp:server-cuda-b11312`"][volta])
        == "deployed (PTX JIT) [observed]"
    )
    sglang = table["SGLang (`engine: sglang`)"]
    assert str(sglang[volta]) == "no [observed]"
    assert str(sglang[volta + 1]) == "runs, not deployed [read from code]"  # Turing: its own check, not a report
    assert all(str(c).startswith("as its backend") for c in table["Ollama (`engine: ollama`)"])
    old_vllm = table["vLLM `vllm/vllm-openai:v0.9.2`"]
    assert str(old_vllm[volta]) == "no [observed]"  # torch 2.7.0+cu128 has no sm_70 (V100 reports)
    assert str(old_vllm[volta + 1]) == "dense only: no fp16 Triton MoE [read from code]"  # Triton 3.3 on sm_75
    assert str(old_vllm[volta + 3]).startswith("deployed")  # sm_86 cubins run on Ada (sm_89)
    assert str(table["vLLM `vllm/vllm-openai:v0.19.1`"][volta]) == "deployed [unverified]"
