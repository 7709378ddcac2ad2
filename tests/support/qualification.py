"""Real releases and runs for the qualification tests: PyPI wheels (fetched with pip once, cached under
/var/cache/llm-cluster), the gate script run with a stand-in `docker`, and `docker run --network none`
as a network namespace of its own."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from tests.support import cache_lock, tool

CACHE = Path("/var/cache/llm-cluster")
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


# The Linux x86-64 wheels a release may ship (vLLM 0.19.1's is manylinux_2_31, Triton's 2_27/2_28): each is
# only unpacked and read here, or run on this machine's newer glibc (Triton's ptxas).
PLATFORMS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def _pip_download(requirement: str, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            requirement,
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            PY,
            *(arg for p in PLATFORMS for arg in ("--platform", p)),
            "-d",
            str(dest),
            "-q",
        ],
        check=True,
        timeout=1800,
    )
    name = requirement.replace("==", "-")
    return next(dest.glob(f"{name}-*.whl"))


def unpacked_wheel(requirement: str, root: Path, keep: Callable[[str], bool] = lambda name: True) -> Path:
    """The PyPI wheel of `requirement` (`name==version`, cached beside `root`) unpacked into `root`, the files
    `keep` names, each with the mode the wheel gives it (zipfile does not: Triton's ptxas must stay executable).
    The cache is whole once `root/.unpacked` exists (written last); anything else is unpacked again."""
    marker = root / ".unpacked"
    dest = root.parent
    with cache_lock(dest):
        if marker.is_file():
            return root
        wheel = next(dest.glob(f"{requirement.replace('==', '-')}-*.whl"), None) or _pip_download(requirement, dest)
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                if not info.is_dir() and keep(info.filename):
                    mode = info.external_attr >> 16 & 0o777
                    Path(z.extract(info, root)).chmod(mode or 0o644)
        marker.write_text(f"{wheel.name}\n")
    return root


def python_files(name: str) -> bool:
    """A wheel's Python and its metadata: what reading a package's own code needs."""
    return name.endswith(".py") or ".dist-info/" in name


def triton_dir(version: str) -> Path:
    """A real Triton release unpacked (cached)."""
    return unpacked_wheel(f"triton=={version}", CACHE / "triton" / version)


def torch_wheel(version: str) -> Path:
    """The real torch wheel from PyPI (cached)."""
    with cache_lock(CACHE / "torch"):
        return next((CACHE / "torch").glob(f"torch-{version}-*.whl"), None) or _pip_download(
            f"torch=={version}", CACHE / "torch"
        )


def lint_and_run_gate(script: str, tmp_path: Path, docker: str) -> subprocess.CompletedProcess[str]:
    """The gate script, shellcheck-clean, run with a stand-in `docker` (bash body `docker`; $ARGV_OUT is a
    file it may write to)."""
    path = tmp_path / "qualify.sh"
    path.write_text(script)
    lint = subprocess.run([tool("shellcheck"), "-s", "bash", str(path)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(f"#!/bin/bash\n{docker}\n")
    (fake / "docker").chmod(0o755)
    return subprocess.run(
        ["bash", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{fake}:/usr/bin:/bin", "ARGV_OUT": str(tmp_path / "argv")},
    )


# `docker run --network none`: a network namespace of its own with only its loopback, which docker brings up.
NETWORK_NONE = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "network-none"]
