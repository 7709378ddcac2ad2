"""Test hosts on this machine: network namespaces on one bridge, each with its own files, sshd and dockerd.

`up(stack)` creates, for every node of a lab stack, a namespace `lab-<node>` whose link (named bond0
inside) joins the bridge lab-br0, a mount namespace with the host's own /etc/hosts, /data,
/var/lib/llm-cluster, /etc/llm-cluster, /run (so /run/docker.sock is its own engine), /root and the
fake-GPU shims on PATH; its dockerd and its sshd. Beside them: lab-registry (the registry mirror every
dockerd pulls through) and lab-client (a client outside the cluster). No namespace has a route
beyond 198.18.0.0/24. `down()` removes all of it and checks that nothing is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lab.config import (
    BRIDGE,
    BRIDGE_ADDRESS,
    CLIENT_ADDRESS,
    LAB_DIR,
    REGISTRY_ADDRESS,
    REGISTRY_ALIASES,
    REPO,
    STATE,
    SUBNET,
    LabHost,
    LabStack,
)

PREFIX = "lab-"
REGISTRY_NS = "lab-registry"
CLIENT_NS = "lab-client"
FIXTURES = REPO / "tests" / "fixtures" / "preflight"
SHIM_TOOLS = ("nvidia-smi", "ibstat", "ibv_devices", "nvidia-container-cli", "df")
# Paths each host sees as its own; the machine gets an empty mount point where it has none.
MOUNT_POINTS = ("/data", "/var/lib/llm-cluster", "/etc/llm-cluster")
OPERATOR = STATE / "operator"  # the operator's side: the lab's user key, its agent socket
# Each host's Docker data (its pulled images, its containers' layers) lives in a tmpfs of its own: an
# upper bound, not a reservation (about 0.5 GiB is used per host). On this machine's disk, mounted with
# `discard`, deleting six hosts' overlay trees file by file took minutes at every lab-down.
DOCKER_TMPFS_SIZE = "8g"


class LabError(RuntimeError):
    """The lab cannot be brought up or down; the message says what to check."""


LOCK = Path("/tmp/lab.lock")  # one lab per machine: whoever brings it up, or runs tests/lab, holds this


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def _lock_holders() -> set[int]:
    """Pids holding a flock on LOCK (from /proc/locks)."""
    try:
        inode = LOCK.stat().st_ino
    except FileNotFoundError:
        return set()
    holders = set()
    for line in Path("/proc/locks").read_text().splitlines():
        f = line.split()
        if len(f) >= 6 and f[1] == "FLOCK" and "->" not in line and f[5].rsplit(":", 1)[-1] == str(inode):
            holders.add(int(f[4]))
    return holders


@contextlib.contextmanager
def lab_lock(timeout: float = 3600, say: Callable[[str], None] = print) -> Iterator[None]:
    """Hold /tmp/lab.lock for the block (waiting for whoever has the lab), unless a process this one runs
    under already holds it (`flock /tmp/lab.lock make test`)."""
    if _lock_holders() & _ancestors():
        yield
        return
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LabError(
                        f"{LOCK} is held by pid(s) {sorted(_lock_holders())} for more than "
                        f"{timeout:.0f}s: someone else has the lab"
                    ) from None
                if not told:
                    say(f"lab: waiting for {LOCK} (held by pid(s) {sorted(_lock_holders())}: the lab is in use)")
                    told = True
                time.sleep(2)
        yield
    finally:
        os.close(fd)


def sh(*argv: str, check: bool = True, capture: bool = True, timeout: float | None = 60) -> str:
    """Run a command; LabError with its stderr when it fails."""
    p = subprocess.run(argv, capture_output=capture, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise LabError(f"{' '.join(argv)} failed ({p.returncode}): {(p.stderr or '').strip()}")
    return p.stdout if capture else ""


def can_create_namespaces() -> str | None:
    """None when this machine can host the lab; else why not (the test tier skips with it)."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, bind mounts, dockerd)"
    for tool in ("ip", "nsenter", "unshare", "dockerd", "sshd", "docker-registry", "rsync", "ssh-agent", "chronyd"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} is missing (run .ci/system-deps as root)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot create a network namespace here: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _netns_exists(name: str) -> bool:
    return name in sh("ip", "netns", "list").split()


