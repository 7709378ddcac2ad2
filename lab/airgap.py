"""The lab as an air-gapped cluster: a private registry with auth, nothing else serving images.

The lab hosts already have no route beyond 198.18.0.0/24. For an air-gapped stack the lab adds, in the
registry's namespace, a second Debian `docker-registry` on 198.18.0.2:5000: HTTPS with a certificate from
a CA made here (each lab dockerd trusts it through /etc/docker/certs.d/198.18.0.2:5000/ca.crt, as a real
node trusts its private registry), htpasswd (bcrypt) auth, and the same storage as the mirror, read-only.
Its one user and password are what the plan's mock runtime gives the program for the stack's secure
`registryUsername` and `registryPassword` (plan.stackfile.secret_placeholder): so the credentials travel
from the stack's secrets through the docker provider's registryAuth to the engine's pull, and a wrong one
is refused by the registry. Then the mirror every lab dockerd pulls through is stopped: an image the stack
still named on Docker Hub or nvcr.io would have nowhere to come from.

`airgap_stack(base)` writes the air-gapped variant of a lab stack (its `images` section and the two
secure keys, or `images.tarballs`) into the lab's state directory; `save_tarballs` writes the tarballs
an air-gapped node loads, from images a lab host holds.
"""

from __future__ import annotations

import crypt  # deprecated in 3.11, present through 3.12; the only bcrypt on this machine without a wheel
import shutil
import subprocess
from pathlib import Path

import yaml

from lab.config import CACHE, REGISTRY_ADDRESS, STATE, LabHost
from lab.hosts import REGISTRY_NS, LabError, _start, _stop_pids, _wait_port, _write, sh

PORT = 5000
REGISTRY = f"{REGISTRY_ADDRESS}:{PORT}"
DIR = STATE / "airgap"
CERTS_D = Path("/etc/docker/certs.d") / REGISTRY
NS = "llm-cluster:"


def credentials(stack_name: str) -> tuple[str, str]:
    """The user and password the program is handed for the stack's secure registry keys."""
    from plan.stackfile import secret_placeholder

    return (
        secret_placeholder(stack_name, NS + "registryUsername"),
        secret_placeholder(stack_name, NS + "registryPassword"),
    )


def airgap_stack(base: Path, name: str = "lab-airgap", tarballs: str | None = None) -> Path:
    """The lab stack `base` as an air-gapped stack: every image from the lab's private registry with auth,
    or, with `tarballs`, loaded from that directory on every host."""
    doc = yaml.safe_load(base.read_text(encoding="utf-8"))
    config = doc["config"]
    if tarballs is not None:
        config[NS + "images"] = {"airGapped": True, "tarballs": tarballs}
    else:
        config[NS + "images"] = {"airGapped": True, "registry": REGISTRY}
        # The stack file holds only ciphertext for these; the plan stands in a marker per key.
        config[NS + "registryUsername"] = {"secure": "v1:lab-registry-user"}
        config[NS + "registryPassword"] = {"secure": "v1:lab-registry-password"}
    gateway = config.get(NS + "gateway")
    if gateway is not None:
        # An air-gapped stack pulls the default gateway image from the registry (or loads its tarball) like
        # every other: the lab's registry holds that very image, built from its Dockerfile (lab/images.py),
        # so the build's mirrors (gateway.imageBuild) have nothing to apply to.
        gateway.pop("imageBuild", None)
    path = STATE / f"Pulumi.{name}.yaml"
    _write(path, yaml.safe_dump(doc, sort_keys=False))
    return path


def stack_images(path: Path) -> list[str]:
    """The images the stack runs, under the names it gives them (the stand-ins are built under these; the
    private registry serves them at the same repository paths, as the program maps them)."""
    from components.planning.image_supply import stack_images as images_of
    from components.planning.load import load_stack_config
    from plan.stackfile import load_stack_file

    stack = load_stack_file(path)
    return images_of(load_stack_config(stack.config, stack.secret_keys))


def _tls() -> None:
    """A CA and a server certificate for the registry's IP address (SAN), made with openssl."""
    ca_key, ca, key, csr, crt = (DIR / n for n in ("ca.key", "ca.crt", "registry.key", "registry.csr", "registry.crt"))
    sh(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        "/CN=llm-cluster lab registry CA",
    )
    sh(
        "openssl",
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        f"/CN={REGISTRY_ADDRESS}",
    )
    ext = DIR / "san.cnf"
    _write(ext, f"subjectAltName=IP:{REGISTRY_ADDRESS}\nextendedKeyUsage=serverAuth\n")
    sh(
        "openssl",
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(crt),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )


def start(stack_name: str) -> str:
    """The private registry with auth on 198.18.0.2:5000, trusted by every lab dockerd; its address."""
    DIR.mkdir(parents=True, exist_ok=True)
    _tls()
    user, password = credentials(stack_name)
    # bcrypt at its lowest cost (2^4): the registry checks the password on every blob request, and at
    # the default 2^12 six hosts pulling at once on a loaded 2-core machine timed out (lab runs 16:25-17:04).
    # The credential is the lab's own throwaway one.
    salt = crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)
    _write(DIR / "htpasswd", f"{user}:{crypt.crypt(password, salt)}\n", 0o600)
    store = CACHE / "registry"
    _write(
        DIR / "registry.yml",
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {store}}}, maintenance: {{readonly: {{enabled: true}}}}}}\n"
        f"http: {{addr: '{REGISTRY}', tls: {{certificate: {DIR / 'registry.crt'}, key: {DIR / 'registry.key'}}}}}\n"
        f"auth: {{htpasswd: {{realm: llm-cluster-lab, path: {DIR / 'htpasswd'}}}}}\n",
    )
    pid = _start(
        ["nsenter", f"--net=/run/netns/{REGISTRY_NS}", "docker-registry", "serve", str(DIR / "registry.yml")],
        DIR / "registry.log",
    )
    _write(DIR / "registry.pid", str(pid))
    _wait_port(REGISTRY_ADDRESS, PORT, "the private registry")
    CERTS_D.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DIR / "ca.crt", CERTS_D / "ca.crt")
    return REGISTRY


def stop_mirror() -> None:
    """Stop the registry mirror (198.18.0.2:80) every lab dockerd pulls through: nothing else serves images."""
    pid_file = STATE / "registry.pid"
    if pid_file.exists():
        _stop_pids([int(pid_file.read_text())], "the registry mirror", grace=10)
    probe = subprocess.run(["curl", "-s", "-o", "/dev/null", "--max-time", "3", f"http://{REGISTRY_ADDRESS}/v2/"])
    if probe.returncode == 0:
        raise LabError("the registry mirror still answers on 198.18.0.2:80 after it was stopped")


def stop_registry() -> None:
    """Stop the private registry (its files stay until stop())."""
    pid_file = DIR / "registry.pid"
    if pid_file.exists():
        _stop_pids([int(pid_file.read_text())], "the private registry", grace=10)


def stop() -> None:
    """Stop the private registry and remove what start() put on the machine (the CA under /etc/docker)."""
    stop_registry()
    shutil.rmtree(CERTS_D, ignore_errors=True)
    for parent in (CERTS_D.parent, CERTS_D.parent.parent):
        try:
            parent.rmdir()  # only when empty: /etc/docker may hold the machine's own daemon.json
        except OSError:
            break
    shutil.rmtree(DIR, ignore_errors=True)


def save_tarballs(stack_path: Path, source: LabHost, targets: list[LabHost], directory: str) -> list[str]:
    """`docker save` every image the stack runs from `source`'s engine (where the registry run left them
    under the private registry's names) into `directory` on every target host, named as the program
    loads them; the files are hard links of one copy. Returns the file names."""
    from components.planning.image_supply import split_reference, tarball_name

    if not directory.startswith("/data/"):
        raise LabError(f"{directory}: the lab hosts keep their own files under /data")
    sock = f"unix://{source.dir}/run/docker.sock"
    first = source.dir / "data" / directory.removeprefix("/data/")
    first.mkdir(parents=True, exist_ok=True)
    names = []
    for ref in stack_images(stack_path):
        sh("docker", "-H", sock, "tag", f"{REGISTRY}/{split_reference(ref)[1]}", ref)
        name = tarball_name(ref)
        sh("docker", "-H", sock, "save", "-o", str(first / name), ref, timeout=600)
        names.append(name)
    for host in targets:
        d = host.dir / "data" / directory.removeprefix("/data/")
        if d == first:
            continue
        d.mkdir(parents=True, exist_ok=True)
        for name in names:
            (d / name).unlink(missing_ok=True)
            (d / name).hardlink_to(first / name)
    return names
