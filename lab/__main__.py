"""`python -m lab up|down|hosts|images|rehearse|destroy` — `make lab` is `up`, `make lab-down` is `down`.

up: the test hosts, the stand-in images (built once per machine), the source weights, then the
rehearsal of the stack's plan; it prints the gateway URL, a key, Prometheus and Grafana.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from lab import hosts
from lab.config import REPO, LabConfigError, LabStack, load_lab_stack


def weights(stack: LabStack) -> list[str]:
    """A generated model directory (config.json and a few MB of shards) on each model's source node."""
    import yaml

    doc = yaml.safe_load(stack.path.read_text())["config"]
    made = []
    real = dict(stack.real_vllm)
    for name, model in (doc.get("llm-cluster:models") or {}).items():
        node = (model.get("source") or {}).get("node")
        if not node:
            continue
        path = str(model["path"])
        if not path.startswith("/data/"):
            raise hosts.LabError(f"llm-cluster:models.{name}.path: the lab's hosts keep weights under /data")
        root = stack.host(node).dir / "data" / path.removeprefix("/data/")
        root.mkdir(parents=True, exist_ok=True)
        if name in real:
            real_model_files(name, model, real[name], root)
            made.append(f"{node}:{path} ({real[name]})")
            continue
        (root / "config.json").write_text(
            json.dumps({"model_type": model.get("arch", name), "lab": True, **engine_model_config(doc, name, model)})
        )
        engine_model_files(doc, name, root)
        for i in range(2):
            shard = root / f"model-0000{i + 1}-of-00002.safetensors"
            if not shard.exists():
                # Deterministic bytes, 2 MiB per shard: enough for rsync and the manifests to mean something.
                seed = f"{name}-{i}".encode()
                import hashlib

                block = b"".join(hashlib.sha256(seed + n.to_bytes(4, "big")).digest() for n in range(1024))
                shard.write_bytes(block * 64)
        made.append(f"{node}:{path}")
    return made


def real_model_files(name: str, model: dict, kind: str, root: Path) -> None:
    """The tiny model `kind` the real engine loads (lab/vllm_cpu.py model()), copied to `root`; its config.json
    must be the one the stack plans with (models.<name>.configJson), so the plan sizes the model it serves."""
    import shutil

    from lab import vllm_cpu

    made = vllm_cpu.model(kind)
    declared = model.get("configJson")
    if not declared or (REPO / declared).read_bytes() != (made / "config.json").read_bytes():
        raise hosts.LabError(
            f"llm-cluster:models.{name}.configJson: the lab serves its tiny {kind} for this model, so the stack must "
            f"plan with that model's config.json ({made / 'config.json'}; committed as lab/models/{kind}/config.json)"
        )
    for f in made.iterdir():
        shutil.copy2(f, root / f.name)


def real_vllm_images(stack: LabStack) -> list[str]:
    """The real-engine image loaded onto each host whose plan pulls it (lab/vllm_cpu.py IMAGE_DIFFERENCES:
    delivery); the hosts it was loaded on. Nothing for a stack without lab:realVllm."""
    from lab import images, vllm_cpu
    from lab.rehearse import IMAGE, plan_resources

    if not stack.real_vllm:
        return []
    vllm_cpu.engine()
    tar = images.real_vllm_image()
    providers = {r.urn: r for r in plan_resources(stack.path, stack.name)[0]}
    loaded = []
    for r in plan_resources(stack.path, stack.name)[0]:
        if r.type == IMAGE and r.inputs.get("name") == vllm_cpu.REAL_IMAGE:
            address = str((providers[r.provider.rsplit("::", 1)[0]].inputs if r.provider else {}).get("host", ""))
            host = next((h for h in stack.hosts if urlsplit(address).hostname == h.address), None)
            if host is None:
                raise hosts.LabError(f"{r.name}: cannot tell which lab host pulls {vllm_cpu.REAL_IMAGE} ({address!r})")
            hosts.sh("docker", "-H", f"unix://{host.dir}/run/docker.sock", "load", "-q", "-i", str(tar), timeout=900)
            loaded.append(host.node)
    return sorted(loaded)


def _pools_of(doc: dict, model: str) -> list[dict]:
    return [p for p in (doc.get("llm-cluster:pools") or {}).values() if p.get("model") == model]


def engine_model_config(doc: dict, name: str, model: dict) -> dict:
    """config.json keys an engine reads of the generated model: LMDeploy's `architectures` (its backend choice)."""
    from lab.standins import lmdeploy as lmdeploy_standin

    if any(p.get("engine") == "lmdeploy" for p in _pools_of(doc, name)) and model.get("arch"):
        return lmdeploy_standin.model_config(str(model["arch"]))
    return {}


def engine_model_files(doc: dict, name: str, root) -> None:  # type: ignore[no-untyped-def]
    """Weights an engine loads for real: llama.cpp pools' GGUF file (a tiny random llama the real server runs)."""
    from lab.standins import llamacpp as llamacpp_standin

    for pool in _pools_of(doc, name):
        if pool.get("engine") == "llamacpp":
            llamacpp_standin.write_gguf(root / str(pool["llamacpp"]["ggufFile"]))


def built_dockerfiles(stack: LabStack) -> list[Path]:
    """The Dockerfiles the stack's plan builds on a host (docker:RemoteImage with `build`)."""
    from lab.rehearse import IMAGE, dockerfile_of, plan_resources

    return sorted(
        {
            dockerfile_of(r.inputs["build"])
            for r in plan_resources(stack.path, stack.name)[0]
            if r.type == IMAGE and r.inputs.get("build")
        }
    )


