"""Stand-in images under the exact names the stack uses, built locally and served by the lab's registry.

Nothing comes from an image registry: a Debian root file system from debootstrap is the base; each
image adds Debian packages (installed in a chroot of the base) or PyPI wheels, and its stand-in
program, as one layer over the shared base; it carries the real image's ENTRYPOINT, CMD, USER,
WORKDIR and paths (each fact below says where it is from). Built once per machine into
/var/cache/llm-cluster/lab/ (the registry's storage and a stamp of the build inputs); a missing or
stale cache is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from components.planning.gateway.image import CONTEXT_DIR as GATEWAY_CONTEXT
from components.planning.gateway.image import GATEWAY_IMAGE
from lab.config import CACHE, LAB_DIR, REGISTRY_ADDRESS, REPO, STATE
from lab.hosts import REGISTRY_NS, LabError, sh
from lab.standins import llamacpp as llamacpp_standin
from lab.standins import lmdeploy as lmdeploy_standin

SUITE = "bookworm"
BASE_PACKAGES = ("python3", "procps", "ca-certificates", "iproute2", "curl", "openssh-client", "rsync")
# The Ray of the real vLLM images (same major version): vLLM 0.9.2 requires ray[cgraph]>=2.43 and its
# image, built July 2025, installs 2.47.x (requirements/cuda.txt at v0.9.2). The stand-in installs
# ray[client]: `ray start --head --ray-client-server-port` needs its grpc server.
RAY_FOR_VLLM = {"0.9": "2.47.1", "0.10": "2.48.0", "0.11": "2.49.2"}
RAY_DEFAULT = "2.49.2"
# The stand-in torch computes on numpy (lab/standins/vllm/torch): the test venv's release.
NUMPY = "2.4.6"


@dataclass(frozen=True)
class Kind:
    """One kind of stand-in: what it adds to the base and the real image's runtime facts."""

    packages: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    user: str | None = None
    workdir: str | None = None
    stopsignal: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    source: str = ""
    run: tuple[str, ...] = ()  # Dockerfile lines after the files are in (RUN, HEALTHCHECK)


