"""vLLM argv, env and the /health gate: exact outputs, parsed by a parser rebuilt from vLLM 0.9.2's own."""

from __future__ import annotations

import argparse
import http.server
import json
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.engines.base import (
    container_labels,
    container_name,
    endpoint,
    health_gate_script,
    ready_url,
    server_container_name,
)
from components.engines.registry import ENGINES
from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from components.spec.topology import instances
from tests.support import tool
from tests.support.expected_argv import R1_RAY_HEAD_ARGV, REFERENCE_NCCL_ENV

# The memory keys the readiness gate of the reference stack's chat pool names.
VLLM_MEMORY_KEYS = f"pools.chat.{ENGINES['vllm'].memory_keys}"

VLLM = ENGINES["vllm"]

# Each supported version's parser dump (components/engines/DATA-SOURCES.md says how each was made).
SERVE_ARGS = {
    "0.9.2": Path(__file__).parent / "fixtures" / "vllm-0.9.2-serve-args.json",
    "0.19.1": Path(__file__).parents[1] / "components" / "engines" / "vllm" / "data" / "vllm-0.19.1-serve-args.json",
}


class ParseError(Exception):
    """argparse refused the command line."""


class StrictParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, and takes no abbreviations (a typo is an error)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ParseError(message)


def _human_int(text: str) -> int:
    # vLLM's human_readable_int takes 1k / 1K / 2M; the planner writes plain integers.
    mult = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20}
    return int(float(text[:-1]) * mult[text[-1]]) if text[-1:] in mult else int(text)


TYPES = {
    "int": int,
    "float": float,
    "human_readable_int": _human_int,
    "human_readable_int_or_auto": lambda t: -1 if t in ("-1", "auto") else _human_int(t),
}


def serve_parser(version: str = "0.19.1") -> StrictParser:
    """`vllm serve`'s parser rebuilt from a version's dump: option strings, actions, nargs, choices, types."""
    parser = StrictParser(prog="vllm serve", allow_abbrev=False, add_help=False)
    for entry in json.loads(SERVE_ARGS[version].read_text()):
        if "positional" in entry:
            parser.add_argument(entry["positional"], nargs=entry["nargs"])
            continue
        kind, opts = entry["kind"], entry["opts"]
        if kind == "_HelpAction":
            continue
        if kind == "BooleanOptionalAction":
            parser.add_argument(*[o for o in opts if not o.startswith("--no-")], action=argparse.BooleanOptionalAction)
        elif kind == "_StoreTrueAction":
            parser.add_argument(*opts, action="store_true")
        else:
            # vLLM's optional_type(int) and friends: the dump names the wrapped type.
            kind = entry.get("inner_type", entry["type"]) if entry["type"] == "_optional_type" else entry["type"]
            kw: dict[str, Any] = {"type": TYPES.get(kind, str)}
            if entry["nargs"] is not None:
                kw["nargs"] = entry["nargs"]
            if entry["choices"] is not None:
                kw["choices"] = entry["choices"]
            parser.add_argument(*opts, action="append" if kind == "_AppendAction" else "store", **kw)
    return parser


def parse(argv: list[str], version: str = "0.19.1") -> argparse.Namespace:
    """Parse a planned argv as `vllm serve` of that version would (its first two words must be `vllm serve`)."""
    assert argv[:2] == ["vllm", "serve"]
    return serve_parser(version).parse_args(argv[2:])


def spec_with(config: dict[str, Any], pool: str, **vllm: Any) -> StackSpec:
    """The reference stack with some of one pool's vllm options changed."""
    config["llm-cluster:pools"][pool]["vllm"].update(vllm)
    return load_stack_config(config, set())


def test_parser_rebuilt_from_the_dump_is_strict() -> None:
    # These must fail, or the checks below prove nothing.
    for version in SERVE_ARGS:
        for bad in (
            ["/m", "--tensor-parallel-size", "two"],
            ["/m", "--dtype", "bf16"],
            ["/m", "--kv-cache-dtype", "int8"],
            ["/m", "--gpu-memory-util", "0.9"],
            ["/m", "--no-such-flag"],
        ):
            with pytest.raises(ParseError):
                serve_parser(version).parse_args(bad)
    with pytest.raises(ParseError):  # 0.9.2 had choices for --block-size, 0.19.1 takes any int
        serve_parser("0.9.2").parse_args(["/m", "--block-size", "24"])
    with pytest.raises(ParseError):  # gone in 0.19.1
        serve_parser("0.19.1").parse_args(["/m", "--swap-space", "4"])


