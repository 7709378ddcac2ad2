"""The operator-side clock check, run for real (bash, awk) against a stand-in `ssh` whose node clock is skewed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from components.planning.nodes.clock import clock_script
from tests.support import tool

# Stand-ins for the operator's `date` and for ssh, on a clock of the test's own: the operator's readings
# before and after the round trip are T0 and T0 + before + after, the node answers T0 + before + skew.
# No real time passes, so the verdicts do not depend on how loaded the machine is.
T0 = 1_760_000_000.0
FAKE_DATE = """#!/bin/sh
# Stand-in for date +%s.%N: the next operator reading from $CLOCK_SEQ (one per line, consumed in order).
read -r now < "$CLOCK_SEQ"
sed -i 1d "$CLOCK_SEQ"
echo "$now"
"""
FAKE_SSH = """#!/bin/sh
# Stand-in for ssh: the node's reading of its own clock.
echo "$NODE_CLOCK"
"""


def run(
    tmp_path: Path, skew: float, before: float = 0.0, after: float = 0.0, bound: float = 1.0
) -> subprocess.CompletedProcess[str]:
    """The script with the node `skew` s ahead, answering `before` s into the round trip, `after` s before its end."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("ssh", FAKE_SSH), ("date", FAKE_DATE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    seq = tmp_path / "clock.seq"
    seq.write_text(f"{T0:.6f}\n{T0 + before + after + 0.01:.6f}\n")
    script = clock_script(["ssh", "-o", "BatchMode=yes"], "root@198.18.9.1", "gpu-01", bound)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CLOCK_SEQ": str(seq),
        "NODE_CLOCK": f"{T0 + before + skew:.6f}",
    }
    done = subprocess.run([tool("bash"), "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert seq.read_text() == "", "the script reads the operator's clock exactly twice"
    return done


def test_a_clock_in_step_passes_and_says_the_offset(tmp_path: Path) -> None:
    done = run(tmp_path, 0.0)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "clock gpu-01: offset -0.005 s (+/- 0.005 s), within 1 s\n"


@pytest.mark.parametrize(("skew", "word"), [(30.0, "ahead of"), (-30.0, "behind")])
def test_a_clock_surely_off_by_more_than_the_bound_fails_naming_chrony(tmp_path: Path, skew: float, word: str) -> None:
    done = run(tmp_path, skew)
    assert done.returncode == 1
    first, fix = done.stderr.splitlines()
    interval = "29.990 to 30.000" if skew > 0 else "30.000 to 30.010"
    assert (
        first == f"ERROR: gpu-01's clock is {interval} s {word} this machine's (bound 1 s, "
        "preflight.maxClockOffsetSeconds)"
    )
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
