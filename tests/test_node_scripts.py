"""Node scripts: shellcheck and bash -n on every one; hosts block, manifest and fstab removal run twice on scratch files."""

from __future__ import annotations

import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from components.engines.weights import checkpoint_bytes, linear_bytes_per_param, model_params
from components.facts.models import model_arch
from components.planning.nodes import scripts as ns
from components.spec import StackSpec
from tests.support import tool

PATH = "/data/models/DeepSeek-R1-GPTQ-Int4"
SSH = ns.ssh_argv(22, False)


def every_script(spec: StackSpec) -> dict[str, str]:
    """Every script the reference stack generates, plus the variants other stacks use."""
    scripts = {
        "hosts-create": ns.hosts_create_script(ns.hosts_entries(spec)),
        "hosts-delete": ns.hosts_delete_script(),
        "manifest-build": ns.manifest_build_script(PATH),
        "manifest-verify": ns.manifest_verify_script(PATH),
        "manifest-delete": ns.manifest_delete_script(PATH, ("manifest", "cache")),
        "copy": ns.copy_script(
            PATH, serving="gpu-01", target="gpu-02", target_login="root@192.168.10.12", ssh=SSH, manifest="manifest"
        ),
        "copy-checked": ns.copy_script(
            PATH,
            serving="gpu-02",
            target="gpu-03",
            target_login="root@10.0.0.3",
            ssh=ns.ssh_argv(2222, True),
            manifest="expected",
        ),
        "copy-delete": ns.copy_delete_script(PATH, target_login="root@192.168.10.12", ssh=SSH),
        "mount": ns.mount_script("nas:/export/models/r1", PATH),
        "unmount": ns.unmount_script("nas:/export/models/r1", PATH),
        "present": ns.present_check_script(PATH),
        "key-file": ns.operator_file_create_script("~/.ssh/llm-cluster/prod/gpu-01.key"),
        "key-file-delete": ns.operator_file_delete_script("~/.ssh/llm-cluster/prod/gpu-01.key"),
    }
    scripts.update({f"preflight-{n}": ns.preflight_script(ns.node_expectation(spec, n)) for n in spec.nodes})
    # A non-root SSH user's preflight starts with the sudo and docker-group check.
    scripts["preflight-deploy"] = ns.preflight_script(ns.node_expectation(spec, "gpu-01"), "deploy")
    return scripts


def run(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script, "llm-cluster", *args], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


