"""A non-root SSH user: only the steps that write system files go through `sudo -n`, and the generated
scripts really run so under a real unprivileged user of this machine (created here with passwordless
sudo and the docker group, removed afterwards), while the same steps without sudo are refused; the mount,
fstab, hosts and nftables steps in throwaway mount and network namespaces (below)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.planning.gateway.keys import keys_script
from components.planning.monitoring.grafana import grafana_password_generate_script
from components.planning.monitoring.prometheus import config_files_script
from components.planning.nodes.scripts import (
    access_script,
    bash_command,
    hosts_create_script,
    hosts_delete_script,
    manifest_build_script,
)
from tests.conftest import prod_config, run_stack

NS = "llm-cluster:"
# The commands whose scripts write /etc/hosts, /etc/fstab and mounts, /etc/llm-cluster or nftables.
ROOT_STEPS = {
    "hosts",
    "firewall",
    "mount",
    "gateway-keys",
    "gateway-tls",
    "gateway-config",
    "gateway-usage-dir",
    "monitoring-grafana-admin-password",
    "monitoring-grafana-config",
    "monitoring-prometheus-config",
    "monitoring-alertmanager-config",
}
# What only root may do on a node; a command without sudo must do none of it (a new root step is caught).
PRIVILEGED = re.compile(
    r"/etc/(hosts|fstab|llm-cluster)|^\s*(chown|mount|umount|nft -f|systemctl enable)\b|"
    r"install [^\n]*-o ",
    re.M,
)
# This run's users (sudo + docker group, and neither), named for this process: another run of the suite
# on the machine (a developer's, CI's) makes and deletes its own, never these.
DEPLOY, PLAIN = f"llmc{os.getpid()}-deploy", f"llmc{os.getpid()}-plain"
SUDOERS = Path(f"/etc/sudoers.d/llmc-test-{os.getpid()}")


def step_of(name: str) -> str:
    """'gpu-03-hosts' -> 'hosts', 'weights-x-mount-gpu-03' -> 'mount': the step without node names."""
    words = [w for w in name.split("-") if not (w.startswith("gpu") or w.isdigit())]
    if words[0] == "weights":
        return next((w for w in words if w in ("mount", "manifest", "verify", "copy", "check")), "weights")
    return "-".join(words)


def sudo_steps(config: dict[str, Any]) -> dict[str, bool]:
    """step -> whether its create and delete run through sudo (every command of the stack)."""
    out: dict[str, bool] = {}
    for r in run_stack(config, preview=True).registrations:
        if r.type in ("command:remote:Command", "command:local:Command"):
            inputs = r.plain_inputs()
            phases = [inputs[p] for p in ("create", "delete") if isinstance(inputs.get(p), str)]
            sudo = {p.startswith("sudo -n -- bash -c ") for p in phases}
            assert len(sudo) == 1, f"{r.name}: create and delete disagree about sudo"
            out[step_of(r.name)] = sudo.pop()
    return out


def test_a_non_root_user_runs_exactly_the_root_steps_through_sudo() -> None:
    config = prod_config()
    config[NS + "ssh"] = {**config.get(NS + "ssh", {}), "user": "deploy"}
    config[NS + "models"]["qwen3-30b-a3b"]["source"] = {"sharedMount": "nfs01:/export/qwen"}
    steps = sudo_steps(config)
    assert {s for s, sudo in steps.items() if sudo} == ROOT_STEPS & set(steps)
    assert {"mount", "hosts", "firewall", "gateway-config", "gateway-usage-dir"} <= set(steps)
    # Everything else runs as the user: preflight, weights bookkeeping and copies, gates, the clock.
    assert {"preflight", "manifest", "verify", "copy", "clock", "chat-health"} <= {
        s for s, sudo in steps.items() if not sudo
    }


def test_no_command_without_sudo_does_what_only_root_may() -> None:
    config = prod_config()
    config[NS + "ssh"] = {**config.get(NS + "ssh", {}), "user": "deploy"}
    config[NS + "models"]["qwen3-30b-a3b"]["source"] = {"sharedMount": "nfs01:/export/qwen"}
    for r in run_stack(config, preview=True).registrations:
        inputs = r.plain_inputs()
        if r.type == "command:remote:Command" and not str(inputs.get("create", "")).startswith("sudo -n"):
            # The preflight only reads; its Python mentions paths and tools in its fixes.
            scripts = [inputs[p] for p in ("create", "delete") if isinstance(inputs.get(p), str)]
            if step_of(r.name) != "preflight":
                assert not [m.group(0) for s in scripts for m in PRIVILEGED.finditer(s)], r.name


def test_root_needs_no_sudo() -> None:
    assert not any(sudo_steps(prod_config()).values())


def test_the_preflight_of_a_non_root_user_checks_sudo_and_the_docker_group_first() -> None:
    config = prod_config()
    config[NS + "ssh"] = {**config.get(NS + "ssh", {}), "user": "deploy"}
    preflight = run_stack(config, preview=True).get("gpu-03-preflight").plain_inputs()["create"]
    assert access_script("deploy") in preflight
    assert (
        access_script("deploy")
        not in run_stack(prod_config(), preview=True).get("gpu-03-preflight").plain_inputs()["create"]
    )


# --- the scripts under a real unprivileged user ----------------------------------------------------


def _root(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def users() -> Iterator[None]:
    """Two users of this machine: DEPLOY with passwordless sudo and the docker group, PLAIN with neither."""
    if os.geteuid() != 0 or not shutil.which("sudo") or not shutil.which("runuser"):
        pytest.skip("needs root, sudo and runuser (.ci/system-deps installs sudo)")
    for user in (DEPLOY, PLAIN):
        subprocess.run(["userdel", "-r", user], capture_output=True)
        _root("useradd", "-m", "-s", "/bin/bash", user)
    if subprocess.run(["getent", "group", "docker"], capture_output=True).returncode != 0:
        _root("groupadd", "docker")
    _root("usermod", "-aG", "docker", DEPLOY)
    SUDOERS.write_text(f"{DEPLOY} ALL=(root) NOPASSWD: ALL\n")
    SUDOERS.chmod(0o440)
    _root("visudo", "-cf", str(SUDOERS))
    try:
        yield
    finally:
        SUDOERS.unlink(missing_ok=True)
        for user in (DEPLOY, PLAIN):
            subprocess.run(["userdel", "-r", user], capture_output=True)


@pytest.fixture
def system_dir(users: None) -> Iterator[Path]:
    """A root-owned directory the users can enter but not write, standing for /etc on a node."""
    path = Path(tempfile.mkdtemp(prefix="llmc-s-etc-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def as_user(user: str, command: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run a Command's create string as `user`, the way SSH hands it to the login shell."""
    return subprocess.run(
        ["runuser", "-u", user, "--", "bash", "-c", command],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )


def test_the_hosts_block_is_written_and_removed_through_sudo_and_refused_without(system_dir: Path) -> None:
    hosts = system_dir / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    create = hosts_create_script([("198.18.0.11", "gpu-01")], str(hosts))
    refused = as_user(DEPLOY, bash_command(create))
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    done = as_user(DEPLOY, bash_command(create, sudo=True))
    assert done.returncode == 0, done.stderr
    assert hosts.read_text() == "127.0.0.1 localhost\n# BEGIN llm-cluster\n198.18.0.11 gpu-01\n# END llm-cluster\n"
    assert (hosts.stat().st_uid, oct(hosts.stat().st_mode & 0o777)) == (0, "0o644")  # rewritten in place
    again = as_user(DEPLOY, bash_command(create, sudo=True))
    assert "already up to date" in again.stdout
    removed = as_user(DEPLOY, bash_command(hosts_delete_script(str(hosts)), sudo=True))
    assert removed.returncode == 0 and hosts.read_text() == "127.0.0.1 localhost\n"


def test_gateway_keys_and_grafana_password_are_made_root_only_through_sudo(system_dir: Path) -> None:
    keys = as_user(DEPLOY, bash_command(keys_script(["default"], str(system_dir / "gateway")), sudo=True))
    assert keys.returncode == 0, keys.stderr
    key_file = system_dir / "gateway" / "keys" / "default"
    assert keys.stdout.startswith('{"default": "sk-') and key_file.stat().st_uid == 0
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert as_user(DEPLOY, f"cat {key_file}").returncode != 0  # the user itself cannot read it back
    password_file = system_dir / "grafana" / "admin-password"
    made = as_user(DEPLOY, bash_command(grafana_password_generate_script(str(password_file)), sudo=True))
    assert made.returncode == 0, made.stderr
    assert (password_file.stat().st_uid, password_file.stat().st_gid) == (472, 0)  # chown needs root
    assert as_user(DEPLOY, bash_command(grafana_password_generate_script(str(system_dir / "g2" / "p")))).returncode != 0