def _add_netns(name: str, address: str, veth: str) -> None:
    """A namespace joined to the bridge by a veth pair (bond0 inside), with only the lab subnet's route."""
    sh("ip", "netns", "add", name)
    sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "bond0", "netns", name)
    sh("ip", "link", "set", veth, "master", BRIDGE, "up")
    sh("ip", "-n", name, "link", "set", "lo", "up")
    sh("ip", "-n", name, "addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", "bond0")
    sh("ip", "-n", name, "link", "set", "bond0", "up")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _host_files(stack: LabStack, host: LabHost) -> None:
    """The host's own directory: hosts file, data, state dirs, home with keys, run dir, shims, host key."""
    d = host.dir
    for sub in ("data", "var-lib-llm-cluster", "etc-llm-cluster", "run", "docker"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    sh("mount", "-t", "tmpfs", "-o", f"size={DOCKER_TMPFS_SIZE},mode=0711", "lab-docker", str(d / "docker"))
    aliases = "".join(f"{REGISTRY_ADDRESS} {a}\n" for a in REGISTRY_ALIASES)
    _write(
        d / "etc-hosts",
        f"127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
        f"# the lab's registry mirror answers for these registries\n{aliases}",
    )
    ssh = d / "home" / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    ssh.chmod(0o700)
    key = (OPERATOR / "id_ed25519").read_text()
    pub = (OPERATOR / "id_ed25519.pub").read_text()
    # Nodes reach each other as the same user with the same key, as the README asks of real nodes.
    _write(ssh / "authorized_keys", pub, 0o600)
    _write(ssh / "id_ed25519", key, 0o600)
    _write(ssh / "id_ed25519.pub", pub, 0o644)
    shims = d / "shims"
    shims.mkdir(exist_ok=True)
    shutil.copy2(LAB_DIR / "shims" / "gpu_shim.py", shims / "gpu_shim.py")
    for tool in SHIM_TOOLS:
        (shims / tool).symlink_to("gpu_shim.py")
    for tool in ("nvidia-container-runtime-hook", "nvidia-container-runtime"):
        shutil.copy2(LAB_DIR / "shims" / tool, shims / tool)
    shutil.copytree(FIXTURES, shims / "fixtures")
    set_shims(host, gpus=host.gpus, topo=host.topo, hca=host.hca)
    key_src = LAB_DIR / "hostkeys" / host.node
    shutil.copy2(key_src, d / "ssh_host_ed25519_key")
    (d / "ssh_host_ed25519_key").chmod(0o600)
    shutil.copy2(key_src.with_suffix(".pub"), d / "ssh_host_ed25519_key.pub")


def set_shims(host: LabHost, **choice: object) -> dict:
    """Change what the host's fake-GPU tools print (gpus, topo, hca); returns the previous choice."""
    path = host.dir / "shims" / "choice.json"
    before = json.loads(path.read_text()) if path.exists() else {}
    _write(path, json.dumps({**before, **choice}))
    return before


def _wait_port(address: str, port: int, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise LabError(
                    f"{what} does not answer on {address}:{port} after {timeout:.0f}s (logs under {STATE})"
                ) from None
            time.sleep(0.2)


def _start(argv: list[str], log: Path) -> int:
    with open(log, "ab") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    return p.pid


def start_registry() -> None:
    """The registry mirror on lab-registry:80, storing in the machine's lab cache (images survive the lab)."""
    from lab.config import CACHE

    store = CACHE / "registry"
    store.mkdir(parents=True, exist_ok=True)
    conf = STATE / "registry.yml"
    _write(
        conf,
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {store}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '{REGISTRY_ADDRESS}:80'}}\n",
    )
    pid = _start(
        ["nsenter", f"--net=/run/netns/{REGISTRY_NS}", "docker-registry", "serve", str(conf)], STATE / "registry.log"
    )
    _write(STATE / "registry.pid", str(pid))
    _wait_port(REGISTRY_ADDRESS, 80, "the registry mirror")
    # The lab's NTP server (chrony serving this machine's clock): the hosts' chronyd follow it.
    ntp = STATE / "ntp"
    ntp.mkdir(exist_ok=True)
    _write(
        ntp / "chrony.conf",
        f"local stratum 8\nallow {SUBNET}\nbindaddress {REGISTRY_ADDRESS}\ncmdport 0\npidfile {ntp}/chronyd.pid\n",
    )
    sh(
        "nsenter",
        f"--net=/run/netns/{REGISTRY_NS}",
        "chronyd",
        "-x",
        "-u",
        "root",
        "-f",
        str(ntp / "chrony.conf"),
        "-l",
        str(ntp / "chronyd.log"),
    )


