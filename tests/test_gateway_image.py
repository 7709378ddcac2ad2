"""Tested = deployed: the real-nginx tests run exactly the nginx and Lua module the gateway image pins."""

from __future__ import annotations

import datetime
import hashlib
import http.server
import json
import re
import shlex
import shutil
import subprocess
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from components.planning.gateway.image import (
    BASE_IMAGE,
    BUILD_CONTEXT,
    CONTEXT_DIR,
    GATEWAY_IMAGE,
    LUA_MODULE,
    MODULES_DIR,
    NDK_MODULE,
    TESTED_PACKAGES,
    build_args,
    debian_sources,
    dockerfile,
)
from components.planning.image_supply import images_for_node, mirror_script
from components.planning.load import load_stack_config
from components.spec import SpecError, StackSpec
from plan.harness import ProgramRun
from tests.conftest import ROOT, prod_config
from tests.support import deployed_nginx as fetcher
from tests.support import free_port
from tests.support.gateway import deployed, lua_reports, nginx_binary


def _md5sums(deb: Path) -> dict[str, str]:
    """The package's own md5sums control file: path -> digest."""
    out = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True).stdout
    listed = subprocess.run(["tar", "-xO", "./md5sums"], input=out, capture_output=True, check=True).stdout
    return {path: digest for digest, path in (line.split(None, 1) for line in listed.decode().splitlines())}


def _pinned_deb(pkg: str) -> Path:
    """The pinned package's .deb the tree was unpacked from, checked to be the pinned version."""
    debs = list((deployed().dir / "pinned").glob(f"{pkg}_*.deb"))
    assert len(debs) == 1, debs
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(debs[0]), "Package", "Version"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert fields == [f"Package: {pkg}", f"Version: {TESTED_PACKAGES[pkg]}"]
    return debs[0]


def _upstream(pkg: str) -> str:
    """The pinned version without epoch and Debian revision: 1:0.10.28-2 -> 0.10.28."""
    return TESTED_PACKAGES[pkg].split(":", 1)[-1].rsplit("-", 1)[0]


def test_the_tests_run_the_nginx_and_lua_module_the_image_pins() -> None:
    found = deployed()
    assert {p: found.packages[p] for p in TESTED_PACKAGES} == TESTED_PACKAGES
    root = found.dir / "root"
    # What nginx.conf names is the image's paths under the unpacked root.
    assert f"{root}/usr/sbin/nginx" in found.nginx.read_text()
    # The launcher runs the very argv the benches start valgrind with.
    assert found.nginx.read_text().splitlines()[-1] == f'exec {shlex.join(found.argv)} "$@"'
    assert (found.ndk_module, found.lua_module) == (
        root / "usr/lib/nginx/modules/ndk_http_module.so",
        root / "usr/lib/nginx/modules/ngx_http_lua_module.so",
    )
    assert (MODULES_DIR, NDK_MODULE, LUA_MODULE) == (
        "/usr/lib/nginx/modules",
        "ndk_http_module.so",
        "ngx_http_lua_module.so",
    )
    assert found.lua_package_path == f"{root}/usr/share/lua/5.1/?.lua"
    assert found.lua_package_cpath == f"{root}/usr/lib/x86_64-linux-gnu/lua/5.1/?.so"
    # Every file of every pinned package is byte for byte the package's (its own md5sums) ...
    owner: dict[str, str] = {}
    for pkg in TESTED_PACKAGES:
        for rel, digest in _md5sums(_pinned_deb(pkg)).items():
            assert hashlib.md5((root / rel).read_bytes()).hexdigest() == digest, rel
            owner[rel] = pkg
    # ... and what nginx loads comes from the package meant to provide it: the binaries, LuaJIT (what the
    # Lua module links), resty.core and cjson (what the search paths find).
    lua_module_libs = subprocess.run(
        ["objdump", "-p", str(found.lua_module)], capture_output=True, text=True, check=True
    ).stdout
    assert "  NEEDED               libluajit-5.1.so.2\n" in lua_module_libs
    luajit = (root / "usr/lib/x86_64-linux-gnu/libluajit-5.1.so.2").resolve().relative_to(root)
    cjson = (root / "usr/lib/x86_64-linux-gnu/lua/5.1/cjson.so").resolve().relative_to(root)
    assert {
        rel: owner.get(rel)
        for rel in (
            "usr/sbin/nginx",
            "usr/lib/nginx/modules/ndk_http_module.so",
            "usr/lib/nginx/modules/ngx_http_lua_module.so",
            str(luajit),
            "usr/share/lua/5.1/resty/core.lua",
            "usr/share/lua/5.1/resty/lrucache.lua",
            str(cjson),
        )
    } == {
        "usr/sbin/nginx": "nginx",
        "usr/lib/nginx/modules/ndk_http_module.so": "libnginx-mod-http-ndk",
        "usr/lib/nginx/modules/ngx_http_lua_module.so": "libnginx-mod-http-lua",
        str(luajit): "libluajit-5.1-2",
        "usr/share/lua/5.1/resty/core.lua": "lua-resty-core",
        "usr/share/lua/5.1/resty/lrucache.lua": "lua-resty-lrucache",
        str(cjson): "lua-cjson",
    }
    version = subprocess.run([nginx_binary(), "-v"], capture_output=True, text=True).stderr
    assert re.search(r"nginx/(\S+)", version).group(1) == _upstream("nginx")  # type: ignore[union-attr]
    if "snapshot" in found.sources.values():
        warnings.warn(
            f"pinned packages came from snapshot.debian.org ({found.sources}): the image's default build "
            "cannot fetch them from the archive any more; move the pins in components/facts/gateway_image.py, or build "
            "with gateway.imageBuild pointing at snapshot.debian.org",
            stacklevel=2,
        )


