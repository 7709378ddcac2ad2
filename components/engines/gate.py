"""The pieces of the qualification gate the engines share: how a check is described to the gate
(GateCheck), the Python preamble and torch checks of images that carry torch (vLLM, LMDeploy), the Triton
fp16-dot kernel and its compiler harness. Each engine module composes its own check from these
(components.engines.*.gate_check); components.planning.qualification runs them per node and image.

The Python checks run with the image's python3 as `python3 -c PROGRAM FACTS_JSON`: plain Python, no
project import, one JSON line per check ({"check", "ok", "detail", "fix"}), exit 1 when one failed.
FACTS_JSON always holds `capability` (the node's GPU as the stack plans it, 70 for sm_70) and
`recommended` (the image to name when this one cannot run).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from components.node_programs import NODE_PROGRAMS


@dataclass(frozen=True)
class GateCheck:
    """What the gate runs in one image: `docker run --rm --gpus device=N --network none --entrypoint
    <entrypoint> <image> <args...>`, and how messages name it."""

    engine: str  # "vLLM 0.19.1", "LMDeploy 0.16.0", "llama.cpp b11312"
    entrypoint: str
    args: tuple[str, ...]
    checks: str  # what it checks, in words (the gate script's comment)


PREAMBLE = r"""
import json, sys
facts = json.loads(sys.argv[1])
failed = []

def report(check, ok, detail, fix=""):
    print(json.dumps({"check": check, "ok": ok, "detail": detail, **({"fix": fix} if not ok else {})}), flush=True)
    if not ok:
        failed.append(check)
"""

# torch sees a GPU, it is the GPU the stack plans, torch has kernels for it, an fp16 matmul is right.
# Leaves `torch`, `ok` (a GPU is visible) and `arch` ("sm_70") for the checks after it.
TORCH_CHECKS = r"""
arch = "sm_%d" % facts["capability"]
try:
    import torch
    ok = bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
    report("torch-sees-gpu", ok, f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
           f"{torch.cuda.device_count() if ok else 0} device(s)",
           "the container sees no GPU: check the NVIDIA container runtime (docker info | grep -i runtime) "
           "and the driver (nvidia-smi) on this node")
except Exception as e:
    ok = False
    report("torch-sees-gpu", False, f"import torch failed: {e}", "the image has no working torch")
if ok:
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"sm_{major}{minor}"
    report("gpu-as-planned", major * 10 + minor == facts["capability"],
           f"{torch.cuda.get_device_name(0)} is {arch}; the stack plans sm_{facts['capability']}",
           "the node's GPU is not the one the stack names: fix nodes.<node>.gpu.model (or nodeDefaults.gpu.model) "
           "so that the plan and the policies judge the real GPU")
    archs = torch.cuda.get_arch_list()
    report("torch-arch-list", arch in archs, f"{torch.cuda.get_device_name(0)} is {arch}; torch has {archs}",
           f"this torch has no {arch} kernels: use an image whose torch is built for {arch} "
           f"(on V100: {facts['recommended']})")
    try:
        a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
        err = (a @ a).float().sub(a.float() @ a.float()).abs().max().item()
        report("fp16-matmul", err < 1.0, f"max |fp16 - fp32| = {err:.4f}", "fp16 matmul is wrong on this GPU")
    except Exception as e:
        report("fp16-matmul", False, f"{type(e).__name__}: {e}", "a plain fp16 matmul fails: torch cannot run here")
"""

# The engine's Python package imports at the version the facts expect (facts: module, version).
ENGINE_VERSION_CHECK = r"""
try:
    import importlib
    engine = importlib.import_module(facts["module"])
    version = getattr(engine, "__version__", "?")
    report("engine-version", version == facts["version"], f"{facts['module']} {version}, facts expect {facts['version']}",
           f"the image does not carry {facts['module']} {facts['version']}: fix the image tag or its declared facts")
except Exception as e:
    report("engine-version", False, f"import {facts['module']} failed: {e}", "the image does not carry the engine")
"""

# Every planned argv parses with the engine's own parser: @PARSER@ builds `parser`, argv[@SKIP@:] is parsed
# (what follows the command words and the model); the engine's error() raises instead of exiting.
_ARGV_CHECK = r"""
for argv in facts["argvs"]:
    try:
@PARSER@
        def error(message):
            raise ValueError(message)
        parser.error = error
        parser.parse_args(argv[@SKIP@:])
        report("argv-parses", True, " ".join(argv[:@SKIP@ + 1]) + " ... parses")
    except SystemExit as e:
        report("argv-parses", False, f"the image's parser exited ({e})", "fix the flags the plan named")
    except Exception as e:
        report("argv-parses", False, f"{type(e).__name__}: {e}", "the planned flags are not this image's: fix the "
               "image tag, or the flag the message names")
