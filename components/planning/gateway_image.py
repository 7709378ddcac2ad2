"""The gateway's image: Debian's nginx and njs at exactly the versions the real-nginx tests run.

The tests drive the Debian packages installed on the test machine (`.ci/system-deps`), so the image
the gateway deploys by default is built from the same Debian release with the same package
versions pinned; `tests/test_gateway_image.py` fails when the test machine's versions and these pins
part. The image is built on the gateway node by its Docker engine (the docker provider's
`RemoteImage` build, the context being `components/planning/gateway_image/`), from `debian:bookworm-slim`
and the Debian archive. Any other `gateway.image` (e.g. the official `nginx:1.27.5`) still works,
but its nginx and njs are then not the tested ones.
"""
from __future__ import annotations

from pathlib import Path

# Package -> version, as `dpkg-query -W` prints them on the machine the tests ran on.
TESTED_PACKAGES: dict[str, str] = {
    "nginx": "1.22.1-9+deb12u11",
    "nginx-common": "1.22.1-9+deb12u11",
    "libnginx-mod-http-js": "0.7.9-2",
}
BASE_IMAGE = "debian:bookworm-slim"
# Docker tags allow [A-Za-z0-9_.-]: Debian's `+` becomes `-`.
GATEWAY_IMAGE = ("llm-cluster/gateway:nginx-" + TESTED_PACKAGES["nginx"].replace("+", "-")
                 + "-njs-" + TESTED_PACKAGES["libnginx-mod-http-js"])
CONTEXT_DIR = Path(__file__).with_name("gateway_image")
# The build context as the provider gets it: relative to the project, where Pulumi runs the program
# (an absolute path would make the plan differ from one clone to the next).
BUILD_CONTEXT = "components/planning/gateway_image"
# The worker user of the official nginx image, kept so both images own the usage log alike.
WORKER_UID = 101


def dockerfile() -> str:
    """The Dockerfile of GATEWAY_IMAGE (committed under CONTEXT_DIR; a test keeps the two equal)."""
    pins = " ".join(f"{pkg}={version}" for pkg, version in TESTED_PACKAGES.items())
    return f"""# Generated from components/planning/gateway_image.py; change the pins there, not here.
# nginx and njs exactly as the real-nginx tests run them (tests/test_gateway_image.py checks it).
FROM {BASE_IMAGE}
RUN set -eux; \\
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
