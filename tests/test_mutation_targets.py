"""`make mutation` plants each known bug by one exact text replacement: a refactor that moves or reformats the
text leaves the mutant stale, and the bug unchecked. Each must still apply exactly once, to tests that exist."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checks import mutation

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mutant", mutation.MUTANTS, ids=[m.name for m in mutation.MUTANTS])
def test_each_mutant_applies_once_to_tests_that_exist(mutant: mutation.Mutant) -> None:
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: its text is in {mutant.path} {text.count(mutant.old)} times"
    assert mutant.new != mutant.old
    for test in mutant.tests:
        assert (ROOT / test.split("::")[0]).is_file(), f"{mutant.name}: {test} does not exist"


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in mutation.MUTANTS]
    assert len(names) == len(set(names))
