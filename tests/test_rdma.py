"""RDMA preflight: ib_write_bw's real output formats, the pair test run for real (bash, python3, the real
ib_write_bw binary where no HCA exists, a stand-in printing a real output elsewhere), and its wiring."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.node_programs.fabric import ib_argv, parse_ib_write_bw, parse_nccl_net
from components.planning.fabric.rdma import rdma_plan, rdma_script
from components.planning.load import load_stack_config
from components.spec import StackSpec
from components.spec.topology import all_instances
from plan.harness import ProgramRun
from tests.support import tool

OPS = Path(__file__).parent / "fixtures" / "ops"
AKS = OPS / "ib_write_bw.report_gbits.all-sizes.results-only.azure-aks-ib-hdr200.aks-rdma-infiniband.txt"
ROCM = OPS / "ib_write_bw.report_gbits.bidir-all-sizes.full-client-output.roce-gid3.rocm-docs.txt"
NS = "llm-cluster:"


def reasoning(spec: StackSpec) -> Any:
    return next(i for i in all_instances(spec) if i.uses_ray)


def test_results_table_only_hdr200_ib() -> None:
    r = parse_ib_write_bw(AKS.read_text())
    assert (r.device, r.link_type, r.gid_index, r.unit) == ("", "", None, "Gb/sec")
    assert r.rows[0] == (2, 5000, 0.045656, 0.045526) and len(r.rows) == 23
    assert r.average_gbps == max(r.rows)[3] and 190 < r.average_gbps < 200


def test_full_client_output_roce_gid_3() -> None:
    r = parse_ib_write_bw(ROCM.read_text())
    assert (r.device, r.link_type, r.gid_index) == ("<RDMA-NIC-2>", "Ethernet", 3)
    assert r.rows[-1] == (8388608, 5000, 204.59, 204.59) and r.average_gbps == 204.59


def test_output_without_a_table_is_refused() -> None:
    with pytest.raises(ValueError, match="no ib_write_bw results header"):
        parse_ib_write_bw(" Did not detect devices \n If device exists, check if driver is up\n")


def test_the_pair_uses_the_stacks_hca_port_and_gid(prod_spec: StackSpec) -> None:
    plan = rdma_plan(prod_spec, reasoning(prod_spec))
    assert ib_argv(plan, "192.168.10.12") == [
        "ib_write_bw",
        "-d",
        "mlx5_0",
        "-i",
        "1",
        "-p",
        "18515",
        "-s",
        "1048576",
        "-n",
        "2000",
        "-F",
        "--report_gbits",
        "-x",
        "3",
        "192.168.10.12",
    ]
    assert plan["floor_gbps"] == 190.0
    assert [n["name"] for n in plan["nodes"]] == ["gpu-01", "gpu-02"]  # type: ignore[index]


def fake_bin(tmp_path: Path, ib_output: Path | None) -> dict[str, str]:
    """ssh runs its command here (logged); ib_write_bw prints a real output (or the real binary runs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ssh.log"
    (bin_dir / "ssh").write_text(
        f'#!/bin/bash\nlogin=""\nwhile [ $# -gt 1 ]; do case "$1" in -o|-p) shift 2;; '
        f'*) login=$1; shift;; esac; done\necho "$login $1" >> {log}\nexec bash -c "$1"\n'
    )
    if ib_output is not None:
        (bin_dir / "ib_write_bw").write_text(
            f'#!/bin/sh\necho "$*" >> {tmp_path}/ib.log\n'
            f'for a; do last=$a; done\ncase "$last" in 1*) cat {ib_output};; esac\n'
        )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def run_script(spec: StackSpec, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script = rdma_script(spec, reasoning(spec)).replace('"port": 1,', '"port": 1, "server_start_s": 0.2,')
    return subprocess.run([tool("bash"), "-c", script], capture_output=True, text=True, env=env, timeout=120)


def test_a_pair_at_the_floor_passes_and_the_server_runs_on_the_peer(prod_spec: StackSpec, tmp_path: Path) -> None:
    tool("python3")
    done = run_script(prod_spec, fake_bin(tmp_path, AKS))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "rdma reasoning-gpu-01: gpu-01 -> gpu-02 196.6 Gb/s (floor 190)\n"
    # The server went to gpu-02 over ssh; the client ran here, on the head, against gpu-02's address.
    assert (tmp_path / "ssh.log").read_text().startswith("root@192.168.10.12 timeout 60 ib_write_bw -d mlx5_0")
    calls = (tmp_path / "ib.log").read_text().splitlines()
    assert sorted(c.endswith("192.168.10.12") for c in calls) == [False, True]


def test_a_slow_pair_fails_naming_the_pair_the_figure_and_what_to_check(config: dict[str, Any], tmp_path: Path) -> None:
    config[NS + "nodeDefaults"]["hca"]["minWriteBandwidthGbps"] = 200
    done = run_script(load_stack_config(config, set()), fake_bin(tmp_path, AKS))
    assert done.returncode == 1
    error, fix = done.stderr.splitlines()
    assert error == "ERROR: rdma reasoning-gpu-01: gpu-01 -> gpu-02: ib_write_bw average 196.6 Gb/s, below 200 Gb/s"
    assert fix.startswith("    fix: check ibstat mlx5_0 on both nodes (Active/LinkUp at 200 Gb/s)")
    assert "GID index 3 is RoCE v2" in fix and fix.endswith(
        "nodes.gpu-01.hca.minWriteBandwidthGbps (or nodeDefaults.hca)"
    )


def test_the_real_ib_write_bw_without_an_hca_is_reported_with_its_own_words(
    prod_spec: StackSpec, tmp_path: Path
) -> None:
    tool("ib_write_bw")
    done = run_script(prod_spec, fake_bin(tmp_path, None))
    assert done.returncode == 1
    assert "ERROR: rdma reasoning-gpu-01: gpu-01 -> gpu-02: ib_write_bw gave no result (" in done.stderr
    assert "Unable to find the Infiniband/RoCE device" in done.stderr


def test_the_script_is_shellcheck_clean(prod_spec: StackSpec, tmp_path: Path) -> None:
    (tmp_path / "r.sh").write_text(rdma_script(prod_spec, reasoning(prod_spec)))
    subprocess.run([tool("shellcheck"), "-s", "bash", str(tmp_path / "r.sh")], check=True)


def test_ray_starts_only_after_the_rdma_check_of_both_nodes(prod_run: ProgramRun) -> None:
    rdma = prod_run.get("reasoning-gpu-01-ray-rdma")
    deps = {u.rsplit("::", 1)[1] for u in rdma.dependencies}
    assert {"gpu-01-preflight", "gpu-02-preflight", "gpu-01-firewall", "gpu-02-firewall"} <= deps
    assert rdma.urn in prod_run.get("reasoning-gpu-01-ray-head").dependencies
    assert rdma.plain_inputs()["connection"]["host"] == "192.168.10.11"


def test_the_rdma_check_can_be_switched_off(config: dict[str, Any], stack_runner: Any) -> None:
    config[NS + "preflight"] = {"rdmaBandwidth": False}
    assert not [r for r in stack_runner(config).registrations if r.name.endswith("-rdma")]


# --- NCCL's transport in its INFO lines ------------------------------------------------------------


def nccl(name: str) -> str:
    return next(OPS.glob(f"nccl-debug-info.{name}*")).read_text()


def test_nccl_over_ib_on_v100() -> None:
    net = parse_nccl_net(nccl("net-ib.azure"))
    assert net.networks == {"pytorch-mnist-master-0:7": "IB"} and net.ib_devices == ["mlx5_0:1/IB"]
    assert not net.fell_back


def test_nccl_over_roce() -> None:
    net = parse_nccl_net(nccl("net-ib-roce"))
    assert set(net.networks.values()) == {"IB"} and net.ib_devices == ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"]


def test_nccl_socket_fallback_without_libibverbs() -> None:
    net = parse_nccl_net(nccl("net-socket-fallback"))
    assert net.networks == {"pytorch-mnist-master-0:40": "Socket"} and net.fell_back
    assert net.socket_interfaces == ["eth0:10.244.1.4<0>"]
    assert net.warnings == ["Failed to open libibverbs.so[.1]"]


def test_nccl_one_host_on_sockets_among_ib_hosts_is_a_fallback() -> None:
    net = parse_nccl_net(nccl("mixed"))
    assert sorted(set(net.networks.values())) == ["IB", "Socket"] and net.fell_back
    assert net.warnings == ["NET/IB : No device found."]
    assert json.dumps(net.networks).count("Socket") == 2
