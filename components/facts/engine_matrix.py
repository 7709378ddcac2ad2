"""Engines x GPU generations: whether llm-cluster deploys each engine there, and how sure that is.

Built from the engine facts themselves: each engine's package gives its rows (Engine.matrix_rows), these
are the cells, the engines the project does not deploy and the table's text (the README's table is
components.engines.matrix's output, checked by tests/test_engine_matrix.py), so the table cannot drift from what the spec and the policy pack decide.
Every "observed" report behind these facts was made on V100s: on other generations the same fact counts
as read from code (build files, kernel lists, documented requirements), never as observed.
"""

from __future__ import annotations

from dataclasses import dataclass

from components.facts.evidence import Evidence, Sourced
from components.facts.other_engines import OTHER_ENGINES

# One GPU per generation, as the facts tables name compute capabilities.
GENERATIONS: tuple[tuple[str, int], ...] = (
    ("Volta sm_70", 70),
    ("Turing sm_75", 75),
    ("Ampere sm_80", 80),
    ("Ada sm_89", 89),
    ("Hopper sm_90", 90),
)


@dataclass(frozen=True)
class Cell:
    """One engine on one GPU generation."""

    verdict: str  # "deployed", "deployed (PTX JIT)", "no", "runs, not deployed", "as its backend"
    evidence: str  # the evidence level of the fact behind the verdict

    def __str__(self) -> str:
        return f"{self.verdict} [{self.evidence}]"


def level(s: Sourced, capability: int) -> str:
    if s.evidence is Evidence.OBSERVED and capability != OBSERVED_ON:
        return Evidence.CODE.value
    return s.evidence.value


OBSERVED_ON = 70  # the GPU of every observed report in the facts (V100)


def sass_runs(archs: tuple[int, ...], capability: int) -> bool:
    """A cubin runs on GPUs of its major version with an equal or higher minor (sm_86 code on sm_89)."""
    return any(a // 10 == capability // 10 and a <= capability for a in archs)


def other_rows() -> list[tuple[str, list[Cell]]]:
    """The engines the runbooks name that llm-cluster does not deploy: where each would run."""
    out = []
    for e in OTHER_ENGINES.values():
        if e.min_capability is None:
            cells = [Cell("as its backend", level(e.source, cap)) for _, cap in GENERATIONS]
        else:
            cells = [
                Cell("no" if cap < e.min_capability else "runs, not deployed", level(e.source, cap))
                for _, cap in GENERATIONS
            ]
        out.append((f"{e.title} (`engine: {e.name}`)", cells))
    return out


def markdown(rows: list[tuple[str, list[Cell]]]) -> str:
    """The table as the README shows it."""
    head = "| engine | " + " | ".join(g for g, _ in GENERATIONS) + " |"
    sep = "| --- |" + " --- |" * len(GENERATIONS)
    body = [f"| {name} | " + " | ".join(str(c) for c in cells) + " |" for name, cells in rows]
    return "\n".join([head, sep, *body]) + "\n"
