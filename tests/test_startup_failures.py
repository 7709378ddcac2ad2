"""Fatal startup errors (components/facts/startup_failures.py): read in real engine logs, by Python and by
`grep -E` alike, never in healthy ones; and the readiness gate, run for real with bash, stops on them as
soon as the server dies instead of waiting out its timeout."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from components.engines.base import health_gate_script, startup_failure_advice
from components.engines.registry import ENGINES
from components.facts.startup_failures import COMMON, StartupFailure, all_failures, first_failure
from tests.support import tool

# The memory keys the readiness gate of the reference stack's chat pool names.
VLLM_MEMORY_KEYS = f"pools.chat.{ENGINES['vllm'].memory_keys}"

FIXTURES = Path(__file__).parent / "fixtures"
FAILING = FIXTURES / "startup-failures"
# The capacity fixtures' startup logs that end in vLLM's refusal (engine, the id they must read as).
CAPACITY_REFUSALS = {
    "deepseek-r1-distill-qwen-14b.rtx4090-x2.tp2.v0.7.2-v0.weights-only.vllm-issue-13061.log": (
        "vllm",
        "kv-cache-too-small",
    )
}
# Real startup logs of servers that came up (or whose startup went on), and of deaths the list leaves to
# the gate's crash-loop rule (unmatched.*: a port taken may be another server's, or free again in a moment):
# none of them may read as a known fatal error.
HEALTHY = [
    *sorted(p for p in (FIXTURES / "vllm-startup-logs").glob("*.log") if p.name not in CAPACITY_REFUSALS),
    *sorted((FIXTURES / "engines").glob("*.log")),
    *sorted(FAILING.glob("healthy.*.log")),
    *sorted(FAILING.glob("unmatched.*.log")),
]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the gate, against a stand-in for docker ---------------------------------------------------------

# `docker inspect -f …` answers "<restart count> <status>" (or the count alone) from files the test
# writes, adding `step` to the count at each full inspect (a crash loop); `docker logs` prints the log
# file and records its arguments. A missing count file is a missing container.
FAKE_DOCKER = r"""#!/usr/bin/env bash
set -euo pipefail
state=$FAKE_DOCKER_STATE
case $1 in
  inspect)
    [[ -f $state/count ]] || { echo "Error: No such object: $4" >&2; exit 1; }
    count=$(<"$state/count")
    if [[ $3 == *State.Status* ]]; then
      echo $((count + $(<"$state/step"))) >"$state/count"
      echo "$(<"$state/count") $(<"$state/status")"
    else
      echo "$count"
    fi ;;
  logs)
    echo "$*" >>"$state/logs-args"
    cat "$state/log" ;;
  *) exit 2 ;;
