"""Where the gateway runs: its nginx's paths and listener, the host directories mounted into its
container, and how a host script reaches that nginx (no Pulumi)."""

from __future__ import annotations

from dataclasses import dataclass

from components.planning.gateway.image import LUA_CPATHS, LUA_MODULE, LUA_PATHS, MODULES_DIR, NDK_MODULE
from components.planning.monitoring.prometheus import host_port
from components.spec.stack import StackSpec

# The image's NDK and Lua modules, NDK's first: the Lua module links against it.
LUA_MODULES = (f"{MODULES_DIR}/{NDK_MODULE}", f"{MODULES_DIR}/{LUA_MODULE}")


# Where the gateway host keeps its generated keys: keys.json (id -> key, 0600, the operator's copy)
# outside the directory mounted into the container, which holds only the digests.
HOST_KEYS_DIR = "/etc/llm-cluster/gateway"
HOST_DIGESTS_DIR = f"{HOST_KEYS_DIR}/nginx"
# The rest of the gateway's host files, each directory mounted read-only into the container, so a
# changed file is an update of the command that writes it, which reloads nginx (never a new container):
HOST_CONF_DIR = f"{HOST_KEYS_DIR}/conf"  # nginx.conf, the Lua module, the routing table
HOST_TLS_DIR = f"{HOST_KEYS_DIR}/tls"  # cert.pem, key.pem (0600)
HOST_CA_DIR = f"{HOST_KEYS_DIR}/ca"  # the private CA of generated certificates; its key never leaves
CONTAINER_CONF_DIR = "/etc/llm-gateway"
CONTAINER_KEYS_DIR = "/etc/llm-gateway-keys"
CONTAINER_TLS_DIR = "/etc/llm-gateway-tls"
DIGESTS_FILE = "key-hashes.json"
CONTAINER_NAME = "llm-gateway"


@dataclass(frozen=True)
class GatewayLayout:
    """Where nginx runs: paths and listener. The container's by default; tests use a temp prefix."""

    port: int
    listen_address: str = ""
    """Empty: every address (host network); tests bind 127.0.0.1."""
    conf_dir: str = "/etc/nginx"
    load_modules: tuple[str, ...] = LUA_MODULES
    """The NDK and Lua modules, in load order: the image's; tests: the unpacked packages'."""
    lua_path: str = ";".join(LUA_PATHS)
    """Where resty.core and resty.lrucache are (`…/?.lua`, `;`-separated): the image's; tests: the tree's."""
    lua_cpath: str = ";".join(LUA_CPATHS)
    """Where cjson is (`…/?.so`): the image's; tests: the tree's."""
    digests_file: str = f"/etc/nginx/llm-keys/{DIGESTS_FILE}"
    tls_dir: str = "/etc/nginx/llm-tls"
    pid_file: str = "/var/run/nginx.pid"
    error_log: str = "/dev/stderr"
    usage_dir: str | None = None
    """The usage log as one file a day (usage-YYYY-MM-DD.log, UTC) in this directory, pruned by
    gateway.usageLog's retention; None: counted in the metrics, written nowhere."""
    metrics_listen: str | None = None
    """host:port of GET /metrics (the container's: the node's cluster address); None: not served."""
    temp_dir: str | None = None
    """Client body / proxy temp paths; None keeps the build's defaults."""
    user: str | None = "nginx"
    """Worker user (the image has `nginx`); None when nginx does not start as root."""
    worker_processes: str = "auto"

    @property
    def lua_dir(self) -> str:
        """Where the gateway's Lua modules (gateway.lua, …) are inside the container."""
        return f"{self.conf_dir}/llm"

    @property
    def routes_file(self) -> str:
        """The generated routing table (read when nginx starts) inside the container."""
        return f"{self.conf_dir}/llm/routes.json"


def container_layout(spec: StackSpec) -> GatewayLayout:
    """The layout of the gateway container: host network, the stack's port, config from host mounts."""
    g = spec.gateway
    assert g is not None
    return GatewayLayout(
        port=g.port,
        conf_dir=CONTAINER_CONF_DIR,
        digests_file=f"{CONTAINER_KEYS_DIR}/{DIGESTS_FILE}",
        tls_dir=CONTAINER_TLS_DIR,
        usage_dir=g.usage_log.dir,
        metrics_listen=metrics_address(spec),
    )


def nginx_argv() -> list[str]:
    """The gateway container's command: nginx in the foreground on the mounted config."""
    return ["nginx", "-c", f"{CONTAINER_CONF_DIR}/nginx.conf", "-g", "daemon off;"]


@dataclass(frozen=True)
class NginxControl:
    """How a host script reaches the running nginx: `docker exec` on a node, the binary in tests."""

    nginx: str = f"docker exec {CONTAINER_NAME} nginx -c {CONTAINER_CONF_DIR}/nginx.conf"
    """A shell command prefix that runs nginx against the gateway's config."""
    running: str = f"[ \"$(docker inspect -f '{{{{.State.Running}}}}' {CONTAINER_NAME} 2>/dev/null)\" = true ]"
    """A shell condition: true when that nginx is up (else it reads the files when it starts)."""


def reload_lines(what: str, control: NginxControl = NginxControl()) -> str:
    """Check the config the files now make with `nginx -t`, then `nginx -s reload`: new workers take
    new requests, old ones finish theirs (streams included). Messages on stderr (stdout may be a secret)."""
    return f"""if {control.running}; then
  if ! out=$({control.nginx} -t -q 2>&1); then
    echo "gateway: nginx -t refuses the new {what}: $out" >&2
    echo "nginx goes on serving the config it has loaded; fix the stack and deploy again" >&2
    exit 1
  fi
  {control.nginx} -s reload
  echo "gateway: nginx reloaded ({what} changed; requests in flight finish on the old workers)" >&2
else
  echo "gateway: {CONTAINER_NAME} not running yet; it reads the {what} when it starts" >&2
fi
"""


def metrics_address(spec: StackSpec) -> str:
    """host:port where nginx serves /metrics: the gateway node's cluster address, plain HTTP."""
    g = spec.gateway
    assert g is not None
    return host_port(spec.node(g.node).address, g.metrics_port)