def test_the_lua_module_requires_the_nginx_abi_the_image_pins() -> None:
    # Debian rebuilds its nginx modules for each nginx ABI: the pinned module must be the one built for
    # the pinned nginx (apt would otherwise refuse the image's install, or pick another nginx).
    provides = subprocess.run(
        ["dpkg-deb", "-f", str(_pinned_deb("nginx")), "Provides"], capture_output=True, text=True, check=True
    ).stdout.strip()
    abi = next(p for p in provides.split(", ") if p.startswith("nginx-abi-"))
    assert abi == "nginx-abi-1.26.3-1"
    for pkg in ("libnginx-mod-http-ndk", "libnginx-mod-http-lua"):
        depends = (
            subprocess.run(
                ["dpkg-deb", "-f", str(_pinned_deb(pkg)), "Depends"], capture_output=True, text=True, check=True
            )
            .stdout.strip()
            .split(", ")
        )
        assert [d for d in depends if d.startswith("nginx-abi-")] == [abi], (pkg, depends)


def test_a_running_nginx_reports_the_pinned_lua_module_luajit_and_resty_core(tmp_path: Path) -> None:
    # Their own idea of their versions, in a running nginx, and where resty.core and cjson were found.
    got = lua_reports(
        tmp_path,
        """ngx.say(ngx.config.nginx_version, "\\n", ngx.config.ngx_lua_version, "\\n",
      jit.version, "\\n", tostring(package.loaded["resty.core"] ~= nil), "\\n", require("resty.core").version,
      "\\n", package.searchpath("resty.core", package.path), "\\n",
      package.searchpath("cjson", package.cpath), "\\n", require("cjson").encode({ok = true}))""",
    ).splitlines()
    nginx = [int(n) for n in _upstream("nginx").split(".")]
    lua = [int(n) for n in _upstream("libnginx-mod-http-lua").split(".")]
    found = deployed()
    assert got[:2] + got[3:] == [
        str(nginx[0] * 1000000 + nginx[1] * 1000 + nginx[2]),
        str(lua[0] * 1000000 + lua[1] * 1000 + lua[2]),
        "true",
        _upstream("lua-resty-core"),
        found.lua_package_path.replace("?", "resty/core"),
        found.lua_package_cpath.replace("?", "cjson"),
        '{"ok":true}',
    ]
    # OpenResty's LuaJIT names itself 2.1.<commit time>: the day the pinned snapshot was taken.
    luajit = re.fullmatch(r"LuaJIT 2\.1\.(\d+)", got[2])
    assert luajit is not None, got[2]
    day = datetime.datetime.fromtimestamp(int(luajit.group(1)), datetime.UTC).strftime("%Y%m%d")
    assert f"2.1.0+openresty{day}-" in TESTED_PACKAGES["libluajit-5.1-2"]


def test_the_committed_dockerfile_is_the_generated_one() -> None:
    assert (CONTEXT_DIR / "Dockerfile").read_text() == dockerfile()
    assert (ROOT / BUILD_CONTEXT) == CONTEXT_DIR
    text = dockerfile()
    assert f"FROM {BASE_IMAGE}\n" in text and BASE_IMAGE == "debian:trixie-slim"
    for pkg, version in TESTED_PACKAGES.items():
        assert f" {pkg}={version} " in text
    assert "njs" not in text and "libnginx-mod-http-js" not in TESTED_PACKAGES
    # No epoch colon and no `+` in a Docker tag.
    assert GATEWAY_IMAGE == "llm-cluster/gateway:nginx-1.26.3-3-deb13u12-lua-0.10.28-2"
    for arg, default in build_args().items():
        assert f"\nARG {arg}={default}\n" in text


