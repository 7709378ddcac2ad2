"""The LMDeploy and llama.cpp stand-in images' programs, run from their image files on this machine.

No namespaces needed: each image's files are laid out as lab/images.py lays them into the image
(lab/standins/lmdeploy, lab/standins/llamacpp), then run with the argv the lab-engines stack plans
(Pulumi.lab-engines.yaml), bound to loopback instead of the host's lab address:
- LMDeploy: the image's python3 (this machine's Debian python3, the same interpreter) with only the image's
  site-packages: LMDeploy 0.16.0's own CLI parses the argv and refuses what it refuses; the server answers
  the OpenAI endpoints and serves lmdeploy's own metric names; the gate's in-image check passes on the
  hosts' fake V100 and fails without a GPU.
- llama.cpp: the real llama-server b11312 (a CPU build) loads the generated GGUF with the planned argv and
  answers; the gate's bash check passes against the image's /app.
The lab tier (test_lab_engines.py) runs the same images on the lab's hosts, behind the gateway.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.engines.llamacpp.engine import LLAMACPP_CHECK
from components.engines.llamacpp.facts import IMAGES as LLAMACPP_IMAGES
from components.engines.lmdeploy.engine import LMDEPLOY_CHECK
from components.engines.lmdeploy.facts import IMAGES as LMDEPLOY_IMAGES
from components.engines.registry import engine_for
from components.planning.qualification import Qualification, node_qualifications
from components.spec.topology import instances
from lab.config import REPO
from lab.images import NUMPY
from lab.standins import llamacpp as llamacpp_standin
from lab.standins import lmdeploy as lmdeploy_standin
from tests.support.lab_tier import assert_bounded
from tests.support.qualification import NETWORK_NONE

STACK = REPO / "Pulumi.lab-engines.yaml"
LMDEPLOY = "openmmlab/lmdeploy:v0.16.0-cu12.8"
LLAMACPP = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312"
PYTHON = "/usr/bin/python3"  # the image's interpreter: Debian bookworm's python3, as on this machine


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    from components.planning.load import load_stack_config
    from plan.stackfile import load_stack_file

    stack = load_stack_file(STACK, "lab-engines")
    return load_stack_config(stack.config, stack.secret_keys)


def planned_argv(spec, pool: str, index: int = 0) -> list[str]:  # type: ignore[no-untyped-def]
    """The server argv the stack plans for one instance of `pool`."""
    inst = instances(spec, pool)[index]
    return engine_for(spec.pools[pool]).serve_argv(spec, inst)


def on_loopback(argv: list[str], flag: str, port_flag: str, port: int) -> list[str]:
    """The planned argv bound to 127.0.0.1:`port` instead of the host's lab address."""
    out = list(argv)
    out[out.index(flag) + 1] = "127.0.0.1"
    out[out.index(port_flag) + 1] = str(port)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, body: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=None if body is None else json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode}): {proc.stdout.read() if proc.stdout else ''}")
        try:
            if get(url)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} not healthy within {timeout:.0f}s")
        time.sleep(0.3)


def qualification(spec, image: str) -> Qualification:  # type: ignore[no-untyped-def]
    return next(q for q in node_qualifications(spec) if q.image == image)


# --- LMDeploy ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lmdeploy_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's /opt/py3 site-packages, as the lab builds it."""
    files = tmp_path_factory.mktemp("lmdeploy-image")
    lmdeploy_standin.add_image_files(files, LMDEPLOY, REPO / ".venv" / "bin" / "pip", NUMPY)
    return files / lmdeploy_standin.SITE


# The image's python3 with only the image's site-packages (.pth files run: the stubs boot as in the image).
BOOT = "import site, sys; site.addsitedir(sys.argv.pop(1)); sys.argv[0] = sys.argv.pop(1); exec(sys.argv.pop(1))"
LMDEPLOY_MAIN = "from lab_lmdeploy.server import main; sys.exit(main())"


