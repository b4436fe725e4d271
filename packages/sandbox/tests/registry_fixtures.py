"""A real registry on loopback for the image tests, with token authentication on.

`Registry` runs Debian's ``docker-registry`` (the CNCF distribution registry) on 127.0.0.1 with
its storage in a temporary directory, trusting a `TokenServer` that runs in this process: it
signs RS256 JWTs with a key made here, whose self-signed certificate travels in each token's
``x5c`` header and is the registry's ``rootcertbundle``. Users with the right password get
the actions they ask for; anonymous callers may pull ``public/*`` only. Images are pushed with
``skopeo copy`` from OCI layouts the tests build. `Proxy` stands in front of the registry as a
mirror that counts requests and can flip a byte of every layer it serves.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import http.server
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.error import HTTPError, URLError

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

USER, PASSWORD = "tester", "s3cret"
SERVICE, ISSUER = "test-registry", "test-token-issuer"
REGISTRY_BINARY = shutil.which("docker-registry")
SKOPEO = shutil.which("skopeo")
MISSING_TOOLS = ", ".join(
    name for name, path in (("docker-registry", REGISTRY_BINARY), ("skopeo", SKOPEO)) if not path
)
"""Empty when the registry tests can run; else what to apt-get install."""


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """The registry's token endpoint: ``GET /token?service=...&scope=...``."""

    def __init__(self, directory: Path) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test token issuer")])
        now = datetime.datetime.now(datetime.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.bundle = directory / "token-ca.pem"
        self.bundle.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))
        self.requests: list[dict[str, Any]] = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self._server.server_address[1]
        self.realm = f"http://127.0.0.1:{self.port}/token"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def token(self, user: str | None, scopes: list[str]) -> str:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            wanted = [a for a in actions.split(",") if a]
            if user is None:
                wanted = [a for a in wanted if a == "pull"] if name.startswith("public/") else []
            if kind == "repository" and wanted:
                access.append({"type": kind, "name": name, "actions": wanted})
        der = self.certificate.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": user or "",
            "aud": SERVICE,
            "exp": now + 600,
            "nbf": now - 60,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = (
            f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        )
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64url(signature)}"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                user = None
                authorization = self.headers.get("Authorization", "")
                if authorization.startswith("Basic "):
                    name, _, password = base64.b64decode(authorization[6:]).decode().partition(":")
                    if (name, password) != (USER, PASSWORD):
                        self.send_error(401, "bad credentials")
                        server.requests.append({"user": name, "refused": True})
                        return
                    user = name
                scopes = query.get("scope", [])
                server.requests.append({"user": user, "scopes": scopes})
                token = server.token(user, scopes)
                body = json.dumps({"token": token, "access_token": token, "expires_in": 600})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def closed_port() -> int:
    """A loopback port nothing listens on (a mirror or registry that is down)."""
    return free_port()


class Registry:
    """``docker-registry serve`` on 127.0.0.1, token auth on; `stop()` ends it."""

    def __init__(self, directory: Path, tokens: TokenServer) -> None:
        assert REGISTRY_BINARY is not None
        self.directory = directory
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = directory / "registry.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: info\n  accesslog:\n    disabled: false\n"
            f"storage:\n  filesystem:\n    rootdirectory: {directory / 'storage'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n  secret: {secrets.token_hex(16)}\n"
            "auth:\n  token:\n"
            f"    realm: {tokens.realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n"
            f"    rootcertbundle: {tokens.bundle}\n"
        )
        self.log = directory / "registry.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [REGISTRY_BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"docker-registry exited:\n{self.log.read_text()}")
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2)
            except HTTPError as error:
                if error.code == 401:
                    return
            except (URLError, OSError):
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"docker-registry did not start:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def blob_gets(self, digest: str) -> int:
        """GET requests the registry served for blob `digest` (its access log)."""
        pattern = re.compile(rf'"GET /v2/[^ ]+/blobs/{re.escape(digest)} HTTP/[0-9.]+" 200 ')
        return len(pattern.findall(self.log.read_text(errors="replace")))

    def push(self, layout: Path, ref: str, repository: str, tag: str, *, all: bool = False) -> None:
        """Push the layout's image `ref` to ``repository:tag`` with skopeo."""
        assert SKOPEO is not None
        subprocess.run(
            [
                SKOPEO,
                "--insecure-policy",
                "copy",
                "--quiet",
                "--preserve-digests",
                *(["--all"] if all else []),
                "--dest-tls-verify=false",
                "--dest-creds",
                f"{USER}:{PASSWORD}",
                f"oci:{layout}:{ref}",
                f"docker://{self.host}/{repository}:{tag}",
            ],
            check=True,
            capture_output=True,
            env={**os.environ, "HOME": str(self.directory)},
        )


class Storage:
    """Object storage a registry redirects blob downloads to: serves what it was given and
    keeps the headers of each request (no registry token may reach it)."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.requests: list[dict[str, str]] = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        storage = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                storage.requests.append(dict(self.headers.items()))
                body = storage.blobs.get(self.path.partition("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


class Proxy:
    """A registry front in front of `upstream`, counting requests. By default it forwards
    every request as it is (the client's tokens work through it), as a pull-through mirror
    would. With `tamper`, it flips one byte of each layer blob it serves (blobs over 1 KiB:
    configs stay intact, so the pull reaches the layers). With `basic`, it asks its clients
    for basic auth itself and reaches the registry with a token of its own. With `storage`,
    it answers blob requests with a redirect there."""

    def __init__(
        self,
        upstream: str,
        *,
        tamper: bool = False,
        basic: TokenServer | None = None,
        storage: Storage | None = None,
    ) -> None:
        self.upstream = upstream
        self.tamper = tamper
        self.basic = basic
        self.storage = storage
        self.paths: list[str] = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.host = f"127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def blob_gets(self, digest: str) -> int:
        return sum(1 for p in self.paths if p.endswith(f"/blobs/{digest}"))

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.paths.append(self.path)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                if proxy.basic is not None:
                    expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                    if headers.get("Authorization") != f"Basic {expected}":
                        self.send_response(401)
                        self.send_header("WWW-Authenticate", 'Basic realm="test mirror"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    repository = self.path.split("/v2/", 1)[-1].rsplit("/", 2)[0]
                    token = proxy.basic.token(USER, [f"repository:{repository}:pull"])
                    headers["Authorization"] = f"Bearer {token}"
                connection = http.client.HTTPConnection(proxy.upstream, timeout=30)
                connection.request("GET", self.path, headers=headers)
                response = connection.getresponse()
                body = response.read()
                connection.close()
                is_blob = "/blobs/" in self.path and response.status == 200
                if proxy.tamper and is_blob and len(body) > 1024:
                    body = body[:-100] + bytes([body[-100] ^ 0xFF]) + body[-99:]
                if proxy.storage is not None and is_blob:
                    key = f"/objects/{secrets.token_hex(8)}"
                    proxy.storage.blobs[key] = body
                    self.send_response(307)
                    self.send_header("Location", f"http://{proxy.storage.host}{key}?signed=1")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


@contextmanager
def running_registry(directory: Path) -> Iterator[tuple[Registry, TokenServer]]:
    tokens = TokenServer(directory)
    try:
        registry = Registry(directory, tokens)
        try:
            yield registry, tokens
        finally:
            registry.stop()
    finally:
        tokens.close()