esac
"""


def _gate(
    tmp_path: Path,
    log: str,
    *,
    count: int | None = 0,
    step: int = 0,
    status: str = "running",
    timeout_s: int = 20,
    failures: list[tuple[str, str]] | None = None,
) -> tuple[subprocess.CompletedProcess[str], float]:
    tool("curl")
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    if count is not None:
        (state / "count").write_text(str(count))
    (state / "step").write_text(str(step))
    (state / "status").write_text(status)
    (state / "log").write_text(log)
    pairs = failures if failures is not None else startup_failure_advice(ENGINES["vllm"], "chat", "qwen3-30b-a3b")
    script = tmp_path / "gate.sh"
    script.write_text(
        health_gate_script(
            f"http://127.0.0.1:{_closed_port()}/health",
            timeout_s,
            "vllm-chat-gpu-03",
            server="vllm",
            memory_keys=VLLM_MEMORY_KEYS,
            interval_s=1,
            progress_every_s=60,
            failures=pairs,
        )
    )
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_DOCKER_STATE": str(state)},
    )
    return done, time.monotonic() - started


FA2 = (
    "(VllmWorker rank=0 pid=231) ERROR 07-10 02:11:40 [multiproc_executor.py:487] RuntimeError: FlashAttention "
    "only supports Ampere GPUs or newer.\n"
)


def test_gate_with_failures_is_shellcheck_clean(tmp_path: Path) -> None:
    for engine in ENGINES.values():
        script = tmp_path / f"{engine.name}.sh"
        script.write_text(
            health_gate_script(
                "http://192.168.10.13:8000/health",
                1800,
                "vllm-chat-gpu-03",
                server=engine.name,
                memory_keys=f"pools.chat.{engine.memory_keys}",
                failures=startup_failure_advice(engine, "chat", "qwen3-30b-a3b"),
            )
        )
        lint = subprocess.run([tool("shellcheck"), str(script)], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout


def test_a_server_that_dies_with_a_known_error_stops_the_gate_at_once_with_its_cause(tmp_path: Path) -> None:
    done, took = _gate(tmp_path, "INFO loading weights\n" + FA2, step=1, timeout_s=60)
    assert done.returncode == 1
    assert took < 30  # not the 60-s timeout
    first, cause = done.stderr.splitlines()[:2]
    assert first == f"vllm: vllm-chat-gpu-03 died at startup (1x since the gate began): {FA2.strip()}"
    assert cause.startswith("Cause: MLA (DeepSeek-V2/V3/R1, Kimi-K2) prefill calls FlashAttention-2")
    assert "VLLM_MLA_DISABLE=1 in pools.chat.env" in cause
    # Only what the server logged since the gate began: an old run's error is not this one's.
    args = (tmp_path / "state" / "logs-args").read_text().split()
    assert args[:2] == ["logs", "--since"] and re.fullmatch(r"\d{10}", args[2]) and args[3] == "vllm-chat-gpu-03"
    assert abs(int(args[2]) - time.time()) < 120


def test_a_stopped_container_counts_as_a_death(tmp_path: Path) -> None:
    done, _ = _gate(tmp_path, FA2, step=0, status="exited", timeout_s=60)
    assert done.returncode == 1 and "died at startup (1x since the gate began)" in done.stderr


def test_a_known_error_in_the_log_of_a_server_still_loading_does_not_stop_the_gate(tmp_path: Path) -> None:
    # No death: the line may be an earlier run's; the gate waits, and times out as before.
    done, took = _gate(tmp_path, FA2, step=0, timeout_s=2)
    assert done.returncode == 1
    assert "died" not in done.stderr and "not healthy after" in done.stderr
    assert "--since" not in (tmp_path / "state" / "logs-args").read_text()  # only the timeout's tail


def test_a_crash_loop_without_a_known_error_stops_after_three_deaths_with_the_last_lines(tmp_path: Path) -> None:
    log = "".join(f"line {i}\n" for i in range(40)) + "Segmentation fault (core dumped)\n"
    done, took = _gate(tmp_path, log, step=1, timeout_s=60)
    assert done.returncode == 1 and took < 30
    lines = done.stderr.splitlines()
    assert lines[0] == (
        "vllm: vllm-chat-gpu-03 died 3x since the gate began, with no fatal error this gate "
        "knows in its log; its last lines:"
    )
    assert lines[1:] == [f"line {i}" for i in range(11, 40)] + ["Segmentation fault (core dumped)"]
    assert (tmp_path / "state" / "logs-args").read_text().count("--since") == 3  # a look at each death


def test_without_the_container_the_gate_waits_as_before(tmp_path: Path) -> None:
    done, _ = _gate(tmp_path, FA2, count=None, step=1, timeout_s=2)
    assert done.returncode == 1 and "died" not in done.stderr and "not healthy after" in done.stderr


def test_the_first_failure_in_the_engines_order_names_the_cause(tmp_path: Path) -> None:
    # Both lines in one log: the more specific (listed first) wins over the generic OOM.
    pairs = [("KV cache is needed", "kv"), ("CUDA out of memory", "oom")]
    log = "torch.OutOfMemoryError: CUDA out of memory.\nValueError: ... 3.5 GiB KV cache is needed, which is larger\n"
    done, _ = _gate(tmp_path, log, step=1, failures=pairs)
    assert done.stderr.splitlines()[1] == "Cause: kv"


def test_patterns_with_quotes_and_brackets_reach_grep_intact(tmp_path: Path) -> None:
    pairs = [('it\'s \\[x\\] "y" \\$z', "quoted")]
    done, _ = _gate(tmp_path, 'a line: it\'s [x] "y" $z\n', step=1, failures=pairs)
    assert done.stderr.splitlines()[1] == "Cause: quoted"


# --- the entries ---------------------------------------------------------------------------------------


def test_an_entry_whose_pattern_python_and_grep_read_differently_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'\\\\d' is not POSIX ERE"):
        StartupFailure("x", "oom", r"error \d+", "c", "f", COMMON[0].source)


def test_each_engines_ids_are_unique_and_every_fix_placeholder_is_known() -> None:
    for engine in ENGINES.values():
        failures = engine.startup_failures
        assert len({f.id for f in failures}) == len(failures), engine.name
        for f in failures:
            assert f.fix.format(pool="p", model="m", memory_keys="k")  # every placeholder is known


@pytest.mark.parametrize("path", HEALTHY, ids=lambda p: p.name)
def test_no_healthy_startup_log_reads_as_a_failure(path: Path) -> None:
    text = path.read_text(errors="replace")
    for engine in ENGINES.values():
        assert all_failures(text, engine.startup_failures) == [], (engine.name, path.name)
        assert _grep(engine.startup_failures, text) == []


def _grep(failures: tuple[StartupFailure, ...], text: str) -> list[str]:
    """The ids whose pattern `grep -E` finds in text (what the gate and doctor run on a node)."""
    found = []
    for f in failures:
        done = subprocess.run([tool("grep"), "-E", "-q", "-e", f.pattern], input=text, text=True)
        assert done.returncode in (0, 1), (f.id, done.stderr)
        if done.returncode == 0:
            found.append(f.id)
    return found


def _expected(path: Path) -> tuple[str, str]:
    """A failing log's engine and the id it must read as: <engine>.<id>.<source>.log."""
    if path.name in CAPACITY_REFUSALS:
        return CAPACITY_REFUSALS[path.name]
    engine, failure_id = path.name.split(".")[:2]
    return engine, failure_id


FAILING_LOGS = [
    *sorted(p for p in FAILING.glob("*.log") if not p.name.startswith(("healthy.", "unmatched."))),
    *(FIXTURES / "vllm-startup-logs" / name for name in CAPACITY_REFUSALS),
]


@pytest.mark.parametrize("path", FAILING_LOGS, ids=lambda p: p.name)
def test_each_real_failure_log_reads_as_its_cause_in_python_and_in_grep(path: Path) -> None:
    engine, failure_id = _expected(path)
    failures = ENGINES[engine].startup_failures
    text = path.read_text(errors="replace")
    found = first_failure(text, failures)
    assert found is not None and found[0].id == failure_id, found and found[0].id
    assert _grep(failures, text)[0] == failure_id


def test_every_entry_has_a_real_log_that_shows_it() -> None:
    shown = {_expected(p)[1] for p in FAILING_LOGS}
    listed = {f.id for e in ENGINES.values() for f in e.startup_failures}
    assert listed - shown == set()
    assert os.path.exists(FAILING / "SOURCES.md")
    sources = (FAILING / "SOURCES.md").read_text()
    for p in [*FAILING.glob("*.log")]:
        assert p.name in sources, f"{p.name}: say where it comes from in SOURCES.md"