def lmdeploy(site: Path, args: list[str], gpus: str | None, **kw: Any) -> subprocess.Popen:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(site), "HF_HUB_OFFLINE": "1"}
    if gpus is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = gpus
    return subprocess.Popen(
        [PYTHON, "-I", "-S", "-c", BOOT, str(site), "lmdeploy", LMDEPLOY_MAIN, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def lmdeploy_exit(site: Path, args: list[str], gpus: str | None = "0,1") -> tuple[int, str]:
    p = lmdeploy(site, args, gpus)
    out, _ = p.communicate(timeout=120)
    return p.returncode, out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated model directory as the lab writes it for an LMDeploy pool (lab/__main__.py weights)."""
    d = tmp_path_factory.mktemp("Qwen3-32B-AWQ")
    (d / "config.json").write_text(json.dumps({"lab": True, **lmdeploy_standin.model_config("qwen3-32b")}))
    return d


@pytest.fixture(scope="module")
def lmdeploy_server(spec, lmdeploy_site: Path, model_dir: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    port = free_port()
    argv = on_loopback(planned_argv(spec, "awq"), "--server-name", "--server-port", port)
    argv[3] = str(model_dir)
    p = lmdeploy(lmdeploy_site, argv[1:], "0,1")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", p)
        yield url
    finally:
        p.terminate()
        p.wait(timeout=30)


def test_the_planned_lmdeploy_argv_is_what_the_lab_runs(spec) -> None:  # type: ignore[no-untyped-def]
    assert planned_argv(spec, "awq") == [
        "lmdeploy",
        "serve",
        "api_server",
        "/data/models/Qwen3-32B-AWQ",
        "--backend",
        "turbomind",
        "--model-name",
        "qwen3-32b",
        "--server-name",
        "198.18.0.11",
        "--server-port",
        "8000",
        "--tp",
        "2",
        "--dtype",
        "float16",
        "--model-format",
        "awq",
        "--session-len",
        "8192",
        "--max-batch-size",
        "32",
        "--cache-max-entry-count",
        "0.8",
        "--quant-policy",
        "8",
    ]


def test_lmdeploy_serves_the_openai_endpoints_with_usage(lmdeploy_server: str) -> None:
    assert json.loads(get(f"{lmdeploy_server}/health")[1]) == {"status": "healthy"}
    models = json.loads(get(f"{lmdeploy_server}/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["qwen3-32b"]
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
    ):
        status, raw = get(f"{lmdeploy_server}{path}", {"model": "qwen3-32b", **body})
        answer = json.loads(raw)
        assert status == 200, answer
        text = answer["choices"][0]["message"]["content"] if "chat" in path else answer["choices"][0]["text"]
        assert text.startswith("lab stand-in qwen3-32b answers from ")
        usage = answer["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0


def test_lmdeploy_streams_with_usage_on_the_last_chunk(lmdeploy_server: str) -> None:
    status, raw = get(
        f"{lmdeploy_server}/v1/chat/completions",
        {
            "model": "qwen3-32b",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert status == 200
    events = [e.removeprefix("data: ") for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks).startswith("lab stand-in qwen3-32b answers")
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"]["completion_tokens"] > 0


def test_lmdeploy_answers_404_for_any_other_name(lmdeploy_server: str) -> None:
    status, raw = get(f"{lmdeploy_server}/v1/chat/completions", {"model": "qwen3", "messages": []})
    assert (status, json.loads(raw)) == (
        404,
        {
            "message": "The model 'qwen3' does not exist.",
            "type": "not_found_error",
            "code": 404,
            "param": None,
            "object": "error",
        },
    )


def test_lmdeploy_metrics_carry_the_names_monitoring_reads(lmdeploy_server: str) -> None:
    get(f"{lmdeploy_server}/v1/completions", {"model": "qwen3-32b", "prompt": "count me"})
    text = get(f"{lmdeploy_server}/metrics")[1].decode()
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    facts = LMDEPLOY_IMAGES[LMDEPLOY]
    assert set(facts.metrics.values()) <= families, set(facts.metrics.values()) - families
    generated = [line for line in text.splitlines() if line.startswith("lmdeploy:generation_tokens_total{")]
    assert generated and float(generated[0].split()[-1]) > 0, generated
    assert 'model_name="qwen3-32b"' in generated[0]


def test_lmdeploy_refuses_a_flag_of_another_engine(lmdeploy_site: Path, model_dir: Path) -> None:
    code, out = lmdeploy_exit(lmdeploy_site, ["serve", "api_server", str(model_dir), "--tensor-parallel", "2"])
    assert code == 2
    assert out.strip().splitlines()[-1] == "lmdeploy: error: unrecognized arguments: --tensor-parallel 2"


def test_lmdeploy_refuses_a_value_outside_its_choices(lmdeploy_site: Path, model_dir: Path) -> None:
    code, out = lmdeploy_exit(lmdeploy_site, ["serve", "api_server", str(model_dir), "--quant-policy", "3"])
    assert code == 2
    # lmdeploy's own type for it (QuantPolicy's values) refuses it, in its words
    assert (
        out.strip().splitlines()[-1]
        == "lmdeploy serve api_server: error: argument --quant-policy: invalid _parse value: '3'"
    )


def test_lmdeploy_needs_the_gpus_of_its_tensor_parallel(lmdeploy_site: Path, model_dir: Path) -> None:
    code, out = lmdeploy_exit(lmdeploy_site, ["serve", "api_server", str(model_dir), "--tp", "2"], gpus="0")
    assert code == 1
    assert out.strip().splitlines()[-1] == "RuntimeError: TurboMind needs 2 GPU(s) for --tp 2; the container sees 1"


def test_lmdeploy_falls_back_from_turbomind_for_an_architecture_it_lacks(lmdeploy_site: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    code, out = lmdeploy_exit(lmdeploy_site, ["serve", "api_server", str(tmp_path), "--backend", "turbomind"])
    assert code == 1
    assert f"Fallback to pytorch engine because {str(tmp_path)!r} not supported by turbomind engine." in out, out


def test_lmdeploy_needs_a_model_directory(lmdeploy_site: Path, tmp_path: Path) -> None:
    code, out = lmdeploy_exit(lmdeploy_site, ["serve", "api_server", str(tmp_path)])
    assert code == 1
    assert out.strip().splitlines()[-1] == f"OSError: {tmp_path} does not appear to have a file named config.json"


def lmdeploy_gate(site: Path, facts: str, gpus: str | None) -> tuple[int, dict[str, dict]]:
    """The gate's in-image program (`python3 -c LMDEPLOY_CHECK FACTS`) with the image's site-packages."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(site)}
    if gpus is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = gpus
    p = subprocess.run(
        [PYTHON, "-I", "-S", "-c", BOOT, str(site), "-c", LMDEPLOY_CHECK, facts],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return p.returncode, {
        c["check"]: c for c in map(json.loads, [ln for ln in p.stdout.splitlines() if ln.startswith('{"check"')])
    }


def test_the_lmdeploy_image_passes_the_gate_on_the_hosts_fake_v100(spec, lmdeploy_site: Path) -> None:  # type: ignore[no-untyped-def]
    q = qualification(spec, LMDEPLOY)
    assert q.check.entrypoint == "python3" and q.check.args[:2] == ("-c", LMDEPLOY_CHECK)
    code, checks = lmdeploy_gate(lmdeploy_site, q.check.args[2], "0")
    assert code == 0, checks
    assert [c for c in checks] == [
        "torch-sees-gpu",
        "gpu-as-planned",
        "torch-arch-list",
        "fp16-matmul",
        "turbomind-kernels",
        "engine-version",
        "argv-parses",
    ]
    assert checks["turbomind-kernels"]["detail"].startswith(
        "_turbomind.cpython-311-x86_64-linux-gnu.so: 91 sm_70 kernels"
    )
    assert checks["engine-version"]["detail"] == "lmdeploy.version 0.16.0, facts expect 0.16.0"
    assert checks["argv-parses"]["detail"] == "lmdeploy serve api_server /data/models/Qwen3-32B-AWQ ... parses"


def test_without_gpus_the_lmdeploy_gate_fails(spec, lmdeploy_site: Path) -> None:  # type: ignore[no-untyped-def]
    code, checks = lmdeploy_gate(lmdeploy_site, qualification(spec, LMDEPLOY).check.args[2], None)
    assert code == 1
    assert checks["torch-sees-gpu"]["ok"] is False and checks["torch-sees-gpu"]["detail"].endswith("0 device(s)")


# --- llama.cpp ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llamacpp_app(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's /app (the real llama-server of b11312 built for the CPU, its libraries, the device wrapper)."""
    files = tmp_path_factory.mktemp("llamacpp-image")
    llamacpp_standin.add_image_files(files)
    return files / "app"


def app_env(app: Path, gpus: str | None) -> dict[str, str]:
    # In the image, ldconfig finds the libraries in /app; here the loader is told where they are.
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(app)}
    if gpus is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = gpus
    return env


def test_the_planned_llamacpp_argv_is_what_the_lab_runs(spec) -> None:  # type: ignore[no-untyped-def]
    assert planned_argv(spec, "gguf") == [
        "/app/llama-server",
        "-m",
        "/data/models/tiny-llama/tiny-llama-f32.gguf",
        "--alias",
        "tiny-llama,tiny-llama-alias",
        "--host",
        "198.18.0.12",
        "--port",
        "8000",
        "--n-gpu-layers",
        "999",
        "--split-mode",
        "none",
        "--ctx-size",
        "1024",
        "--parallel",
        "4",
        "--flash-attn",
        "on",
        "--fit",
        "off",
        "--jinja",
        "--metrics",
        "--threads",
        "2",
        "--n-predict",
        "16",
    ]


def test_the_real_llama_server_loads_the_generated_gguf_with_the_planned_argv(
    spec, llamacpp_app: Path, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    model = llamacpp_standin.write_gguf(tmp_path / "tiny-llama-f32.gguf")
    port = free_port()
    argv = on_loopback(planned_argv(spec, "gguf"), "--host", "--port", port)
    argv[0], argv[2] = str(llamacpp_app / "llama-server"), str(model)
    p = subprocess.Popen(
        argv, env=app_env(llamacpp_app, "0"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", p)
        for name in ("tiny-llama", "tiny-llama-alias"):
            status, raw = get(
                f"{url}/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}]}
            )
            answer = json.loads(raw)
            assert status == 200, answer
            assert answer["system_fingerprint"] == "b11312-0c1e570"
            assert_bounded(answer)
        text = get(f"{url}/metrics")[1].decode()
        for series in LLAMACPP_IMAGES[LLAMACPP].metrics.values():
            assert f"# TYPE {series} " in text, series
        models = json.loads(get(f"{url}/v1/models")[1])
        assert models["data"][0]["aliases"] == ["tiny-llama", "tiny-llama-alias"]
    finally:
        p.terminate()
        log = p.communicate(timeout=30)[0]
    assert "n_slots = 4, n_ctx_slot = 256" in log  # -c 1024 over 4 slots: contextPerSlot 256


def test_the_image_lists_the_gpus_docker_gave_it(llamacpp_app: Path) -> None:
    out = subprocess.run(
        [str(llamacpp_app / "llama-server"), "--list-devices"],
        env=app_env(llamacpp_app, "2,3"),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.splitlines()[1:] == [
        "  Device 0: Tesla V100-SXM2-32GB, compute capability 7.0, VMM: yes",
        "  Device 1: Tesla V100-SXM2-32GB, compute capability 7.0, VMM: yes",
        "Available devices:",
        "  CUDA0: Tesla V100-SXM2-32GB (32768 MiB, 32768 MiB free)",
        "  CUDA1: Tesla V100-SXM2-32GB (32768 MiB, 32768 MiB free)",
    ]


def llamacpp_gate(q: Qualification, app: Path, gpus: str | None) -> subprocess.CompletedProcess[str]:
    """The gate's bash check, with the image's /app for /app, in a network namespace with only its loopback up
    (what `docker run --network none` gives the gate)."""
    assert q.check.entrypoint == "/bin/bash" and q.check.args[:2] == ("-c", LLAMACPP_CHECK)
    args = [a.replace("/app/", f"{app}/") for a in q.check.args]
    return subprocess.run(
        [*NETWORK_NONE, "/bin/bash", *args], capture_output=True, text=True, timeout=600, env=app_env(app, gpus)
    )


def test_the_llamacpp_image_passes_the_gate_on_the_hosts_fake_v100(spec, llamacpp_app: Path) -> None:  # type: ignore[no-untyped-def]
    run = llamacpp_gate(qualification(spec, LLAMACPP), llamacpp_app, "0")
    checks = [json.loads(ln) for ln in run.stdout.splitlines()]
    assert run.returncode == 0, run.stdout + run.stderr
    assert checks == [
        {"check": "engine-version", "ok": True, "detail": "version: 0.5.0-dev (build 11312, commit 0c1e570)"},
        {"check": "gpu-visible", "ok": True, "detail": "CUDA0: Tesla V100-SXM2-32GB (32768 MiB, 32768 MiB free)"},
        {"check": "gpu-as-planned", "ok": True, "detail": "device 0 is sm_70, as planned"},
        {"check": "argv-parses", "ok": True, "detail": f"{llamacpp_app}/llama-server ... parses"},
    ]


def test_without_gpus_the_llamacpp_gate_fails(spec, llamacpp_app: Path) -> None:  # type: ignore[no-untyped-def]
    run = llamacpp_gate(qualification(spec, LLAMACPP), llamacpp_app, None)
    assert run.returncode == 1
    assert json.loads(run.stdout.splitlines()[1])["detail"] == "llama-server lists no CUDA device: (none)"


def test_the_real_llama_server_refuses_a_flag_of_another_build(spec, llamacpp_app: Path) -> None:  # type: ignore[no-untyped-def]
    q = qualification(spec, LLAMACPP)
    bad = shlex.split(q.check.args[7]) + ["--cache-type-k", "q3_k"]
    bad_q = Qualification(
        q.node,
        q.image,
        type(q.check)(q.check.engine, q.check.entrypoint, (*q.check.args[:7], shlex.join(bad)), q.check.checks),
        q.argvs,
        q.node_ref,
    )
    run = llamacpp_gate(bad_q, llamacpp_app, "0")
    assert run.returncode == 1
    last = json.loads(run.stdout.splitlines()[-1])
    assert last["check"] == "argv-parses" and last["ok"] is False
    assert last["detail"].startswith('error while handling argument "--cache-type-k"')
