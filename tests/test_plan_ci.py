"""The plan in CI: byte-identical outputs across runs of the same input, SARIF 2.1.0 and JUnit XML
verdicts valid against their published schemas, and no BrokenPipe traceback from any CLI."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def plan_files(out: Path, seed: str, *args: str) -> dict[str, bytes]:
    """Every file one `python -m plan` run writes, under a given hash seed (set and dict order differ)."""
    env = {**os.environ, "PYTHONHASHSEED": seed}
    done = subprocess.run([sys.executable, "-m", "plan", "--quiet", "--out", str(out), *args], cwd=ROOT, env=env,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_two_runs_of_the_same_stack_write_byte_identical_plans(tmp_path: Path) -> None:
    for mode in ([], ["--up"]):
        first = plan_files(tmp_path / f"a{len(mode)}", "1", *mode)
        second = plan_files(tmp_path / f"b{len(mode)}", "2", *mode)
        assert {"prod/plan.txt", "prod/plan.json"} <= set(first)
        assert sorted(first) == sorted(second)
        assert [name for name in first if first[name] != second[name]] == []
