"""The nginx and Lua module the gateway image deploys, fetched for the real-nginx tests whatever this machine runs.

The gateway image pins Debian packages (components/facts/gateway_image.py). This module fetches
exactly those versions, with the dependencies Debian resolves for them, from the same archives the
image's Dockerfile uses (deb.debian.org; snapshot.debian.org for a pinned version that has left
the archive), checks each package is the pinned one, unpacks them into
/var/cache/llm-cluster/gateway-nginx/<image tag>/ and writes `bin/nginx`: that release's nginx
started by that release's own dynamic loader and libraries, so a bookworm test machine runs trixie's
nginx, its Lua module and LuaJIT unchanged. Done once per machine (under a lock; a missing or partial cache is rebuilt).

    python tests/support/deployed_nginx.py   # fetch if needed, then print the nginx, module and Lua paths
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from components.planning.gateway.image import (  # noqa: E402
    GATEWAY_IMAGE,
    LUA_CPATHS,
    LUA_MODULE,
    LUA_PATHS,
    MODULES_DIR,
    NDK_MODULE,
    TESTED_PACKAGES,
    debian_sources,
)
from tests.support import cache_lock  # noqa: E402

CACHE = Path(os.environ.get("LLM_CLUSTER_CACHE", "/var/cache/llm-cluster")) / "gateway-nginx"
SNAPSHOT = "https://snapshot.debian.org"
ARCH = "amd64"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Where trixie's libc6 puts its loader and libraries (merged /usr).
LIBDIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
LOADER = "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class DeployedNginx:
    """The unpacked release: its nginx launcher, the modules and Lua search paths nginx.conf names (the
    image's own, under root), and every package version in it."""

    dir: Path
    nginx: Path
    ndk_module: Path
    """load_module it first: the Lua module links against it."""
    lua_module: Path
    lua_package_path: str
    """The tree's LUA_PATHS, `;`-separated, without the trailing `;;` (nginx.conf appends the config's own
    directory before it and `;;` after it)."""
    lua_package_cpath: str
    """The tree's LUA_CPATHS, likewise."""
    packages: dict[str, str]
    """Package -> version of every .deb unpacked (the pinned ones and their dependencies)."""
    sources: dict[str, str]
    """Pinned package -> where it came from: "archive" or "snapshot"."""

    @property
    def argv(self) -> list[str]:
        """The nginx binary itself on its release's loader: what bin/nginx execs, for a tool that
        must start the binary (valgrind stops instrumenting at the launcher script's exec)."""
        return binary_argv(self.dir / "root")

    def layout_fields(self) -> dict[str, object]:
        """GatewayLayout's fields for this tree's modules and Lua libraries."""
        return {
            "load_modules": (str(self.ndk_module), str(self.lua_module)),
            "lua_path": self.lua_package_path,
            "lua_cpath": self.lua_package_cpath,
        }


def binary_argv(root: Path) -> list[str]:
    """The unpacked release's nginx started by its own loader and libraries."""
    return [
        str(root / LOADER),
        "--library-path",
        ":".join(str(root / d) for d in LIBDIRS),
        str(root / "usr/sbin/nginx"),
    ]


def cache_dir() -> Path:
    """This image's directory: a new pin set (a new image tag) is a new directory."""
    return CACHE / GATEWAY_IMAGE.split(":", 1)[1]


def deployed_nginx() -> DeployedNginx:
    """The image's nginx + Lua module on this machine, fetched first if the cache lacks it."""
    target = cache_dir()
    with cache_lock(CACHE):
        found = _load(target)
        if found is not None:
            return found
        build = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=CACHE))
        build.chmod(0o755)  # readable by any user who runs the tests
        try:
            _fetch(build)
            if target.exists():
                shutil.rmtree(target)  # a partial or stale tree (its manifest did not check out)
            build.rename(target)
        finally:
            shutil.rmtree(build, ignore_errors=True)
        found = _load(target)
        if found is None:
            raise RuntimeError(f"{target}: fetched, but its manifest does not check out")
        return found