def test_every_script_is_shellcheck_clean_and_parses(prod_spec: StackSpec, tmp_path: Path) -> None:
    shellcheck = tool("shellcheck")
    paths = []
    for name, text in every_script(prod_spec).items():
        assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text, name
        p = tmp_path / f"{name}.sh"
        p.write_text(text)
        paths.append(str(p))
        assert subprocess.run(["bash", "-n", str(p)], capture_output=True).returncode == 0, name
        wrapped = tmp_path / f"{name}.cmd"
        wrapped.write_text(ns.bash_command(text))
        assert subprocess.run(["sh", "-n", str(wrapped)], capture_output=True).returncode == 0, name
    done = subprocess.run([shellcheck, "--severity=style", *paths], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_bash_command_hands_the_script_over_verbatim(tmp_path: Path) -> None:
    script = "#!/usr/bin/env bash\nset -euo pipefail\nprintf '%s|' \"$0\" 'a \"b\"' $'c\\td' \"${HOME:+x}\"\n"
    done = subprocess.run(["sh", "-c", ns.bash_command(script)], capture_output=True, text=True)
    assert done.stdout == 'llm-cluster|a "b"|c\td|x|'
    with pytest.raises(ValueError, match="heredoc delimiter"):
        ns.bash_command("echo\nLLM_CLUSTER_SCRIPT\n")


# --- /etc/hosts ----------------------------------------------------------------------------------

HOSTS = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n192.168.10.11 gpu-01  # added by hand\n"


def test_hosts_block_is_written_once_kept_in_place_and_removed(prod_spec: StackSpec, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    inode = hosts.stat().st_ino
    create = ns.hosts_create_script(ns.hosts_entries(prod_spec), str(hosts))
    first = run(create)
    after_first = hosts.read_text()
    second = run(create)
    assert (first.returncode, second.returncode) == (0, 0)
    assert first.stdout == f"{hosts}: llm-cluster block written\n"
    assert second.stdout == f"{hosts}: llm-cluster block already up to date\n"
    assert (
        hosts.read_text()
        == after_first
        == HOSTS
        + (
            "# BEGIN llm-cluster\n192.168.10.11 gpu-01\n192.168.10.12 gpu-02\n192.168.10.13 gpu-03\n"
            "192.168.10.14 gpu-04\n192.168.10.15 gpu-05\n192.168.10.16 gpu-06\n# END llm-cluster\n"
        )
    )
    assert hosts.stat().st_ino == inode

    # A changed stack replaces the block; it is never duplicated.
    run(ns.hosts_create_script([("10.0.0.1", "gpu-01")], str(hosts)))
    assert hosts.read_text() == HOSTS + "# BEGIN llm-cluster\n10.0.0.1 gpu-01\n# END llm-cluster\n"

    delete = ns.hosts_delete_script(str(hosts))
    assert run(delete).stdout == f"{hosts}: llm-cluster block removed\n"
    assert run(delete).stdout == f"{hosts}: llm-cluster block already up to date\n"
    assert hosts.read_text() == HOSTS


def test_hosts_script_runs_through_the_remote_command_wrapper(prod_spec: StackSpec, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    cmd = ns.bash_command(ns.hosts_create_script(ns.hosts_entries(prod_spec)[:1], str(hosts)))
    assert subprocess.run(["sh", "-c", cmd], capture_output=True).returncode == 0
    assert hosts.read_text().endswith("# BEGIN llm-cluster\n192.168.10.11 gpu-01\n# END llm-cluster\n")


# --- manifest ------------------------------------------------------------------------------------


def make_weights(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "deepseek_v3"}\n')
    (root / "model-00001-of-00002.safetensors").write_bytes(os.urandom(300_000))
    (root / "sub" / "with space.bin").write_bytes(b"x" * 1000)


def state_of(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((root / ".llm-cluster").iterdir())}


def test_manifest_is_stable_and_rehashes_only_changed_files(tmp_path: Path) -> None:
    tool("sha256sum")
    root = tmp_path / "weights"
    make_weights(root)
    build = ns.manifest_build_script(str(root))
    first = run(build)
    assert first.returncode == 0, first.stderr
    state = state_of(root)
    assert sorted(state) == ["cache", "manifest"]
    manifest = state["manifest"].decode().splitlines()
    assert [ln.split("\t")[2] for ln in manifest] == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "sub/with space.bin",
    ]
    sha = subprocess.run(
        ["sha256sum", str(root / "sub" / "with space.bin")], capture_output=True, text=True
    ).stdout.split()[0]
    assert manifest[2] == f"1000\t{sha}\tsub/with space.bin"
    assert "hashing 3 changed file(s)" in first.stdout

    second = run(build)
    assert state_of(root) == state
    assert "hashing 0 changed file(s)" in second.stdout and "sha256 [" not in second.stderr

    (root / "config.json").write_text('{"model_type": "deepseek_v3", "x": 1}\n')
    third = run(build)
    assert "hashing 1 changed file(s)" in third.stdout and "sha256 [1/1] config.json" in third.stderr
    assert state_of(root)["manifest"] != state["manifest"]


def copy_like_rsync(src: Path, dst: Path) -> None:
    """What the copy step leaves on a target: the files with their mtimes, and the source manifest as expected."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".llm-cluster"), copy_function=shutil.copy2)
    (dst / ".llm-cluster").mkdir()
    shutil.copy2(src / ".llm-cluster" / "manifest", dst / ".llm-cluster" / "expected")


def test_verify_marks_a_matching_copy_and_refuses_a_corrupt_one(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_weights(src)
    assert run(ns.manifest_build_script(str(src))).returncode == 0
    copy_like_rsync(src, dst)
    verify = ns.manifest_verify_script(str(dst))
    first = run(verify)
    assert first.returncode == 0, first.stderr
    state = state_of(dst)
    want = subprocess.run(
        ["sha256sum", str(dst / ".llm-cluster" / "expected")], capture_output=True, text=True
    ).stdout.split()[0]
    assert state["verified"].decode() == want + "\n"
    second = run(verify)
    assert second.returncode == 0 and state_of(dst) == state

    (dst / "model-00001-of-00002.safetensors").write_bytes(os.urandom(300_000))
    bad = run(verify)
    assert bad.returncode == 1
    assert f"1 file(s) at {dst} on" in bad.stderr and "model-00001-of-00002.safetensors" in bad.stderr
    assert "verified" not in state_of(dst)


def copy_like_rsync_a(src: Path, dst: Path) -> list[str]:
    """`rsync -a`'s quick check: send only files missing on the target or differing in size or mtime."""
    sent = []
    for f in sorted(p for p in src.rglob("*") if p.is_file() and ".llm-cluster" not in p.parts):
        rel = f.relative_to(src)
        t = dst / rel
        if not t.exists() or (t.stat().st_size, t.stat().st_mtime_ns) != (f.stat().st_size, f.stat().st_mtime_ns):
            t.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, t)
            sent.append(str(rel))
    return sent


def test_verify_removes_a_corrupt_file_so_the_next_copy_sends_it_again(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_weights(src)
    assert run(ns.manifest_build_script(str(src))).returncode == 0
    copy_like_rsync(src, dst)
    # A shard arrived damaged: same size, same mtime, other bytes. rsync -a would never send it again.
    shard = dst / "model-00001-of-00002.safetensors"
    st = shard.stat()
    shard.write_bytes(os.urandom(st.st_size))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    verify = ns.manifest_verify_script(str(dst), "weights-r1-copy-gpu-01-to-gpu-02")
    bad = run(verify)
    assert bad.returncode == 1
    assert (
        "    fix: those files were removed here, so the next copy sends them again: run pulumi up --replace "
        "<urn of weights-r1-copy-gpu-01-to-gpu-02> (pulumi stack --show-urns); if it repeats, check the disk\n"
    ) in bad.stderr
    assert not shard.exists()
    assert "model-00001" not in (dst / ".llm-cluster" / "cache").read_text()  # its stale checksum is gone too
    assert copy_like_rsync_a(src, dst) == ["model-00001-of-00002.safetensors"]
    again = run(verify)
    assert again.returncode == 0, again.stderr
    assert "hashing 1 changed file(s)" in again.stdout


def test_verify_without_the_source_manifest_says_the_copy_did_not_finish(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    done = run(ns.manifest_verify_script(str(tmp_path / "w")))
    assert done.returncode == 1 and "the copy did not finish" in done.stderr


def test_missing_source_weights_name_the_path(tmp_path: Path) -> None:
    done = run(ns.manifest_build_script(str(tmp_path / "absent")))
    assert done.returncode == 1 and f"ERROR: {tmp_path / 'absent'} does not exist" in done.stderr


# --- copy, mount, present ----------------------------------------------------------------------


def test_copy_script_rsyncs_resumably_without_the_bookkeeping() -> None:
    text = ns.copy_script(
        PATH, serving="gpu-01", target="gpu-02", target_login="root@192.168.10.12", ssh=SSH, manifest="manifest"
    )
    assert (
        'rsync -a --partial --info=progress2 --exclude=/.llm-cluster/ -e "${ssh[*]}" "$root/" "$dst:$root/"'
    ) in text
    assert "ssh=(ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -p 22)" in text
    assert f"manifest={PATH}/.llm-cluster/manifest" in text
    assert f"'cat {PATH}/.llm-cluster/verified 2>/dev/null || true'" in text
    assert ns.ssh_argv(2222, True) == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-p",
        "2222",
    ]


def test_fstab_entry_is_removed_once_and_only_it(tmp_path: Path) -> None:
    fstab = tmp_path / "fstab"
    other = "UUID=abc / ext4 defaults 0 1\n"
    fstab.write_text(other + ns.fstab_entry("nas:/export/r1", str(tmp_path / "m")) + "\n")
    unmount = ns.unmount_script("nas:/export/r1", str(tmp_path / "m"), str(fstab))
    assert run(unmount).returncode == 0 and fstab.read_text() == other
    assert run(unmount).returncode == 0 and fstab.read_text() == other
    assert ns.fstab_entry("nas:/export/r1", "/data/models/r1/") == "nas:/export/r1 /data/models/r1 nfs ro,_netdev 0 0"
    assert f"entry='nas:/export/r1 {PATH} nfs ro,_netdev 0 0'" in ns.mount_script("nas:/export/r1", PATH)


def test_a_share_is_never_expanded_by_the_shell(tmp_path: Path) -> None:
    # The spec refuses such shares; the script must not depend on it.
    share = "nas:/export/$(touch pwned)`touch pwned2`"
    script = ns.mount_script(share, str(tmp_path / "m"), str(tmp_path / "fstab"))
    assert f"share={ns.q(share)}\n" in script and "cannot mount $share at" in script
    assert f"echo {ns.q(f'    fix: check the export {share} holds the model' + chr(39) + 's files')} >&2" in script
    done = subprocess.run(
        ["bash", "-c", script.replace('mount "$root" ||', "false ||")], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 1 and f"ERROR: cannot mount {share} at" in done.stderr
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_a_newline_in_a_value_does_not_end_the_comment_line() -> None:
    script = ns.copy_delete_script(PATH, target_login="root@10.0.0.2\nrm -rf /tmp/x", ssh=SSH)
    lines = script.splitlines()
    assert lines[1] == f"# llm-cluster: forget the copy of {PATH} on root@10.0.0.2 rm -rf /tmp/x"
    assert lines[2] == "set -euo pipefail"


def test_bookkeeping_lives_in_state_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ns, "STATE_DIR", ".bookkeeping")
    for script in (
        ns.manifest_build_script(PATH),
        ns.manifest_verify_script(PATH),
        ns.copy_script(
            PATH, serving="gpu-01", target="gpu-02", target_login="root@10.0.0.2", ssh=SSH, manifest="manifest"
        ),
        ns.copy_delete_script(PATH, target_login="root@10.0.0.2", ssh=SSH),
    ):
        assert ".llm-cluster/" not in script and ".bookkeeping" in script


def test_present_check_requires_a_readable_config(tmp_path: Path) -> None:
    assert run(ns.present_check_script(str(tmp_path))).returncode == 1
    (tmp_path / "config.json").write_text("{}")
    done = run(ns.present_check_script(str(tmp_path)))
    assert done.returncode == 0 and done.stdout == f"{tmp_path}: 1 files, config.json readable\n"


def test_operator_key_file_is_0600_from_stdin_and_removed(tmp_path: Path) -> None:
    path = "~/.ssh/llm-cluster/prod/gpu-01.key"
    env = {"HOME": str(tmp_path)}
    for _ in range(2):
        done = subprocess.run(
            ["bash", "-c", ns.operator_file_create_script(path)],
            input="KEY\n",
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        )
        assert done.returncode == 0, done.stderr
    key = tmp_path / ".ssh/llm-cluster/prod/gpu-01.key"
    assert key.read_text() == "KEY\n" and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert sorted(os.listdir(key.parent)) == ["gpu-01.key"]
    assert run(ns.operator_file_delete_script(path), env=env).returncode == 0 and not key.exists()


# --- fan-out -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8, 9, 16])
def test_fanout_takes_ceil_log2_rounds_and_copies_each_node_once(n: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    rounds = ns.fanout_rounds("n0", nodes)
    assert len(rounds) == (math.ceil(math.log2(n)) if n > 1 else 0)
    have = {"n0"}
    for pairs in rounds:
        servers = [s for s, _ in pairs]
        assert len(servers) == len(set(servers)) and set(servers) <= have  # one copy each, from a holder
        have |= {d for _, d in pairs}
    assert sorted(d for pairs in rounds for _, d in pairs) == sorted(nodes[1:])


def test_fanout_of_the_chat_pool() -> None:
    assert ns.fanout_rounds("gpu-03", ["gpu-03", "gpu-04", "gpu-05", "gpu-06"]) == [
        [("gpu-03", "gpu-04")],
        [("gpu-03", "gpu-05"), ("gpu-04", "gpu-06")],
    ]


# --- expectations --------------------------------------------------------------------------------


def test_reference_node_expectation(prod_spec: StackSpec) -> None:
    exp = ns.node_expectation(prod_spec, "gpu-02")
    assert (exp.gpu_model, exp.gpu_count, exp.compute_cap, exp.nvlink, exp.max_tensor_parallel) == (
        "Tesla V100-SXM2-32GB",
        8,
        "7.0",
        True,
        8,
    )
    assert exp.driver_min == "560.28.03" and (exp.disk_path, exp.min_free_gib) == ("/data", 100)
    assert exp.hca == {"device": "mlx5_0", "port": 1, "link_layer": "ethernet", "rate_gbps": 200}
    assert exp.models == [{"path": PATH, "size_bytes": ns.model_size_bytes(prod_spec, "deepseek-r1")}]
    # The source node already holds its weights; nodes outside pools expect none.
    assert ns.node_expectation(prod_spec, "gpu-01").models == []
    assert ns.node_expectation(prod_spec, "gpu-03").models == []


def test_model_size_estimate_and_override(prod_spec: StackSpec) -> None:
    # The capacity planner's whole model: linear layers at 4 bits plus one fp16 scale and a 4-bit zero
    # per 128, embeddings, LM head, norms and routers at fp16 (not the catalog's params_b x 4 bits).
    arch = model_arch("deepseek-r1")
    linear = linear_bytes_per_param("gptq", 2, 4, 128)
    assert ns.model_size_bytes(prod_spec, "deepseek-r1") == int(
        checkpoint_bytes(arch, act_bytes=2, linear_bytes=linear)
    )
    assert round(ns.model_size_bytes(prod_spec, "deepseek-r1") / 2**30) == 327
    assert checkpoint_bytes(arch, act_bytes=2, linear_bytes=linear) - model_params(arch) * linear > 2 * 2**30
    assert round(ns.model_size_bytes(prod_spec, "qwen3-30b-a3b") / 2**30) == 57  # 30.5B fp16
    m = prod_spec.models["deepseek-r1"].model_copy(update={"size_gib": 360.0})
    spec = prod_spec.model_copy(update={"models": {**prod_spec.models, "deepseek-r1": m}})
    assert ns.model_size_bytes(spec, "deepseek-r1") == 360 * 2**30
