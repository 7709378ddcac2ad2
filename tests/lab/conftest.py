"""The lab tier's figures (time to up, recovery times, requests lost), printed after the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FIGURES: dict[str, Any] = {}
OUT = Path(__file__).resolve().parent.parent.parent / "build" / "lab" / "figures.json"


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    """Measured figures; written to build/lab/figures.json and shown in the terminal summary."""
    return FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(FIGURES, indent=1, sort_keys=True))
    terminalreporter.section("lab figures")
    for k, v in sorted(FIGURES.items()):
        terminalreporter.write_line(f"{k}: {v}")
