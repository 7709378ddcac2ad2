"""The qualification gate: per node and serving image, a short GPU check run in that image before any
server starts (and while the weights still copy), so an image that cannot run on the node's GPU stops the
deploy in seconds with what failed and the fix, not after a 15-minute load.

What runs is the engine's (Engine.gate_check, composed from components.engines.gate):
  vLLM       torch sees the GPU, it is the planned GPU, sm_XY is in torch.cuda.get_arch_list(), an fp16
             matmul is right, Triton compiles and runs an fp16 `tl.dot` (Triton 3.3 cannot below sm_80),
             vllm imports at the expected version, every planned argv parses with the image's parser;
  LMDeploy   the same torch checks, TurboMind's _turbomind.so has SASS for the GPU, lmdeploy imports at
             the expected version, the planned `serve api_server` argv parses with lmdeploy's parser;
  llama.cpp  llama-server's build is the expected one, it lists a CUDA device of the planned compute
             capability, and the planned argv gets past llama-server's own parser.
This module only collects the gates (one per node and image, with the argvs served there) and writes the
script that runs one: `docker run --rm --gpus device=0 --network none --entrypoint … <image> …`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from components.engines.base import masked_secrets
from components.engines.gate import GateCheck
from components.engines.registry import engine_for
from components.planning.image_supply import node_ref
from components.spec import StackSpec
from components.spec.topology import instances


@dataclass(frozen=True)
class Qualification:
    """One node's gate for one serving image."""

    node: str
    image: str
    check: GateCheck
    argvs: tuple[tuple[str, ...], ...]  # the server command lines planned on this node in this image
    ref: str = ""  # the image as the node's engine holds it (images.registry renames it); "" = image

    @property
    def node_ref(self) -> str:
        """What `docker run` names on the node."""
        return self.ref or self.image


def node_qualifications(spec: StackSpec) -> list[Qualification]:
    """One Qualification per node and serving image whose engine has a gate for it (an image without facts
    gets the policy pack's advisory instead): the argvs it must parse are the instances' served from that
    node; a Ray worker node runs the image's GPU code with none of its own."""
    found: dict[tuple[str, str], tuple[str, list[tuple[str, ...]]]] = {}
    for name, pool in spec.pools.items():
        if not pool.qualification_gate:
            continue
        engine = engine_for(pool)
        for inst in instances(spec, name):
            for node in inst.nodes:
                entry = found.setdefault((node, pool.image), (name, []))
                if node == inst.head:
                    # The parse needs the flags, not the credentials: the gate's command (and its log) never
                    # holds them; the pool's own containers carry them, and the pack reports them there.
                    entry[1].append(tuple(masked_secrets(engine.serve_argv(spec, inst), engine.secret_flags)))
    out = []
    for (node, image), (pool, argvs) in sorted(found.items()):
        unique = tuple(dict.fromkeys(argvs))
        check = engine_for(spec.pools[pool]).gate_check(spec, pool, node, unique)
        if check is not None:
            out.append(Qualification(node, image, check, unique, node_ref(spec, image)))
    return out


def qualification_script(q: Qualification, *, device: int = 0, timeout_s: int = 600) -> str:
    """Bash run on the node: the engine's check in the image on one GPU, its lines shown, a failure explained."""
    run = " ".join(shlex.quote(a) for a in q.check.args)
    return f"""#!/usr/bin/env bash
# Qualification gate: can {q.image} ({q.check.engine}) run on this node's GPU? Checks {q.check.checks}, in the image.
set -euo pipefail
image={shlex.quote(q.node_ref)}
node={shlex.quote(q.node)}
# The check is a program for the image's interpreter, quoted so that nothing in it expands here.
# shellcheck disable=SC2016
if ! out=$(timeout {int(timeout_s)} docker run --rm --gpus device={int(device)} --network none \\
    --entrypoint {shlex.quote(q.check.entrypoint)} "$image" {run} 2>&1); then
  echo "$out"
  echo "qualification: $image cannot serve on $node (GPU {int(device)}); the failed checks above say why and" \\
    "what to change. Nothing was started on this node." >&2
  exit 1
fi
echo "$out"
echo "qualification: $image qualified on $node"
"""
