"""Remote scripts that prepare a node: /etc/hosts block, preflight, weights manifest, copy, mount.

Every generator returns bash text: `set -euo pipefail`, values `shlex.quote`d, idempotent (a second
run changes nothing), with a delete counterpart where the create leaves something behind.
`bash_command` wraps a script for `remote.Command` without re-quoting it, so the plan shows it
as it runs.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from components.engines.weights import GIB, checkpoint_bytes, linear_bytes_per_param
from components.facts.hardware import DTYPE_ALIASES, DTYPE_BYTES, GPUS
from components.facts.models import model_arch
from components.node_programs import preflight
from components.node_programs.preflight import Expectation
from components.planning.image_supply import node_supplies
from components.spec import StackSpec

HOSTS_BEGIN = "# BEGIN llm-cluster"
HOSTS_END = "# END llm-cluster"
STATE_DIR = ".llm-cluster"  # per model directory: manifest, checksum cache, verified marker
_HEREDOC = "LLM_CLUSTER_SCRIPT"
_FILE_HEREDOC = "LLM_CLUSTER_CONFIG_FILE"
_PREFLIGHT_HEREDOC = "LLM_CLUSTER_PREFLIGHT_PY"

q = shlex.quote


def _script(purpose: str, body: str) -> str:
    # The purpose carries stack values (paths, shares, logins): a newline in one must not end the comment.
    comment = "".join(c if c.isprintable() else " " for c in purpose)
    return f"#!/usr/bin/env bash\n# llm-cluster: {comment}\nset -euo pipefail\n{body}"


def refuse_heredoc_end(text: str, delimiter: str, what: str) -> None:
    """A quoted heredoc passes `text` verbatim unless a line of it is the delimiter, which would end it early."""
    if f"\n{delimiter}\n" in f"\n{text}\n":
        raise ValueError(f"{what} contains the heredoc delimiter {delimiter}")


def run_shipped_python(source: Path, delimiter: str, argument: str) -> str:
    """Bash lines that write a Python program shipped in the script to a temporary file and run it with
    one argument (a JSON plan). A file, not `python3 -`: the program keeps stdin for what is piped in."""
    text = source.read_text()
    refuse_heredoc_end(text, delimiter, source.name)
    return (
        f"prog=$(mktemp)\ntrap 'rm -f \"$prog\"' EXIT\ncat > \"$prog\" <<'{delimiter}'\n{text.rstrip()}\n"
        f'{delimiter}\npython3 "$prog" {q(argument)}\n'
    )


def bash_command(script: str, *, sudo: bool = False) -> str:
    """The `create`/`delete` string of a remote or local Command: the shell hands the script to bash verbatim.

    `sudo`: run it as root through passwordless sudo, for the steps that write system files when the SSH
    user is not root (root_steps). `sudo -n` fails at once instead of waiting for a password; the script
    travels as an argument, and stdin (a secret piped in) passes through.
    """
    refuse_heredoc_end(script, _HEREDOC, "script")
    runner = "sudo -n -- bash" if sudo else "bash"
    return f"{runner} -c \"$(cat <<'{_HEREDOC}'\n{script.rstrip()}\n{_HEREDOC}\n)\" llm-cluster"


def root_steps(spec: StackSpec) -> bool:
    """Whether the steps that need root (/etc/hosts, /etc/fstab and mounts, /etc/llm-cluster, nftables) go
    through sudo: the SSH user is not root. Everything else runs as the user (docker through its group)."""
    return spec.ssh.user != "root"


def access_script(user: str) -> str:
    """Bash that fails, saying how to fix it, unless this login can do what a non-root deployment needs:
    passwordless sudo (for root_steps) and the docker group (the Docker provider talks to dockerd over SSH)."""
    u = q(user)
    return f"""if [ "$(id -u)" -ne 0 ]; then
  if ! sudo -n true 2>/dev/null; then
    echo "ERROR: $(id -un) on $(hostname) cannot run sudo without a password" >&2
    echo "    fix: as root, echo {q(f"{user} ALL=(root) NOPASSWD: ALL")} > /etc/sudoers.d/llm-cluster; chmod 0440 /etc/sudoers.d/llm-cluster" >&2
    exit 1
  fi
  if ! id -nG | tr ' ' '\\n' | grep -qx docker; then
    echo "ERROR: $(id -un) on $(hostname) is not in the docker group: the Docker provider could not reach dockerd" >&2
    echo "    fix: as root, usermod -aG docker {u} (then log in again)" >&2
    exit 1
  fi