def image_refs(stack: LabStack) -> list[str]:
    """The images the lab's registry serves for the stack: every image it pulls, and the base image of
    every one it builds on a host (the Dockerfile's FROM, pulled by that host's engine)."""
    from lab.debmirror import parse_dockerfile
    from lab.rehearse import IMAGE, plan_resources
    from lab.vllm_cpu import REAL_IMAGE

    pulled = {
        r.inputs["name"]
        for r in plan_resources(stack.path, stack.name)[0]
        if r.type == IMAGE and not r.inputs.get("build") and not (stack.real_vllm and r.inputs["name"] == REAL_IMAGE)
    }
    return sorted(pulled | {parse_dockerfile(f.read_text()).base for f in built_dockerfiles(stack)})


def debian_mirror(stack: LabStack) -> str | None:
    """The Debian archive the stack's host builds read, recorded (once per machine) and served in the lab."""
    from lab import debmirror, images

    files = built_dockerfiles(stack)
    if not files:
        return None
    if len(files) > 1:
        raise hosts.LabError(f"the lab serves one Debian mirror, for one Dockerfile; the stack builds {len(files)}")
    root = debmirror.record(files[0], images.debian_rootfs(debmirror.parse_dockerfile(files[0].read_text()).base))
    debmirror.serve(root)
    return debmirror.MIRROR_URL


def summary(rehearsal) -> str:  # type: ignore[no-untyped-def]
    """Where a person reaches the lab's stack from this machine, and a key to do it with."""
    from lab.config import STATE

    state = {s["name"]: s["outputs"] for s in rehearsal.state.values()}
    keys = state.get("gateway-keys", {}).get("stdout", "?")
    out = rehearsal.outputs
    lines = [f"gateway:    {out.get('gatewayUrl')}  (API keys: {keys})"]
    ca = state.get("gateway-tls", {}).get("stdout")
    if ca:  # the gatewayCaCert output: what gateway-tls prints
        path = STATE / "gateway-ca.pem"
        path.write_text(ca + "\n")
        lines.append(
            f"            its CA (output gatewayCaCert): {path}  e.g. curl --cacert {path} "
            f"{out.get('gatewayUrl')}/v1/models -H 'Authorization: Bearer <key>'"
        )
    lines += [
        f"Prometheus: {out.get('prometheusUrl')}",
        f"Grafana:    {out.get('grafanaUrl')}  (the lab's stand-in: /api/health only)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("action", choices=["up", "down", "hosts", "images", "rehearse", "destroy"])
    p.add_argument("--stack", default="lab", help="Pulumi.<stack>.yaml (default: lab)")
    args = p.parse_args(argv)
    try:
        stack = load_lab_stack(REPO / f"Pulumi.{args.stack}.yaml")
    except LabConfigError as e:
        print(f"lab: {e}", file=sys.stderr)
        return 2
    from lab.rehearse import RehearsalError

    try:
        # One lab per machine: the action holds /tmp/lab.lock (unless the caller runs under it already).
        with hosts.lab_lock(say=lambda line: print(line, file=sys.stderr)):
            return run(args.action, stack)
    except (hosts.LabError, RehearsalError) as e:
        print(f"lab: {e}", file=sys.stderr)
        return 1


def run(action: str, stack: LabStack) -> int:
    """One action of `python -m lab` on the lab stack."""
    from lab import images
    from lab.rehearse import ADAPTATIONS, Rehearsal

    if action == "down":
        left = hosts.down()
        if left:
            print("lab: left behind:\n  " + "\n  ".join(left), file=sys.stderr)
            return 1
        print("lab: down, nothing left behind")
        return 0
    if action in ("up", "hosts"):
        why = hosts.can_create_namespaces()
        if why:
            print(f"lab: cannot run here: {why}", file=sys.stderr)
            return 1
        t0 = time.monotonic()
        hosts.up(stack)
        print(f"lab: {len(stack.hosts)} hosts up in {time.monotonic() - t0:.0f}s")
        if action == "hosts":
            return 0
    if action in ("up", "images"):
        t0 = time.monotonic()
        images.ensure(image_refs(stack))
        print(f"lab: images served by the registry mirror ({time.monotonic() - t0:.0f}s)")
        if mirror := debian_mirror(stack):
            print(f"lab: the Debian packages the stack's image builds install, served at {mirror}")
        if loaded := real_vllm_images(stack):
            from lab.vllm_cpu import IMAGE_DIFFERENCES, REAL_IMAGE

            print(
                f"lab: the real vLLM engine's {REAL_IMAGE} loaded on {', '.join(loaded)}; it differs from the real image in:"
            )
            for what, why in IMAGE_DIFFERENCES.items():
                print(f"lab:   {what}: {why}")
        if action == "images":
            return 0
    agent = hosts.start_agent()
    r = Rehearsal(stack.path, stack.name, agent)
    if action == "destroy":
        r.destroy()
        print("lab: destroyed")
        return 0
    print("lab: weights on their source nodes: " + ", ".join(weights(stack)))
    t0 = time.monotonic()
    steps = r.up()
    ran = sum(s.action != "same" for s in steps)
    print(f"lab: up in {time.monotonic() - t0:.0f}s ({ran} of {len(steps)} steps ran)")
    for line in sorted(set(ADAPTATIONS)):
        print(f"lab: adapted to this machine: {line}")
    print(summary(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
