"""The llama.cpp server image of the lab: the real llama-server of the image's build, for the CPU.

`ghcr.io/ggml-org/llama.cpp:server-cuda-b11312` is .devops/cuda.Dockerfile's `server` target at b11312
(commit 0c1e57098; the copy vendored in the PyPI sdist llama_cpp_python==0.3.36, whose CHANGELOG names
the commit): `/app/llama-server` and the build's shared libraries in /app, libgomp1 and curl,
`ENV LLAMA_ARG_HOST=0.0.0.0`, `WORKDIR /app`, `HEALTHCHECK curl -f http://localhost:8080/health`,
`ENTRYPOINT ["/app/llama-server"]`, root. The stand-in carries the same files at the same paths, built
from that source without CUDA (GGML_NATIVE=OFF: it runs on any x86-64 this machine's CI has), on the
lab's Debian base instead of nvidia/cuda:12.8.1-runtime-ubuntu24.04. It is the real server: its own
parser takes the planned argv, it loads a real (tiny, random-weight) GGUF and answers the OpenAI API and
/metrics itself. What it cannot show: CUDA, the sm_70 PTX JIT, any speed.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

BUILD_NUMBER, COMMIT = 11312, "0c1e570"
# The source of the image's build, and where the CPU build of it is cached on this machine.
SDIST = "llama_cpp_python==0.3.36"
CACHE = Path("/var/cache/llm-cluster") / f"llamacpp-b{BUILD_NUMBER}"
BINARY = CACHE / "build" / "bin" / "llama-server"
# .devops/cuda.Dockerfile at b11312, `server` target (the facts the stand-in image carries).
SOURCE = (
    'ggml-org/llama.cpp .devops/cuda.Dockerfile at b11312 (server target): ENTRYPOINT ["/app/llama-server"], '
    "WORKDIR /app, ENV LLAMA_ARG_HOST=0.0.0.0, HEALTHCHECK curl -f http://localhost:8080/health, root; "
    "the build's *.so* in /app"
)
PACKAGES = ("libgomp1",)  # curl is in the lab's base already
ENTRYPOINT = ("/app/llama-server",)
WORKDIR = "/app"
ENV = {"LLAMA_ARG_HOST": "0.0.0.0"}
# The image keeps the libraries beside the binary; the CPU build's RUNPATH names this machine's cache,
# so the dynamic linker is told about /app instead (the same files, found the same way at run time).
DOCKERFILE_LINES = (
    "RUN echo /app > /etc/ld.so.conf.d/llama.cpp.conf && ldconfig",
    'HEALTHCHECK CMD ["curl", "-f", "http://localhost:8080/health"]',
)


def server_build(log=print) -> Path:  # type: ignore[no-untyped-def]
    """llama-server b11312 built for the CPU from the image's source (cached; built when missing, ~35 min on
    two busy cores: the sdist from PyPI, cmake and a C++ compiler from Debian)."""
    if BINARY.is_file():
        return BINARY
    CACHE.mkdir(parents=True, exist_ok=True)
    log(f"llama.cpp b{BUILD_NUMBER}: building llama-server for the CPU into {CACHE} (once per machine)")
    sdist = next(CACHE.glob("llama_cpp_python-*.tar.gz"), None)
    if sdist is None:
        # pip reads an sdist's metadata through its build backend (scikit-build-core), installed for that
        # alone in an isolated environment: nothing of it is built, and the test venv does not need it.
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                SDIST,
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                str(CACHE),
                "-q",
            ],
            check=True,
            timeout=1800,
        )
        sdist = next(CACHE.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as t:
        t.extractall(CACHE, filter="data")
    source = CACHE / sdist.name.removesuffix(".tar.gz") / "vendor" / "llama.cpp"
    with open(CACHE / "build.log", "w") as out:
        subprocess.run(
            [
                "cmake",
                "-S",
                str(source),
                "-B",
                str(CACHE / "build"),
                "-DGGML_NATIVE=OFF",
                f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}",
                f"-DLLAMA_BUILD_COMMIT={COMMIT}",
                "-DLLAMA_OPENSSL=OFF",
                "-DCMAKE_BUILD_TYPE=Release",
            ],
            check=True,
            timeout=1800,
            stdout=out,
            stderr=out,
        )
        subprocess.run(
            ["cmake", "--build", str(CACHE / "build"), "--target", "llama-server", "-j2"],
            check=True,
            timeout=3600,
            stdout=out,
            stderr=out,
        )
    return BINARY


# `--list-devices` of a CUDA build lists the GPUs the container was given (ggml_cuda_init's lines, then the
# device list); this CPU build has none. As the lab's stand-in torch does, the image's llama-server answers
# that one question with the hosts' fake GPUs (NVIDIA_VISIBLE_DEVICES, which `--gpus` sets), and is the
# real server for everything else: it execs the real binary, which becomes the container's process.
DEVICES_WRAPPER = """#!/bin/bash
# llm-cluster lab: llama-server b@BUILD@ (a CPU build: the real binary is llama-server.cpu beside this).
for arg in "$@"; do
  if [[ $arg == --list-devices ]]; then
    IFS=, read -r -a gpus <<<"${NVIDIA_VISIBLE_DEVICES:-}"
    [[ ${NVIDIA_VISIBLE_DEVICES:-} == all ]] && gpus=(@ALL@)
    [[ ${NVIDIA_VISIBLE_DEVICES:-void} =~ ^(void|none|)$ ]] && gpus=()
    if (( ${#gpus[@]} )); then
      echo "ggml_cuda_init: found ${#gpus[@]} CUDA devices (lab stand-in: the hosts' fake GPUs):"
      for i in "${!gpus[@]}"; do echo "  Device $i: @NAME@, compute capability @CAP@, VMM: yes"; done
    fi
    echo "Available devices:"
    for i in "${!gpus[@]}"; do echo "  CUDA$i: @NAME@ (@MIB@ MiB, @MIB@ MiB free)"; done
    (( ${#gpus[@]} )) || echo "  (none)"
    exit 0
  fi
done
exec "${BASH_SOURCE[0]%/*}/llama-server.cpu" "$@"
"""


def devices_wrapper() -> str:
    """/app/llama-server: the GPU list of the hosts' shims for --list-devices, the real server otherwise."""
    repo = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("lab_gpu_shim", repo / "lab" / "shims" / "gpu_shim.py")
    assert spec is not None and spec.loader is not None
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    name, count, (major, minor) = shim.gpu_model(repo / "tests" / "fixtures" / "preflight")
    from components.facts.hardware import gpu

    mib = int(gpu(name).memory_gib * 1024)
    return (
        DEVICES_WRAPPER.replace("@BUILD@", str(BUILD_NUMBER))
        .replace("@ALL@", " ".join(map(str, range(count))))
        .replace("@NAME@", name)
        .replace("@CAP@", f"{major}.{minor}")
        .replace("@MIB@", str(mib))
    )


def add_image_files(files: Path) -> None:
    """/app of the server image: llama-server and every shared library of the build (symlinks kept)."""
    binary = server_build()
    app = files / "app"
    app.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, app / "llama-server.cpu")
    (app / "llama-server").write_text(devices_wrapper())
    (app / "llama-server").chmod(0o755)
    for lib in sorted(binary.parent.glob("*.so*")):
        if lib.is_symlink():
            (app / lib.name).symlink_to(lib.readlink())
        else:
            shutil.copy2(lib, app / lib.name)


def write_gguf(path: Path) -> Path:
    """A tiny random-weight llama GGUF at `path` (tests/fixtures/engines/make_tiny_llama_gguf.py, the model
    the fixtures of b11312's answers were recorded with): a real model the real server loads in a second."""
    if path.is_file():
        return path
    maker = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "engines" / "make_tiny_llama_gguf.py"
    spec = importlib.util.spec_from_file_location("lab_tiny_llama", maker)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    module.write_tiny_llama(tmp)
    tmp.rename(path)
    return path