fi
"""


def script_hash(script: str) -> str:
    """The `triggers` value that makes a changed script re-run (sha256, 16 hex digits)."""
    return hashlib.sha256(script.encode()).hexdigest()[:16]


# --- config files on a host --------------------------------------------------------------------


def put_files_lines(
    files: Mapping[str, str], roots: Sequence[str], owner: str, mode: str, stdin_path: str | None = None
) -> list[str]:
    """Bash lines writing each host path's text atomically under `roots`, and removing the files there
    an earlier run wrote that this one does not. `stdin_path` is one more file read from stdin (a secret).

    Services mount the roots (directories, never single files: a file replaced by rename stays the
    old inode in a file mount), so the running service sees the new files and can reload them.
    """
    lines = [
        "put() {  # put <path>: stdin into <path>, atomically (same directory, then rename)",
        "  local tmp",
        '  install -d -m 0755 "$(dirname "$1")"',
        '  tmp=$(mktemp "$1.XXXXXX")',
        '  cat > "$tmp"',
        f'  chmod {mode} "$tmp"',
        f'  chown {q(owner)} "$tmp"',
        '  mv -f "$tmp" "$1"',
        "}",
    ]
    lines += [f"install -d -m 0755 {q(r)}" for r in roots]
    wanted = [*files, *([stdin_path] if stdin_path else [])]
    for path, text in files.items():
        refuse_heredoc_end(text, _FILE_HEREDOC, path)
        lines.append(f"put {q(path)} <<'{_FILE_HEREDOC}'\n{text.rstrip(chr(10))}\n{_FILE_HEREDOC}")
    if stdin_path:
        lines.append(f"put {q(stdin_path)}")
    lines.append("# Files an earlier config wrote and this one does not (a removed rules file): gone.")
    lines.append(f"find {' '.join(q(r) for r in roots)} -type f -print0 | while IFS= read -r -d '' f; do")
    lines.append(
        f'  case "$f" in {"|".join(q(w) for w in wanted)}) ;; *) rm -f -- "$f" ;; esac' if wanted else '  rm -f -- "$f"'
    )
    lines.append("done")
    return lines


_PUT = re.compile(rf"^put (\S+) <<'{_FILE_HEREDOC}'\n(.*?)\n{_FILE_HEREDOC}$", re.M | re.S)


def written_files(script: str) -> dict[str, str]:
    """host path -> text of every file a put_files_lines script writes (the plan lists them as artifacts)."""
    return {shlex.split(path)[0]: text + "\n" for path, text in _PUT.findall(script)}


# --- /etc/hosts ----------------------------------------------------------------------------------


def hosts_entries(spec: StackSpec) -> list[tuple[str, str]]:
    """Every node's cluster address and name, in stack order (the runbook's /etc/hosts lines)."""
    return [(spec.nodes[n].address, n) for n in spec.nodes]


_STRIP_BLOCK = (
    'awk -v b="$begin" -v e="$end" \'$0 == b { skip = 1; next } $0 == e { skip = 0; next } !skip\' "$hosts" > "$tmp"'
)


def _hosts_prelude(hosts_file: str) -> str:
    return (
        f"hosts={q(hosts_file)}\nbegin={q(HOSTS_BEGIN)}\nend={q(HOSTS_END)}\n"
        "tmp=$(mktemp)\ntrap 'rm -f \"$tmp\"' EXIT\n"
        f"{_STRIP_BLOCK}\n"
    )


_WRITE_IF_CHANGED = """\
if cmp -s "$tmp" "$hosts"; then
  echo "$hosts: llm-cluster block already up to date"
else
  # Rewrite in place: keeps the file's inode, owner and mode (and works on a bind-mounted hosts file).
  cat "$tmp" > "$hosts"
  echo "$hosts: llm-cluster block {verb}"