KINDS: dict[str, Kind] = {
    "vllm": Kind(
        entrypoint=("python3", "-m", "vllm.entrypoints.openai.api_server"),
        workdir="/vllm-workspace",
        source="vllm-project/vllm docker/Dockerfile (vllm-openai target): "
        'ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"], root',
    ),
    # Not a stand-in: the real vLLM 0.19.1 (its CPU build) under the real image's name, ENTRYPOINT and layout
    # (lab/vllm_cpu.py IMAGE_DIFFERENCES says what differs; built by real_vllm_image, not from the registry).
    "vllm-real": Kind(
        # libnuma1: the CPU build's vllm/_C*.so link libnuma.so.1 (without it: no CPU ops); g++ and Python's headers:
        # torch's Inductor compiles CPU kernels at the engine's warm-up even with --enforce-eager (InvalidCxxCompiler
        # without a compiler).
        packages=("libnuma1", "g++", "python3-dev"),
        entrypoint=("vllm", "serve"),
        workdir="/vllm-workspace",
        env={"VLLM_USAGE_SOURCE": "production-docker-image"},
        source="vllm-project/vllm docker/Dockerfile, vllm-openai target (FROM vllm-openai-base): "
        'ENTRYPOINT ["vllm", "serve"], no CMD, no USER (root; the vllm-openai-nonroot target is opt-in), '
        "WORKDIR /vllm-workspace, ENV VLLM_USAGE_SOURCE production-docker-image, packages installed with "
        "uv pip install --system into /usr/local/lib/python3.12/dist-packages, ray from requirements/cuda.txt "
        "(read at the stored commit dead20ba; the ENTRYPOINT was python3 -m vllm.entrypoints.openai.api_server "
        "up to v0.9.2, docker/Dockerfile:527)",
    ),
    "dcgm-exporter": Kind(
        entrypoint=("/usr/local/dcgm/dcgm-exporter-entrypoint.sh",),
        source="NVIDIA/dcgm-exporter docker/Dockerfile: ENTRYPOINT /usr/local/dcgm/dcgm-exporter-entrypoint.sh",
    ),
    "node-exporter": Kind(
        packages=("prometheus-node-exporter",),
        entrypoint=("/bin/node_exporter",),
        user="nobody",
        source='prometheus/node_exporter Dockerfile: ENTRYPOINT ["/bin/node_exporter"], USER nobody',
    ),
    "prometheus": Kind(
        packages=("prometheus",),
        entrypoint=("/bin/prometheus",),
        cmd=("--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"),
        user="nobody",
        workdir="/prometheus",
        source='prometheus/prometheus Dockerfile: ENTRYPOINT ["/bin/prometheus"], CMD '
        "--config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path=/prometheus, "
        "USER nobody, WORKDIR /prometheus",
    ),
    "grafana": Kind(
        packages=("python3-yaml",),
        entrypoint=("/run.sh",),
        user="472",
        env={"GF_PATHS_PROVISIONING": "/etc/grafana/provisioning", "GF_PATHS_DATA": "/var/lib/grafana"},
        source='grafana/grafana Dockerfile: ENTRYPOINT ["/run.sh"], USER 472 (grafana), '
        "GF_PATHS_PROVISIONING=/etc/grafana/provisioning",
    ),
    # E's engine stand-ins (lab/standins/llamacpp, lab/standins/lmdeploy: each module's docstring says what).
    "llamacpp": Kind(
        packages=llamacpp_standin.PACKAGES,
        entrypoint=llamacpp_standin.ENTRYPOINT,
        workdir=llamacpp_standin.WORKDIR,
        env=llamacpp_standin.ENV,
        run=llamacpp_standin.DOCKERFILE_LINES,
        source=llamacpp_standin.SOURCE,
    ),
    "lmdeploy": Kind(
        packages=lmdeploy_standin.PACKAGES, entrypoint=lmdeploy_standin.ENTRYPOINT, source=lmdeploy_standin.SOURCE
    ),
}

DEBIAN_SOURCE = (
    "debuerreotype (docker-library/debian): one layer of debootstrap --variant=minbase, "
    'minimizing-config and slimify; CMD ["bash"]'
)

# Which stand-in an image repository gets.
REPOSITORIES = {
    "vllm/vllm-openai": "vllm",
    "ghcr.io/ggml-org/llama.cpp": "llamacpp",
    "openmmlab/lmdeploy": "lmdeploy",
    "nvcr.io/nvidia/k8s/dcgm-exporter": "dcgm-exporter",
    "prom/node-exporter": "node-exporter",
    "prom/prometheus": "prometheus",
    "grafana/grafana": "grafana",
    "debian": "debian",  # the base image of a Dockerfile a lab host builds (the default gateway image)
    # Not a stand-in: the default gateway image itself, for a stack that pulls it (air-gapped).
    GATEWAY_IMAGE.split(":", 1)[0]: "gateway",
}


def split_ref(ref: str) -> tuple[str, str]:
    """`repo:tag` (a registry host with a port stays in the repo)."""
    repo, _, tag = ref.rpartition(":")
    if not repo or "/" in tag:
        return ref, "latest"
    return repo, tag


def registry_path(repo: str) -> str:
    """The repository path the mirror serves: Docker Hub's `library/` for official images, nvcr.io's own."""
    first = repo.split("/")[0]
    if "." in first or ":" in first:
        return repo.split("/", 1)[1]
    return repo if "/" in repo else f"library/{repo}"


def kind_of(ref: str) -> str:
    repo, tag = split_ref(ref)
    kind = REPOSITORIES.get(repo)
    if kind is None:
        raise LabError(f"no lab stand-in for image {ref!r}; the lab builds: {', '.join(sorted(REPOSITORIES))}")
    if kind == "debian" and not tag.endswith("-slim"):
        raise LabError(f"no lab stand-in for image {ref!r}: the lab builds Debian's <release>-slim images")
    return kind