def _printf_of_sources(text: str) -> str:
    """The Dockerfile's command that writes apt's sources, as one shell line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("printf 'Types: deb"))
    end = next(i for i in range(start, len(lines)) if "/etc/apt/sources.list.d/debian.sources" in lines[i])
    return " ".join(line.strip().rstrip("\\").strip() for line in lines[start : end + 1]).rstrip(";")


@pytest.mark.parametrize(
    "args",
    [
        build_args(),
        build_args(
            "http://10.0.0.5:3142/debian", "https://snapshot.debian.org/archive/debian-security/20261201T000000Z", False
        ),
    ],
)
def test_the_dockerfile_writes_the_sources_the_tests_fetch_from(args: dict[str, str], tmp_path: Path) -> None:
    # The image's apt and the tests' fetch read the same sources: run the Dockerfile's printf for real.
    command = _printf_of_sources(dockerfile()).replace(
        "/etc/apt/sources.list.d/debian.sources", str(tmp_path / "debian.sources")
    )
    subprocess.run(["bash", "-euc", command], env={"PATH": "/usr/bin:/bin", **args}, check=True)
    assert (tmp_path / "debian.sources").read_text() == debian_sources(
        args["DEBIAN_MIRROR"], args["DEBIAN_SECURITY_MIRROR"], args["APT_CHECK_VALID_UNTIL"] == "yes"
    )


def test_the_gateway_node_builds_the_image_and_never_pulls_it(prod_run: ProgramRun, prod_spec: StackSpec) -> None:
    assert prod_spec.gateway is not None and prod_spec.gateway.image == GATEWAY_IMAGE
    assert GATEWAY_IMAGE not in images_for_node(prod_spec, "gpu-01")
    image = prod_run.get("gateway-image")
    assert image.plain_inputs()["name"] == GATEWAY_IMAGE
    assert image.plain_inputs()["build"] == {
        "context": BUILD_CONTEXT,
        "dockerfile": "Dockerfile",
        "buildArgs": {
            "DEBIAN_MIRROR": "http://deb.debian.org/debian",
            "DEBIAN_SECURITY_MIRROR": "http://deb.debian.org/debian-security",
            "APT_CHECK_VALID_UNTIL": "yes",
        },
    }
    assert image.provider.startswith(prod_run.get("gpu-01-docker").urn)
    nginx = prod_run.get("gateway-nginx")
    assert image.urn in nginx.property_dependencies["image"]


def test_image_build_mirrors_reach_the_build_and_the_mirror_script() -> None:
    config = prod_config()
    config["llm-cluster:gateway"]["imageBuild"] = {
        "debianMirror": "http://10.0.0.5:3142/debian/",
        "checkValidUntil": False,
    }
    spec = load_stack_config(config, set())
    assert spec.gateway is not None and spec.gateway.image_build.args() == {
        "DEBIAN_MIRROR": "http://10.0.0.5:3142/debian",
        "DEBIAN_SECURITY_MIRROR": "http://deb.debian.org/debian-security",
        "APT_CHECK_VALID_UNTIL": "no",
    }
    assert (
        f"docker build -t {GATEWAY_IMAGE} --build-arg DEBIAN_MIRROR=http://10.0.0.5:3142/debian "
        f"--build-arg APT_CHECK_VALID_UNTIL=no {BUILD_CONTEXT}\n"
    ) in mirror_script(spec)
    assert f"docker build -t {GATEWAY_IMAGE} {BUILD_CONTEXT}\n" in mirror_script(
        load_stack_config(prod_config(), set())
    )


# --- the fetch itself ------------------------------------------------------------------------------

SnapshotAdd = Callable[..., None]


@pytest.fixture
def snapshot_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[SnapshotAdd]:
    """A loopback server answering like snapshot.debian.org's machine-readable API (/mr/binary/<pkg>/<version>/
    binfiles?fileinfo=1, then /file/<sha1>); yields add(name, data, digest=sha1 of data) to publish a file."""
    files: dict[str, tuple[str, bytes]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            m = re.fullmatch(r"/mr/binary/([^/]+)/([^/]+)/binfiles\?fileinfo=1", self.path)
            if m:
                hits = [h for h, (name, _) in files.items() if name.startswith(f"{m.group(1)}_")]
                body = json.dumps(
                    {
                        "result": [{"architecture": "amd64", "hash": h} for h in hits],
                        "fileinfo": {h: [{"name": files[h][0], "archive_name": "debian-security"}] for h in hits},
                    }
                ).encode()
            elif self.path.startswith("/file/") and self.path[6:] in files:
                body = files[self.path[6:]][1]
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    def add(name: str, data: bytes, digest: str | None = None) -> None:
        files[digest or hashlib.sha1(data).hexdigest()] = (name, data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(fetcher, "SNAPSHOT", f"http://127.0.0.1:{server.server_address[1]}")
    yield add
    server.shutdown()
    server.server_close()


def test_a_pin_that_left_the_archive_comes_from_snapshot_checked(snapshot_server: SnapshotAdd, tmp_path: Path) -> None:
    deb = next((deployed().dir / "pinned").glob("nginx-common_*.deb"))
    snapshot_server(deb.name, deb.read_bytes())
    got = fetcher._from_snapshot("nginx-common", TESTED_PACKAGES["nginx-common"], tmp_path)
    assert got == tmp_path / deb.name and got.read_bytes() == deb.read_bytes()
    # A file whose bytes do not match the SHA-1 snapshot names is refused, and so is a version it lacks.
    snapshot_server("nginx_1.26.3-3+deb13u12_amd64.deb", b"not the package", "0" * 40)
    with pytest.raises(RuntimeError) as err:
        fetcher._from_snapshot("nginx", TESTED_PACKAGES["nginx"], tmp_path)
    assert (
        str(err.value) == f"{fetcher.SNAPSHOT}: nginx_1.26.3-3+deb13u12_amd64.deb does not match its SHA-1 {'0' * 40}"
    )
    with pytest.raises(RuntimeError) as err:
        fetcher._from_snapshot("libfoo", "1.0", tmp_path)
    assert str(err.value) == f"libfoo 1.0 (amd64) is neither in the Debian archive nor on {fetcher.SNAPSHOT}"


def test_a_pin_that_left_the_archive_while_snapshot_is_unreachable_says_what_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As when trixie-security moved past the pinned build and snapshot.debian.org did not resolve.
    port = free_port()  # nothing listens there
    monkeypatch.setattr(fetcher, "SNAPSHOT", f"http://127.0.0.1:{port}")
    with pytest.raises(RuntimeError) as err:
        fetcher._from_snapshot("nginx", "1.26.3-3+deb13u11", tmp_path, ["1.26.3-3+deb13u12", "1.26.3-3+deb13u10"])
    assert str(err.value) == (
        "nginx 1.26.3-3+deb13u11 has left the Debian archive (it has 1.26.3-3+deb13u12, 1.26.3-3+deb13u10) and "
        f"http://127.0.0.1:{port} cannot be reached ([Errno 111] Connection refused): pin a version the archive "
        "has in components/facts/gateway_image.py TESTED_PACKAGES (and the Dockerfile), or let this machine "
        "reach snapshot.debian.org"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_partial_cache_or_another_lua_module_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache as CI's fresh clone on this machine may find it: a copy without its launcher is not used.
    found = deployed()
    copy = tmp_path / "gateway-nginx" / found.dir.name
    shutil.copytree(found.dir, copy, symlinks=True)
    monkeypatch.setattr(fetcher, "CACHE", tmp_path / "gateway-nginx")
    assert fetcher._load(copy) is not None
    (copy / "bin" / "nginx").unlink()
    assert fetcher._load(copy) is None
    manifest = json.loads((copy / "manifest.json").read_text())
    shutil.copy(found.nginx, copy / "bin" / "nginx")
    assert fetcher._load(copy) is not None
    shutil.rmtree(copy / "root/usr/share/lua/5.1")
    assert fetcher._load(copy) is None  # lua_package_path would name a directory that is not there
    shutil.copytree(found.dir / "root/usr/share/lua/5.1", copy / "root/usr/share/lua/5.1", symlinks=True)
    assert fetcher._load(copy) is not None
    manifest["packages"]["libnginx-mod-http-lua"] = "1:0.10.23-1+deb12u1"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert fetcher._load(copy) is None  # another Lua module than the pin: fetched again


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        (
            {"imageBuild": {"debianMirror": "ftp://mirror.local/debian"}},
            "gateway.imageBuild.debianMirror: 'ftp://mirror.local/debian' must be an http:// or https:// URL of a Debian "
            "archive without spaces or quotes, e.g. http://deb.debian.org/debian",
        ),
        (
            {"imageBuild": {"debianSecurityMirror": "http://m/x'; rm -rf /"}},
            'gateway.imageBuild.debianSecurityMirror: "http://m/x\'; rm -rf /" must be an http:// or https:// URL of a '
            "Debian archive without spaces or quotes, e.g. http://deb.debian.org/debian",
        ),
        (
            {"image": "nginx:1.27.5", "imageBuild": {"debianMirror": "http://10.0.0.5/debian"}},
            f"gateway.imageBuild: applies only to the default image {GATEWAY_IMAGE} (built on the gateway node); "
            "nginx:1.27.5 is pulled: remove imageBuild or gateway.image",
        ),
    ],
)
def test_image_build_refuses_what_apt_or_the_image_cannot_use(gateway: dict[str, object], message: str) -> None:
    config = prod_config()
    config["llm-cluster:gateway"].update(gateway)
    with pytest.raises(SpecError) as err:
        load_stack_config(config, set())
    assert str(err.value) == message