"""


def argv_check(parser: str, skip: int) -> str:
    """The argv-parses check of an engine whose parser `parser` (Python lines, defining `parser`) builds, on
    every planned argv past its first `skip` words."""
    body = textwrap.indent(textwrap.dedent(parser).strip("\n"), " " * 8)
    return _ARGV_CHECK.replace("@PARSER@", body).replace("@SKIP@", str(skip))


EXIT = "\nsys.exit(1 if failed else 0)\n"


def python_check(*parts: str) -> str:
    """One check program: the preamble, the parts in order, exit 1 when a check failed."""
    return PREAMBLE + "".join(parts) + EXIT


# The Triton kernel of the fp16-dot check, on its own so the tests compile exactly this text. One 16x16x16
# fp16 tile product accumulated in fp32 (what every fp16 tl.dot kernel of vLLM lowers through).
TRITON_DOT_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def _dot16(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    c = tl.dot(a, b)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)
"""
DOT_BLOCK = 16
# How the tests and the gate specialise it for a compile: pointer element types and the constexpr.
DOT_SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BLOCK": "constexpr"}

# Triton compiles and runs TRITON_DOT_KERNEL (facts: kernel, block) on the device; needs TORCH_CHECKS first.
TRITON_DOT_CHECK = r"""
if ok:
    try:
        # @triton.jit reads its function's source from a file: write the kernel to one and import it.
        import importlib.util, os, tempfile
        path = os.path.join(tempfile.mkdtemp(), "llm_cluster_qualification_kernel.py")
        with open(path, "w") as f:
            f.write(facts["kernel"])
        spec = importlib.util.spec_from_file_location("llm_cluster_qualification_kernel", path)
        kernel = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernel)
        namespace = vars(kernel)
        import triton
        n = facts["block"]
        x = torch.randn(n, n, device="cuda", dtype=torch.float16)
        y = torch.randn(n, n, device="cuda", dtype=torch.float16)
        out = torch.empty(n, n, device="cuda", dtype=torch.float32)
        namespace["_dot16"][(1,)](x, y, out, BLOCK=n)
        torch.cuda.synchronize()
        err = out.sub(x.float() @ y.float()).abs().max().item()
        report("triton-fp16-dot", err < 0.5, f"triton {triton.__version__}: fp16 tl.dot on {arch}, max error {err:.4f}",
               "wrong results from Triton's fp16 dot on this GPU")
    except Exception as e:
        detail = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        report("triton-fp16-dot", False, f"Triton cannot compile or run an fp16 tl.dot on {arch}: {detail}",
               f"fused MoE, Triton attention and prefix prefill need it: use an image whose Triton compiles fp16 "
               f"dots for {arch} (Triton >= 3.4 on sm_70: {facts['recommended']})")
"""

# The fatbin parser's own text, for checks that read a library's kernels inside the image.
FATBIN_SOURCE = (NODE_PROGRAMS / "fatbin.py").read_text()


def compile_dot_kernel(capability: int, workdir: str) -> dict[str, object]:
    """Compile TRITON_DOT_KERNEL for GPUTarget("cuda", capability, 32) with the Triton on sys.path, no GPU
    needed: {"ok", "triton", "tensor_cores" (mma.sync in the PTX), "error"}. What the fp16-dot check hits."""
    return compile_kernel(TRITON_DOT_KERNEL, "_dot16", DOT_SIGNATURE, {"BLOCK": DOT_BLOCK}, capability, workdir)


def compile_kernel(
    text: str, fn: str, signature: dict[str, str], constexprs: dict[str, int], capability: int, workdir: str
) -> dict[str, object]:
    """Compile the @triton.jit function `fn` of `text` for GPUTarget("cuda", capability, 32) with the Triton on
    sys.path (no GPU needed): {"ok", "triton", "tensor_cores", "error" (the compiler's last line)}."""
    import importlib.util
    import os

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    name = f"llm_cluster_kernel_{fn.strip('_')}"
    path = os.path.join(workdir, f"{name}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jit = getattr(module, fn)
    try:  # Triton >= 3.3 takes constexprs in the signature and as `constexprs`
        source = ASTSource(fn=jit, signature=dict(signature), constexprs=dict(constexprs))
    except TypeError:
        source = ASTSource(
            fn=jit, constants=dict(constexprs), signature={k: v for k, v in signature.items() if v != "constexpr"}
        )
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
    except Exception as err:  # noqa: BLE001 - the compiler's own failure is the result
        lines = str(err).strip().splitlines() or [type(err).__name__]
        return {"ok": False, "triton": triton.__version__, "tensor_cores": False, "error": lines[-1]}
    return {"ok": True, "triton": triton.__version__, "tensor_cores": "mma.sync" in compiled.asm["ptx"], "error": ""}
