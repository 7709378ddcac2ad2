"""doctor: every row of the runbook's troubleshooting table faked on recorded outputs, through the real
probe script's sections (a stand-in for SSH answers exactly the sections the probe asks for)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components.engines.base import nccl_env
from components.engines.registry import ENGINES
from components.planning.nodes import firewall
from components.spec import StackSpec
from ops.doctor import LOG_PATTERN, Finding, main, parse_sections, probe_script
from tests.support import tool

OPS = Path(__file__).parent / "fixtures" / "ops"
RAY = Path(__file__).parent / "fixtures" / "ray"
CHRONY = (OPS / "chronyc-tracking.synchronised.chrony4.3-recorded-here.txt").read_text()
CHRONY_UNSYNC = (OPS / "chronyc-tracking.not-synchronised.chrony4.3-recorded-here.txt").read_text()
RAY_OK = (RAY / "ray-status.2-nodes-16-gpu.verl-docs.txt").read_text()
NCCL_IB = next(OPS.glob("nccl-debug-info.net-ib.azure*")).read_text()
NCCL_SOCKET = next(OPS.glob("nccl-debug-info.net-socket-fallback*")).read_text()
AKS = (OPS / "ib_write_bw.report_gbits.all-sizes.results-only.azure-aks-ib-hdr200.aks-rdma-infiniband.txt").read_text()
# A dmesg transcript published with a driver reset (code index), and vLLM's own refusal (vllm
# worker/worker.py:553-557 at v0.9.2), as tests/fixtures/startup-failures/vllm.bf16-below-sm80.verl-issue-2594.log has it.
XID = "[ 1399.140323] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000\n"
BF16 = (
    "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
    "V100-SXM2-32GB GPU has compute capability 7.0. You can use float16 instead by explicitly setting the`dtype` "
    "flag in CLI, for example: --dtype=half.\n"
)
OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 3 has a total capacity of "
    "31.74 GiB of which 1.12 GiB is free.\n"
)
ADDR = {f"gpu-0{i}": f"192.168.10.1{i}" for i in range(1, 7)}


def healthy(spec: StackSpec) -> dict[str, dict[str, tuple[int, str]]]:
    """Per node, what each probe section returns on a working cluster (real tool outputs where they vary)."""
    out: dict[str, dict[str, tuple[int, str]]] = {}
    for node in spec.nodes:
        script = probe_script(spec, node)
        s: dict[str, tuple[int, str]] = {}
        for name in re.findall(r"^echo '@@doctor (\S+)'$", script, re.M):
            kind, _, what = name.partition(":")
            if kind == "date":
                s[name] = (0, "0\n")  # replaced by "now" at run time
            elif kind == "chrony":
                s[name] = (0, CHRONY)
            elif kind == "timedatectl":
                s[name] = (1, "")
            elif kind == "kernel":
                s[name] = (0, "")
            elif kind == "nft":
                s[name] = (0, firewall.ruleset(spec, node).split("delete table inet llm_cluster\n")[1])
            elif kind == "ports":
                s[name] = (0, "".join(f"{m} open\n" for m in re.findall(r"echo '([^']+)' \"\$s\"", script)))
            elif kind == "ibstat":
                s[name] = (0, "")
            elif kind == "gid":
                s[name] = (0, "RoCE v2\n0000:0000:0000:0000:0000:ffff:c0a8:0a0b\n")
            elif kind == "iface":
                s[name] = (
                    0,
                    f"3: bond0    inet {ADDR[node]}/24 brd 192.168.10.255 scope global bond0\\       "
                    "valid_lft forever preferred_lft forever\n",
                )
            elif kind == "inspect":
                env = [f"{k}={v}" for k, v in nccl_env(spec, node).items()]
                s[name] = (0, f"running host {json.dumps(env)}\n")
            elif kind == "logs":
                s[name] = (0, NCCL_IB if "ray" in what else "")
            elif kind == "ray":
                s[name] = (0, RAY_OK)
            elif kind == "weights":
                s[name] = (0, "ext4\n1073741824 bytes (1.1 GB, 1.0 GiB) copied, 0.512 s, 2.1 GB/s\n")
            elif kind == "health":
                s[name] = (0, "200\n")
            elif kind == "gateway-log":
                s[name] = (1, "")
            else:
                raise AssertionError(f"no recorded output for probe section {name}")
        out[node] = s
    return out


def runner(
    answers: dict[str, dict[str, tuple[int, str]]],
    unreachable: set[str] = frozenset(),
    rdma: tuple[int, str] | None = None,
) -> Callable[[str, str], tuple[int, str, str]]:
    import time

    def run(node: str, script: str) -> tuple[int, str, str]:
        if node in unreachable:
            return 255, "", "ssh: connect to host 192.168.10.12 port 22: No route to host\n"
        if "ib_write_bw" in script and "@@doctor" not in script:
            assert rdma is not None
            return rdma[0], rdma[1], ""
        asked = re.findall(r"^echo '@@doctor (\S+)'$", script, re.M)
        text = ""
        for name in asked:
            rc, out = answers[node][name]
            if name == "date":
                out = f"{time.time():.6f}\n"
            text += f"@@doctor {name}\n{out}@@rc {rc}\n"
        return 0, text, ""

    return run


def doctor(
    spec_answers: dict[str, dict[str, tuple[int, str]]], capsys: Any, *args: str, **kw: Any
) -> tuple[int, dict[str, Any]]:
    code = main(["--stack", "prod", "--json", *args], run=runner(spec_answers, **kw))
    return code, json.loads(capsys.readouterr().out)


def failures(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f["check"], f["target"], f["seen"]) for f in report["findings"] if f["status"] == "fail"]


def finding(report: dict[str, Any], check: str, target: str) -> dict[str, str]:
    return next(f for f in report["findings"] if f["check"] == check and f["target"] == target)


@pytest.fixture
def answers(prod_spec: StackSpec) -> dict[str, dict[str, tuple[int, str]]]:
    return copy.deepcopy(healthy(prod_spec))


def test_a_healthy_cluster_has_no_failure(answers: Any, capsys: Any) -> None:
    code, report = doctor(answers, capsys)
    assert code == 0 and report["failed"] == 0
    assert {f["check"] for f in report["findings"]} == {
        "ssh",
        "clock",
        "firewall",
        "ports",
        "gid",
        "ray",
        "nccl",
        "weights",
        "replica",
        "xid",
    }
    assert finding(report, "ray", "reasoning-gpu-01")["seen"] == "2 nodes, 16 GPUs"
    assert finding(report, "nccl", "gpu-02/ray-worker-reasoning-gpu-01")["seen"] == "NET/IB: mlx5_0:1/IB"


# --- row 1: `ray status` shows no worker ----------------------------------------------------------


def test_row1_ray_missing_a_worker(answers: Any, capsys: Any) -> None:
    answers["gpu-01"]["ray:reasoning-gpu-01"] = (
        0,
        RAY_OK.replace(" 1 node_1eb4d7d07e793114c23a89d1a41f1f76acf6ef5b35af844a4ee8e4ba\n", "").replace(
            "0.0/16.0 GPU", "0.0/8.0 GPU"
        ),
    )
    code, report = doctor(answers, capsys)
    assert code == 1
    f = finding(report, "ray", "reasoning-gpu-01")
    assert f["seen"] == "ray status: 1/2 nodes, 8/16 GPUs"
    assert f["do"].startswith("workers reach 192.168.10.11 on TCP 6379 and 10001")


def test_row1_firewall_blocks_the_gcs_and_the_table_is_gone(answers: Any, capsys: Any) -> None:
    answers["gpu-02"]["ports"] = (
        0,
        answers["gpu-02"]["ports"][1].replace(
            "gpu-01 192.168.10.11 6379 pools.reasoning.rayPort open",
            "gpu-01 192.168.10.11 6379 pools.reasoning.rayPort closed",
        ),
    )
    answers["gpu-02"]["nft"] = (1, "Error: No such file or directory\nlist table inet llm_cluster\n")
    code, report = doctor(answers, capsys)
    assert ("ports", "gpu-02", "gpu-02 cannot reach: gpu-01 192.168.10.11 6379 pools.reasoning.rayPort") in failures(
        report
    )
    assert finding(report, "firewall", "gpu-02")["seen"].startswith("no nftables table inet llm_cluster")


def test_row1_clock_not_synchronised_or_off_from_the_operator(answers: Any, capsys: Any) -> None:
    answers["gpu-02"]["chrony"] = (0, CHRONY_UNSYNC)
    _, report = doctor(answers, capsys)
    f = finding(report, "clock", "gpu-02")
    assert (f["status"], f["seen"]) == ("fail", "chrony says the clock is not synchronised")
    assert "install chrony" in f["do"]


def test_row1_container_without_host_network(answers: Any, capsys: Any) -> None:
    status, text = answers["gpu-02"]["inspect:ray-worker-reasoning-gpu-01"]
    answers["gpu-02"]["inspect:ray-worker-reasoning-gpu-01"] = (status, text.replace("running host", "running bridge"))
    _, report = doctor(answers, capsys)
    assert ("network-host", "gpu-02/ray-worker-reasoning-gpu-01", "network mode bridge") in failures(report)


# --- row 2: vLLM stuck in NCCL init ------------------------------------------------------------------


def test_row2_gid_index_not_roce_v2_and_wrong_interface(answers: Any, capsys: Any) -> None:
    answers["gpu-02"]["gid"] = (0, "IB/RoCE v1\nfe80:0000:0000:0000:ba59:9fff:fe3a:1b2c\n")
    answers["gpu-02"]["iface"] = (1, 'Device "bond0" does not exist.\n')
    _, report = doctor(answers, capsys)
    assert finding(report, "gid", "gpu-02")["seen"] == "GID index 3 of mlx5_0 port 1 is IB/RoCE v1"
    assert (
        finding(report, "interface", "gpu-02")["seen"]
        == 'bond0 does not hold 192.168.10.12 (Device "bond0" does not exist.)'
    )


def test_row2_container_env_differs_from_the_stack(answers: Any, capsys: Any) -> None:
    status, text = answers["gpu-02"]["inspect:ray-worker-reasoning-gpu-01"]
    answers["gpu-02"]["inspect:ray-worker-reasoning-gpu-01"] = (status, text.replace('"NCCL_IB_GID_INDEX=3", ', ""))
    _, report = doctor(answers, capsys)
    assert ("nccl-env", "gpu-02/ray-worker-reasoning-gpu-01", "NCCL_IB_GID_INDEX=(unset) (stack: 3)") in failures(
        report
    )


# --- row 3: slow cross-node throughput ---------------------------------------------------------------


def test_row3_nccl_fell_back_to_sockets(answers: Any, capsys: Any) -> None:
    answers["gpu-02"]["logs:ray-worker-reasoning-gpu-01"] = (0, NCCL_SOCKET)
    _, report = doctor(answers, capsys)
    f = finding(report, "nccl", "gpu-02/ray-worker-reasoning-gpu-01")
    assert f["seen"] == "NCCL uses NET/Socket (eth0:10.244.1.4<0>); Failed to open libibverbs.so[.1]"
    assert f["do"].startswith("check NCCL_IB_HCA=mlx5_0 names an Active HCA port") and "NCCL_IB_GID_INDEX=3" in f["do"]
    assert "NCCL_SOCKET_IFNAME=bond0" in f["do"]


def test_row3_bandwidth_retest_only_with_the_flag(answers: Any, capsys: Any) -> None:
    _, report = doctor(answers, capsys)
    assert not [f for f in report["findings"] if f["check"] == "rdma"]
    slow = (
        "",
        "ERROR: rdma reasoning-gpu-01: gpu-01 -> gpu-02: ib_write_bw average 96.6 Gb/s, below 190 Gb/s\n"
        "    fix: check ibstat mlx5_0 on both nodes\n",
    )
    code, report = doctor(answers, capsys, "--bandwidth", rdma=(1, slow[1]))
    assert code == 1
    f = finding(report, "rdma", "reasoning-gpu-01")
    assert f["seen"] == "gpu-01 -> gpu-02: ib_write_bw average 96.6 Gb/s, below 190 Gb/s"
    assert f["do"] == "check ibstat mlx5_0 on both nodes"


# --- rows 4 and 5: OOM at start, dtype/kernel unsupported ------------------------------------------


def test_row4_out_of_memory_in_the_server_log_and_the_kernels(answers: Any, capsys: Any) -> None:
    answers["gpu-03"]["logs:vllm-chat-gpu-03"] = (0, OOM)
    answers["gpu-04"]["kernel"] = (0, "[ 8123.4] Out of memory: Killed process 4242 (python3) total-vm:412GB\n")
    _, report = doctor(answers, capsys)
    f = finding(report, "oom", "gpu-03/vllm-chat-gpu-03")
    assert f["seen"] == OOM.strip()[:200]
    assert f["do"].startswith("the GPU ran out of memory while the server loaded")
    assert "Fix: lower pools.chat.vllm.gpuMemoryUtilization or maxModelLen" in f["do"]
    assert finding(report, "oom", "gpu-04")["status"] == "fail"


def test_row5_dtype_not_supported(answers: Any, capsys: Any) -> None:
    answers["gpu-05"]["logs:vllm-chat-gpu-05"] = (0, BF16)
    _, report = doctor(answers, capsys)
    f = finding(report, "dtype-kernel", "gpu-05/vllm-chat-gpu-05")
    assert f["seen"].startswith("ValueError: Bfloat16 is only supported")
    assert "Fix: models.qwen3-30b-a3b.dtype: half" in f["do"]


def test_every_fatal_startup_error_of_the_engine_is_a_finding_with_its_own_fix(answers: Any, capsys: Any) -> None:
    # The reasoning pool's Ray head: MLA prefill on V100, and later an OOM: two causes, two findings.
    answers["gpu-01"]["logs:ray-head-reasoning-gpu-01"] = (
        0,
        "(RayWorkerWrapper pid=311) RuntimeError: FlashAttention only supports Ampere GPUs or newer.\n" + OOM,
    )
    code, report = doctor(answers, capsys)
    assert code == 1
    mla = finding(report, "dtype-kernel", "gpu-01/ray-head-reasoning-gpu-01")
    assert mla["seen"] == "(RayWorkerWrapper pid=311) RuntimeError: FlashAttention only supports Ampere GPUs or newer."
    assert "Fix: set VLLM_MLA_DISABLE=1 in pools.reasoning.env" in mla["do"]
    assert (
        "Fix: lower pools.reasoning.vllm.gpuMemoryUtilization"
        in finding(report, "oom", "gpu-01/ray-head-reasoning-gpu-01")["do"]
    )


def test_the_probe_reads_back_every_failure_line_of_every_engine() -> None:
    # What the node's grep keeps of `docker logs` is what the checks can see.
    for engine in ENGINES.values():
        for f in engine.startup_failures:
            assert f"({f.pattern})" in LOG_PATTERN, (engine.name, f.id)


# --- row 6: weights load slowly ---------------------------------------------------------------------


def test_row6_weights_on_nfs_and_a_slow_disk(answers: Any, capsys: Any) -> None:
    answers["gpu-04"]["weights:qwen3-30b-a3b"] = (
        0,
        "nfs4\n1073741824 bytes (1.1 GB, 1.0 GiB) copied, 9.1 s, 118 MB/s\n",
    )
    answers["gpu-05"]["weights:qwen3-30b-a3b"] = (
        0,
        "xfs\n1073741824 bytes (1.1 GB, 1.0 GiB) copied, 4.3 s, 250 MB/s\n",
    )
    code, report = doctor(answers, capsys)
    assert code == 0  # warnings only
    f = finding(report, "weights", "gpu-04//data/models/Qwen3-30B-A3B")
    assert (f["status"], f["seen"]) == ("warn", "on nfs4, read 118 MB/s")
    assert "models.qwen3-30b-a3b.source.node" in f["do"]
    assert finding(report, "weights", "gpu-05//data/models/Qwen3-30B-A3B")["seen"] == "on xfs, read 250 MB/s"


# --- row 7: a replica answers 502 ------------------------------------------------------------------


def test_row7_a_replica_502s_with_xid_errors(answers: Any, capsys: Any) -> None:
    answers["gpu-01"]["health:chat-gpu-06"] = (7, "000\n")
    answers["gpu-01"]["gateway-log"] = (
        0,
        "".join(json.dumps({"status": 502, "upstream": "192.168.10.16:8000", "pool": "chat"}) + "\n" for _ in range(3)),
    )
    answers["gpu-06"]["kernel"] = (0, XID)
    code, report = doctor(answers, capsys)
    assert code == 1
    f = finding(report, "replica", "chat-gpu-06")
    assert (f["seen"], f["do"].split(",")[0]) == (
        "health answered 000 from gpu-01",
        "docker logs vllm-chat-gpu-06 on gpu-06",
    )
    assert finding(report, "gateway-5xx", "gpu-01")["seen"] == "502/504 today by upstream: 192.168.10.16:8000 3"
    assert finding(report, "xid", "gpu-06")["seen"].startswith("GPU Xid error(s) 32: [ 1399.140323] NVRM: Xid")


def test_an_unreachable_node_fails_and_one_node_can_be_checked_alone(answers: Any, capsys: Any) -> None:
    code, report = doctor(answers, capsys, "--node", "gpu-02", unreachable={"gpu-02"})
    assert code == 1 and report["nodes"] == ["gpu-02"]
    assert failures(report) == [
        (
            "ssh",
            "gpu-02",
            "SSH to root@192.168.10.12 failed: ssh: connect to host 192.168.10.12 port 22: No route to host",
        )
    ]
    assert main(["--stack", "prod", "--node", "gpu-9"], run=runner(answers)) == 2
    assert "--node 'gpu-9' is not a node of prod" in capsys.readouterr().err


def test_the_text_report_says_what_was_seen_and_what_to_do(answers: Any, capsys: Any) -> None:
    answers["gpu-02"]["logs:ray-worker-reasoning-gpu-01"] = (0, NCCL_SOCKET)
    assert main(["--stack", "prod", "--node", "gpu-02"], run=runner(answers)) == 1
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "doctor prod: 1 node(s), 8 finding(s): 1 failed, 0 warning(s)"
    assert re.search(r"^FAIL  nccl +gpu-02/ray-worker-reasoning-gpu-01 +NCCL uses NET/Socket", text, re.M)
    assert re.search(r"^ +do: check NCCL_IB_HCA=mlx5_0", text, re.M)


def test_ssh_runs_the_probe_with_the_stacks_settings(prod_spec: StackSpec, tmp_path: Path, monkeypatch: Any) -> None:
    from ops.doctor import ssh_runner

    seen: list[list[str]] = []

    def fake_run(argv: list[str], **kw: Any) -> Any:
        seen.append(argv)
        return subprocess.CompletedProcess(argv, 0, "@@doctor date\n1\n@@rc 0\n", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert ssh_runner(prod_spec, "prod")("gpu-02", "probe")[0] == 0
    assert seen[-1] == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "Port=22",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "root@192.168.10.12",
        "bash -s",
    ]
    ops = prod_spec.model_copy(update={"ssh": prod_spec.ssh.model_copy(update={"user": "ops"})})
    ssh_runner(ops, "prod")("gpu-02", "probe")
    assert seen[-1][-2:] == ["ops@192.168.10.12", "sudo -n bash -s"]


def test_sections_parse_and_every_probe_is_shellcheck_clean(prod_spec: StackSpec, tmp_path: Path) -> None:
    assert parse_sections("@@doctor a\nx\ny\n@@rc 3\n@@doctor b\n@@rc 0\n") == {"a": (3, "x\ny\n"), "b": (0, "")}
    for node in prod_spec.nodes:
        (tmp_path / f"{node}.sh").write_text(probe_script(prod_spec, node))
    subprocess.run([tool("shellcheck"), "-s", "bash", *map(str, tmp_path.glob("*.sh"))], check=True)
    # Read-only: nothing in the probe writes, restarts or deletes.
    text = probe_script(prod_spec, "gpu-01")
    for word in ("docker rm", "docker stop", "docker restart", "nft add", "nft delete", "nft -f", "rm -", " > /"):
        assert word not in text
    assert isinstance(Finding("x", "y", "ok", "z"), Finding)


def test_the_readme_shows_what_doctor_prints_for_its_three_faults(answers: Any, capsys: Any) -> None:
    answers["gpu-02"]["logs:ray-worker-reasoning-gpu-01"] = (0, NCCL_SOCKET)
    answers["gpu-01"]["health:chat-gpu-06"] = (7, "000\n")
    answers["gpu-06"]["kernel"] = (0, XID)
    answers["gpu-04"]["weights:qwen3-30b-a3b"] = (
        0,
        "nfs4\n1073741824 bytes (1.1 GB, 1.0 GiB) copied, 9.1 s, 118 MB/s\n",
    )
    assert main(["--stack", "prod"], run=runner(answers)) == 1
    shown = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("OK ")]
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme[readme.index("doctor prod: 6 node(s)") : readme.index("exit status 1\n```")].splitlines()
    assert block == shown


# --- the plan's capacity against what the engine logged at start ------------------------------------


def vllm_start(tokens: int, kv_gib: float = 20.67) -> str:
    """vLLM 0.19.1's start-up lines of its memory (gpu_model_runner.py:4821, gpu_worker.py:437,
    kv_cache_utils.py:1319-1325), as its logger writes them."""
    return (
        "(EngineCore_DP0 pid=97) INFO 12-06 10:00:01 [gpu_model_runner.py:4821] Model loading took 7.15 GiB memory "
        "and 41.2 seconds\n"
        f"(EngineCore_DP0 pid=97) INFO 12-06 10:00:09 [gpu_worker.py:437] Available KV cache memory: {kv_gib} GiB\n"
        f"(EngineCore_DP0 pid=97) INFO 12-06 10:00:09 [kv_cache_utils.py:1319] GPU KV cache size: {tokens:,} tokens\n"
        "(EngineCore_DP0 pid=97) INFO 12-06 10:00:09 [kv_cache_utils.py:1325] Maximum concurrency for 32,768 tokens "
        f"per request: {tokens / 32768:.2f}x\n"
    )


@pytest.mark.parametrize(
    ("tokens", "status"),
    # The chat pool's plan: 810,400 KV tokens, 782,036 at the pessimistic end (its class's 3.5 % less).
    [(810_400, "ok"), (782_036, "ok"), (782_035, "warn"), (700_000, "warn")],
)
def test_the_kv_cache_the_engine_logged_is_held_against_the_plan(
    answers: Any, capsys: Any, tokens: int, status: str
) -> None:
    answers["gpu-03"]["logs:vllm-chat-gpu-03"] = (0, vllm_start(tokens))
    _, report = doctor(answers, capsys)
    f = finding(report, "capacity", "gpu-03/vllm-chat-gpu-03")
    assert f["status"] == status
    assert f["seen"].startswith(f"{tokens:,} KV tokens logged at start, 810,400 planned")
    assert f["seen"].endswith(
        "; KV cache 20.67 GiB per GPU logged, 18.5487 planned; weights 7.15 GiB logged, 7.15 planned"
    )
    if status == "warn":
        assert f["do"].startswith(
            f"the estimate was optimistic for pools.chat beyond its measured error: the pool holds {tokens / 32768:.1f} "
            "full-length requests, not the planned 24.7314. Size "
        )


def test_the_profilers_own_terms_are_compared_and_the_most_undercounted_is_named(answers: Any, capsys: Any) -> None:
    # vLLM 0.10.2+ states its terms in one line (INFO up to 0.11, DEBUG in 0.19.1: gpu_worker.py:640-655).
    terms = (
        "(EngineCore_DP0 pid=97) DEBUG 12-06 10:00:09 [gpu_worker.py:655] Free memory on device (31.20/31.74 GiB) on "
        "startup. Desired GPU memory utilization is (0.9, 28.57 GiB). Actual usage is 7.15 GiB for weight, 0.80 GiB "
        "for peak activation, 2.90 GiB for non-torch memory, and 0.40 GiB for CUDAGraph memory. Replace "
        "gpu_memory_utilization config with `--kv-cache-memory=1` (0.00 GiB) to fit into requested memory.\n"
    )
    answers["gpu-03"]["logs:vllm-chat-gpu-03"] = (0, vllm_start(700_000) + terms)
    _, report = doctor(answers, capsys)
    f = finding(report, "capacity", "gpu-03/vllm-chat-gpu-03")
    assert f["status"] == "warn"
    assert f["seen"].endswith(
        "weights 7.15 GiB logged, 7.15 planned; activation peak 0.80 GiB logged, 0.71 planned; "
        "non-torch memory 2.90 GiB logged, 2.15 planned"
    )
    assert "The plan undercounted most the non-torch memory: 2.90 GiB logged, 2.15 planned. Size " in f["do"]


def test_the_probe_reads_back_the_engines_memory_lines() -> None:
    for line in vllm_start(903_280).splitlines()[:3]:
        assert re.search(LOG_PATTERN, line), line


def test_a_server_that_logged_no_memory_lines_is_not_judged(answers: Any, capsys: Any) -> None:
    _, report = doctor(answers, capsys)
    assert [f for f in report["findings"] if f["check"] == "capacity"] == []