def _load(target: Path) -> DeployedNginx | None:
    """The cached release when complete and exactly the pins, else None (to be fetched again)."""
    try:
        manifest = json.loads((target / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    root = target / "root"
    found = DeployedNginx(
        dir=target,
        nginx=target / "bin" / "nginx",
        ndk_module=_under(root, f"{MODULES_DIR}/{NDK_MODULE}"),
        lua_module=_under(root, f"{MODULES_DIR}/{LUA_MODULE}"),
        lua_package_path=";".join(str(_under(root, p)) for p in LUA_PATHS),
        lua_package_cpath=";".join(str(_under(root, p)) for p in LUA_CPATHS),
        packages=manifest["packages"],
        sources=manifest["sources"],
    )
    pinned = {p: found.packages.get(p) for p in TESTED_PACKAGES}
    # Each search path's directory too: a pin set that moved resty.core or cjson is not this tree.
    needed = (
        found.nginx,
        found.ndk_module,
        found.lua_module,
        root / LOADER,
        *(_under(root, p).parent for p in (*LUA_PATHS, *LUA_CPATHS)),
    )
    if pinned != TESTED_PACKAGES or not all(p.exists() for p in needed):
        return None
    return found


def _under(root: Path, image_path: str) -> Path:
    """An image path (absolute) in the unpacked tree."""
    return root / image_path.lstrip("/")


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr.strip()}")
    return result.stdout


def _apt_env(work: Path) -> dict[str, str]:
    """apt on a private tree: the image's sources, no installed packages, nothing of the host's state."""
    for d in ("etc/sources.list.d", "etc/preferences.d", "lists/partial", "cache/archives/partial", "state"):
        (work / d).mkdir(parents=True, exist_ok=True)
    (work / "etc/sources.list.d/debian.sources").write_text(debian_sources())
    (work / "state/status").write_text("")
    (work / "apt.conf").write_text(
        "\n".join(
            [
                f'Dir::Etc::sourcelist "{work}/etc/sources.list";',
                f'Dir::Etc::sourceparts "{work}/etc/sources.list.d";',
                f'Dir::Etc::preferencesparts "{work}/etc/preferences.d";',
                f'Dir::Etc::trusted "{KEYRING}";',
                f'Dir::State "{work}/state";',
                f'Dir::State::Lists "{work}/lists";',
                f'Dir::State::status "{work}/state/status";',
                f'Dir::Cache "{work}/cache";',
                f'APT::Architecture "{ARCH}";',
                'APT::Architectures { "' + ARCH + '"; };',
                # Root's apt drops to _apt for downloads, which cannot write into this tree.
                'APT::Sandbox::User "root";',
                'Debug::NoLocking "true";',
                "",
            ]
        )
    )
    return {**os.environ, "APT_CONFIG": str(work / "apt.conf"), "DEBIAN_FRONTEND": "noninteractive"}


def _archive_versions(env: dict[str, str], pkg: str) -> list[str]:
    out = _run(["apt-cache", "madison", pkg], env)
    return [f.strip() for line in out.splitlines() for f in line.split("|")[1:2]]


def _from_snapshot(pkg: str, version: str, dest: Path, archive: list[str] | None = None) -> Path:
    """A pinned .deb the archive no longer has (it has `archive`), from snapshot.debian.org by name and
    version (SHA-1 checked)."""
    query = f"{SNAPSHOT}/mr/binary/{urllib.parse.quote(pkg)}/{urllib.parse.quote(version)}/binfiles?fileinfo=1"
    try:
        with urllib.request.urlopen(query, timeout=60) as resp:
            info = json.load(resp)
    except OSError as err:
        # What a fresh machine meets the day trixie-security publishes a newer build of a pin.
        reason = getattr(err, "reason", None) or err
        raise RuntimeError(
            f"{pkg} {version} has left the Debian archive (it has {', '.join(archive or []) or 'no version'}) and "
            f"{SNAPSHOT} cannot be reached ({reason}): pin a version the archive has in "
            "components/facts/gateway_image.py TESTED_PACKAGES (and the Dockerfile), "
            "or let this machine reach snapshot.debian.org"
        ) from None
    for entry in info.get("result", []):
        if entry.get("architecture") not in (ARCH, "all"):
            continue
        digest = entry["hash"]
        name = info["fileinfo"][digest][0]["name"]
        path = dest / name
        with urllib.request.urlopen(f"{SNAPSHOT}/file/{digest}", timeout=300) as resp:
            path.write_bytes(resp.read())
        if hashlib.sha1(path.read_bytes()).hexdigest() != digest:
            raise RuntimeError(f"{SNAPSHOT}: {name} does not match its SHA-1 {digest}")
        return path
    raise RuntimeError(f"{pkg} {version} ({ARCH}) is neither in the Debian archive nor on {SNAPSHOT}")


def _fetch(build: Path) -> None:
    work = build / "apt"
    env = _apt_env(work)
    print(
        f"gateway-nginx: fetching {', '.join(f'{p}={v}' for p, v in TESTED_PACKAGES.items())} "
        f"into {build.parent} (once per machine)",
        file=sys.stderr,
    )
    _run(["apt-get", "update", "-q"], env)
    pinned_dir = build / "pinned"
    pinned_dir.mkdir()
    sources: dict[str, str] = {}
    for pkg, version in TESTED_PACKAGES.items():
        archive = _archive_versions(env, pkg)
        if version in archive:
            _run(["apt-get", "download", "-q", f"{pkg}={version}"], env, cwd=pinned_dir)
            sources[pkg] = "archive"
        else:
            _from_snapshot(pkg, version, pinned_dir, archive)
            sources[pkg] = "snapshot"
    # apt resolves the dependencies of the pinned files themselves (what the image's apt-get install does).
    _run(
        [
            "apt-get",
            "install",
            "--download-only",
            "-y",
            "-q",
            "--no-install-recommends",
            *sorted(str(p) for p in pinned_dir.glob("*.deb")),
        ],
        env,
    )
    debs = {_field(p, "Package"): p for p in (work / "cache/archives").glob("*.deb")}
    debs.update({_field(p, "Package"): p for p in pinned_dir.glob("*.deb")})
    packages = {pkg: _field(path, "Version") for pkg, path in sorted(debs.items())}
    for pkg, version in TESTED_PACKAGES.items():
        if packages.get(pkg) != version:
            raise RuntimeError(f"fetched {pkg} {packages.get(pkg)}, the image pins {version}")
    root = build / "root"
    for path in debs.values():
        _run(["dpkg-deb", "-x", str(path), str(root)])
    (build / "bin").mkdir()
    launcher = build / "bin" / "nginx"
    final = cache_dir()
    launcher.write_text(
        "#!/bin/sh\n# trixie's nginx on its own loader and libraries (tests/support/deployed_nginx.py).\n"
        f'exec {shlex.join(binary_argv(final / "root"))} "$@"\n'
    )
    launcher.chmod(0o755)
    shutil.rmtree(work)
    (build / MANIFEST).write_text(
        json.dumps({"image": GATEWAY_IMAGE, "packages": packages, "sources": sources}, indent=1) + "\n"
    )


def _field(deb: Path, name: str) -> str:
    return _run(["dpkg-deb", "-f", str(deb), name]).strip()


if __name__ == "__main__":
    found = deployed_nginx()
    print(
        f"nginx: {found.nginx}\nndk module: {found.ndk_module}\nlua module: {found.lua_module}\n"
        f"lua_package_path: {found.lua_package_path}\nlua_package_cpath: {found.lua_package_cpath}"
    )
