"""`make test`'s runner (tests/checks/tiers.py): the lab tier in its own pytest beside the others."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.checks import tiers


def test_the_lab_tier_runs_alone_and_the_others_a_worker_per_cpu_module_by_module() -> None:
    build = tiers.BUILD
    assert tiers.lab_argv(["-x"]) == [
        sys.executable, "-m", "pytest", "-q", f"--junitxml={build / 'test-lab.xml'}", "-x", "tests/lab"
    ]  # fmt: skip
    assert tiers.other_argv(["-x"]) == [
        sys.executable, "-m", "pytest", "-q", "-n", "auto", "--dist", "loadfile", "-m", "not lab",
        f"--junitxml={build / 'test-other.xml'}", "-x", "tests",
    ]  # fmt: skip


def fake_tier(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.mark.parametrize(
    ("lab_exit", "other_exit", "expected"),
    [(0, 0, 0), (1, 0, 1), (0, 1, 1), (2, 1, 2)],
)
def test_the_lab_log_is_shown_whole_after_the_others_and_a_failing_tier_fails_the_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfdbinary: pytest.CaptureFixture[bytes],
    lab_exit: int,
    other_exit: int,
    expected: int,
) -> None:
    monkeypatch.setattr(tiers, "BUILD", tmp_path)
    monkeypatch.setattr(tiers, "LAB_LOG", tmp_path / "test-lab.log")
    monkeypatch.setattr(tiers, "ROOT", tmp_path)
    # The lab tier writes before and after the other tiers end (they end at once here).
    lab = f"import sys, time; print('lab starts', flush=True); time.sleep(1.5); print('lab ends'); sys.exit({lab_exit})"
    monkeypatch.setattr(tiers, "lab_argv", lambda extra: fake_tier(lab))
    monkeypatch.setattr(
        tiers, "other_argv", lambda extra: fake_tier(f"print('others'); raise SystemExit({other_exit})")
    )
    assert tiers.main([]) == expected
    out = capfdbinary.readouterr().out.decode()
    assert out.index("others") < out.index("== the lab tier") < out.index("lab starts") < out.index("lab ends")
    assert out.rstrip().endswith(f"make test: the lab tier exited {lab_exit}, the other tiers {other_exit}")