def test_monitoring_config_files_are_written_and_owned_through_sudo(system_dir: Path) -> None:
    script = config_files_script(
        "prometheus", "prometheus", {"prometheus/prometheus.yml": "global: {}\n"}, [], root=str(system_dir)
    )
    assert as_user(DEPLOY, bash_command(script)).returncode != 0
    done = as_user(DEPLOY, bash_command(script, sudo=True))
    assert done.returncode == 0, done.stderr
    written = system_dir / "prometheus" / "prometheus.yml"
    assert written.read_text() == "global: {}\n" and (written.stat().st_uid, written.stat().st_gid) == (65534, 65534)


def test_weights_bookkeeping_runs_as_the_user_in_a_directory_it_owns(users: None) -> None:
    home = Path(f"/home/{DEPLOY}")
    model = home / "models" / "m"
    done = as_user(
        DEPLOY,
        f"mkdir -p {model} && printf weights > {model}/w.safetensors && "
        + bash_command(manifest_build_script(str(model))),
    )
    assert done.returncode == 0, done.stderr
    manifest = model / ".llm-cluster" / "manifest"
    assert manifest.read_text().endswith("\tw.safetensors\n")
    assert manifest.stat().st_uid == int(subprocess.run(["id", "-u", DEPLOY], capture_output=True, text=True).stdout)


def test_the_access_check_passes_a_prepared_user_and_names_the_fix_for_others(users: None) -> None:
    check = "set -euo pipefail\n" + access_script(DEPLOY) + "echo access ok\n"
    assert as_user(DEPLOY, bash_command(check)).stdout == "access ok\n"
    refused = as_user(PLAIN, bash_command("set -euo pipefail\n" + access_script(PLAIN)))
    assert refused.returncode == 1
    assert f"ERROR: {PLAIN} on " in refused.stderr and "cannot run sudo without a password" in refused.stderr
    assert f"echo '{PLAIN} ALL=(root) NOPASSWD: ALL' > /etc/sudoers.d/llm-cluster" in refused.stderr
    # With sudo but outside the docker group: the Docker provider could not reach dockerd.
    SUDOERS.write_text(f"{DEPLOY} ALL=(root) NOPASSWD: ALL\n{PLAIN} ALL=(root) NOPASSWD: ALL\n")
    try:
        no_docker = as_user(PLAIN, bash_command("set -euo pipefail\n" + access_script(PLAIN)))
        assert no_docker.returncode == 1 and "is not in the docker group" in no_docker.stderr
        assert f"usermod -aG docker {PLAIN}" in no_docker.stderr
    finally:
        SUDOERS.write_text(f"{DEPLOY} ALL=(root) NOPASSWD: ALL\n")


# --- the generated mount/fstab, /etc/hosts and nftables steps, for real, in a throwaway sandbox ---------
#
# Each run happens in a mount namespace of its own (unshare --mount: private propagation) where /etc and
# /usr/sbin are overlays on a tmpfs: every write the steps make to /etc/fstab, /etc/hosts, /etc/llm-cluster
# lands in the overlay and disappears with the namespace, and the machine's own files are never written.
# The nftables step runs in a network namespace made for it (opsfw-<pid>-nonroot, removed afterwards), so
# its table is loaded there, not on the machine. No NFS exists here (no kernel nfs, no server): the
# overlay's /usr/sbin gets a `mount.nfs` stand-in that bind-mounts the export's directory read-only, so the
# real util-linux `mount <path>` reads the real fstab entry, calls the helper as root and makes a real mount.

