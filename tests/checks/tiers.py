"""`make test`'s run of the tiers: the lab tier beside the others.

The lab tier (tests/lab) is one pytest process — one lab per machine — and most of its time is spent waiting
on hosts, Docker, Ray and engines to start, fail and return. The other tiers run meanwhile, a worker per CPU
with each test module kept on one worker (its module-scoped servers and stacks set up once). The lab tier
writes to build/test-lab.log, shown here once the other tiers are done and followed to its end; each tier's
JUnit report goes to build/. The exit status is the first failing tier's, else 0.

    .venv/bin/python tests/checks/tiers.py [pytest options for both tiers]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build"
LAB_LOG = BUILD / "test-lab.log"


def lab_argv(extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", f"--junitxml={BUILD / 'test-lab.xml'}", *extra, "tests/lab"]


def other_argv(extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-n",
        "auto",
        "--dist",
        "loadfile",
        "-m",
        "not lab",
        f"--junitxml={BUILD / 'test-other.xml'}",
        *extra,
        "tests",
    ]


def follow(log: Path, process: subprocess.Popen[bytes]) -> None:
    """Copy `log` to stdout from its start until `process` has ended and everything it wrote is shown."""
    with open(log, "rb") as f:
        while True:
            chunk = f.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            elif process.poll() is not None:
                rest = f.read()
                sys.stdout.buffer.write(rest)
                sys.stdout.flush()
                return
            else:
                time.sleep(1)


def main(extra: list[str]) -> int:
    BUILD.mkdir(exist_ok=True)
    with open(LAB_LOG, "wb") as log:
        lab = subprocess.Popen(lab_argv(extra), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    other = subprocess.run(other_argv(extra), cwd=ROOT).returncode
    print(f"\n== the lab tier (tests/lab, {LAB_LOG.relative_to(ROOT)}), run beside the others", flush=True)
    follow(LAB_LOG, lab)
    lab_rc = lab.wait()
    print(f"\nmake test: the lab tier exited {lab_rc}, the other tiers {other}")
    return lab_rc or other


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
