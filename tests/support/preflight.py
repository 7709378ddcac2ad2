"""The preflight tests' real outputs (tests/fixtures/preflight and tests/fixtures/ops, sources in their
SOURCES.md), by file name, and the shipped preflight script run on this machine with fake tools that print them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from components.node_programs.preflight import Expectation
from components.planning.nodes.scripts import preflight_script

FIX = Path(__file__).parent.parent / "fixtures" / "preflight"
OPS = Path(__file__).parent.parent / "fixtures" / "ops"
CHRONY_SYNC = (OPS / "chronyc-tracking.synchronised.chrony4.3-recorded-here.txt").read_text()
CHRONY_UNSYNC = (OPS / "chronyc-tracking.not-synchronised.chrony4.3-recorded-here.txt").read_text()
TIMEDATECTL_NEW = (OPS / "timedatectl-status.synchronized-yes.systemd-new-format.myblackhole.txt").read_text()
TIMEDATECTL_OLD = (OPS / "timedatectl.ntp-synchronized-yes.systemd-old-format.mydailyblog.txt").read_text()


def fixture(name: str) -> str:
    return (FIX / name).read_text()


TOPO_DGX1 = "nvidia-smi-topo-m.dgx1-v100-4nic.ucx-py-docs.txt"
TOPO_1NIC = "nvidia-smi-topo-m.8x-v100-sxm2-16gb-dgx1-like-1nic.oneflow-dlperf.txt"
TOPO_H100 = "nvidia-smi-topo-m.8x-h100-nv18-no-nics.ml-engineering.txt"
TOPO_PCIE = "nvidia-smi-topo-m.8x-pcie-gpus-pix-phb-sys.model-not-stated.matrix-only.nccl-issue-1439.txt"
SMI_TABLE = "nvidia-smi.8x-tesla-v100-sxm2-32gb.azure-nd40rs-v2.drv535.usernetes-azure.txt"
IB_ROCE = "ibstat.cx7-mt4129-rate200-ethernet-roce-active.first-2-CA-blocks.mooncake-issue-1999.txt"
IB_9CA = "ibstat.a100-9x-mt4126vf-8ib-hdr200-1eth200-active.gpud-testdata.txt"
IB_PANIC = "ibstat.a100-azure-8x-cx6vf-mt4124-ib-hdr200-active-with-ibpanic-stderr.gpud-testdata.txt"
IB_DOWN_DISABLED = (
    "ibstat.cx6-mt4123-hdr200-ib-active-plus-down-disabled.first-2-of-3-CA-blocks.nccl-tests-issue-128.txt"
)
IB_NO_SM = "ibstat-mlx5_7.cx6-vf-mt4124-rate200-ib-state-down-phys-linkup.network-operator-issue-249.txt"
IB_POLLING = "ibstat.cx7-mt4129-state-down-phys-polling.guids-redacted-by-source.gpud-pr-482.txt"
IB_H100 = "ibstat.h100-cx6dx-mt4125-eth-down-disabled-plus-cx7-ib400-active.gpud-testdata.txt"
IBV_ONE = "ibv_devices.single-vf-mlx5_10-in-k8s-pod.cascade-docker.txt"
IBV_FOUR = "ibv_devices.vfs-with-zero-node-guid.whitespace-collapsed-as-posted.sriov-network-device-plugin-issue-20.txt"
DOCKER_OK = "docker-info-grep-Runtimes.nvidia-runtime-present.nvidia-container-toolkit-issue-196.txt"
DOCKER_DEFAULT = "docker-info-grep-runtime-root.nvidia-default-runtime.jetson.isaac_ros_common-docs.txt"
DOCKER_MISSING = "docker-info-grep-runtime.nvidia-runtime-missing.nvidia-container-toolkit-issue-653.txt"


def query_csv_from_table(table: str, count: int | None = None) -> str:
    """The `--query-gpu=name,compute_cap,driver_version,memory.total` rows the real table's GPUs give."""
    driver = re.search(r"Driver Version: (\S+)", table).group(1)  # type: ignore[union-attr]
    names = re.findall(r"^\|\s+\d+\s+(.+?)\s{2,}(?:On|Off)\s+\|", table, re.M)
    mems = re.findall(r"/\s+(\d+)MiB \|", table)
    rows = [f"{n}, 7.0, {driver}, {m} MiB" for n, m in zip(names, mems)]
    return "\n".join(rows[:count]) + "\n"


def fake_tools(bin_dir: Path, *, gpus: str, topo: str, ibstat: str, docker: str) -> None:
    files = {
        "gpus": gpus,
        "topo": topo,
        "ibstat": ibstat,
        "ibv": fixture(IBV_FOUR),
        "docker": docker,
        "chrony": CHRONY_SYNC,
    }
    for key, text in files.items():
        (bin_dir / f"{key}.out").write_text(text)
    tools = {
        "nvidia-smi": 'if [ "$1" = topo ]; then cat "$D/topo.out"; else cat "$D/gpus.out"; fi',
        "ibstat": 'cat "$D/ibstat.out"',
        "ibv_devices": 'cat "$D/ibv.out"',
        "docker": 'cat "$D/docker.out"',
        "chronyc": 'cat "$D/chrony.out"',
        "nft": "echo 'nftables v1.0.6 (Lester Gooch #5)'",
    }
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nD="{bin_dir}"\n{body}\n')
        path.chmod(0o755)


def run_preflight(tmp_path: Path, exp: Expectation, **outputs: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("python3") is None:
        pytest.fail("python3 is needed on PATH to run the preflight script (apt-get install python3)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_tools(bin_dir, **outputs)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.run(["bash", "-c", preflight_script(exp)], capture_output=True, text=True, env=env)


def meminfo(tmp_path: Path, kib: int) -> str:
    """A /proc/meminfo whose MemTotal is `kib` (proc(5): the kernel's usable RAM in kB)."""
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {kib} kB\nMemFree:        {kib // 2} kB\n")
    return str(path)


def cpuinfo(tmp_path: Path, cpus: int) -> str:
    """A /proc/cpuinfo listing `cpus` logical CPUs (proc(5): one `processor` entry each)."""
    path = tmp_path / "cpuinfo"
    path.write_text(
        "".join(
            f"processor\t: {n}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz\n\n"
            for n in range(cpus)
        )
    )
    return str(path)