fi
"""


def hosts_create_script(entries: list[tuple[str, str]], hosts_file: str = "/etc/hosts") -> str:
    """Replace (or append) the marked block of cluster names; leaves every other line alone."""
    lines = [HOSTS_BEGIN] + [f"{address} {name}" for address, name in entries] + [HOSTS_END]
    body = (
        _hosts_prelude(hosts_file)
        + "printf '%s\\n' "
        + " ".join(q(ln) for ln in lines)
        + ' >> "$tmp"\n'
        + _WRITE_IF_CHANGED.replace("{verb}", "written")
    )
    return _script(f"cluster names in {hosts_file}", body)


def hosts_delete_script(hosts_file: str = "/etc/hosts") -> str:
    """Remove the marked block, nothing else."""
    return _script(
        f"remove the cluster names from {hosts_file}",
        _hosts_prelude(hosts_file) + _WRITE_IF_CHANGED.replace("{verb}", "removed"),
    )


# --- preflight -----------------------------------------------------------------------------------


def model_size_bytes(spec: StackSpec, model: str) -> int:
    """On-disk size of a model's weights: `sizeGib` when stated, else the capacity planner's whole-model
    weights (quantized linear layers, embeddings and LM head at the activation dtype); 0 if unknown."""
    m = spec.models[model]
    if m.size_gib is not None:
        return int(m.size_gib * GIB)
    if m.arch is None:
        return 0  # configJson models without sizeGib: only minFreeDiskGib guards the disk
    act_bytes = DTYPE_BYTES.get(DTYPE_ALIASES[m.dtype], 2)
    try:
        linear = linear_bytes_per_param(m.quantization, act_bytes, m.quant_bits, m.group_size)
    except ValueError:  # a method the capacity planner does not model: its nominal bit width
        linear = m.quant_bits / 8
    return int(checkpoint_bytes(model_arch(m.arch), act_bytes=act_bytes, linear_bytes=linear))


def copied_models(spec: StackSpec, node: str) -> list[str]:
    """Models whose weights are copied to this node (it serves them and is not their source)."""
    models = dict.fromkeys(p.model for p in spec.pools.values() if node in p.nodes)
    return [m for m in models if spec.models[m].source.node not in (None, node)]


def node_expectation(spec: StackSpec, node: str) -> Expectation:
    """What the preflight checks on a node, from the stack."""
    n = spec.node(node)
    assert n.gpu is not None  # the spec refuses nodes without GPUs
    gpu = GPUS[n.gpu.model]
    hca = (
        None
        if n.hca is None
        else {"device": n.hca.device, "port": n.hca.port, "link_layer": n.hca.link_layer, "rate_gbps": n.hca.rate_gbps}
    )
    tps = [p.tensor_parallel for p in spec.pools.values() if node in p.nodes]
    memory_gib, memory_key = spec.node_memory(node)
    cpu_cores, cpu_key = spec.node_cpus(node)
    return Expectation(
        node=node,
        gpu_model=gpu.name,
        gpu_count=n.gpu.count,
        compute_cap=f"{gpu.capability // 10}.{gpu.capability % 10}",
        nvlink=gpu.nvlink,
        max_tensor_parallel=max(tps, default=0),
        driver_min=n.driver_min_version,
        hca=hca,
        disk_path=n.disk_path or "/",
        min_free_gib=n.min_free_disk_gib or 0,
        models=[
            {"path": spec.models[m].path, "size_bytes": model_size_bytes(spec, m)} for m in copied_models(spec, node)
        ],
        firewall=spec.firewall.managed,
        max_clock_offset_s=spec.preflight.max_clock_offset_seconds,
        memory_gib=memory_gib,
        memory_key=memory_key,
        cpu_cores=cpu_cores,
        cpu_key=cpu_key,
        registry=spec.images.registry_host or "",
        tarballs=[s.source for s in node_supplies(spec, node) if s.via == "tarball"],
    )


def preflight_script(exp: Expectation, user: str = "root") -> str:
    """Run the checks of components/node_programs/preflight.py on the node (its source travels in a heredoc);
    a non-root `user` is first checked for passwordless sudo and the docker group (access_script)."""
    source = inspect.getsource(preflight)
    refuse_heredoc_end(source, _PREFLIGHT_HEREDOC, "preflight source")
    body = (
        (access_script(user) if user != "root" else "") + "command -v python3 >/dev/null 2>&1 || {\n"
        '  echo "ERROR: python3 is missing on $(hostname)" >&2\n'
        '  echo "    fix: install python3 (the preflight checks run with it)" >&2\n'
        "  exit 1\n}\n"
        f"python3 - {q(exp.to_json())} <<'{_PREFLIGHT_HEREDOC}'\n{source.rstrip()}\n{_PREFLIGHT_HEREDOC}\n"
    )
    return _script(f"preflight of {exp.node} (GPUs, driver, NVLink, HCA, container runtime, disk, clock, nft)", body)


# --- model weights -------------------------------------------------------------------------------

# Sizes, mtimes and sha256 of every file under the model directory, cached in $state/cache so that
# only files whose size or mtime changed are hashed again (hashing 400 GB takes the best part of an
# hour). The manifest is "size<TAB>sha256<TAB>relative path", sorted: equal weights, equal manifest.
# The caller sets $root (the model directory) and $state (_state_vars).
_BUILD_MANIFEST = r"""
mkdir -p "$state"
touch "$state/cache"
tab=$(printf '\t')
find "$root" -path "$state" -prune -o -type f -printf '%s\t%T@\t%P\n' | LC_ALL=C sort -t "$tab" -k3 > "$state/stat"
awk -F '\t' -v OFS='\t' '
  FILENAME == ARGV[1] { key[$4] = $1 OFS $2; sum[$4] = $3; next }
  ($3 in key) && key[$3] == ($1 OFS $2) { print $1, $2, sum[$3], $3; next }
  { print $1, $2, "-", $3 }' "$state/cache" "$state/stat" > "$state/pending"