def test_reasoning_argv_is_exact_and_parses(prod_spec: StackSpec) -> None:
    inst = instances(prod_spec, "reasoning")[0]
    argv = VLLM.serve_argv(prod_spec, inst)
    assert argv == R1_RAY_HEAD_ARGV
    ns = parse(argv)
    assert ns.model_tag == "/data/models/DeepSeek-R1-GPTQ-Int4"
    assert ns.served_model_name == ["deepseek-r1", "/data/models/DeepSeek-R1-GPTQ-Int4"]
    assert (ns.tensor_parallel_size, ns.pipeline_parallel_size) == (8, 2)
    assert ns.distributed_executor_backend == "ray" and ns.dtype == "half"
    assert ns.enable_prefix_caching is None and ns.enable_chunked_prefill is None  # V1's defaults (on)
    assert ns.trust_remote_code is True and ns.gpu_memory_utilization == 0.9
    assert ns.attention_backend == "TRITON_ATTN" and ns.enforce_eager is True
    assert ns.model is None  # the model is the positional


def test_chat_replica_argv_is_exact_and_parses(prod_spec: StackSpec) -> None:
    insts = instances(prod_spec, "chat")
    assert [i.name for i in insts] == ["chat-gpu-03", "chat-gpu-04", "chat-gpu-05", "chat-gpu-06"]
    argv = VLLM.serve_argv(prod_spec, insts[2])
    assert argv == [
        "vllm",
        "serve",
        "/data/models/Qwen3-30B-A3B",
        "--served-model-name",
        "qwen3-30b-a3b",
        "/data/models/Qwen3-30B-A3B",
        "--host",
        "192.168.10.15",
        "--port",
        "8000",
        "--tensor-parallel-size",
        "8",
        "--distributed-executor-backend",
        "mp",
        "--dtype",
        "half",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "128",
        "--gpu-memory-utilization",
        "0.9",
        "--attention-backend",
        "TRITON_ATTN",
        "--shutdown-timeout",
        "60",
    ]
    assert parse(argv).max_model_len == 32768
    assert parse(argv).shutdown_timeout == 60  # pools.chat.drainSeconds' default