def debian_rootfs(ref: str) -> Path:
    """The root file system (a tarball) of the `debian:<release>-slim` stand-in: debootstrap, slimmed."""
    kind_of(ref)
    return _base(split_ref(ref)[1].removesuffix("-slim"))


def vllm_facts(tag: str) -> dict:
    """The image's vLLM version, its parser dump and metric names (project data, per version)."""
    version = tag.lstrip("v")
    dump = REPO / "components" / "engines" / "vllm" / "data" / f"vllm-{version}-serve-args.json"
    metrics = sorted((REPO / "tests" / "fixtures" / "metrics").glob(f"vllm-{version}*.txt"))
    if not dump.exists() or not metrics:
        raise LabError(
            f"the vLLM stand-in for {tag} needs the real parser dump components/engines/vllm/data/vllm-{version}-"
            f"serve-args.json and a metric list tests/fixtures/metrics/vllm-{version}*.txt"
        )
    # The planner's methods over the engine images it knows (components.engines.vllm.facts).
    from components.engines.vllm.facts import QUANTIZATION_METHODS

    minor = ".".join(version.split(".")[:2])
    return {
        "version": version,
        "dump": dump,
        "metrics": metrics[0],
        "ray": RAY_FOR_VLLM.get(minor, RAY_DEFAULT),
        "quantizations": sorted(QUANTIZATION_METHODS),
        "standin": standin_facts(f"vllm/vllm-openai:{tag}"),
    }


def standin_facts(ref: str) -> dict:
    """What the stand-in torch and triton report in image `ref` (lab/standins/vllm/torch, triton): the
    image's torch, CUDA, arch list and Triton from the project's facts, the Triton release's verdict on
    fp16 dots, and the GPU the lab hosts pretend to have (the one their nvidia-smi shims print)."""
    from components.engines.vllm.facts import image_facts

    facts = image_facts(ref)
    if facts is None or facts.triton_facts is None:
        raise LabError(
            f"the vLLM stand-in for {ref} needs its torch and Triton facts in components/engines/vllm/facts.py "
            "(the qualification gate checks them in the image)"
        )
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_gpu_shim", LAB_DIR / "shims" / "gpu_shim.py")
    assert spec is not None and spec.loader is not None
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    name, count, capability = shim.gpu_model(REPO / "tests" / "fixtures" / "preflight")
    return {
        "torch": facts.torch,
        "cuda": facts.cuda,
        "torch_arch_list": list(facts.torch_arch_list),
        "triton": facts.triton,
        "fp16_dot_min_capability": facts.triton_facts.fp16_dot_min_capability,
        "triton_failure": facts.triton_facts.failure,
        "gpu": {"name": name, "count": count, "capability": capability},
    }


# What each stand-in is made of under lab/standins (a directory: its *.py files), besides this module.
KIND_FILES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "openai_http.py"),
    "dcgm-exporter": ("dcgm_exporter.py",),
    "grafana": ("grafana.py",),
    "lmdeploy": ("lmdeploy", "openai_http.py", "vllm/torch"),
    "llamacpp": ("llamacpp",),
}


def inputs_hash(ref: str) -> str:
    """What one image is built from: this module, its stand-in's files, the data it carries, its name."""
    kind = kind_of(ref)
    h = hashlib.sha256(Path(__file__).read_bytes() + ref.encode())
    for rel in KIND_FILES.get(kind, ()):
        path = LAB_DIR / "standins" / rel
        for f in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(f.read_bytes())
    if kind == "gateway":
        h.update((GATEWAY_CONTEXT / "Dockerfile").read_bytes())
    elif kind == "debian":
        tar = CACHE / "base" / f"{split_ref(ref)[1].removesuffix('-slim')}.tar"
        h.update(str(tar.stat().st_size if tar.exists() else 0).encode())
    elif kind == "vllm":
        f = vllm_facts(split_ref(ref)[1])
        h.update(
            f["dump"].read_bytes()
            + f["metrics"].read_bytes()
            + f["ray"].encode()
            + json.dumps(f["standin"], sort_keys=True).encode()
        )
    elif kind == "lmdeploy":
        h.update(
            json.dumps(lmdeploy_standin.standin_facts(ref), sort_keys=True).encode()
            + (REPO / "components" / "engines" / "lmdeploy" / "tools" / "dump_lmdeploy.py").read_bytes()
        )
    return h.hexdigest()[:16]


