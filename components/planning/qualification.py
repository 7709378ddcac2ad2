"""The qualification gate: per node and serving image, a short GPU check run in that image before any
server starts (and while the weights still copy), so an image that cannot run on the node's GPU stops the
deploy in seconds with what failed and the fix, not after a 15-minute load.

`docker run --rm --gpus device=0 --entrypoint python3 <image> -c CHECK <json>` on the node runs CHECK
(plain Python, no project import) with the facts it must hold the image to:
  1. torch sees a GPU;
  2. the GPU's sm_XY is in torch.cuda.get_arch_list() (else "no kernel image is available");
  3. a small fp16 matmul runs and matches fp32;
  4. Triton compiles and runs an fp16 `tl.dot` kernel on the device (what fused MoE, Triton attention
     and prefix prefill need; Triton 3.3 cannot below sm_80);
  5. the engine imports at the version the facts expect;
  6. the planned argv parses with the engine's own parser in the image.
It prints one JSON line per check and exits 1 when one fails. TRITON_DOT_KERNEL is also compiled for
sm_70 against real Triton wheels by tests/test_qualification.py (no GPU needed to compile).
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from components.facts.images import DEFAULT_IMAGES, ImageFacts
from components.spec import StackSpec

# The Triton kernel of check 4, on its own so the tests compile exactly this text. One 16x16x16 fp16
# tile product accumulated in fp32 (what every fp16 tl.dot kernel of vLLM lowers through).
TRITON_DOT_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _dot16(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
    b = tl.load(b_ptr + offs[:, None] * BLOCK + offs[None, :])
    c = tl.dot(a, b)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], c)
'''
DOT_BLOCK = 16
# How the tests and the gate specialise it for a compile: pointer element types and the constexpr.
DOT_SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "BLOCK": "constexpr"}

CHECK = r'''
import json, sys, traceback
facts = json.loads(sys.argv[1])
failed = []

def report(check, ok, detail, fix=""):
    print(json.dumps({"check": check, "ok": ok, "detail": detail, **({"fix": fix} if not ok else {})}), flush=True)
    if not ok:
        failed.append(check)

try:
    import torch
    ok = torch.cuda.is_available() and torch.cuda.device_count() > 0
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
try:
    import importlib
    engine = importlib.import_module(facts["module"])
    version = getattr(engine, "__version__", "?")
    report("engine-version", version == facts["version"], f"{facts['module']} {version}, facts expect {facts['version']}",
           f"the image does not carry {facts['module']} {facts['version']}: fix the image tag or its declared facts")
except Exception as e:
    report("engine-version", False, f"import {facts['module']} failed: {e}", "the image does not carry the engine")
for argv in facts["argvs"]:
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        root = FlexibleArgumentParser(prog="vllm")
        parser = ServeSubcommand().subparser_init(root.add_subparsers())
        def error(message):
            raise ValueError(message)
        parser.error = error
        parser.parse_args(argv[2:])
        report("argv-parses", True, " ".join(argv[:3]) + " ... parses")
    except SystemExit as e:
        report("argv-parses", False, f"the image's parser exited ({e})", "fix the flags the plan named")
    except Exception as e:
        report("argv-parses", False, f"{type(e).__name__}: {e}", "the planned flags are not this image's: fix the "
               "image tag, or the flag the message names")
sys.exit(1 if failed else 0)
'''


def compile_dot_kernel(capability: int, workdir: str) -> dict[str, object]:
    """Compile TRITON_DOT_KERNEL for GPUTarget("cuda", capability, 32) with the Triton on sys.path, no GPU
    needed: {"ok", "triton", "tensor_cores" (mma.sync in the PTX), "error"}. What check 4 would hit."""
    return compile_kernel(TRITON_DOT_KERNEL, "_dot16", DOT_SIGNATURE, {"BLOCK": DOT_BLOCK}, capability, workdir)


def compile_kernel(text: str, fn: str, signature: dict[str, str], constexprs: dict[str, int], capability: int,
                   workdir: str) -> dict[str, object]:
    """Compile the @triton.jit function `fn` of `text` for GPUTarget("cuda", capability, 32) with the Triton on
    sys.path (no GPU needed): {"ok", "triton", "tensor_cores", "error" (the compiler's last line)}."""
    import importlib.util
    import os

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = os.path.join(workdir, f"llm_cluster_kernel_{fn.strip('_')}.py")
    with open(path, "w") as f:
        f.write(text)
    spec = importlib.util.spec_from_file_location(f"llm_cluster_kernel_{fn.strip('_')}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jit = getattr(module, fn)
    try:  # Triton >= 3.3 takes constexprs in the signature and as `constexprs`
        source = ASTSource(fn=jit, signature=dict(signature), constexprs=dict(constexprs))
    except TypeError:
        source = ASTSource(fn=jit, constants=dict(constexprs),
                           signature={k: v for k, v in signature.items() if v != "constexpr"})
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
    except Exception as err:  # noqa: BLE001 - the compiler's own failure is the result
        lines = str(err).strip().splitlines() or [type(err).__name__]
        return {"ok": False, "triton": triton.__version__, "tensor_cores": False, "error": lines[-1]}
    return {"ok": True, "triton": triton.__version__, "tensor_cores": "mma.sync" in compiled.asm["ptx"],
            "error": ""}


@dataclass(frozen=True)
class Qualification:
    """What one node's gate checks in one serving image."""

    node: str
    image: str
    facts: ImageFacts
    argvs: tuple[tuple[str, ...], ...]  # the server command lines planned on this node in this image
    recommended: str  # the image to name when this one cannot run
    ref: str = ""  # the image as the node's engine holds it (images.registry renames it); "" = image

    @property
    def node_ref(self) -> str:
        """What `docker run` names on the node."""
        return self.ref or self.image


def node_qualifications(spec: StackSpec) -> list[Qualification]:
    """One Qualification per node and serving image whose engine has a gate and whose image has facts
    (an image without facts gets the policy pack's advisory instead): the argvs it must parse are the
    instances' served from that node."""
    from components.planning.engines import engine_for
    from components.planning.topology import instances

    found: dict[tuple[str, str], tuple[ImageFacts, list[tuple[str, ...]], str]] = {}
    for name, pool in spec.pools.items():
        engine = engine_for(pool)
        facts = engine.image_facts(spec, name)
        if not engine.qualifies or facts is None:
            continue
        for inst in instances(spec, name):
            for node in inst.nodes:
                entry = found.setdefault((node, pool.image), (facts, [], DEFAULT_IMAGES[pool.engine]))
                if node == inst.head:
                    entry[1].append(tuple(engine.serve_argv(spec, inst)))
    from components.planning.image_supply import node_ref
    return [Qualification(node, image, facts, tuple(dict.fromkeys(argvs)), recommended, node_ref(spec, image))
            for (node, image), (facts, argvs, recommended) in sorted(found.items())]


def check_input(q: Qualification) -> str:
    """The JSON the check reads (argv[1]): the facts it holds the image to."""
    return json.dumps({"version": q.facts.version, "module": q.facts.engine, "kernel": TRITON_DOT_KERNEL,
                       "block": DOT_BLOCK, "argvs": [list(a) for a in q.argvs], "recommended": q.recommended},
                      sort_keys=True)


def qualification_script(q: Qualification, *, device: int = 0, timeout_s: int = 600) -> str:
    """Bash run on the node: the check in the image on one GPU, its lines shown, a failure explained."""
    return f"""#!/usr/bin/env bash
# Qualification gate: can {q.image} ({q.facts.engine} {q.facts.version}) run on this node's GPU? Checks torch's
# arch list, an fp16 matmul, a Triton fp16 dot, the engine version and the planned flags, in the image.
set -euo pipefail
image={shlex.quote(q.node_ref)}
node={shlex.quote(q.node)}
if ! out=$(timeout {int(timeout_s)} docker run --rm --gpus device={int(device)} --network none --entrypoint python3 \\
    "$image" -c {shlex.quote(CHECK)} {shlex.quote(check_input(q))} 2>&1); then
  echo "$out"
  echo "qualification: $image cannot serve on $node (GPU {int(device)}); the failed checks above say why and" \\
    "what to change. Nothing was started on this node." >&2
  exit 1
fi
echo "$out"
echo "qualification: $image qualified on $node"
"""