NETNS = f"opsfw-{os.getpid()}-nonroot"
SHARE = "nfs01:/export/qwen"
MOUNT_NFS = """#!/bin/bash
# Stand-in for mount.nfs in the test's mount namespace: <host>:<path> -> a read-only bind of EXPORTS<path>.
set -euo pipefail
mount --bind "EXPORTS${1#*:}" "$2"
mount -o remount,bind,ro "$2"
"""
DRIVER = """#!/bin/bash
set -uo pipefail
sandbox=$1 user=$2 model=$3; shift 3
mount -t tmpfs llmc-sandbox "$sandbox"
for d in etc sbin; do
  mkdir -p "$sandbox/upper-$d" "$sandbox/work-$d"
  mount -t overlay overlay -o "lowerdir=/${d/sbin/usr/sbin},upperdir=$sandbox/upper-$d,workdir=$sandbox/work-$d" \\
    "/${d/sbin/usr/sbin}"
done
install -m 0755 "$sandbox/../mount.nfs" /usr/sbin/mount.nfs
for step in "$@"; do
  runuser -u "$user" -- bash -c "$(cat "$step")" > "$step.out" 2> "$step.err"
  echo "$?" > "$step.rc"
  { echo "--- fstab"; grep -v '^#' /etc/fstab || true
    echo "--- hosts"; sed -n '/# BEGIN llm-cluster/,/# END llm-cluster/p' /etc/hosts
    echo "--- mount"; ! mountpoint -q "$model" || echo "mounted $(findmnt -n -o OPTIONS "$model" | cut -d, -f1)"
    echo "--- nft"; nft list table inet llm_cluster 2>/dev/null | grep -c ' drop\\| accept' || true
    echo "--- files"; ls /etc/llm-cluster 2>/dev/null || true
  } > "$step.state"
done
"""


def stack_steps(user: str, model_path: str) -> dict[str, tuple[str, str]]:
    """The create and delete strings of gpu-03's hosts, firewall and weights-mount commands, as generated."""
    config = prod_config()
    config[NS + "ssh"] = {**config.get(NS + "ssh", {}), "user": user}
    config[NS + "models"]["qwen3-30b-a3b"].update(path=model_path, source={"sharedMount": SHARE})
    wanted = {"gpu-03-hosts": "hosts", "gpu-03-firewall": "firewall", "weights-qwen3-30b-a3b-mount-gpu-03": "mount"}
    out = {}
    for r in run_stack(config, preview=True).registrations:
        if r.name in wanted:
            out[wanted[r.name]] = (r.plain_inputs()["create"], r.plain_inputs()["delete"])
    assert set(out) == set(wanted.values())
    return out


@pytest.fixture
def sandbox(users: None) -> Iterator[Path]:
    """A root-owned scratch directory with the export's files and the mount.nfs stand-in, and NETNS."""
    if not shutil.which("unshare") or not shutil.which("nsenter") or not shutil.which("nft"):
        pytest.fail("needs unshare/nsenter (util-linux) and nft (nftables): run `make test` as root")
    root = Path(tempfile.mkdtemp(prefix="llmc-s-sandbox-", dir="/tmp"))
    root.chmod(0o755)
    (root / "export" / "qwen").mkdir(parents=True)
    (root / "export" / "qwen" / "config.json").write_text("{}\n")
    (root / "mount.nfs").write_text(MOUNT_NFS.replace("EXPORTS", str(root)))  # nfs01:/export/qwen -> root/export/qwen
    (root / "driver.sh").write_text(DRIVER)
    (root / "ns").mkdir()
    (root / "models").mkdir(mode=0o755)
    subprocess.run(["ip", "netns", "delete", NETNS], capture_output=True)
    _root("ip", "netns", "add", NETNS)
    try:
        yield root
    finally:
        subprocess.run(["ip", "netns", "delete", NETNS], capture_output=True)
        subprocess.run(["umount", "-R", str(root / "models")], capture_output=True)  # never mounted outside
        shutil.rmtree(root, ignore_errors=True)