def boot_host(host: LabHost) -> int:
    """Start the host's init (mounts, dockerd, sshd) in its namespaces; returns the sshd pid."""
    pid = _start(
        [
            "nsenter",
            f"--net=/run/netns/{host.netns}",
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
            "bash",
            str(LAB_DIR / "host-init.sh"),
            "boot",
            str(host.dir),
            host.node,
            host.address,
            REGISTRY_ADDRESS,
        ],
        host.dir / "init.log",
    )
    _write(host.dir / "sshd.pid", str(pid))
    return pid


def host_pid(host: LabHost) -> int:
    """The pid of the host's sshd: its namespaces are the host's."""
    return int((host.dir / "sshd.pid").read_text())


def in_host(host: LabHost, *argv: str, timeout: float = 60) -> str:
    """Run a command inside a running host's namespaces (as its console would)."""
    return sh("nsenter", f"--target={host_pid(host)}", "--net", "--mount", "--uts", *argv, timeout=timeout)


def dockerd_pid(host: LabHost) -> int | None:
    try:
        return int((host.dir / "run" / "docker.pid").read_text())
    except (OSError, ValueError):
        return None


def restart_dockerd(host: LabHost) -> None:
    """Stop the host's dockerd (its containers stop with it) and start it again, as a reboot would."""
    pid = dockerd_pid(host)
    if pid:
        _stop_pids([pid], "dockerd", grace=30)
    in_host(host, "bash", str(LAB_DIR / "host-init.sh"), "dockerd", str(host.dir), REGISTRY_ADDRESS)


def _operator_key() -> None:
    OPERATOR.mkdir(parents=True, exist_ok=True)
    if not (OPERATOR / "id_ed25519").exists():
        sh(
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "llm-cluster lab user",
            "-f",
            str(OPERATOR / "id_ed25519"),
        )


def start_agent() -> str:
    """An ssh-agent holding the lab's user key (the lab stack says ssh.agent: true); its socket path."""
    sock = OPERATOR / "agent.sock"
    if sock.exists():
        probe = subprocess.run(["ssh-add", "-l"], env={**os.environ, "SSH_AUTH_SOCK": str(sock)}, capture_output=True)
        if probe.returncode == 0:
            return str(sock)
        sock.unlink()
    out = sh("ssh-agent", "-a", str(sock), "-s")
    pid = int(out.split("SSH_AGENT_PID=")[1].split(";")[0])
    _write(OPERATOR / "agent.pid", str(pid))
    sh("env", f"SSH_AUTH_SOCK={sock}", "ssh-add", "-q", str(OPERATOR / "id_ed25519"))
    return str(sock)


def up(stack: LabStack) -> None:
    """Create every host of the stack, the registry mirror and the client namespace."""
    if (STATE / "lab.json").exists() or _netns_exists(REGISTRY_NS):
        raise LabError(f"a lab is already up (state in {STATE}); `make lab-down` first")
    STATE.mkdir(parents=True, exist_ok=True)
    created = [p for p in MOUNT_POINTS if not Path(p).exists()]
    for p in created:
        Path(p).mkdir(parents=True)
    _write(
        STATE / "lab.json",
        json.dumps(
            {
                "stack": str(stack.path),
                "stackName": stack.name,
                "mountPoints": created,
                "hosts": [h.node for h in stack.hosts],
            }
        ),
    )
    _operator_key()
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{BRIDGE_ADDRESS}/{SUBNET.prefixlen}", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    _add_netns(REGISTRY_NS, REGISTRY_ADDRESS, "lab-v-reg")
    _add_netns(CLIENT_NS, CLIENT_ADDRESS, "lab-v-client")
    start_registry()
    for i, host in enumerate(stack.hosts):
        _add_netns(host.netns, host.address, f"lab-v{i}")
        _host_files(stack, host)
        boot_host(host)
    for host in stack.hosts:
        _wait_port(host.address, 22, f"sshd of {host.node}")
        wait_docker(host)


