"""The gateway's image: Debian's nginx and njs at exactly the versions the real-nginx tests run.

The real-nginx tests run these very packages: `tests/deployed_nginx.py` fetches them (and their
dependencies) from the Debian archive once per machine into /var/cache/llm-cluster/gateway-nginx/
and runs that nginx through its own loader, whatever the test machine's release. The image the
gateway deploys by default is built from the same Debian release with the same versions pinned;
`tests/test_gateway_image.py` fails when the binaries the tests run and these pins part. The image is
built on the gateway node by its Docker engine (the docker provider's `RemoteImage` build, the
context being `components/planning/gateway_image/`), from `debian:trixie-slim` and the Debian archive,
or the mirrors `gateway.imageBuild` names. Any other `gateway.image` (e.g. the official `nginx:1.27.5`)
still works, but its nginx and njs are then not the tested ones.

Why this pair: njs keeps state shared by all nginx workers (`js_shared_dict_zone`, the per-key token
budgets) from 0.8.0 on, and bookworm has only 0.7.9; trixie's libnginx-mod-http-js 0.8.9-1 is built
for trixie's nginx 1.26.3, and 1.26.3-3+deb13u11 is that nginx with trixie-security's fixes (nine
CVEs over deb13u10, one of them in reading request bodies).
"""
from __future__ import annotations

from pathlib import Path

# Package -> Debian version: every nginx package the image installs, pinned (libnginx-mod-stream is a
# dependency of the njs module's package; the gateway does not load it).
TESTED_PACKAGES: dict[str, str] = {
    "nginx": "1.26.3-3+deb13u11",
    "nginx-common": "1.26.3-3+deb13u11",
    "libnginx-mod-stream": "1.26.3-3+deb13u11",
    "libnginx-mod-http-js": "0.8.9-1",
}
DEBIAN_RELEASE = "trixie"
BASE_IMAGE = f"debian:{DEBIAN_RELEASE}-slim"
# The archive and its security archive (where stable's security updates are published first).
DEBIAN_SUITES: dict[str, tuple[str, ...]] = {
    "archive": (DEBIAN_RELEASE, f"{DEBIAN_RELEASE}-updates"),
    "security": (f"{DEBIAN_RELEASE}-security",),
}
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# Docker tags allow [A-Za-z0-9_.-]: Debian's `+` becomes `-`.
GATEWAY_IMAGE = ("llm-cluster/gateway:nginx-" + TESTED_PACKAGES["nginx"].replace("+", "-")
                 + "-njs-" + TESTED_PACKAGES["libnginx-mod-http-js"])
CONTEXT_DIR = Path(__file__).with_name("gateway_image")
# The build context as the provider gets it: relative to the project, where Pulumi runs the program
# (an absolute path would make the plan differ from one clone to the next).
BUILD_CONTEXT = "components/planning/gateway_image"
# The worker user of the official nginx image, kept so both images own the usage log alike.
WORKER_UID = 101


def build_args(debian_mirror: str = DEBIAN_MIRROR, security_mirror: str = DEBIAN_SECURITY_MIRROR,
               check_valid_until: bool = True) -> dict[str, str]:
    """The Dockerfile's build arguments: where apt fetches the pinned packages from."""
    return {"DEBIAN_MIRROR": debian_mirror, "DEBIAN_SECURITY_MIRROR": security_mirror,
            "APT_CHECK_VALID_UNTIL": "yes" if check_valid_until else "no"}


def debian_sources(debian_mirror: str = DEBIAN_MIRROR, security_mirror: str = DEBIAN_SECURITY_MIRROR,
                   check_valid_until: bool = True) -> str:
    """apt's deb822 sources for the image's release: the file the Dockerfile writes, and the one the
    tests' fetch of the same packages uses (tests/deployed_nginx.py)."""
    return "\n".join(_STANZA % (uri, " ".join(DEBIAN_SUITES[archive]), "yes" if check_valid_until else "no")
                     for archive, uri in (("archive", debian_mirror), ("security", security_mirror)))


# One deb822 stanza per archive, as debian:trixie-slim ships them.
_STANZA = ("Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n"
           "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\nCheck-Valid-Until: %s\n")


def dockerfile() -> str:
    """The Dockerfile of GATEWAY_IMAGE (committed under CONTEXT_DIR; a test keeps the two equal)."""
    pins = " ".join(f"{pkg}={version}" for pkg, version in TESTED_PACKAGES.items())
    defaults = build_args()
    archive, security = (" ".join(DEBIAN_SUITES[k]) for k in ("archive", "security"))
    # debian_sources() written by printf from the build arguments (printf reads the same escapes).
    stanza = _STANZA.replace("\n", "\\n")
    return f"""# Generated from components/planning/gateway_image.py; change the pins there, not here.
# nginx and njs exactly as the real-nginx tests run them (tests/test_gateway_image.py checks it).
FROM {BASE_IMAGE}
# Where apt fetches from: a local mirror of each archive for a site without Internet access, or
# snapshot.debian.org once a pinned version has left the archive (its Release files have expired:
# APT_CHECK_VALID_UNTIL=no).
ARG DEBIAN_MIRROR={defaults["DEBIAN_MIRROR"]}
ARG DEBIAN_SECURITY_MIRROR={defaults["DEBIAN_SECURITY_MIRROR"]}
ARG APT_CHECK_VALID_UNTIL={defaults["APT_CHECK_VALID_UNTIL"]}
RUN set -eux; \\
    rm -f /etc/apt/sources.list; \\
    printf '{stanza}\\n{stanza}' \\
      "$DEBIAN_MIRROR" '{archive}' "$APT_CHECK_VALID_UNTIL" \\
      "$DEBIAN_SECURITY_MIRROR" '{security}' "$APT_CHECK_VALID_UNTIL" > /etc/apt/sources.list.d/debian.sources; \\
    printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; \\
    apt-get update; \\
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {pins} curl ca-certificates; \\
    rm -f /usr/sbin/policy-rc.d; rm -rf /var/lib/apt/lists/*; \\
    groupadd --system --gid {WORKER_UID} nginx; \\
    useradd --system --uid {WORKER_UID} --gid nginx --no-create-home --home-dir /nonexistent \\
      --shell /usr/sbin/nologin nginx; \\
    nginx -v
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
"""


def is_built(image: str) -> bool:
    """Whether the gateway node builds this image rather than pulling it."""
    return image == GATEWAY_IMAGE
