"""Shared fixtures: the reference stack's config and spec, and the program run under Pulumi's mocks."""
from __future__ import annotations

import copy
import hashlib
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# The shared helpers (tests/support) assert as the tests do: their failures show the values compared too.
pytest.register_assert_rewrite("tests.support")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from components.spec import StackSpec  # noqa: E402

from components.planning.load import load_stack_config
from plan.harness import ProgramRun, run_main_program  # noqa: E402
from plan.stackfile import load_stack_file  # noqa: E402

PROD = ROOT / "Pulumi.prod.yaml"
TREE_CHANGED = "WARNING: the working tree changed while the suite ran"
_TREE_AT_START = pytest.StashKey[str | None]()


def _tree_state() -> str | None:
    """A digest of HEAD and every uncommitted change to tracked files; None outside a git checkout."""
    try:
        out = [subprocess.run(argv, cwd=ROOT, capture_output=True, check=True).stdout
               for argv in (["git", "rev-parse", "HEAD"], ["git", "diff", "HEAD", "--binary"])]
    except (OSError, subprocess.CalledProcessError):
        return None
    return hashlib.sha256(b"\0".join(out)).hexdigest()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_TREE_AT_START] = _tree_state()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Say so when the tree changed under the run (a rebase, an edit): the modules imported at the
    start then meet files read later (Lua modules, scripts, fixtures) of another version, and a failure
    after that point may be that mix, not the code (two "flaky" rollout failures were exactly this)."""
    before = config.stash.get(_TREE_AT_START, None)
    if before is not None and _tree_state() != before:
        terminalreporter.write_line(f"{TREE_CHANGED} (HEAD moved or tracked files were edited): failures may "
                                    "come from a mix of old and new files; run again on a tree left alone",
                                    red=True, bold=True)


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