# --- building -------------------------------------------------------------------------------------


def _base(suite: str = SUITE) -> Path:
    """A debootstrap root file system of `suite` (cached), as a tarball for `docker import`."""
    tar = CACHE / "base" / f"{suite}.tar"
    if tar.exists():
        return tar
    root = CACHE / "base" / f"rootfs-{suite}.tmp"
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    print(f"lab images: debootstrap {suite} (once per machine)", flush=True)
    include = BASE_PACKAGES if suite == SUITE else ()
    sh(
        "debootstrap",
        "--variant=minbase",
        *([f"--include={','.join(include)}"] if include else []),
        suite,
        str(root),
        "http://deb.debian.org/debian",
        timeout=1800,
    )
    if suite != SUITE:
        _slimify(root)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (root / junk).glob("*"):
            if p.is_file():
                p.unlink()
    sh("tar", "-C", str(root), "-cf", str(tar) + ".tmp", ".", timeout=600)
    Path(str(tar) + ".tmp").rename(tar)
    shutil.rmtree(root)
    return tar


# What makes Debian's official `debian:<release>-slim` image slim and container-shaped, as its build
# (debuerreotype: minimizing-config and slimify) writes it: apt keeps no caches, fetches no translations
# and suggests nothing; dpkg leaves out documentation, manuals and locales.
SLIM_FILES = {
    "etc/apt/apt.conf.d/docker-autoremove-suggests": 'Apt::AutoRemove::SuggestsImportant "false";\n',
    "etc/apt/apt.conf.d/docker-clean": (
        'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
        '/var/cache/apt/*.bin || true"; };\n'
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb '
        '/var/cache/apt/*.bin || true"; };\n'
        'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";\n'
    ),
    "etc/apt/apt.conf.d/docker-gzip-indexes": 'Acquire::GzipIndexes "true";\n',
    "etc/apt/apt.conf.d/docker-no-languages": 'Acquire::Languages "none";\n',
    "etc/dpkg/dpkg.cfg.d/docker": "".join(
        f"path-exclude {p}\n"
        for p in (
            "/usr/share/doc/*",
            "/usr/share/info/*",
            "/usr/share/linda/*",
            "/usr/share/lintian/overrides/*",
            "/usr/share/locale/*",
            "/usr/share/man/*",
            "/usr/share/groff/*",
        )
    )
    + ("path-include /usr/share/doc/*/copyright\npath-include /usr/share/locale/locale.alias\n"),
}


