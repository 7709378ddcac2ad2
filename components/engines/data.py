"""Where an engine's data lives: each engine package keeps its parser dumps and fact tables in its data/."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ENGINES_DIR = Path(__file__).parent


@cache
def parser_dump(name: str) -> Path:
    """The file of a parser dump (an ImageFacts' `serve_args`), found in the data/ of the engine that owns it."""
    found = sorted(ENGINES_DIR.glob(f"*/data/{name}"))
    if len(found) != 1:
        raise FileNotFoundError(f"parser dump {name!r}: {len(found)} files under {ENGINES_DIR}/*/data")
    return found[0]
