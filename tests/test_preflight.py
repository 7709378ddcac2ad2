"""Preflight parsers on real outputs (tests/fixtures/preflight), the node check, and the shipped script run end to end."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from components.node_programs.preflight import (
    CHRONY_FIX,
    GIB,
    ClockState,
    Expectation,
    Finding,
    Outputs,
    check_cpus,
    check_memory,
    check_node,
    collect,
    parse_chrony_tracking,
    parse_cpu_count,
    parse_df_available,
    parse_docker_runtimes,
    parse_gpu_query,
    parse_ibstat,
    parse_ibv_devices,
    parse_timedatectl,
    parse_topo,
    version_tuple,
)
from components.planning.nodes.scripts import node_expectation
from tests.support.preflight import (
    CHRONY_SYNC,
    CHRONY_UNSYNC,
    DOCKER_DEFAULT,
    DOCKER_MISSING,
    DOCKER_OK,
    IB_9CA,
    IB_DOWN_DISABLED,
    IB_H100,
    IB_NO_SM,
    IB_PANIC,
    IB_POLLING,
    IB_ROCE,
    IBV_FOUR,
    IBV_ONE,
    SMI_TABLE,
    TIMEDATECTL_NEW,
    TIMEDATECTL_OLD,
    TOPO_1NIC,
    TOPO_DGX1,
    TOPO_H100,
    TOPO_PCIE,
    cpuinfo,
    fixture,
    meminfo,
    query_csv_from_table,
    run_preflight,
)

# --- parsers ------------------------------------------------------------------------------------


def test_gpu_query_rows_from_the_v100_table() -> None:
    gpus = parse_gpu_query(query_csv_from_table(fixture(SMI_TABLE)))
    assert len(gpus) == 8
    assert {(g.name, g.compute_cap, g.driver_version, g.memory_mib) for g in gpus} == {
        ("Tesla V100-SXM2-32GB", "7.0", "535.183.01", 32768)
    }


def test_gpu_query_without_compute_cap_from_an_old_driver() -> None:
    assert parse_gpu_query("Tesla V100-SXM2-32GB, 470.57.02, 32510 MiB\n")[0].compute_cap is None
    with pytest.raises(ValueError, match="unexpected nvidia-smi"):
        parse_gpu_query("garbage\n")


def test_topo_dgx1_hybrid_cube_mesh_links_and_nic_affinity() -> None:
    topo = parse_topo(fixture(TOPO_DGX1))
    assert topo.gpus == tuple(f"GPU{i}" for i in range(8))
    assert topo.links[("GPU0", "GPU1")] == "NV1" and topo.links[("GPU0", "GPU3")] == "NV2"
    assert topo.links[("GPU0", "GPU5")] == "SYS"
    assert topo.nvlink_peers("GPU0") == ["GPU1", "GPU2", "GPU3", "GPU4"]
    assert topo.has_nvlink
    assert set(topo.nics) == {"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
    assert [g for g, k in topo.nics["mlx5_0"].items() if k == "PIX"] == ["GPU0", "GPU1"]


def test_topo_with_node_column_and_legend() -> None:
    topo = parse_topo(fixture(TOPO_1NIC))
    assert topo.nics == {
        "mlx5_0": {
            "GPU0": "NODE",
            "GPU1": "NODE",
            "GPU2": "PIX",
            "GPU3": "PIX",
            "GPU4": "SYS",
            "GPU5": "SYS",
            "GPU6": "SYS",
            "GPU7": "SYS",
        }
    }
    assert len(topo.links) == 56


def test_topo_nvswitch_and_numa_columns() -> None:
    topo = parse_topo(fixture(TOPO_H100))
    assert set(topo.links.values()) == {"NV18"} and topo.nics == {}


def test_topo_pcie_only_has_no_nvlink() -> None:
    topo = parse_topo(fixture(TOPO_PCIE))
    assert not topo.has_nvlink
    assert set(topo.links.values()) == {"PIX", "PHB", "SYS"}
    assert topo.nvlink_peers("GPU0") == []


def test_ibstat_roce_ports() -> None:
    cas = parse_ibstat(fixture(IB_ROCE))
    assert set(cas) == {"mlx5_0", "mlx5_1"}
    p = cas["mlx5_0"][1]
    assert (p.state, p.physical_state, p.rate_gbps, p.link_layer) == ("Active", "LinkUp", 200, "Ethernet")


def test_ibstat_tab_indented_nine_cas_mixed_link_layers() -> None:
    cas = parse_ibstat(fixture(IB_9CA))
    assert len(cas) == 9
    assert cas["mlx5_0"][1].link_layer == "Ethernet" and cas["mlx5_1"][1].link_layer == "InfiniBand"
    assert all(ports[1].state == "Active" and ports[1].rate_gbps == 200 for ports in cas.values())


def test_ibstat_keeps_the_cas_printed_before_an_ibpanic() -> None:
    cas = parse_ibstat(fixture(IB_PANIC))
    assert len(cas) == 8 and "mlx5_8" not in cas


def test_ibstat_down_states() -> None:
    assert parse_ibstat(fixture(IB_DOWN_DISABLED))["mlx5_1"][1].physical_state == "Disabled"
    no_sm = parse_ibstat(fixture(IB_NO_SM))["mlx5_7"][1]
    assert (no_sm.state, no_sm.physical_state) == ("Down", "LinkUp")
    polling = parse_ibstat(fixture(IB_POLLING))["mlx5_10"][1]
    assert (polling.state, polling.physical_state, polling.rate_gbps) == ("Down", "Polling", 10)
    h100 = parse_ibstat(fixture(IB_H100))
    assert [ca for ca, ports in h100.items() if ports[1].state != "Active"] == ["mlx5_2", "mlx5_7", "mlx5_8"]


def test_ibv_devices() -> None:
    assert parse_ibv_devices(fixture(IBV_ONE)) == {"mlx5_10": "e2b239fffe173d23"}
    assert list(parse_ibv_devices(fixture(IBV_FOUR))) == ["mlx5_2", "mlx5_0", "mlx5_3", "mlx5_1"]


def test_docker_runtimes() -> None:
    assert parse_docker_runtimes(fixture(DOCKER_OK)) == (["io.containerd.runc.v2", "runc", "nvidia"], None)
    assert parse_docker_runtimes(fixture(DOCKER_DEFAULT))[1] == "nvidia"
    assert parse_docker_runtimes(fixture(DOCKER_MISSING)) == (["io.containerd.runc.v2", "runc"], "runc")


def test_df_of_this_machine() -> None:
    out = subprocess.run(["df", "-Pk", "/"], capture_output=True, text=True, check=True).stdout
    assert parse_df_available(out) == int(out.splitlines()[-1].split()[3]) * 1024


def test_chrony_tracking_synchronised_and_not() -> None:
    assert parse_chrony_tracking(CHRONY_SYNC) == ClockState("chrony", True, 0.000002413, "C6120901 (198.18.9.1)")
    assert parse_chrony_tracking(CHRONY_UNSYNC) == ClockState("chrony", False, 0.0, "00000000 ()")
    with pytest.raises(ValueError, match="no Leap status"):
        parse_chrony_tracking("506 Cannot talk to daemon\n")


def test_timedatectl_in_both_systemd_formats() -> None:
    assert parse_timedatectl(TIMEDATECTL_NEW) == ClockState("timedatectl", True)
    assert parse_timedatectl(TIMEDATECTL_OLD) == ClockState("timedatectl", True)
    # No attributable unsynchronised sample was found (fixtures/ops/SOURCES.md): the one word changed.
    unsynced = TIMEDATECTL_NEW.replace("System clock synchronized: yes", "System clock synchronized: no")
    assert parse_timedatectl(unsynced) == ClockState("timedatectl", False)


def test_driver_versions_compare_numerically() -> None:
    assert version_tuple("535.183.01") < version_tuple("560.28.03") < version_tuple("560.100")


# --- the check ----------------------------------------------------------------------------------


@pytest.fixture
def expected(prod_spec) -> Expectation:  # type: ignore[no-untyped-def]
    """gpu-02 of the reference stack, with the driver minimum the Azure fixture meets."""
    return dataclasses.replace(node_expectation(prod_spec, "gpu-02"), driver_min="535.0")


def healthy() -> Outputs:
    return Outputs(
        gpus=query_csv_from_table(fixture(SMI_TABLE)),
        topo=fixture(TOPO_DGX1),
        ibstat=fixture(IB_ROCE),
        ibv_devices=fixture(IBV_FOUR),
        docker_info=fixture(DOCKER_OK),
        chrony=CHRONY_SYNC,
        nft="nftables v1.0.6 (Lester Gooch #5)\n",
        df="Filesystem 1024-blocks Used Available Capacity Mounted on\n"
        f"/dev/nvme0n1 7000000000 1000 {500 * 1024 * 1024} 1% /data\n",
    )


def errors(findings: list[Finding]) -> list[str]:
    return [f.what for f in findings if f.level == "error"]


def test_a_healthy_reference_node_passes(expected: Expectation) -> None:
    assert check_node(expected, healthy()) == []


def test_the_reference_driver_minimum_refuses_the_azure_535_driver(prod_spec) -> None:  # type: ignore[no-untyped-def]
    found = check_node(node_expectation(prod_spec, "gpu-02"), healthy())
    assert found == [
        Finding(
            "error",
            "gpu-02 runs NVIDIA driver 535.183.01, the stack needs >= 560.28.03",
            "upgrade the driver to 560.28.03 or newer (same version on all nodes)",
        )
    ]


def test_a_missing_gpu_names_the_count_to_fix(expected: Expectation) -> None:
    out = dataclasses.replace(healthy(), gpus=query_csv_from_table(fixture(SMI_TABLE), 7))
    [f] = check_node(expected, out)
    assert f.what == "gpu-02 has 7 GPU(s), the stack expects 8"
    assert "nodes.gpu-02.gpu (or nodeDefaults.gpu).count to 7" in f.fix


def test_another_gpu_model_names_the_model_to_set(expected: Expectation) -> None:
    exp = dataclasses.replace(expected, gpu_model="Tesla V100-SXM2-16GB")
    [f] = check_node(exp, healthy())
    assert f.what == "gpu-02 has Tesla V100-SXM2-32GB, the stack expects Tesla V100-SXM2-16GB"
    assert f.fix == "set nodes.gpu-02.gpu (or nodeDefaults.gpu).model to 'Tesla V100-SXM2-32GB'"


def test_sxm_gpus_without_nvlink_are_an_error(expected: Expectation) -> None:
    [f] = check_node(expected, dataclasses.replace(healthy(), topo=fixture(TOPO_PCIE)))
    assert f.level == "error" and "shows no NVLink between any GPUs" in f.what


def test_pcie_gpus_with_tp8_are_only_a_warning(expected: Expectation) -> None:
    exp = dataclasses.replace(expected, nvlink=False)
    [f] = check_node(exp, dataclasses.replace(healthy(), topo=fixture(TOPO_PCIE)))
    assert f.level == "warning" and "tensorParallel 8" in f.what
    assert (
        check_node(
            dataclasses.replace(exp, max_tensor_parallel=4), dataclasses.replace(healthy(), topo=fixture(TOPO_PCIE))
        )
        == []
    )


def test_hca_without_subnet_manager_says_to_start_opensm(expected: Expectation) -> None:
    exp = dataclasses.replace(
        expected, hca={"device": "mlx5_7", "port": 1, "link_layer": "infiniband", "rate_gbps": 200}
    )
    found = check_node(exp, dataclasses.replace(healthy(), ibstat=fixture(IB_NO_SM), ibv_devices=None))
    assert found == [
        Finding(
            "error",
            "gpu-02: mlx5_7 port 1 is Down/LinkUp, not Active/LinkUp",
            "the link is up but no subnet manager assigned it: start opensm or check the switch's SM",
        )
    ]


def test_hca_down_disabled_and_slow(expected: Expectation) -> None:
    exp = dataclasses.replace(
        expected, hca={"device": "mlx5_1", "port": 1, "link_layer": "infiniband", "rate_gbps": 200}
    )
    found = check_node(exp, dataclasses.replace(healthy(), ibstat=fixture(IB_DOWN_DISABLED), ibv_devices=None))
    assert errors(found) == [
        "gpu-02: mlx5_1 port 1 is Down/Disabled, not Active/LinkUp",
        "gpu-02: mlx5_1 port 1 runs at 10 Gb/s, the stack expects 200",
    ]


def test_hca_link_layer_and_missing_device(expected: Expectation) -> None:
    found = check_node(expected, dataclasses.replace(healthy(), ibstat=fixture(IB_DOWN_DISABLED)))
    assert errors(found) == ["gpu-02: mlx5_0 port 1 link layer is InfiniBand, the stack says ethernet"]
    assert found[0].fix == "set nodes.gpu-02.hca (or nodeDefaults.hca).linkLayer to 'infiniband'"
    found = check_node(
        expected, dataclasses.replace(healthy(), ibstat=fixture(IB_POLLING), ibv_devices=fixture(IBV_ONE))
    )
    assert errors(found) == ["gpu-02: ibv_devices does not list mlx5_0", "gpu-02: no HCA mlx5_0; ibstat shows mlx5_10"]


def test_nvidia_runtime_missing_unless_the_gpus_hook_is_installed(expected: Expectation) -> None:
    out = dataclasses.replace(healthy(), docker_info=fixture(DOCKER_MISSING))
    [f] = check_node(expected, out)
    assert "nvidia-container-toolkit" in f.fix and "io.containerd.runc.v2 runc" in f.what
    assert check_node(expected, dataclasses.replace(out, container_cli=True)) == []


def test_disk_needs_the_weights_still_to_copy(expected: Expectation) -> None:
    # 500 GiB free: enough for the ~327 GiB DeepSeek-R1 GPTQ estimate + 100 GiB kept free, not for 600 GiB.
    big = dataclasses.replace(expected, models=[{"path": "/data/models/x", "size_bytes": 600 * GIB}])
    [f] = check_node(big, healthy())
    assert f.what == (
        "gpu-02: 500 GiB free at /data, need 700 GiB (weights still to copy: 600 GiB, minFreeDiskGib: 100)"
    )
    # Weights already half there (an interrupted copy) need only the rest.
    assert check_node(big, dataclasses.replace(healthy(), present_bytes={"/data/models/x": 300 * GIB})) == []


def test_disk_keeps_min_free_after_the_copy(expected: Expectation) -> None:
    # 450 GiB to copy into 500 GiB free would leave 50 GiB: below minFreeDiskGib 100.
    tight = dataclasses.replace(expected, models=[{"path": "/data/models/x", "size_bytes": 450 * GIB}])
    [f] = check_node(tight, healthy())
    assert f.what == (
        "gpu-02: 500 GiB free at /data, need 550 GiB (weights still to copy: 450 GiB, minFreeDiskGib: 100)"
    )
    assert check_node(dataclasses.replace(tight, min_free_gib=50), healthy()) == []


@pytest.mark.parametrize(
    ("outputs", "what"),
    [
        (
            dict(chrony=CHRONY_UNSYNC),
            "gpu-02: the clock is not synchronised (chronyc tracking: Leap status Not synchronised)",
        ),
        (
            dict(chrony=None, timedatectl=TIMEDATECTL_NEW.replace(": yes", ": no")),
            "gpu-02: the clock is not synchronised (timedatectl: System clock synchronized: no)",
        ),
        (
            dict(
                chrony=None,
                errors={
                    "chrony": "[Errno 2] No such file or directory: 'chronyc'",
                    "timedatectl": "System has not been booted with systemd",
                },
            ),
            "gpu-02: no time synchronisation found (chronyc and timedatectl: [Errno 2] No such file or directory: "
            "'chronyc')",
        ),
    ],
)
def test_an_unsynchronised_clock_is_refused_naming_chrony(expected: Expectation, outputs: dict, what: str) -> None:
    assert check_node(expected, dataclasses.replace(healthy(), **outputs)) == [Finding("error", what, CHRONY_FIX)]
    assert "install chrony" in CHRONY_FIX


def test_a_clock_chrony_knows_to_be_off_by_more_than_the_bound_is_refused(expected: Expectation) -> None:
    tight = dataclasses.replace(expected, max_clock_offset_s=0.000001)
    assert errors(check_node(tight, healthy())) == [
        "gpu-02: chrony says the clock is 0.000 s fast of NTP time (bound: preflight.maxClockOffsetSeconds 1e-06)"
    ]
    assert check_node(dataclasses.replace(expected, max_clock_offset_s=0.5), healthy()) == []


def test_nft_is_required_only_when_the_firewall_is_managed(expected: Expectation) -> None:
    out = dataclasses.replace(healthy(), nft=None, errors={"nft": "[Errno 2] No such file or directory: 'nft'"})
    assert errors(check_node(expected, out)) == [
        "gpu-02: `nft` is missing ([Errno 2] No such file or directory: 'nft'); llm-cluster loads the host firewall "
        "with it"
    ]
    assert check_node(dataclasses.replace(expected, firewall=False), out) == []


def test_a_missing_tool_is_an_error_saying_what_to_install(expected: Expectation) -> None:
    out = dataclasses.replace(healthy(), ibstat=None, errors={"ibstat": "[Errno 2] No such file or directory"})
    [f] = check_node(expected, out)
    assert f.what == "`ibstat` gave nothing ([Errno 2] No such file or directory)"
    assert f.fix.startswith("install infiniband-diags")


def test_collect_falls_back_for_old_drivers_and_keeps_what_a_failing_tool_printed(expected: Expectation) -> None:
    old_row = "Tesla V100-SXM2-32GB, 470.57.02, 32510 MiB\n"
    path = str(expected.models[0]["path"])

    def run(argv: list[str]) -> tuple[int, str, str]:
        if argv[0] == "nvidia-smi" and argv[1] != "topo":
            if "compute_cap" in argv[1]:
                return 6, "", 'Field "compute_cap" is not a valid field to query.\n'
            return 0, old_row, ""
        return {
            "nvidia-smi": (0, fixture(TOPO_DGX1), ""),
            "ibstat": (255, fixture(IB_PANIC), "ibpanic: [1234] main: stat of IB device 'mlx5_8' failed\n"),
            "ibv_devices": (127, "", "[Errno 2] No such file or directory: 'ibv_devices'"),
            "docker": (0, fixture(DOCKER_OK), ""),
            "nvidia-container-cli": (127, "", "not found"),
            "df": (0, healthy().df or "", ""),
            "du": (0, f"123456\t{path}\n", ""),
            "chronyc": (1, "", "506 Cannot talk to daemon\n"),
            "timedatectl": (0, TIMEDATECTL_NEW, ""),
            "nft": (127, "", "[Errno 2] No such file or directory: 'nft'"),
        }[argv[0]]

    out = collect(expected, run)
    assert out.gpus == old_row and parse_gpu_query(out.gpus)[0].compute_cap is None
    assert out.ibstat == fixture(IB_PANIC)  # ibpanic on one CA: the others still count
    assert out.ibv_devices is None
    assert out.errors["ibv_devices"] == "[Errno 2] No such file or directory: 'ibv_devices'"
    assert (out.topo, out.docker_info, out.container_cli) == (fixture(TOPO_DGX1), fixture(DOCKER_OK), False)
    assert out.present_bytes == {path: 123456}
    # chrony's daemon is not running: systemd-timesyncd's view (timedatectl) is asked instead.
    assert (out.chrony, out.timedatectl) == (None, TIMEDATECTL_NEW)
    assert out.errors["chrony"] == "506 Cannot talk to daemon" and out.nft is None


# --- the script, on this machine with fake tools that print the real outputs ---------------------


def test_a_node_with_fewer_cpus_than_the_stack_says_is_a_warning_naming_the_key(
    tmp_path: Path, prod_spec, expected: Expectation
) -> None:  # type: ignore[no-untyped-def]
    planned = node_expectation(prod_spec, "gpu-02")
    assert (planned.cpu_cores, planned.cpu_key) == (
        80,
        "nodes.gpu-02.cpuCores, unset: the reference cluster's GPU servers' 80",
    )
    exp = dataclasses.replace(
        expected,
        disk_path=str(tmp_path),
        min_free_gib=0,
        models=[],
        meminfo_path=meminfo(tmp_path, 376 * 1024 * 1024),
        cpuinfo_path=cpuinfo(tmp_path, 40),
    )
    done = run_preflight(
        tmp_path,
        exp,
        gpus=query_csv_from_table(fixture(SMI_TABLE)),
        topo=fixture(TOPO_DGX1),
        ibstat=fixture(IB_ROCE),
        docker=fixture(DOCKER_OK),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "preflight gpu-02: 0 error(s), 1 warning(s)"
    assert (
        f"WARNING: gpu-02 has 40 CPUs ({tmp_path}/cpuinfo), the stack says 80 ({planned.cpu_key}): the "
        "threads of its servers were planned for the larger figure and would compete for the cores\n"
        "    fix: state the node's CPUs: nodes.gpu-02.cpuCores: 40\n"
    ) in done.stdout
    # More CPUs than stated is fine; this machine's own /proc/cpuinfo parses.
    more = dataclasses.replace(exp, cpuinfo_path=cpuinfo(tmp_path, 96))
    assert check_cpus(more, Outputs(cpuinfo=Path(more.cpuinfo_path).read_text())) == []
    assert parse_cpu_count(Path("/proc/cpuinfo").read_text()) == os.cpu_count()


def test_preflight_script_passes_on_a_healthy_node(tmp_path: Path, expected: Expectation) -> None:
    # 376 GiB managed by the kernel on a server the stack says has 380.
    exp = dataclasses.replace(
        expected,
        disk_path=str(tmp_path),
        min_free_gib=0,
        models=[{"path": str(tmp_path / "none"), "size_bytes": 1}],
        meminfo_path=meminfo(tmp_path, 376 * 1024 * 1024),
        cpuinfo_path=cpuinfo(tmp_path, 80),
    )
    done = run_preflight(
        tmp_path,
        exp,
        gpus=query_csv_from_table(fixture(SMI_TABLE)),
        topo=fixture(TOPO_DGX1),
        ibstat=fixture(IB_ROCE),
        docker=fixture(DOCKER_OK),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "preflight gpu-02: 0 error(s), 0 warning(s)"


def test_a_node_with_less_ram_than_the_stack_says_is_a_warning_naming_the_key(
    tmp_path: Path, prod_spec, expected: Expectation
) -> None:  # type: ignore[no-untyped-def]
    # The prod stack states no RAM: the reference server's figure, and the key to set, travel to the node.
    planned = node_expectation(prod_spec, "gpu-02")
    assert (planned.memory_gib, planned.memory_key) == prod_spec.node_memory("gpu-02")
    assert planned.memory_gib == 380.0 and planned.memory_key.startswith("nodes.gpu-02.memoryGib, unset: ")
    exp = dataclasses.replace(
        expected,
        disk_path=str(tmp_path),
        min_free_gib=0,
        models=[],
        memory_gib=planned.memory_gib,
        memory_key=planned.memory_key,
        meminfo_path=meminfo(tmp_path, 24 * 1024 * 1024),
        cpuinfo_path=cpuinfo(tmp_path, 80),
    )
    done = run_preflight(
        tmp_path,
        exp,
        gpus=query_csv_from_table(fixture(SMI_TABLE)),
        topo=fixture(TOPO_DGX1),
        ibstat=fixture(IB_ROCE),
        docker=fixture(DOCKER_OK),
    )
    assert done.returncode == 0, done.stderr  # a warning: the node still runs what fits
    assert done.stdout.strip().splitlines()[-1] == "preflight gpu-02: 0 error(s), 1 warning(s)"
    assert (
        f"WARNING: gpu-02 has 24 GiB of RAM (MemTotal), the stack says 380 GiB ({exp.memory_key}): the "
        "host-memory check judged swap space and CPU offload against the larger figure"
    ) in done.stdout
    assert "fix: state the node's RAM: nodes.gpu-02.memoryGib: 24" in done.stdout
    # The stack's own figure for the node is what is compared.
    spec_says = dataclasses.replace(exp, memory_gib=24.0, memory_key="nodes.gpu-02.memoryGib")
    assert check_memory(spec_says, Outputs(meminfo=Path(exp.meminfo_path).read_text())) == []


def test_preflight_script_fails_with_what_to_fix(tmp_path: Path, prod_spec) -> None:  # type: ignore[no-untyped-def]
    exp = dataclasses.replace(
        node_expectation(prod_spec, "gpu-02"),
        disk_path=str(tmp_path),
        min_free_gib=0,
        models=[],
        meminfo_path=meminfo(tmp_path, 376 * 1024 * 1024),
        cpuinfo_path=cpuinfo(tmp_path, 80),
    )
    done = run_preflight(
        tmp_path,
        exp,
        gpus=query_csv_from_table(fixture(SMI_TABLE), 7),
        topo=fixture(TOPO_PCIE),
        ibstat=fixture(IB_H100),
        docker=fixture(DOCKER_MISSING),
    )
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[-1] == "preflight gpu-02: 5 error(s), 0 warning(s)"
    for text in [
        "ERROR: gpu-02 has 7 GPU(s), the stack expects 8",
        "ERROR: gpu-02 runs NVIDIA driver 535.183.01, the stack needs >= 560.28.03",
        "ERROR: gpu-02: `nvidia-smi topo -m` shows no NVLink between any GPUs",
        "ERROR: gpu-02: mlx5_0 port 1 link layer is InfiniBand, the stack says ethernet",
        "ERROR: gpu-02: Docker has no nvidia runtime (io.containerd.runc.v2 runc)",
    ]:
        assert text in done.stderr


def test_preflight_module_stays_python_3_8_and_stdlib_only() -> None:
    # It runs on the nodes' own python3 (Ubuntu 20.04 ships 3.8) without any package installed.
    import ast
    import sys

    from components.node_programs import preflight

    source = Path(preflight.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}
