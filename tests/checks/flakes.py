"""Run the suite again and again in random order, optionally with every core kept busy, and print each run.

    .venv/bin/python tests/checks/flakes.py --runs 3 --load 2 [pytest args, e.g. tests/test_ray_gate.py]

A flaky test is a bug: this is how the suite is checked for tests that depend on timing, on their
order or on what else the machine does. --load N starts N CPU hogs for the whole run (stress-ng when
installed, else Python busy loops), at normal priority: the tests compete with them for every core.
Each run gets its own pytest-randomly seed, printed, so a failing order can be replayed with
`pytest -p randomly -p "randomly" --randomly-seed=SEED`. Not part of `make test`: it takes runs × the suite.
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv" / "bin" / "python"
BUSY_LOOP = "while True: pass"


def start_load(cpus: int) -> list[subprocess.Popen[bytes]]:
    """CPU hogs on `cpus` cores, until stopped."""
    if cpus <= 0:
        return []
    stress = shutil.which("stress-ng")
    if stress:
        return [
            subprocess.Popen(
                [stress, "--cpu", str(cpus), "--cpu-method", "matrixprod", "--quiet"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        ]
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True) for _ in range(cpus)]


def stop_load(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)


def summary_of(output: str) -> str:
    """pytest's closing line ("3 failed, 530 passed in 301.2s")."""
    lines = [line.strip("= ") for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    return lines[-1] if lines else "no summary (crashed?)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--load", type=int, default=0, help="CPU hogs to run alongside (2 = both cores of CI)")
    p.add_argument("--seed", type=int, action="append", help="replay these seeds instead of random ones")
    p.add_argument("--log-dir", type=Path, default=ROOT / "build" / "flakes")
    args, pytest_args = p.parse_known_args()
    # A kill of this script must not leave the hogs running: SIGTERM unwinds through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.log_dir.mkdir(parents=True, exist_ok=True)
    seeds = args.seed or [random.randrange(1, 2**31) for _ in range(args.runs)]
    failed_runs = 0
    for n, seed in enumerate(seeds, 1):
        load = start_load(args.load)
        start = time.monotonic()
        try:
            out = subprocess.run(
                [
                    str(PYTHON),
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "randomly",
                    f"--randomly-seed={seed}",
                    *(pytest_args or ["tests"]),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
        finally:
            stop_load(load)
        log = args.log_dir / f"run-{seed}.log"
        log.write_text(out.stdout + out.stderr)
        failures = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out.stdout, re.M)))
        failed_runs += bool(out.returncode)
        print(
            f"run {n}/{len(seeds)} seed={seed} load={args.load} rc={out.returncode} "
            f"{time.monotonic() - start:.0f}s: {summary_of(out.stdout)}",
            flush=True,
        )
        for f in failures:
            print(f"    {f}", flush=True)
        # tests/conftest.py says so when the tree changed under the run: its failures are not evidence.
        for line in re.findall(r"^WARNING: the working tree changed.*$", out.stdout, re.M):
            print(f"    {line}", flush=True)
    print(f"{len(seeds) - failed_runs}/{len(seeds)} runs passed (log: {args.log_dir})")
    return 1 if failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
