"""The Docker Engine API over `ssh://`, reached the way the docker provider reaches it.

The provider (docker/cli connhelper) runs the local ssh binary as
`ssh <ssh_opts> -o ConnectTimeout=30 -T -- user@host docker system dial-stdio` and speaks HTTP to the
remote engine over that process's stdin/stdout, keeping the connection for further requests. So does
this client: each ssh process's stdio is joined to one end of a socket pair that http.client uses as
its socket; idle connections are kept and reused, new ones dialled when all are busy.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import io
import json
import os
import socket
import subprocess
import tarfile
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

API = "/v1.41"  # Debian docker.io 20.10's API version


def _reap(proc: subprocess.Popen) -> None:
    """Wait for an ssh dial-stdio process to end (it does once its connection is closed), else kill it."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class DockerError(RuntimeError):
    """The engine refused a request; the message is the engine's."""


class DockerAPI:
    """Requests to one host's engine through `docker system dial-stdio` over ssh."""

    def __init__(self, host: str, ssh_opts: list[str], env: dict[str, str]):
        url = urllib.parse.urlparse(host)
        if url.scheme != "ssh":
            raise DockerError(f"docker provider host {host!r}: the lab reaches engines over ssh:// only")
        self.target = f"{url.username}@{url.hostname}" if url.username else str(url.hostname)
        self.port = url.port
        self.ssh_opts = list(ssh_opts)
        self.env = env
        self._idle: list[tuple[http.client.HTTPConnection, subprocess.Popen]] = []
        self._lock = threading.Lock()

    def _argv(self) -> list[str]:
        port = ["-p", str(self.port)] if self.port else []
        return [
            "ssh",
            *self.ssh_opts,
            *port,
            "-o",
            "ConnectTimeout=30",
            "-T",
            "--",
            self.target,
            "docker",
            "system",
            "dial-stdio",
        ]

    def _dial(self, timeout: float) -> tuple[http.client.HTTPConnection, subprocess.Popen]:
        mine, theirs = socket.socketpair()
        proc = subprocess.Popen(self._argv(), stdin=theirs, stdout=theirs, stderr=subprocess.DEVNULL, env=self.env)
        theirs.close()
        conn = http.client.HTTPConnection("docker", timeout=timeout)
        conn.sock = mine
        return conn, proc

    @staticmethod
    def _hang_up(conn: http.client.HTTPConnection, proc: subprocess.Popen) -> None:
        conn.close()
        _reap(proc)

    @contextlib.contextmanager
    def local_socket(self) -> Iterator[str]:
        """A unix socket on this machine whose every connection is one `docker system dial-stdio` over this
        client's ssh: for the docker CLI (BuildKit's session and build requests), with the provider's ssh options."""
        with tempfile.TemporaryDirectory(prefix="lab-docker-") as tmp:
            path = os.path.join(tmp, "docker.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(16)
            procs: list[subprocess.Popen] = []

            def accept() -> None:
                while True:
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        return  # closed
                    procs.append(
                        subprocess.Popen(self._argv(), stdin=conn, stdout=conn, stderr=subprocess.DEVNULL, env=self.env)
                    )
                    conn.close()

            thread = threading.Thread(target=accept, daemon=True)
            thread.start()
            try:
                yield path
            finally:
                listener.shutdown(socket.SHUT_RDWR)
                listener.close()
                thread.join(timeout=10)
                for p in procs:
                    if p.poll() is None:
                        p.terminate()
                    _reap(p)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn, proc in idle:
            self._hang_up(conn, proc)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        raw: bytes | None = None,
        content_type: str = "application/json",
        timeout: float = 600,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """One HTTP request to the engine; (status, body). A stale kept connection is dialled again once."""
        url = API + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {**({"Content-Type": content_type} if data is not None else {}), **(headers or {})}
        for attempt in (1, 2):
            with self._lock:
                kept = self._idle.pop() if self._idle else None
            conn, proc = kept or self._dial(timeout)
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            try:
                conn.request(method, url, body=data, headers=headers)
                resp = conn.getresponse()
                payload = resp.read()
            except (OSError, http.client.HTTPException) as e:
                self._hang_up(conn, proc)
                if kept is not None and attempt == 1:
                    continue
                raise DockerError(f"{self.target}: docker over ssh failed: {e!r}") from None
            if resp.will_close or proc.poll() is not None:
                self._hang_up(conn, proc)
            else:
                with self._lock:
                    self._idle.append((conn, proc))
            return resp.status, payload
        raise AssertionError("unreachable")

    def call(self, method: str, path: str, ok: tuple[int, ...] = (200, 201, 204), **kw: Any) -> Any:
        """A request that must succeed; its JSON body (or None)."""
        status, payload = self.request(method, path, **kw)
        if status not in ok:
            try:
                message = json.loads(payload).get("message", payload.decode())
            except ValueError:
                message = payload.decode(errors="replace")
            raise DockerError(f"{method} {path}: {status} {message}")
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError:
            return payload

    def pull(self, ref: str, auth: dict[str, str] | None = None) -> str:
        """POST /images/create (a pull through the engine's registry mirror); the image id. `auth` goes in
        X-Registry-Auth (base64url JSON), as the provider's pullImage sends its registry auth."""
        repo, _, tag = ref.rpartition(":")
        if not repo or "/" in tag:
            repo, tag = ref, "latest"
        header = {"X-Registry-Auth": base64.urlsafe_b64encode(json.dumps(auth).encode()).decode()} if auth else None
        status, payload = self.request("POST", "/images/create", query={"fromImage": repo, "tag": tag}, headers=header)
        # The engine streams progress as JSON lines; an error can come after a 200.
        for line in payload.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "error" in event:
                raise DockerError(f"pull {ref}: {event['error']}")
        if status != 200:
            raise DockerError(f"pull {ref}: {status} {payload[:300]!r}")
        return self.call("GET", f"/images/{urllib.parse.quote(ref, safe='')}/json")["Id"]

    def local_image(self, ref: str) -> str | None:
        """The id of an image the engine already holds under `ref` (GET /images/{ref}/json), else None."""
        status, payload = self.request("GET", f"/images/{urllib.parse.quote(ref, safe='')}/json")
        return json.loads(payload)["Id"] if status == 200 else None

    def upload(self, container: str, files: list[tuple[str, bytes, int]]) -> None:
        """PUT /containers/{id}/archive: files (path, content, mode) as one tar extracted at /."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for path, content, mode in files:
                info = tarfile.TarInfo(path.lstrip("/"))
                info.size, info.mode = len(content), mode
                tar.addfile(info, io.BytesIO(content))
        self.call(
            "PUT",
            f"/containers/{container}/archive",
            query={"path": "/"},
            raw=buf.getvalue(),
            content_type="application/x-tar",
        )