def wait_docker(host: LabHost, timeout: float = 60) -> None:
    """Until the host's engine answers on its socket."""
    sock = host.dir / "run" / "docker.sock"
    deadline = time.monotonic() + timeout
    while subprocess.run(["docker", "-H", f"unix://{sock}", "version"], capture_output=True).returncode:
        if time.monotonic() > deadline:
            raise LabError(f"dockerd of {host.node} does not answer (see {host.dir}/dockerd.log)")
        time.sleep(0.3)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; its parent (often this process) has not reaped it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _stop_pids(pids: list[int], what: str, grace: float = 20) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL what is left."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        _reap()
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    _reap()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def lab_namespaces() -> list[str]:
    return [n for n in sh("ip", "netns", "list").split() if n.startswith(PREFIX)]


def lab_links() -> list[str]:
    """The lab's links in this (the root) namespace: the bridge and the hosts' veth ends."""
    names = [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link", "show").splitlines()]
    return [n for n in names if n.startswith(PREFIX)]


def _netns_pids(name: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def down() -> list[str]:
    """Remove the whole lab; returns what is still left behind (empty when clean)."""
    for ns in lab_namespaces():
        # The engines first: dockerd stops its containers cleanly.
        docker = [int(p) for p in _netns_pids(ns) if _comm(int(p)) == "dockerd"]
        _stop_pids(docker, "dockerd", grace=30)
    for ns in lab_namespaces():
        _stop_pids(_netns_pids(ns), f"processes of {ns}", grace=10)
    agent = OPERATOR / "agent.pid"
    if agent.exists():
        _stop_pids([int(agent.read_text())], "ssh-agent", grace=5)
    # The hosts' veth pairs by their root ends (a pair goes with either end): a namespace's links go
    # only when the kernel cleans it up, after `ip netns del` has returned, so a check right after
    # it could still find them (it did, after a run stopped half-way).
    for link in lab_links():
        if link != BRIDGE:
            sh("ip", "link", "del", link, check=False)
    for ns in lab_namespaces():
        sh("ip", "netns", "del", ns, check=False)
    if Path(f"/sys/class/net/{BRIDGE}").exists():
        sh("ip", "link", "del", BRIDGE, check=False)
    created: list[str] = []
    if (STATE / "lab.json").exists():
        recorded = json.loads((STATE / "lab.json").read_text())
        created = recorded.get("mountPoints", [])
        # The operator-side files the stack's local commands write (known_hosts), when not destroyed first.
        operator_files = Path.home() / ".ssh" / "llm-cluster" / recorded.get("stackName", "lab")
        shutil.rmtree(operator_files, ignore_errors=True)
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        point = line.split()[4]
        if point.startswith(f"{STATE}/hosts/") and point.endswith("/docker"):
            # Every process of the host is gone by now; lazily if something still holds it open.
            if subprocess.run(["umount", point], capture_output=True).returncode:
                sh("umount", "-l", point, check=False)
    if STATE.exists():
        shutil.rmtree(STATE)
    for p in created:
        try:
            Path(p).rmdir()
        except OSError:
            pass
    return leftovers()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def leftovers() -> list[str]:
    """Everything of a lab still on the machine: namespaces, links, mounts, processes, files."""
    left = [f"network namespace {n}" for n in lab_namespaces()]
    left += [f"link {name}" for name in lab_links()]
    state = str(STATE)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if state in line or "/run/netns/lab-" in line:
            left.append(f"mount {line.split()[4]}")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state in cmd or "/run/netns/lab-" in cmd:
            left.append(f"process {proc.name}: {cmd[:120]}")
    if STATE.exists():
        left.append(f"directory {STATE}")
    return left
