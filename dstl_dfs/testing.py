"""Test infrastructure for the ``filesystem`` storage, shipped for providers and users.

- :func:`moto_s3_server`: a real S3 endpoint (moto's server) on a free loopback
  port, with a bucket, for as long as the context lasts.
- :class:`FaultInjectingProxy`: an HTTP proxy on loopback in front of an S3
  endpoint that stalls or fails a chosen fraction of PUT requests.
- :func:`minio_endpoint`: MinIO in a container (testcontainers), where a Docker
  engine is reachable (:func:`docker_unavailable_reason` says why not).

They need the test extras (``pip install 'dstl[test]'``; MinIO also ``dstl[docker]``).
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = [
    "FaultInjectingProxy",
    "S3Endpoint",
    "docker_unavailable_reason",
    "free_port",
    "minio_endpoint",
    "moto_s3_server",
    "wait_for_port",
]

MINIO_IMAGE = "minio/minio:RELEASE.2025-04-22T22-12-26Z"


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class S3Endpoint:
    """A running S3 endpoint with a bucket."""

    url: str
    bucket: str
    access_key: str = "testing"  # test services only: moto accepts any key
    secret_key: str = "testing"

    def config(self, prefix: str = "dstl") -> dict[str, str]:
        """Dstl config that points the ``filesystem`` storage at the bucket."""
        return {
            "dstl.dfs.base-path": f"s3://{self.bucket}/{prefix}",
            "dstl.dfs.s3.endpoint-url": self.url,
            "dstl.dfs.s3.region": "us-east-1",
            "dstl.dfs.s3.access-key-id": self.access_key,
            "dstl.dfs.s3.secret-access-key": self.secret_key,
        }

    def client(self):  # noqa: ANN201 - botocore client
        """An S3 client for the endpoint (the backdoor of tests and benchmarks)."""
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.url,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )


@contextlib.contextmanager
def moto_s3_server(bucket: str = "dstl-test") -> Iterator[S3Endpoint]:
    """Run moto's S3 server on loopback with ``bucket`` created; stop it on exit.

    The server runs in its own process, like a real S3 endpoint: in-process it
    would share the GIL with the client and serialise requests a real service
    handles in parallel.
    """
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = S3Endpoint(f"http://127.0.0.1:{port}", bucket)
        wait_for_port(port, process=server)
        endpoint.client().create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def docker_unavailable_reason() -> str | None:
    """Why containers cannot be started here, or ``None`` when a Docker engine answers."""
    try:
        import docker
    except ImportError:
        return "the docker package is not installed (pip install 'dstl[docker]')"
    try:
        docker.from_env(timeout=5).ping()
    except Exception as exc:
        return f"no Docker engine is reachable ({type(exc).__name__}: {exc})"
    return None


@contextlib.contextmanager
def minio_endpoint(bucket: str = "dstl-test", image: str = MINIO_IMAGE) -> Iterator[S3Endpoint]:
    """MinIO in a container with ``bucket`` created (testcontainers); removed on exit."""
    import urllib.request

    from testcontainers.core.container import DockerContainer

    user, password = "minioadmin", "minioadmin"  # MinIO's local development defaults
    container = (
        DockerContainer(image)
        .with_command("server /data")
        .with_env("MINIO_ROOT_USER", user)
        .with_env("MINIO_ROOT_PASSWORD", password)
        .with_exposed_ports(9000)
    )
    with container:
        url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(9000)}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/minio/health/live", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        endpoint = S3Endpoint(url, bucket, user, password)
        endpoint.client().create_bucket(Bucket=bucket)
        yield endpoint


def wait_for_port(port: int, timeout: float = 30.0, process: subprocess.Popen | None = None) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port`` (or ``process`` exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            msg = f"the server on port {port} exited with code {process.returncode}"
            raise RuntimeError(msg)
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    msg = f"nothing listens on 127.0.0.1:{port} after {timeout}s"
    raise TimeoutError(msg)


class FaultInjectingProxy:
    """Forwards HTTP to ``target`` and stalls or fails a fraction of PUTs, and chosen GETs.

    :param stall_fraction: share of PUTs delayed by ``stall_seconds`` before forwarding.
    :param fail_fraction: share of PUTs answered with 503 without forwarding.
    :param evenly: pick exactly that share of PUTs, evenly spaced (default); else
        draw each PUT at random with ``seed``.

    GETs of objects (listings excluded) take their faults from :attr:`get_faults`, one
    per GET in order: ``"stall"``, ``"fail"`` (503), ``"flip"`` (one body byte
    flipped, headers intact), ``"truncate"`` (half the body, then the connection
    closes) or ``"reset"`` (the connection closes without an answer). With
    :attr:`stall_gets` every GET, listings included, stalls.
    """

    def __init__(
        self,
        target: str,
        *,
        stall_fraction: float = 0.0,
        stall_seconds: float = 2.0,
        fail_fraction: float = 0.0,
        evenly: bool = True,
        seed: int = 7,
    ) -> None:
        host, _, port = target.removeprefix("http://").partition(":")
        self.target = (host, int(port or 80))
        self.stall_fraction = stall_fraction
        self.stall_seconds = stall_seconds
        self.fail_fraction = fail_fraction
        self._random = random.Random(seed)
        self.evenly = evenly
        self.puts = 0
        self._lock = threading.Lock()
        self.stall_next = 0  # the next N PUTs stall whatever the fractions say
        self.get_faults: list[str] = []
        self.stall_gets = False
        self.stalled = 0
        self.failed = 0
        self.forwarded = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)

    def __enter__(self) -> FaultInjectingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _decide(self, method: str, path: str = "") -> str:
        if method == "GET":
            with self._lock:
                if self.stall_gets:
                    self.stalled += 1
                    return "stall"
                if self.get_faults and "list-type" not in path:
                    return self.get_faults.pop(0)
            return "forward"
        if method != "PUT":
            return "forward"
        with self._lock:
            self.puts += 1
            if self.stall_next > 0:
                self.stall_next -= 1
                self.stalled += 1
                return "stall"
            if self.evenly:
                # Exactly the chosen share, evenly spaced: PUT n is picked when the
                # running count floor(n * fraction) steps up.
                fail = int(self.puts * self.fail_fraction) > int((self.puts - 1) * self.fail_fraction)
                stall = int(self.puts * self.stall_fraction) > int((self.puts - 1) * self.stall_fraction)
            else:
                roll = self._random.random()
                fail = roll < self.fail_fraction
                stall = not fail and roll < self.fail_fraction + self.stall_fraction
            if fail:
                self.failed += 1
                return "fail"
            if stall:
                self.stalled += 1
                return "stall"
            return "forward"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:  # noqa: C901 - one branch per injected S3 fault
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                # Responses go out in several writes: without NODELAY, Nagle's
                # algorithm and delayed ACKs add ~40 ms to each request.
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, format: str, *args: object) -> None:
                return

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    raw = bytearray()
                    while True:
                        line = self.rfile.readline()
                        raw += line
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        chunk = self.rfile.read(size + 2)
                        raw += chunk
                        if size == 0:
                            # Trailers end with an empty line.
                            while chunk not in (b"\r\n", b""):
                                chunk = self.rfile.readline()
                                raw += chunk
                            return bytes(raw)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                body = self._body()
                decision = proxy._decide(self.command, self.path)
                if decision == "reset":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if decision == "fail":
                    payload = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if decision == "stall":
                    time.sleep(proxy.stall_seconds)
                conn = http.client.HTTPConnection(*proxy.target, timeout=60)
                try:
                    conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        conn.putheader(name, value)
                    conn.endheaders(body or None)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                with proxy._lock:
                    proxy.forwarded += 1
                self.send_response(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if decision == "flip" and data:
                    data = data[:-1] + bytes([data[-1] ^ 0xFF])
                elif decision == "truncate":
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        return Handler