def test_a_0_9_2_pool_gets_no_flag_its_parser_lacks(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["image"] = "vllm/vllm-openai:v0.9.2"
    config["llm-cluster:pools"]["chat"]["vllm"].update(swapSpaceGib=4)
    spec = load_stack_config(config, set())
    argv = VLLM.serve_argv(spec, instances(spec, "chat")[0])
    # --attention-backend does not exist in 0.9.2: the typed key is not passed to it.
    assert "--attention-backend" not in argv and argv[-2:] == ["--swap-space", "4"]
    assert parse(argv, "0.9.2").swap_space == 4
    # Nor --shutdown-timeout (0.9.2's parser has none): docker's own stop timeout stays.
    assert "--shutdown-timeout" not in argv and VLLM.stop_timeout_seconds(spec, "chat") is None
    with pytest.raises(ParseError):
        parse([*argv, "--shutdown-timeout", "60"], "0.9.2")


def test_drain_seconds_is_vllms_shutdown_timeout_and_the_stop_timeout_is_above_it(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["drainSeconds"] = 120
    spec = load_stack_config(config, set())
    argv = VLLM.serve_argv(spec, instances(spec, "chat")[0])
    assert argv[-2:] == ["--shutdown-timeout", "120"] and parse(argv).shutdown_timeout == 120
    # The engine core and its workers still exit after the drain: docker waits 30 s more before SIGKILL.
    assert VLLM.stop_timeout_seconds(spec, "chat") == 150
    assert VLLM.stop_timeout_seconds(spec, "reasoning") == 90  # its default, 60


def test_drain_seconds_0_keeps_vllms_abort_and_dockers_stop_timeout(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["drainSeconds"] = 0
    spec = load_stack_config(config, set())
    assert "--shutdown-timeout" not in VLLM.serve_argv(spec, instances(spec, "chat")[0])
    assert VLLM.stop_timeout_seconds(spec, "chat") is None


def test_a_negative_drain_seconds_is_refused_naming_the_key(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"]["drainSeconds"] = -1
    with pytest.raises(SpecError, match=r"pools\.chat\.drainSeconds"):
        load_stack_config(config, set())


def test_every_optional_flag_is_a_real_flag_with_a_valid_value(config: dict[str, Any]) -> None:
    spec = spec_with(
        config,
        "chat",
        kvCacheDtype="fp8_e5m2",
        blockSize=32,
        maxNumBatchedTokens=8192,
        enablePrefixCaching=True,
        enableChunkedPrefill=True,
        enforceEager=True,
        extraArgs=["--enable-log-requests", "--max-log-len", "100"],
    )
    argv = VLLM.serve_argv(spec, instances(spec, "chat")[0])
    assert argv[argv.index("--block-size") :] == [
        "--block-size",
        "32",
        "--max-num-batched-tokens",
        "8192",
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--enforce-eager",
        "--shutdown-timeout",
        "60",
        # extraArgs last: a --shutdown-timeout of their own would win (argparse keeps the last).
        "--enable-log-requests",
        "--max-log-len",
        "100",
    ]
    assert argv[argv.index("--kv-cache-dtype") : argv.index("--kv-cache-dtype") + 2] == ["--kv-cache-dtype", "fp8_e5m2"]
    ns = parse(argv)
    assert (ns.kv_cache_dtype, ns.block_size, ns.max_num_batched_tokens) == ("fp8_e5m2", 32, 8192)
    assert ns.enable_prefix_caching and ns.enable_chunked_prefill and ns.enforce_eager and ns.enable_log_requests


def test_unstated_tristates_and_defaults_leave_vllm_its_own(config: dict[str, Any]) -> None:
    spec = load_stack_config(config, set())
    argv = VLLM.serve_argv(spec, instances(spec, "chat")[0])
    assert not [a for a in argv if "prefix-caching" in a or "chunked-prefill" in a]
    assert "--block-size" not in argv and "--kv-cache-dtype" not in argv and "--quantization" not in argv
    assert "--swap-space" not in argv and "--enforce-eager" not in argv
    assert parse(argv).enable_prefix_caching is None


def test_single_gpu_replicas_state_no_executor_and_listen_on_their_own_port(config: dict[str, Any]) -> None:
    config["llm-cluster:pools"]["chat"].update(tensorParallel=1, replicasPerNode=8)
    spec = load_stack_config(config, set())
    insts = instances(spec, "chat")
    r3 = insts[3]
    assert (r3.name, r3.port, r3.gpu_ids) == ("chat-gpu-03-r3", 8003, (3,))
    argv = VLLM.serve_argv(spec, r3)
    assert "--distributed-executor-backend" not in argv
    assert argv[argv.index("--port") + 1] == "8003" and parse(argv).tensor_parallel_size == 1
    assert endpoint(spec, r3) == "http://192.168.10.13:8003"
    assert ready_url(VLLM, spec, r3) == "http://192.168.10.13:8003/health"


def test_extra_args_that_vllm_does_not_know_fail_the_real_parser(config: dict[str, Any]) -> None:
    spec = spec_with(config, "chat", extraArgs=["--enable-expert-paralel"])
    with pytest.raises(ParseError, match="unrecognized arguments: --enable-expert-paralel"):
        parse(VLLM.serve_argv(spec, instances(spec, "chat")[0]))


def test_env_of_a_reasoning_worker_node(prod_spec: StackSpec) -> None:
    inst = instances(prod_spec, "reasoning")[0]
    # No VLLM_USE_V1: vLLM 0.19.1 does not read it (V1 is its only engine).
    assert VLLM.serve_env(prod_spec, inst, "gpu-02") == {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_MLA_DISABLE": "1",
        **REFERENCE_NCCL_ENV,
        "VLLM_HOST_IP": "192.168.10.12",
        # The hub and telemetry off (pools.*.offline, default true); Ray's value is exactly "0".
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def test_env_takes_nccl_extras_and_pool_env_but_keeps_the_node_ip(config: dict[str, Any]) -> None:
    config["llm-cluster:nccl"].update(ibDisable=True, debug="INFO", extraEnv={"NCCL_P2P_LEVEL": "NVL"})
    config["llm-cluster:pools"]["reasoning"]["env"] = {
        "VLLM_MLA_DISABLE": "1",
        "NCCL_DEBUG": "TRACE",
        "VLLM_HOST_IP": "10.0.0.1",
    }
    config["llm-cluster:nodes"]["gpu-02"]["hca"] = {"device": "mlx5_1", "port": 2, "linkLayer": "infiniband"}
    spec = load_stack_config(config, set())
    env = VLLM.serve_env(spec, instances(spec, "reasoning")[0], "gpu-02")
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_P2P_LEVEL"] == "NVL" and env["VLLM_MLA_DISABLE"] == "1"
    assert env["NCCL_DEBUG"] == "TRACE"  # the pool's value wins over the stack's
    assert env["VLLM_HOST_IP"] == "192.168.10.12"  # never a pool-wide value
    assert env["NCCL_IB_HCA"] == "mlx5_1:2" and "NCCL_IB_GID_INDEX" not in env  # InfiniBand: no GID


def test_v1_engine_is_left_alone_on_ampere(config: dict[str, Any]) -> None:
    config["llm-cluster:nodeDefaults"]["gpu"]["model"] = "NVIDIA A100-SXM4-80GB"
    spec = load_stack_config(config, set())
    assert "VLLM_USE_V1" not in VLLM.serve_env(spec, instances(spec, "chat")[0], "gpu-03")


def test_labels_name_role_pool_instance_gpu_and_image(prod_spec: StackSpec) -> None:
    inst = instances(prod_spec, "reasoning")[0]
    assert container_labels(prod_spec, inst, "gpu-02", "ray-worker") == {
        "llm-cluster.role": "ray-worker",
        "llm-cluster.pool": "reasoning",
        "llm-cluster.instance": "reasoning-gpu-01",
        "llm-cluster.node": "gpu-02",
        "llm-cluster.gpu-model": "Tesla V100-SXM2-32GB",
        "llm-cluster.image": "vllm/vllm-openai:v0.19.1",
        "llm-cluster.engine": "vllm",
    }


def test_container_names_come_from_one_function_of_instance_and_role(prod_spec: StackSpec) -> None:
    ray, chat = instances(prod_spec, "reasoning")[0], instances(prod_spec, "chat")[0]
    assert [container_name(ray, r) for r in ("ray-head", "ray-worker")] == [
        "ray-head-reasoning-gpu-01",
        "ray-worker-reasoning-gpu-01",
    ]
    assert container_name(chat, "vllm") == "vllm-chat-gpu-03"
    # The container running `vllm serve` (what the /health gate's hint names): its own, or the Ray head.
    assert (server_container_name(VLLM, chat), server_container_name(VLLM, ray)) == (
        "vllm-chat-gpu-03",
        "ray-head-reasoning-gpu-01",
    )
    with pytest.raises(ValueError, match="container role 'head node' must be letters, digits and '-'"):
        container_name(ray, "head node")


# --- the /health gate, with real bash, shellcheck and curl ---


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def healthy_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_health_gate_is_valid_shellcheck_clean_bash(tmp_path: Path) -> None:
    script = tmp_path / "gate.sh"
    script.write_text(
        health_gate_script(
            "http://192.168.10.13:8000/health", 1800, "vllm-chat-gpu-03", server="vllm", memory_keys=VLLM_MEMORY_KEYS
        )
    )
    assert subprocess.run([tool("bash"), "-n", str(script)], capture_output=True).returncode == 0
    lint = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


def test_health_gate_passes_once_health_answers(healthy_url: str, tmp_path: Path) -> None:
    tool("curl")
    script = tmp_path / "gate.sh"
    script.write_text(health_gate_script(healthy_url, 10, "vllm-x", server="vllm", memory_keys=VLLM_MEMORY_KEYS))
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"vllm: {healthy_url} healthy after ")


def test_health_gate_reports_progress_and_times_out_with_what_to_check(tmp_path: Path) -> None:
    tool("curl")
    url = f"http://127.0.0.1:{_closed_port()}/health"
    script = tmp_path / "gate.sh"
    script.write_text(
        health_gate_script(
            url, 2, "vllm-chat-gpu-03", server="vllm", memory_keys=VLLM_MEMORY_KEYS, interval_s=1, progress_every_s=1
        )
    )
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"}
    )  # no docker here: the log tail is skipped
    assert done.returncode == 1
    # Seconds as bash counts them: whole-second ticks, so the exact figures are not asserted.
    assert re.fullmatch(
        rf"vllm: waiting for {re.escape(url)}: \d+s elapsed \(timeout 2s\)", done.stdout.splitlines()[0]
    )
    assert re.match(
        rf"vllm: {re.escape(url)} not healthy after \d+s \(timeout 2s\)\. Check `docker logs "
        r"vllm-chat-gpu-03` \(weights path mounted and complete",
        done.stderr,
    )


def test_the_server_containers_stop_timeout_is_planned_above_the_drain(prod_preview_run: Any) -> None:
    # docker:Container's stopTimeout (an integer, replaces the container; tests/fixtures/schemas/docker-5.2):
    # the API server's container only (the one `docker stop` sends SIGTERM to vLLM's drain through the watchdog).
    stop = {
        r.urn.rsplit("::", 1)[1]: r.display_inputs().get("stopTimeout")
        for r in prod_preview_run.by_type("docker:index/container:Container")
    }
    assert stop["chat-gpu-03-vllm"] == stop["reasoning-gpu-01-ray-head"] == 90
    assert stop["reasoning-gpu-01-ray-worker-gpu-02"] is None
    assert all(v is None for k, v in stop.items() if not k.endswith(("-vllm", "-ray-head"))), stop
