"""The LMDeploy image of the lab: `openmmlab/lmdeploy:v<version>-cu12.8` with the real lmdeploy Python.

The real image (InternLM/lmdeploy docker/Dockerfile at v0.16.0, `final` stage) is
nvidia/cuda:12.8.1-base-ubuntu24.04 with a venv at /opt/py3 (Python 3.12) first on PATH, lmdeploy and
torch from the cu126 index installed in it, `TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas`, root, and no
ENTRYPOINT or CMD of its own: the CUDA base's `/opt/nvidia/nvidia_entrypoint.sh` (it runs
/opt/nvidia/entrypoint.d, then `exec "$@"`). The stand-in keeps the paths, PATH and entrypoint on the lab's
Debian base (its Python is 3.11, so the wheel is the cp311 one of the same release) and carries:
- the whole lmdeploy wheel of the image's version (its CLI, configs, metrics and TurboMind's real
  _turbomind.so, whose cubins the qualification gate counts), imported with its missing requirements stubbed
  (lab_lmdeploy/boot.py, as components/engines/lmdeploy/tools/dump_lmdeploy.py does);
- the real prometheus_client, numpy and pydantic (lmdeploy's metrics and configs run on them);
- the lab's stand-in torch (lab/standins/vllm/torch) reporting the image's torch facts and the hosts' V100;
- `lmdeploy` (lab_lmdeploy/server.py): LMDeploy's own entrypoint and parser, then a canned-text server.
Nothing here runs TurboMind, a GPU kernel or a model.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CACHE = Path("/var/cache/llm-cluster") / "lmdeploy"
PROMETHEUS_CLIENT = "0.26.0"
PYDANTIC = "2.14.3"  # the program's own pin (requirements.txt): lmdeploy's configs are pydantic dataclasses
SITE = "opt/py3/lib/python3.11/site-packages"
PACKAGES: tuple[str, ...] = ()
ENTRYPOINT = ("/opt/nvidia/nvidia_entrypoint.sh",)
ENV = {
    "PATH": "/opt/py3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
    "CUDA_VERSION_SHORT": "cu128",
    "PYTORCH_CUDA_VERSION": "cu126",
}
SOURCE = (
    "InternLM/lmdeploy docker/Dockerfile at v0.16.0 (final stage on nvidia/cuda:12.8.1-base-ubuntu24.04): "
    "venv /opt/py3 first on PATH, TRITON_PTXAS_PATH, root; ENTRYPOINT the CUDA base's "
    "/opt/nvidia/nvidia_entrypoint.sh, no CMD"
)
# torch of the image (components/engines/lmdeploy/facts.py: torch from the cu126 index; its note: 2.11.0+cu126 lists
# sm_70, pytorch#182250): the arch list PyTorch's cu126 wheels are built for.
TORCH_CU126_ARCH_LIST = (50, 60, 70, 75, 80, 86, 90)
ENTRYPOINT_SCRIPT = """#!/bin/bash
# The CUDA base images' entrypoint: their /opt/nvidia/entrypoint.d scripts (a banner, driver checks), then
# the command. The lab stand-in has no entrypoint.d scripts.
set -e
exec "$@"
"""
TORCH_STUBS = """

def __getattr__(name):
    # lab (LMDeploy image): lmdeploy's modules name torch types at import time; what the stand-in lacks is a stub.
    if name.startswith("__"):
        raise AttributeError(name)
    import dump_lmdeploy
    return dump_lmdeploy._stub_class(name)