read -r files bytes todo todo_bytes < <(awk -F '\t' '{ n++; b += $1 } $3 == "-" { t++; tb += $1 }
  END { printf "%d %.0f %d %.0f\n", n, b, t, tb }' "$state/pending")
echo "$root: $files files, $((bytes / 1073741824)) GiB; hashing $todo changed file(s), $((todo_bytes / 1073741824)) GiB"
done_files=0
while IFS="$tab" read -r size mtime sum rel; do
  if [ "$sum" = "-" ]; then
    done_files=$((done_files + 1))
    echo "  sha256 [$done_files/$todo] $rel" >&2  # stdout of the loop is the cache
    sum=$(sha256sum < "$root/$rel" | cut -d ' ' -f 1)
  fi
  printf '%s\t%s\t%s\t%s\n' "$size" "$mtime" "$sum" "$rel"
done < "$state/pending" > "$state/cache.new"
cut -f 1,3,4 "$state/cache.new" > "$state/manifest.new"
for f in cache manifest; do
  if cmp -s "$state/$f.new" "$state/$f"; then rm -f "$state/$f.new"; else mv "$state/$f.new" "$state/$f"; fi
done
rm -f "$state/stat" "$state/pending"
"""


def _state_vars(path: str) -> str:
    """$root, the model directory, and $state, llm-cluster's bookkeeping under it."""
    return f'root={q(path.rstrip("/") or "/")}\nstate="$root/{STATE_DIR}"\n'


def manifest_build_script(path: str) -> str:
    """On the weights' source: (re)build the manifest of sizes and sha256, hashing only changed files."""
    body = (
        _state_vars(path) + 'test -d "$root" || { echo "ERROR: $root does not exist on $(hostname)" >&2; '
        'echo "    fix: put the weights there, or correct the model\'s path/source.node" >&2; exit 1; }\n'
        + _BUILD_MANIFEST.lstrip()
        + 'echo "manifest: $state/manifest ($(sha256sum < "$state/manifest" | cut -c 1-16))"\n'
    )
    return _script(f"manifest of the weights at {path}", body)


def manifest_verify_script(path: str, copy_command: str = "this node's copy command") -> str:
    """On a target: the local weights match the source's manifest ($state/expected); marks them verified.

    A mismatched file is removed (with its cached checksum): rsync skips a file whose size and mtime
    match, so a corrupt one left in place would never be sent again.
    """
    body = (
        _state_vars(path) + 'test -f "$state/expected" || { echo "ERROR: no source manifest at '
        '$state/expected on $(hostname)" >&2; echo "    fix: the copy did not finish; '
        'run pulumi up again (rsync resumes)" >&2; exit 1; }\n'
        + _BUILD_MANIFEST.lstrip()
        + r"""wrong=$(LC_ALL=C comm -23 <(LC_ALL=C sort "$state/expected") <(LC_ALL=C sort "$state/manifest"))
if [ -n "$wrong" ]; then
  rm -f "$state/verified"
  count=$(printf '%s\n' "$wrong" | wc -l)
  echo "ERROR: $count file(s) at $root on $(hostname) differ from the source (size, sha256, path):" >&2
  printf '%s\n' "$wrong" | head -n 20 >&2
  printf '%s\n' "$wrong" | cut -f 3- > "$state/wrong"
  awk -F '\t' 'FILENAME == ARGV[1] { bad[$0] = 1; next } !($4 in bad)' "$state/wrong" "$state/cache" > "$state/cache.new"
  mv "$state/cache.new" "$state/cache"
  while IFS= read -r rel; do rm -f -- "${root:?}/$rel"; done < "$state/wrong"
  rm -f "$state/wrong"
"""
        + f"""  echo {
            q(
                f"    fix: those files were removed here, so the next copy sends them again: run pulumi up "
                f"--replace <urn of {copy_command}> (pulumi stack --show-urns); if it repeats, check the disk"
            )
        } >&2
  exit 1
fi
"""
        + r"""want=$(sha256sum < "$state/expected" | cut -d ' ' -f 1)
if [ "$(cat "$state/verified" 2>/dev/null || true)" != "$want" ]; then echo "$want" > "$state/verified"; fi
echo "verified: $root matches the source manifest ($(cut -c 1-16 "$state/verified"))"
"""
    )
    return _script(f"verify the weights at {path}", body)


def manifest_delete_script(path: str, files: tuple[str, ...]) -> str:
    """Remove llm-cluster's bookkeeping files under the model directory (never the weights)."""
    state = f"{path.rstrip('/')}/{STATE_DIR}"
    return _script(
        f"forget the weights bookkeeping at {path}", f"rm -f -- {' '.join(q(f'{state}/{f}') for f in files)}\n"
    )


def ssh_argv(port: int, host_key_checking: bool) -> list[str]:
    """ssh between nodes: non-interactive; trusts first contact when host keys are checked (nodes hold no pins)."""
    checking = (
        ["-o", "StrictHostKeyChecking=accept-new"]
        if host_key_checking
        else ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    )
    return ["ssh", "-o", "BatchMode=yes", *checking, "-p", str(port)]


def copy_script(path: str, *, serving: str, target: str, target_login: str, ssh: list[str], manifest: str) -> str:
    """On the serving node: rsync the weights to the target unless it already verified this manifest."""
    root = path.rstrip("/")
    state = f"{root}/{STATE_DIR}"
    remote = lambda cmd: f'"${{ssh[@]}}" "$dst" {q(cmd)} </dev/null'  # noqa: E731
    body = f"""root={q(root)}
dst={q(target_login)}
manifest={q(f"{state}/{manifest}")}
ssh=({" ".join(q(a) for a in ssh)})
command -v rsync >/dev/null || {{ echo "ERROR: rsync is missing on $(hostname); fix: install rsync" >&2; exit 1; }}
want=$(sha256sum < "$manifest" | cut -d ' ' -f 1)
have=$({remote(f"cat {q(state + '/verified')} 2>/dev/null || true")})
if [ "$have" = "$want" ]; then
  echo {q(f"{target} already holds the verified weights of {root}: copy skipped")}
  exit 0
fi
{remote(f"command -v rsync >/dev/null && mkdir -p {q(state)}")} || {{
  echo {q(f"ERROR: cannot prepare {root} on {target} over ssh from {serving}")} >&2
  echo "    fix: let nodes reach each other over SSH as the same user, and install rsync" >&2
  exit 1
}}
echo {q(f"copying {root} from {serving} to {target}")}
rsync -a --partial --info=progress2 --exclude=/{STATE_DIR}/ -e "${{ssh[*]}}" "$root/" "$dst:$root/"
rsync -a -e "${{ssh[*]}}" "$manifest" "$dst:$root/{STATE_DIR}/expected"
"""
    return _script(f"copy the weights at {root} from {serving} to {target}", body)


def copy_delete_script(path: str, *, target_login: str, ssh: list[str]) -> str:
    """Forget the copy: the target's expected manifest and verified mark go, the weights stay (hours to copy back)."""
    state = f"{path.rstrip('/')}/{STATE_DIR}"
    cmd = f"rm -f -- {q(state + '/expected')} {q(state + '/verified')}"
    return _script(
        f"forget the copy of {path} on {target_login}",
        f"{' '.join(q(a) for a in ssh)} {q(target_login)} {q(cmd)} </dev/null\n",
    )


def fanout_rounds(source: str, targets: list[str]) -> list[list[tuple[str, str]]]:
    """Copy rounds: each node that has the weights serves one new node per round (⌈log2 N⌉ rounds for N nodes)."""
    holders = [source]
    pending = [t for t in dict.fromkeys(targets) if t != source]
    rounds: list[list[tuple[str, str]]] = []
    while pending:
        pairs = list(zip(holders, pending))
        rounds.append(pairs)
        pending = pending[len(pairs) :]
        holders += [dst for _, dst in pairs]
    assert len(rounds) == (math.ceil(math.log2(len(holders))) if len(holders) > 1 else 0)
    return rounds


# --- shared mount and weights already present ----------------------------------------------------


def fstab_entry(share: str, path: str) -> str:
    """The fstab line of a read-only NFS model share (vLLM only reads the weights)."""
    return f"{share} {path.rstrip('/')} nfs ro,_netdev 0 0"


_CHECK_READABLE = """\
test -r "$root/config.json" || {
  echo "ERROR: $root/config.json is not readable on $(hostname)" >&2
  echo {fix} >&2
  exit 1
}
echo "$root: $(find "$root" -maxdepth 1 -type f | wc -l) files, config.json readable"
"""


def _check_readable(fix: str) -> str:
    return _CHECK_READABLE.replace("{fix}", q(f"    fix: {fix}"))


def mount_script(share: str, path: str, fstab: str = "/etc/fstab") -> str:
    """Mount the share at the model path (fstab entry added once) and check the weights are readable."""
    body = f"""root={q(path.rstrip("/"))}
share={q(share)}
entry={q(fstab_entry(share, path))}
fstab={q(fstab)}
mkdir -p "$root"
grep -qxF -- "$entry" "$fstab" || printf '%s\\n' "$entry" >> "$fstab"
if ! mountpoint -q "$root"; then
  mount "$root" || {{
    echo "ERROR: cannot mount $share at $root on $(hostname)" >&2
    echo "    fix: install nfs-common and check that the server exports the share to this node" >&2
    exit 1
  }}
fi
""" + _check_readable(f"check the export {share} holds the model's files")
    return _script(f"mount {share} at {path}", body)


def unmount_script(share: str, path: str, fstab: str = "/etc/fstab") -> str:
    """Unmount the share and remove its fstab entry."""
    body = f"""root={q(path.rstrip("/"))}
entry={q(fstab_entry(share, path))}
fstab={q(fstab)}
if mountpoint -q "$root"; then umount "$root"; fi
if grep -qxF -- "$entry" "$fstab"; then
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT
  grep -vxF -- "$entry" "$fstab" > "$tmp" || true
  cat "$tmp" > "$fstab"
fi
"""
    return _script(f"unmount {share} from {path}", body)


def present_check_script(path: str) -> str:
    """Weights said to be on the node already: check they are there and readable (nothing to undo)."""
    body = f"root={q(path.rstrip('/'))}\n" + _check_readable(
        "put the weights there, or use source.node / source.sharedMount for this model"
    )
    return _script(f"check the weights at {path}", body)


# --- files on the operator's machine (for the Docker provider's ssh) -----------------------------


def operator_file_path(stack: str, node: str, kind: str) -> str:
    """Where ssh finds a node's key or known_hosts on the operator's machine (`~` expands in ssh -i and -o)."""
    return f"~/.ssh/llm-cluster/{stack}/{node}.{kind}"


def _home_path(path: str) -> str:
    return '"$HOME"/' + q(path[2:]) if path.startswith("~/") else q(path)


def operator_file_create_script(path: str) -> str:
    """Write stdin to a 0600 file (atomically): key material never appears in the command line."""
    p = _home_path(path)
    return _script(
        f"write {path} from stdin (mode 0600)",
        f'umask 077\nmkdir -p "$(dirname {p})"\ncat > {p}.tmp\nmv -f {p}.tmp {p}\n',
    )


def operator_file_delete_script(path: str) -> str:
    """Remove the file written by operator_file_create_script."""
    return _script(f"remove {path}", f"rm -f -- {_home_path(path)}\n")


def known_hosts_line(host: str, port: int, host_key: str) -> str:
    """A known_hosts line for a pinned host key (`[host]:port` when not on 22)."""
    return f"{host if port == 22 else f'[{host}]:{port}'} {host_key.strip()}\n"
