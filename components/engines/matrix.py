"""The engines x GPU generations table: every registered engine's rows, then the engines known by name only."""

from __future__ import annotations

from components.engines.registry import ENGINES
from components.facts.engine_matrix import Cell, other_rows


def rows() -> list[tuple[str, list[Cell]]]:
    """(engine and image, one cell per generation) for every engine llm-cluster knows."""
    return [row for engine in ENGINES.values() for row in engine.matrix_rows()] + other_rows()
