"""Engines x GPU generations: whether llm-cluster deploys each engine there, and how sure that is.

Built from the engine facts themselves (the README's table is this module's output, checked by
tests/test_engine_matrix.py), so the table cannot drift from what the spec and the policy pack decide.
Every "observed" report behind these facts was made on V100s: on other generations the same fact counts
as read from code (build files, kernel lists, documented requirements), never as observed.
"""
from __future__ import annotations

from dataclasses import dataclass

from components.facts.evidence import Evidence, Sourced
from components.engines.vllm.facts import known_images
from components.engines.llamacpp.facts import IMAGES as LLAMACPP_IMAGES
from components.engines.lmdeploy.facts import IMAGES as LMDEPLOY_IMAGES
from components.facts.other_engines import OTHER_ENGINES

# One GPU per generation, as the facts tables name compute capabilities.
GENERATIONS: tuple[tuple[str, int], ...] = (
    ("Volta sm_70", 70), ("Turing sm_75", 75), ("Ampere sm_80", 80), ("Ada sm_89", 89), ("Hopper sm_90", 90))


@dataclass(frozen=True)
class Cell:
    """One engine on one GPU generation."""

    verdict: str  # "deployed", "deployed (PTX JIT)", "no", "runs, not deployed", "as its backend"
    evidence: str  # the evidence level of the fact behind the verdict

    def __str__(self) -> str:
        return f"{self.verdict} [{self.evidence}]"


def _level(s: Sourced, capability: int) -> str:
    if s.evidence is Evidence.OBSERVED and capability != OBSERVED_ON:
        return Evidence.CODE.value
    return s.evidence.value


OBSERVED_ON = 70  # the GPU of every observed report in the facts (V100)


def _sass_runs(archs: tuple[int, ...], capability: int) -> bool:
    """A cubin runs on GPUs of its major version with an equal or higher minor (sm_86 code on sm_89)."""
    return any(a // 10 == capability // 10 and a <= capability for a in archs)


def vllm_rows() -> list[tuple[str, list[Cell]]]:
    """vLLM images: torch's CUDA build decides whether anything starts, Triton whether fp16 MoE compiles."""
    out = []
    for f in known_images():
        if f.engine != "vllm":
            continue
        cells = []
        for _, cap in GENERATIONS:
            if not _sass_runs(f.torch_arch_list, cap):
                cells.append(Cell("no", _level(f.sources["torch_arch_list"], cap)))
            elif f.triton_fp16_dot(cap) is False:
                cells.append(Cell("dense only: no fp16 Triton MoE", _level(f.sources["triton"], cap)))
            else:
                cells.append(Cell("deployed", _level(f.sources["torch_arch_list"], cap)))
        out.append((f"vLLM `{f.ref}`", cells))
    return out


def rows() -> list[tuple[str, list[Cell]]]:
    """(engine and image, one cell per generation) for every engine llm-cluster knows."""
    out: list[tuple[str, list[Cell]]] = vllm_rows()
    for image in LMDEPLOY_IMAGES.values():
        out.append((f"LMDeploy TurboMind `{image.ref}`",
                    [Cell("deployed" if image.runs_on(cap) else "no", _level(image.sources["sass"], cap))
                     for _, cap in GENERATIONS]))
    for ll in LLAMACPP_IMAGES.values():
        cells = []
        for _, cap in GENERATIONS:
            if not ll.runs_on(cap):
                cells.append(Cell("no", _level(ll.sources["sass"], cap)))
            elif ll.jit_only(cap):
                cells.append(Cell("deployed (PTX JIT)", _level(ll.sources["ptx"], cap)))
            else:
                cells.append(Cell("deployed", _level(ll.sources["sass"], cap)))
        out.append((f"llama.cpp `{ll.ref}`", cells))
    for e in OTHER_ENGINES.values():
        if e.min_capability is None:
            cells = [Cell("as its backend", _level(e.source, cap)) for _, cap in GENERATIONS]
        else:
            cells = [Cell("no" if cap < e.min_capability else "runs, not deployed", _level(e.source, cap))
                     for _, cap in GENERATIONS]
        out.append((f"{e.title} (`engine: {e.name}`)", cells))
    return out


def markdown() -> str:
    """The table as the README shows it."""
    head = "| engine | " + " | ".join(g for g, _ in GENERATIONS) + " |"
    sep = "| --- |" + " --- |" * len(GENERATIONS)
    body = [f"| {name} | " + " | ".join(str(c) for c in cells) + " |" for name, cells in rows()]
    return "\n".join([head, sep, *body]) + "\n"