def run_in_sandbox(root: Path, user: str, steps: list[tuple[str, str]]) -> list[tuple[int, str, str, str]]:
    """Run (label, command) steps in order as `user` inside the sandbox: (rc, stdout, stderr, state) each."""
    files = []
    for i, (label, command) in enumerate(steps):
        path = root / f"step{i}-{label}"
        path.write_text(command)
        files.append(path)
    done = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "nsenter",
            f"--net=/run/netns/{NETNS}",
            "--",
            "bash",
            str(root / "driver.sh"),
            str(root / "ns"),
            user,
            str(root / "models" / "qwen"),
            *map(str, files),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return [
        (
            int((f.parent / (f.name + ".rc")).read_text()),
            (f.parent / (f.name + ".out")).read_text(),
            (f.parent / (f.name + ".err")).read_text(),
            (f.parent / (f.name + ".state")).read_text(),
        )
        for f in files
    ]


def machine_state() -> tuple[bytes, bytes, str]:
    """What the sandbox must never change: the machine's fstab, hosts and nftables tables."""
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    return Path("/etc/fstab").read_bytes(), Path("/etc/hosts").read_bytes(), tables


def test_mount_hosts_and_firewall_steps_run_as_a_sudo_user_create_delete_create(sandbox: Path) -> None:
    model = str(sandbox / "models" / "qwen")
    steps = stack_steps(DEPLOY, model)
    before = machine_state()
    order = ["create", "create", "delete", "create", "delete"]
    runs = run_in_sandbox(
        sandbox,
        DEPLOY,
        [
            (f"{name}-{phase}", steps[name][0 if phase == "create" else 1])
            for phase in order
            for name in ("hosts", "mount", "firewall")
        ],
    )
    assert machine_state() == before  # the machine's fstab, hosts and nft tables: untouched
    for (rc, _out, err, _), label in zip(runs, [f"{n}-{p}" for p in order for n in ("hosts", "mount", "firewall")]):
        assert rc == 0, f"{label}: {err}"
    entry = f"{SHARE} {model} nfs ro,_netdev 0 0"
    created = "--- fstab\n" + entry + "\n--- hosts\n# BEGIN llm-cluster\n"
    states = [state for _, _, _, state in runs]
    # After each create: the fstab entry once, the mount read-only, the hosts block, the nft table.
    for i in (2, 5, 11):
        assert states[i].startswith(created), states[i]
        assert "--- mount\nmounted ro\n" in states[i] and "--- files\nfirewall.nft\n" in states[i]
        assert int(states[i].split("--- nft\n")[1].split("\n")[0]) > 0
    assert states[5] == states[2]  # the second create changes nothing
    assert runs[2][1].startswith("firewall: table inet llm_cluster loaded") and runs[5][1] == runs[2][1]
    assert runs[1][1] == f"{model}: 1 files, config.json readable\n"  # mounted from the export
    assert "already up to date" in runs[3][1]  # hosts, second run
    # After each delete: nothing of it is left.
    for i in (8, 14):
        assert states[i] == "--- fstab\n--- hosts\n--- mount\n--- nft\n0\n--- files\n", states[i]


def test_the_same_steps_without_sudo_are_refused_for_a_non_root_user(sandbox: Path) -> None:
    # The root stack's commands carry no sudo: run by the deploy user they must fail, each of them.
    model = str(sandbox / "models" / "qwen")
    plain = stack_steps("root", model)
    assert not any(c.startswith("sudo") for pair in plain.values() for c in pair)
    runs = run_in_sandbox(sandbox, DEPLOY, [(name, plain[name][0]) for name in ("hosts", "mount", "firewall")])
    for (rc, _, err, state), name in zip(runs, ("hosts", "mount", "firewall")):
        assert rc != 0, f"{name} ran without sudo as {DEPLOY}"
        assert "Permission denied" in err or "Operation not permitted" in err, f"{name}: {err}"
        assert state == "--- fstab\n--- hosts\n--- mount\n--- nft\n0\n--- files\n", (name, state)
