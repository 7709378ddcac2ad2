"""The gateway's image: Debian's nginx and Lua module at exactly the versions the real-nginx tests run.

These are its facts (pins, paths, mirrors); components/planning/gateway/image.py writes its Dockerfile.

The real-nginx tests run these very packages: `tests/support/deployed_nginx.py` fetches them (and their
dependencies) from the Debian archive once per machine into /var/cache/llm-cluster/gateway-nginx/
and runs that nginx through its own loader, whatever the test machine's release. The image the
gateway deploys by default is built from the same Debian release with the same versions pinned;
`tests/test_gateway_image.py` fails when the binaries the tests run and these pins part. The image is
built on the gateway node by its Docker engine (the docker provider's `RemoteImage` build, the
context being `components/planning/gateway_image/`), from `debian:trixie-slim` and the Debian archive,
or the mirrors `gateway.imageBuild` names. Any other `gateway.image` still works if its nginx loads
the NDK and Lua modules at MODULES_DIR and has resty.core and cjson on LUA_PATHS / LUA_CPATHS, but
its nginx and Lua module are then not the tested ones.

What each package is for:
- nginx, nginx-common 1.26.3-3+deb13u12: trixie's nginx with trixie-security's fixes (deb13u11: nine
  CVEs over deb13u10, one of them in reading request bodies; deb13u12, 2026-11-28: CVE-2026-132779,
  send_chain() no longer repeated when it sent nothing; its changelog.Debian). Its package provides
  the module ABI `nginx-abi-1.26.3-1` that both module packages depend on.
- libnginx-mod-http-lua 1:0.10.28-2 (ngx_http_lua_module.so): the request path (key check, routing,
  /v1/models, refusals, the usage body filter), the token budgets and the metrics, in Lua.
- libnginx-mod-http-ndk 1:0.3.4-2 (ndk_http_module.so): the Nginx Development Kit the Lua module is
  linked against; it must be loaded before it.
- libluajit-5.1-2 / libluajit-5.1-common 2.1.0+openresty20250117-2: OpenResty's LuaJIT, which the Lua
  module runs (JIT-compiled; its FFI is what resty.core calls nginx through).
- lua-resty-core 0.1.31-1 (+ its dependency lua-resty-lrucache 0.15-2): the FFI implementation of the
  ngx.* API (the fast path); the Lua module 0.10.28 loads it at start and refuses to start without it.
- lua-cjson 2.1.0+dfsg-2.2+b2: JSON in C (the routing table, usage records, budget refusals).

Why not njs (what the gateway ran before): it clones a VM per request, and its gateway served about a
third of plain proxy_pass's req/s where the same request path in Lua serves over half (bench/gateway.py;
the runs in docs/perf/gateway.md). No njs package is left in the image.
"""

from __future__ import annotations

from pathlib import Path

# Package -> Debian version: every package of nginx and the Lua module the image installs, pinned
# (apt adds only the system libraries they link; the docstring says what each one is for).
TESTED_PACKAGES: dict[str, str] = {
    "nginx": "1.26.3-3+deb13u12",
    "nginx-common": "1.26.3-3+deb13u12",
    "libnginx-mod-http-ndk": "1:0.3.4-2",
    "libnginx-mod-http-lua": "1:0.10.28-2",
    "libluajit-5.1-2": "2.1.0+openresty20250117-2",
    "libluajit-5.1-common": "2.1.0+openresty20250117-2",
    "lua-resty-core": "0.1.31-1",
    "lua-resty-lrucache": "0.15-2",
    "lua-cjson": "2.1.0+dfsg-2.2+b2",
}
# Where the packages put what nginx.conf names, in the image (the tests' unpacked tree has the same
# paths under its root): the modules, in load order (the Lua module needs the NDK's symbols first) ...
MODULES_DIR = "/usr/lib/nginx/modules"
NDK_MODULE = "ndk_http_module.so"
LUA_MODULE = "ngx_http_lua_module.so"
# ... and the Lua search paths: resty.core, resty.lrucache (lua_package_path), cjson (lua_package_cpath).
LUA_PATHS = ("/usr/share/lua/5.1/?.lua",)
LUA_CPATHS = ("/usr/lib/x86_64-linux-gnu/lua/5.1/?.so",)
DEBIAN_RELEASE = "trixie"
BASE_IMAGE = f"debian:{DEBIAN_RELEASE}-slim"
# The archive and its security archive (where stable's security updates are published first).
DEBIAN_SUITES: dict[str, tuple[str, ...]] = {
    "archive": (DEBIAN_RELEASE, f"{DEBIAN_RELEASE}-updates"),
    "security": (f"{DEBIAN_RELEASE}-security",),
}
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"


def _tag_version(version: str) -> str:
    """A Debian version as Docker tags allow it ([A-Za-z0-9_.-]): no epoch, `+` as `-`."""
    return version.split(":", 1)[-1].replace("+", "-")


GATEWAY_IMAGE = (
    "llm-cluster/gateway:nginx-"
    + _tag_version(TESTED_PACKAGES["nginx"])
    + "-lua-"
    + _tag_version(TESTED_PACKAGES["libnginx-mod-http-lua"])
)
# The worker user of the official nginx image, kept so both images own the usage log alike.
WORKER_UID = 101


# The build context as the provider gets it: relative to the project, where Pulumi runs the program
# (an absolute path would make the plan differ from one clone to the next); its path is in every plan
# that builds the image, so it stays where plans have always named it.
CONTEXT_DIR = Path(__file__).parents[1] / "planning" / "gateway_image"
BUILD_CONTEXT = CONTEXT_DIR.relative_to(Path(__file__).parents[2]).as_posix()


def build_args(
    debian_mirror: str = DEBIAN_MIRROR, security_mirror: str = DEBIAN_SECURITY_MIRROR, check_valid_until: bool = True
) -> dict[str, str]:
    """The Dockerfile's build arguments: where apt fetches the pinned packages from."""
    return {
        "DEBIAN_MIRROR": debian_mirror,
        "DEBIAN_SECURITY_MIRROR": security_mirror,
        "APT_CHECK_VALID_UNTIL": "yes" if check_valid_until else "no",
    }


def debian_sources(
    debian_mirror: str = DEBIAN_MIRROR, security_mirror: str = DEBIAN_SECURITY_MIRROR, check_valid_until: bool = True
) -> str:
    """apt's deb822 sources for the image's release: the file the Dockerfile writes, and the one the
    tests' fetch of the same packages uses (tests/support/deployed_nginx.py)."""
    return "\n".join(
        _STANZA % (uri, " ".join(DEBIAN_SUITES[archive]), "yes" if check_valid_until else "no")
        for archive, uri in (("archive", debian_mirror), ("security", security_mirror))
    )


# One deb822 stanza per archive, as debian:trixie-slim ships them.
_STANZA = (
    "Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n"
    "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\nCheck-Valid-Until: %s\n"
)


def is_built(image: str) -> bool:
    """Whether the gateway node builds this image rather than pulling it."""
    return image == GATEWAY_IMAGE
