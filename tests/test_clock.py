"""The operator-side clock check, run for real (bash, awk) against a stand-in `ssh` whose node clock is skewed."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from components.planning.clock import clock_script
from tests.support import tool

FAKE_SSH = """#!/bin/sh
# Stand-in for ssh: prints the "node's" clock, this machine's shifted by $SKEW seconds, after a delay.
sleep "${BEFORE:-0}"
python3 -c 'import os, time; print("%.6f" % (time.time() + float(os.environ.get("SKEW", "0"))))'
sleep "${AFTER:-0}"
"""


def run(tmp_path: Path, skew: float, before: float = 0.0, after: float = 0.0, bound: float = 1.0) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    script = clock_script(["ssh", "-o", "BatchMode=yes"], "root@198.18.9.1", "gpu-01", bound)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SKEW": str(skew), "BEFORE": str(before),
           "AFTER": str(after)}
    return subprocess.run([tool("bash"), "-c", script], capture_output=True, text=True, env=env, timeout=60)


def test_a_clock_in_step_passes_and_says_the_offset(tmp_path: Path) -> None:
    done = run(tmp_path, 0.0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("clock gpu-01: offset ") and done.stdout.rstrip().endswith("within 1 s")


@pytest.mark.parametrize(("skew", "word"), [(30.0, "ahead of"), (-30.0, "behind")])
def test_a_clock_surely_off_by_more_than_the_bound_fails_naming_chrony(tmp_path: Path, skew: float, word: str) -> None:
    done = run(tmp_path, skew)
    assert done.returncode == 1
    first, fix = done.stderr.splitlines()
    assert first.startswith("ERROR: gpu-01's clock is 29.") and f"s {word} this machine's (bound 1 s, " \
        "preflight.maxClockOffsetSeconds)" in first
    assert fix.startswith("    fix: install chrony on the node")


def test_a_slow_round_trip_never_raises_a_false_alarm(tmp_path: Path) -> None:
    # In step, but the node answered only after a 3 s handshake: its reading is near "after", no alarm.
    done = run(tmp_path, 0.0, before=3.0)
    assert done.returncode == 0, done.stderr
    assert "too slow to bound the offset to 1 s" in done.stdout
    # 1.5 s ahead, read early and returned late: the offset may be within the bound, so no failure either.
    done = run(tmp_path, 1.5, after=4.0)
    assert done.returncode == 0, done.stderr
    # The same skew read late is surely beyond the bound.
    assert run(tmp_path, 1.5, before=4.0).returncode == 1


def test_the_script_is_shellcheck_clean(tmp_path: Path) -> None:
    (tmp_path / "c.sh").write_text(clock_script(["ssh", "-p", "22"], "root@198.18.9.1", "gpu-01", 1.0))
    subprocess.run([tool("shellcheck"), "-s", "bash", str(tmp_path / "c.sh")], check=True)