def _slimify(root: Path) -> None:
    """The base as Debian's slim image: its apt and dpkg configuration, and what dpkg would now leave out."""
    for rel, text in SLIM_FILES.items():
        _text(root / rel, text)
    for d in ("usr/share/info", "usr/share/linda", "usr/share/man", "usr/share/groff", "usr/share/lintian/overrides"):
        for p in (root / d).glob("*"):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in (root / "usr/share/locale").glob("*"):
        if p.name != "locale.alias":
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in (root / "usr/share/doc").glob("*/*"):
        if p.name != "copyright":
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _packages_layer(packages: tuple[str, ...], work: Path) -> Path:
    """The files Debian packages add to the base: installed in a chroot of it, diffed against it (cached)."""
    layer = CACHE / "layers" / hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:16]
    if layer.exists():
        return layer
    base_root, full = work / "base", work / "full"
    if not base_root.exists():
        base_root.mkdir(parents=True)
        sh("tar", "-C", str(base_root), "-xf", str(_base()), timeout=600)
    shutil.rmtree(full, ignore_errors=True)
    shutil.rmtree(layer, ignore_errors=True)
    sh("cp", "-a", str(base_root), str(full), timeout=600)
    (full / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
    (full / "usr/sbin/policy-rc.d").chmod(0o755)
    shutil.copy2("/etc/resolv.conf", full / "etc/resolv.conf")
    env = ["env", "DEBIAN_FRONTEND=noninteractive", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]
    sh(*env, "chroot", str(full), "apt-get", "update", "-qq", timeout=600)
    sh(*env, "chroot", str(full), "apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages, timeout=1200)
    sh("chroot", str(full), "apt-get", "clean")
    (full / "usr/sbin/policy-rc.d").unlink()
    shutil.rmtree(full / "var/lib/apt/lists", ignore_errors=True)
    (full / "var/lib/apt/lists").mkdir()
    # Only what differs from the base: one layer over the shared base layer.
    tmp = layer.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    sh("rsync", "-a", f"--compare-dest={base_root}/", f"{full}/", f"{tmp}/", timeout=600)
    shutil.rmtree(full)
    tmp.rename(layer)
    return layer


def _context(ref: str, work: Path) -> Path:
    """The build context of one image: its added files and a Dockerfile with the real image's facts."""
    kind_name = kind_of(ref)
    kind = KINDS[kind_name]
    ctx = work / "ctx" / ref.replace("/", "_").replace(":", "_")
    shutil.rmtree(ctx, ignore_errors=True)
    files = ctx / "files"
    if kind.packages:
        shutil.copytree(_packages_layer(kind.packages, work), files, symlinks=True)
    else:
        files.mkdir(parents=True)
    standins = LAB_DIR / "standins"
    links: list[tuple[str, str]] = []
    extra_env = dict(kind.env)
    if kind_name == "vllm":
        facts = vllm_facts(split_ref(ref)[1])
        site = files / "usr/local/lib/python3.11/dist-packages"
        site.mkdir(parents=True, exist_ok=True)
        pip = REPO / ".venv" / "bin" / "pip"
        sh(
            str(pip),
            "install",
            "-q",
            "--no-warn-script-location",
            "--target",
            str(site),
            f"ray[client]=={facts['ray']}",
            f"numpy=={NUMPY}",
            timeout=1200,
        )
        shutil.rmtree(site / "bin", ignore_errors=True)  # scripts with this machine's interpreter path
        for package in ("vllm", "torch", "triton"):
            shutil.copytree(standins / "vllm" / package, site / package)
        shutil.copy2(standins / "openai_http.py", site / "openai_http.py")
        (site / "standin.json").write_text(json.dumps(facts["standin"], indent=1))
        shutil.copy2(facts["dump"], site / "vllm" / "serve-args.json")
        shutil.copy2(facts["metrics"], site / "vllm" / "metrics.txt")
        (site / "vllm" / "version.json").write_text(
            json.dumps({"version": facts["version"], "quantizations": facts["quantizations"]})
        )
        _script(files / "usr/local/bin/vllm", "from vllm.entrypoints.cli.main import main\nsys.exit(main())")
        _script(files / "usr/local/bin/ray", "from ray.scripts.scripts import main\nsys.exit(main())")
        (files / "vllm-workspace").mkdir()
        extra_env["LAB_STANDIN"] = (
            f"vllm {facts['version']} with ray {facts['ray']}; stand-in torch "
            f"{facts['standin']['torch']} and triton {facts['standin']['triton']}"
        )
    elif kind_name == "llamacpp":
        llamacpp_standin.add_image_files(files)
    elif kind_name == "lmdeploy":
        extra_env.update(lmdeploy_standin.add_image_files(files, ref, REPO / ".venv" / "bin" / "pip", NUMPY))
    elif kind_name == "dcgm-exporter":
        d = files / "usr/local/dcgm"
        d.mkdir(parents=True)
        shutil.copy2(standins / "dcgm_exporter.py", d / "dcgm_exporter.py")
        shutil.copy2(REPO / "tests/fixtures/metrics/dcgm-exporter-default-counters.txt", d / "dcgm-counters.txt")
        _text(
            d / "dcgm-exporter-entrypoint.sh", '#!/bin/sh\nexec python3 /usr/local/dcgm/dcgm_exporter.py "$@"\n', 0o755
        )
    elif kind_name == "node-exporter":
        links += [("/usr/bin/prometheus-node-exporter", "/bin/node_exporter")]
    elif kind_name == "prometheus":
        # /bin is /usr/bin in bookworm: /bin/prometheus is Debian's binary already.
        (files / "prometheus").mkdir()
        (files / "etc/prometheus").mkdir(parents=True, exist_ok=True)
    elif kind_name == "grafana":
        shutil.copy2(standins / "grafana.py", files / "grafana.py")
        _text(files / "run.sh", '#!/bin/sh\nexec python3 /grafana.py "$@"\n', 0o755)
        for d in ("etc/grafana/provisioning", "var/lib/grafana", "usr/share/grafana"):
            (files / d).mkdir(parents=True, exist_ok=True)
        extra_env["LAB_GRAFANA_VERSION"] = split_ref(ref)[1]
    lines = [f"FROM lab/base:{SUITE}", "COPY files/ /"]
    for target, link in links:
        lines.append(f"RUN mkdir -p {Path(link).parent} && ln -sfn {target} {link}")
    if kind_name == "prometheus":
        lines.append("RUN chown -R nobody:nogroup /prometheus /etc/prometheus")
    if kind_name == "grafana":
        lines.append("RUN chown -R 472:0 /var/lib/grafana /etc/grafana")
    lines += kind.run
    lines.append(f"LABEL org.llm-cluster.lab.standin={json.dumps(kind.source)}")
    for k, v in sorted(extra_env.items()):
        lines.append(f"ENV {k}={json.dumps(v)}")
    if kind.workdir:
        lines.append(f"WORKDIR {kind.workdir}")
    if kind.user:
        lines.append(f"USER {kind.user}")
    if kind.stopsignal:
        lines.append(f"STOPSIGNAL {kind.stopsignal}")
    if kind.entrypoint:
        lines.append(f"ENTRYPOINT {json.dumps(list(kind.entrypoint))}")
    if kind.cmd:
        lines.append(f"CMD {json.dumps(list(kind.cmd))}")
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    return ctx


def _import_debian(b: Builder, ref: str, name: str) -> str:
    """The `debian:<release>-slim` stand-in into the builder as `name`: one layer, as Debian's own images
    are (the slimmed debootstrap tree), with their CMD. Its image id."""
    return sh(
        *b.docker(
            "import",
            "--change",
            'CMD ["bash"]',
            "--change",
            f"LABEL org.llm-cluster.lab.standin={json.dumps(DEBIAN_SOURCE)}",
            str(debian_rootfs(ref)),
            name,
        ),
        timeout=900,
    ).strip()


def _gateway_image(b: Builder, target: str) -> str:
    """The default gateway image built from the project's own Dockerfile, as an air-gapped site's operator
    builds it before pushing it to the site's registry (`python -m ops.images`): FROM the lab's
    `debian:<release>-slim`, apt reading the lab's Debian mirror (recorded for this very Dockerfile) with
    Debian's signatures checked. The builder's dockerd is in the registry host's namespace, where that
    mirror listens: the build runs on its network (`--network host`). Its image id."""
    from lab import debmirror

    dockerfile = GATEWAY_CONTEXT / "Dockerfile"
    df = debmirror.parse_dockerfile(dockerfile.read_text())
    # FROM resolves in the builder's own store (it pulls from nowhere): the base under its own name.
    _import_debian(b, df.base, df.base)
    debmirror.serve(debmirror.record(dockerfile, debian_rootfs(df.base)))
    try:
        args = [a for k, v in debmirror.lab_build_args(df).items() for a in ("--build-arg", f"{k}={v}")]
        p = subprocess.run(
            b.docker("build", "-q", "--network", "host", *args, "-t", target, str(GATEWAY_CONTEXT)),
            capture_output=True,
            text=True,
            env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            timeout=1800,
        )
    finally:
        debmirror.stop()  # served again by the stack that builds it on a host (lab/__main__.py debian_mirror)
    if p.returncode:
        raise LabError(
            f"building the gateway image {GATEWAY_IMAGE} from {dockerfile} failed: {p.stderr.strip()[-2000:]}"
        )
    return p.stdout.strip()


def _script(path: Path, body: str) -> None:
    _text(path, f"#!/usr/bin/python3\nimport sys\n{body}\n", 0o755)


def _text(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


class Builder:
    """A dockerd of its own in the registry's namespace: it builds (no network needed) and pushes."""

    def __init__(self) -> None:
        self.run = STATE / "builder"
        self.sock = self.run / "docker.sock"
        self.pid: int | None = None

    def __enter__(self) -> Builder:
        self.run.mkdir(parents=True, exist_ok=True)
        data = CACHE / "builder"
        data.mkdir(parents=True, exist_ok=True)
        log = open(self.run / "dockerd.log", "ab")
        p = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{REGISTRY_NS}",
                "dockerd",
                "--data-root",
                str(data),
                "--exec-root",
                str(self.run / "exec"),
                "-H",
                f"unix://{self.sock}",
                "--pidfile",
                str(self.run / "docker.pid"),
                "--iptables=false",
                "--ip-masq=false",
                "--bridge=none",
                "--insecure-registry",
                REGISTRY_ADDRESS,
            ],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = p.pid
        self.proc = p
        deadline = time.monotonic() + 60
        while subprocess.run(self.docker("version"), capture_output=True).returncode:
            if time.monotonic() > deadline or p.poll() is not None:
                raise LabError(f"the image builder's dockerd did not start (see {self.run}/dockerd.log)")
            time.sleep(0.3)
        return self

    def docker(self, *args: str) -> list[str]:
        return ["/usr/bin/docker", "-H", f"unix://{self.sock}", *args]

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # A build on the host network (the gateway image's) leaves dockerd's bind mount of that namespace
        # (<exec root>/netns/default) behind when it exits, and `down` could not remove the lab's state.
        for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
            point = line.split()[4]
            if point.startswith(f"{self.run}/"):
                sh("umount", point)


def in_registry(ref: str) -> bool:
    """The mirror serves this name and tag."""
    repo, tag = split_ref(ref)
    req = urllib.request.Request(
        f"http://{REGISTRY_ADDRESS}/v2/{registry_path(repo)}/manifests/{tag}",
        method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def ensure(refs: list[str]) -> dict[str, str]:
    """Every ref served by the running registry mirror; an image is built only when the cache lacks it or
    its own inputs changed (each has its stamp: the lab stack and the air-gapped one share the rest)."""
    refs = sorted(set(refs))
    digests = {ref: inputs_hash(ref) for ref in refs}
    stamp_path = CACHE / "images.json"
    stamp = json.loads(stamp_path.read_text()) if stamp_path.exists() else {}
    # One entry per image (another stack's images stay valid): {ref: {"inputs": digest, "id": image id}}.
    known = {r: e for r, e in (stamp.get("built") or {}).items() if isinstance(e, dict)}
    stale = [r for r in refs if (known.get(r) or {}).get("inputs") != digests[r] or not in_registry(r)]
    if not stale:
        return {r: known[r]["id"] for r in refs}
    started = time.monotonic()
    work = CACHE / "work"
    with Builder() as b:
        if any(kind_of(r) not in ("debian", "gateway") for r in stale):
            sh(*b.docker("import", str(_base()), f"lab/base:{SUITE}"), timeout=900)
        for ref in stale:
            what = "the image itself, from its Dockerfile" if kind_of(ref) == "gateway" else f"{kind_of(ref)} stand-in"
            print(f"lab images: building {ref} ({what})", flush=True)
            target = f"{REGISTRY_ADDRESS}/{registry_path(split_ref(ref)[0])}:{split_ref(ref)[1]}"
            if kind_of(ref) == "gateway":
                image_id = _gateway_image(b, target)
            elif kind_of(ref) == "debian":
                image_id = _import_debian(b, ref, target)
            else:
                image_id = _build(b, target, _context(ref, work), f"the stand-in for {ref}")
            sh(*b.docker("push", target), timeout=1800)
            known[ref] = {"inputs": digests[ref], "id": image_id}
            stamp_path.write_text(json.dumps({"built": known}, indent=1, sort_keys=True))
    shutil.rmtree(work, ignore_errors=True)
    print(f"lab images: {len(stale)} stand-in(s) built and pushed in {time.monotonic() - started:.0f}s", flush=True)
    return {r: known[r]["id"] for r in refs}


def _build(b: Builder, target: str, ctx: Path, what: str) -> str:
    """`docker build` of a context on the builder's engine (the classic builder, as the lab's images need no
    BuildKit): the image id, or a LabError naming `what` with the build's last output."""
    p = subprocess.run(
        b.docker("build", "-q", "-t", target, str(ctx)),
        capture_output=True,
        text=True,
        env={"DOCKER_BUILDKIT": "0", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        timeout=1800,
    )
    if p.returncode:
        raise LabError(f"building {what} failed: {p.stderr.strip()[-2000:]}")
    return p.stdout.strip()


# --- the real-engine image ------------------------------------------------------------------------------------


def real_vllm_image() -> Path:
    """The lab's real-engine `vllm/vllm-openai:v0.19.1` as a `docker save` tarball (cached by its inputs): the
    base, a `vllm` command that runs the engine's own CLI entry point with the image's python3, the real
    image's ENTRYPOINT, WORKDIR and ENV, and an empty IMAGE_SITE_PACKAGES where the engine is bind-mounted
    (lab/vllm_cpu.py IMAGE_DIFFERENCES)."""
    from lab import vllm_cpu

    kind = KINDS["vllm-real"]
    key = hashlib.sha256(
        Path(__file__).read_bytes() + json.dumps(dict(vllm_cpu.IMAGE_DIFFERENCES), sort_keys=True).encode()
    ).hexdigest()[:16]
    tar = CACHE / f"vllm-real-{key}.tar"
    if tar.exists():
        return tar
    for old in CACHE.glob("vllm-real-*.tar"):
        old.unlink()
    work = CACHE / "work"
    ctx = work / "ctx" / "vllm-real"
    shutil.rmtree(ctx, ignore_errors=True)
    files = ctx / "files"
    shutil.copytree(_packages_layer(kind.packages, work), files, symlinks=True)
    # The console script vllm's wheel installs (entry point vllm.entrypoints.cli.main:main), for the image's python3,
    # guarded as pip writes it: vLLM's spawned engine core and workers import the main module again.
    _script(
        files / "usr/local/bin/vllm",
        "from vllm.entrypoints.cli.main import main\n\nif __name__ == '__main__':\n    sys.exit(main())",
    )
    (files / vllm_cpu.IMAGE_SITE_PACKAGES.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (files / "vllm-workspace").mkdir()
    lines = [f"FROM lab/base:{SUITE}", "COPY files/ /"]
    lines.append(f"LABEL {vllm_cpu.REAL_ENGINE_LABEL}={json.dumps(kind.source)}")
    lines += [f"ENV {k}={json.dumps(v)}" for k, v in sorted(kind.env.items())]
    lines += [f"WORKDIR {kind.workdir}", f"ENTRYPOINT {json.dumps(list(kind.entrypoint or ()))}"]
    (ctx / "Dockerfile").write_text("\n".join(lines) + "\n")
    t0 = time.monotonic()
    with Builder() as b:
        sh(*b.docker("import", str(_base()), f"lab/base:{SUITE}"), timeout=900)
        _build(b, vllm_cpu.REAL_IMAGE, ctx, f"the real-engine image {vllm_cpu.REAL_IMAGE}")
        sh(*b.docker("save", "-o", str(tar) + ".tmp", vllm_cpu.REAL_IMAGE), timeout=900)
    Path(str(tar) + ".tmp").rename(tar)
    shutil.rmtree(ctx, ignore_errors=True)
    print(f"lab images: built the real-engine {vllm_cpu.REAL_IMAGE} in {time.monotonic() - t0:.0f}s")
    return tar