"""


def wheel_root(version: str) -> Path:
    """The real lmdeploy wheel of `version`, unpacked (cached; downloaded from PyPI when missing)."""
    root = CACHE / version
    if (root / "lmdeploy" / "version.py").is_file():
        return root
    wheel = next(CACHE.glob(f"lmdeploy-{version}-cp311-*.whl"), None)
    if wheel is None:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                f"lmdeploy=={version}",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux_2_28_x86_64",
                "-d",
                str(CACHE),
                "-q",
            ],
            check=True,
            timeout=1800,
        )
        wheel = next(CACHE.glob(f"lmdeploy-{version}-cp311-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    return root


def standin_facts(ref: str) -> dict:
    """What the stand-in torch reports in this image: the image's torch and CUDA, the hosts' GPU."""
    from components.engines.lmdeploy.facts import lmdeploy_image

    facts = lmdeploy_image(ref)
    if facts is None:
        raise ValueError(f"the LMDeploy stand-in for {ref} needs its facts in components/engines/lmdeploy/facts.py")
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_gpu_shim", REPO / "lab" / "shims" / "gpu_shim.py")
    assert spec is not None and spec.loader is not None
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    name, count, capability = shim.gpu_model(REPO / "tests" / "fixtures" / "preflight")
    return {
        "version": facts.version,
        "torch": f"{facts.torch} (lab stand-in)",
        "cuda": facts.cuda,
        "torch_arch_list": list(TORCH_CU126_ARCH_LIST),
        "gpu": {"name": name, "count": count, "capability": capability},
    }


def add_image_files(files: Path, ref: str, pip: Path, numpy: str) -> dict[str, str]:
    """The image's files under `files`; returns the ENV lines the image adds."""
    facts = standin_facts(ref)
    site = files / SITE
    site.mkdir(parents=True)
    root = wheel_root(facts["version"])
    shutil.copytree(root / "lmdeploy", site / "lmdeploy", ignore=shutil.ignore_patterns("__pycache__"))
    for info in root.glob("lmdeploy-*.dist-info"):
        shutil.copytree(info, site / info.name)
    subprocess.run(
        [
            str(pip),
            "install",
            "-q",
            "--no-warn-script-location",
            "--target",
            str(site),
            f"prometheus_client=={PROMETHEUS_CLIENT}",
            f"numpy=={numpy}",
            f"pydantic=={PYDANTIC}",
        ],
        check=True,
        timeout=1200,
    )
    shutil.rmtree(site / "bin", ignore_errors=True)
    shutil.copytree(
        REPO / "lab" / "standins" / "vllm" / "torch", site / "torch", ignore=shutil.ignore_patterns("__pycache__")
    )
    with open(site / "torch" / "__init__.py", "a") as f:
        f.write(TORCH_STUBS)
    (site / "standin.json").write_text(json.dumps(facts, indent=1))
    shutil.copy2(REPO / "components" / "engines" / "lmdeploy" / "tools" / "dump_lmdeploy.py", site / "dump_lmdeploy.py")
    shutil.copytree(HERE / "lab_lmdeploy", site / "lab_lmdeploy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "lab" / "standins" / "openai_http.py", site / "openai_http.py")
    (site / "lab-lmdeploy.pth").write_text("import lab_lmdeploy.boot\n")
    # /opt/py3 is a venv (Python's own layout: pyvenv.cfg and bin/python3 on the system interpreter).
    venv = files / "opt" / "py3"
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n")
    (venv / "bin").mkdir()
    for name in ("python3", "python"):
        (venv / "bin" / name).symlink_to("/usr/bin/python3")
    script = venv / "bin" / "lmdeploy"
    script.write_text("#!/opt/py3/bin/python3\nimport sys\nfrom lab_lmdeploy.server import main\nsys.exit(main())\n")
    script.chmod(0o755)
    entry = files / ENTRYPOINT[0].lstrip("/")
    entry.parent.mkdir(parents=True)
    entry.write_text(ENTRYPOINT_SCRIPT)
    entry.chmod(0o755)
    return {
        **ENV,
        "LAB_STANDIN": f"lmdeploy {facts['version']} (the real wheel's Python, a canned-text engine); "
        f"stand-in torch {facts['torch']}",
    }


def model_config(arch: str) -> dict:
    """config.json keys a generated lab model needs for LMDeploy: `architectures`, as Hugging Face writes it
    for the catalog architecture's model_type (what TurboMind's SUPPORTED_ARCHS is keyed by)."""
    from components.engines.lmdeploy.facts import HF_ARCHITECTURES
    from components.facts.models import model_arch

    model_type = model_arch(arch).model_type
    return (
        {"model_type": model_type, "architectures": [HF_ARCHITECTURES[model_type]]}
        if model_type in HF_ARCHITECTURES
        else {}
    )
