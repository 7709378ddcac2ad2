"""Shared fixtures: the reference stack's config and spec, and the program run under Pulumi's mocks."""
from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.spec import StackSpec, load_stack_config  # noqa: E402
from plan.harness import ProgramRun, run_main_program  # noqa: E402
from plan.stackfile import load_stack_file  # noqa: E402

PROD = ROOT / "Pulumi.prod.yaml"


def prod_config() -> dict[str, Any]:
    """A fresh deep copy of the reference stack's config (full keys), safe to modify."""
    return copy.deepcopy(load_stack_file(PROD, "prod").config)


def run_stack(config: dict[str, Any], secret_keys: set[str] | None = None, *, preview: bool = False,
              stack: str = "prod") -> ProgramRun:
    """Run the real __main__.py under the mock runtime with this config."""
    return run_main_program(config, secret_keys or set(), stack=stack, preview=preview)


@pytest.fixture
def config() -> dict[str, Any]:
    """The reference stack's config, a copy each test may change."""
    return prod_config()


@pytest.fixture(scope="session")
def prod_spec() -> StackSpec:
    """The reference stack, validated."""
    return load_stack_config(prod_config(), set())


@pytest.fixture(scope="session")
def prod_run() -> ProgramRun:
    """The reference stack's registrations, `pulumi up` mode (computed outputs known). Read-only."""
    return run_stack(prod_config())


@pytest.fixture(scope="session")
def prod_preview_run() -> ProgramRun:
    """The reference stack's registrations as `pulumi preview` sees them (computed outputs unknown)."""
    return run_stack(prod_config(), preview=True)


@pytest.fixture
def stack_runner() -> Callable[..., ProgramRun]:
    """run_stack, for tests that plan a changed stack."""
    return run_stack
