"""The Debian archive a Dockerfile built on a lab host reads (the gateway image's), served inside the lab.

The lab's hosts reach nothing beyond the lab, so the build's `apt-get` gets a mirror on the registry
host (http://198.18.0.2:8080/<archive>/, e.g. /debian and /debian-security), set through the build
arguments the stack gives the image (`gateway.imageBuild`). What it serves is recorded once per machine
into /var/cache/llm-cluster/lab/debian/<key>/: the Dockerfile's own RUN steps run in a chroot of the
same `debian:<release>-slim` stand-in the build starts FROM, with every mirror argument pointing at a
recording proxy on loopback that fetches from the archive the argument names by default. Every file
apt asked for — Debian's signed InRelease files, the package indexes (by-hash paths included), the
pinned .debs and their dependencies — is kept at its path, so the build in the lab asks for exactly
those files and gets them byte for byte.

Debian's own signed indexes are served rather than an index made here (apt-ftparchive,
dpkg-scanpackages): the Dockerfile's sources trust only debian-archive-keyring (`Signed-By`), and an
index made here could only be trusted by weakening that. So in the lab apt verifies every package of
the build against Debian's signatures, as on a node. A recording whose InRelease files are no longer
valid (`Valid-Until`: the -security and -updates suites, a week) is recorded again; when a pinned
version has left the archive by then, the recording fails with apt's own message.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lab.config import CACHE, REGISTRY_ADDRESS, STATE
from lab.hosts import REGISTRY_NS, LabError, sh

PORT = 8080
MIRROR_URL = f"http://{REGISTRY_ADDRESS}:{PORT}"


@dataclass(frozen=True)
class Dockerfile:
    """What the lab needs to know of a Dockerfile: its base image, its ARG defaults and its RUN steps."""

    base: str
    args: dict[str, str]
    runs: tuple[str, ...]

    def mirrors(self) -> dict[str, str]:
        """ARG name -> the archive URL it defaults to, for every ARG whose default is an http(s) URL."""
        return {k: v for k, v in self.args.items() if re.match(r"https?://", v)}


def parse_dockerfile(text: str) -> Dockerfile:
    """FROM, ARG and RUN (shell form, continuation lines joined) of a single-stage Dockerfile."""
    lines, current = [], ""
    for raw in text.splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1]
            continue
        lines.append(current + raw)
        current = ""
    base, args, runs = "", {}, []
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        if word == "FROM":
            if base:
                raise LabError("the lab builds single-stage Dockerfiles only (a second FROM)")
            base = rest.split()[0]
        elif word == "ARG":
            name, _, default = rest.strip().partition("=")
            args[name] = default
        elif word == "RUN":
            if rest.lstrip().startswith("["):
                raise LabError("the lab runs shell-form RUN steps only")
            runs.append(rest)
    if not base:
        raise LabError("the Dockerfile has no FROM")
    return Dockerfile(base, args, tuple(runs))


def archive_name(url: str) -> str:
    """The mirror path an archive URL is served under: its last path component (/debian, /debian-security)."""
    name = urllib.parse.urlparse(url).path.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise LabError(f"{url}: an archive URL needs a path (e.g. http://deb.debian.org/debian)")
    return name


def lab_build_args(dockerfile: Dockerfile) -> dict[str, str]:
    """The build arguments that point the Dockerfile's mirrors at the lab's (what the lab stack sets)."""
    return {k: f"{MIRROR_URL}/{archive_name(v)}" for k, v in dockerfile.mirrors().items()}


# --- recording --------------------------------------------------------------------------------------


class _Recorder(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, upstreams: dict[str, str]):
        self.root, self.upstreams, self.fetched = root, upstreams, []
        super().__init__(("127.0.0.1", 0), _RecordingHandler)


class _RecordingHandler(http.server.BaseHTTPRequestHandler):
    """GET /<archive>/<path>: fetched from that archive, kept under the recording's root, answered."""

    server: _Recorder

    def log_message(self, fmt: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        name, _, rest = self.path.lstrip("/").partition("/")
        upstream = self.server.upstreams.get(name)
        if upstream is None or ".." in rest.split("/"):
            self.send_error(404)
            return
        try:
            with urllib.request.urlopen(f"{upstream.rstrip('/')}/{rest}", timeout=300) as r:
                data = r.read()
        except urllib.error.HTTPError as e:
            self.send_error(e.code)  # apt falls back (InRelease → Release) or reports it
            return
        except OSError as e:
            self.send_error(502, str(e))
            return
        # Kept under the decoded path (apt sends `+` as %2b), which is what http.server serves it from.
        path = self.server.root / name / urllib.parse.unquote(rest)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        tmp.rename(path)
        self.server.fetched.append(f"{name}/{urllib.parse.unquote(rest)}")
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def recording_key(dockerfile_text: str, base_tar: Path) -> str:
    return hashlib.sha256(
        dockerfile_text.encode() + base_tar.name.encode() + str(base_tar.stat().st_size).encode()
    ).hexdigest()[:16]


def _valid_until(root: Path) -> float | None:
    """The earliest Valid-Until of the recorded InRelease files (epoch seconds), None when none has one."""
    earliest = None
    for f in root.rglob("InRelease"):
        m = re.search(r"^Valid-Until: (.+)$", f.read_text(errors="replace"), re.M)
        if m:
            t = email.utils.parsedate_to_datetime(m.group(1).strip()).timestamp()
            earliest = t if earliest is None else min(earliest, t)
    return earliest


def record(dockerfile_path: Path, base_tar: Path) -> Path:
    """The recording for this Dockerfile on this base (made when missing or expired); its root directory."""
    text = dockerfile_path.read_text()
    df = parse_dockerfile(text)
    root = CACHE / "debian" / recording_key(text, base_tar)
    manifest = root / "recorded.json"
    if manifest.exists():
        until = _valid_until(root)
        if until is None or until > time.time() + 3600:
            return root
        print(f"lab debian mirror: the recorded indexes expire ({time.ctime(until)}): recording again", flush=True)
    if not df.mirrors():
        raise LabError(
            f"{dockerfile_path}: no ARG names an archive URL, so the lab cannot point its apt at the lab's mirror"
        )
    shutil.rmtree(root, ignore_errors=True)
    work = CACHE / "debian" / "chroot.tmp"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root.mkdir(parents=True)
    started = time.monotonic()
    upstreams = {archive_name(url): url for url in df.mirrors().values()}
    server = _Recorder(root, upstreams)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sh("tar", "-C", str(work), "-xf", str(base_tar), timeout=600)
        port = server.server_address[1]
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            **df.args,
            **{k: f"http://127.0.0.1:{port}/{archive_name(v)}" for k, v in df.mirrors().items()},
        }
        print(
            f"lab debian mirror: recording what {dockerfile_path.name}'s RUN steps fetch from "
            f"{', '.join(sorted(upstreams.values()))} (once per machine)",
            flush=True,
        )
        for step in df.runs:
            p = subprocess.run(
                ["chroot", str(work), "/bin/sh", "-c", step], env=env, capture_output=True, text=True, timeout=1800
            )
            if p.returncode:
                raise LabError(
                    f"recording the Debian packages of {dockerfile_path}: its RUN step failed in a chroot "
                    f"of {df.base} ({p.returncode}):\n{(p.stdout + p.stderr).strip()[-3000:]}"
                )
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(work, ignore_errors=True)
    debs = sorted(f for f in server.fetched if f.endswith(".deb"))
    manifest.write_text(
        json.dumps(
            {
                "dockerfile": str(dockerfile_path),
                "base": df.base,
                "archives": upstreams,
                "files": sorted(server.fetched),
                "debs": debs,
            },
            indent=1,
        )
    )
    print(
        f"lab debian mirror: {len(server.fetched)} files ({len(debs)} packages) recorded in "
        f"{time.monotonic() - started:.0f}s",
        flush=True,
    )
    return root


# --- serving ----------------------------------------------------------------------------------------

PIDFILE = STATE / "debian-mirror.pid"


def serving() -> bool:
    try:
        with urllib.request.urlopen(f"{MIRROR_URL}/", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def serve(root: Path) -> None:
    """Python's http.server on the registry host, serving the recording read-only (a restart serves it again)."""
    stop()
    log = open(STATE / "debian-mirror.log", "ab")
    p = subprocess.Popen(
        [
            "nsenter",
            f"--net=/run/netns/{REGISTRY_NS}",
            "python3",
            "-m",
            "http.server",
            str(PORT),
            "--bind",
            REGISTRY_ADDRESS,
            "--directory",
            str(root),
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    PIDFILE.write_text(str(p.pid))
    deadline = time.monotonic() + 30
    while not serving():
        if time.monotonic() > deadline or p.poll() is not None:
            raise LabError(f"the lab's Debian mirror did not start (see {STATE}/debian-mirror.log)")
        time.sleep(0.2)


def stop() -> None:
    try:
        pid = int(PIDFILE.read_text())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, 15)
    except ProcessLookupError:
        pass
    PIDFILE.unlink(missing_ok=True)
