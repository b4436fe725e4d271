"""HTTP for the registry protocol: urllib in worker threads, authentication and redirects.

Why urllib and threads rather than asyncio streams: the standard library then does TLS with
the system's trust store, proxies from the environment, chunked transfers and redirects,
which a hand-made HTTP/1.1 client over asyncio streams would each have to redo; a pull writes
blobs and unpacks layers with blocking file system calls anyway, so it runs in a worker
thread as a whole and the event loop never waits on it.

Redirects are followed (registries send blob downloads to object storage), but the
``Authorization`` header never leaves the host it was meant for: storage gets a signed URL,
not the registry's token.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from http.client import HTTPException, HTTPMessage, HTTPResponse
from typing import Any
from urllib.error import HTTPError, URLError

from sandbox._images._auth import Challenge, basic, parse_challenges
from sandbox._images._config import ImageCacheConfig, RegistryCredentials
from sandbox._images._errors import PullFailure

CHUNK = 1 << 20
NETWORK_ERRORS = (URLError, HTTPException, OSError)
"""What a request raises when the network (not the server) fails; HTTPError is caught first."""


class _Redirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc.lower()


class Transport:
    """Requests to registry hosts, answering their challenges; tokens are kept per host and
    scope for the life of the transport (one pull)."""

    def __init__(self, config: ImageCacheConfig) -> None:
        self._config = config
        self._opener = urllib.request.build_opener(_Redirects)
        self._auth: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def url(self, host: str, path: str) -> str:
        scheme = "http" if host in self._config.plain_http else "https"
        return f"{scheme}://{host}{path}"

    def credentials(self, *hosts: str) -> RegistryCredentials | None:
        for host in hosts:
            if found := self._config.credentials.get(host):
                return found
        return None

    def open(
        self,
        host: str,
        path: str,
        *,
        scope: str,
        credentials: RegistryCredentials | None,
        headers: Mapping[str, str] | None = None,
    ) -> HTTPResponse:
        """GET `path` on `host`; on a 401, answer the challenge once and try again."""
        url = self.url(host, path)
        for attempt in range(2):
            request = urllib.request.Request(url, headers=dict(headers or {}))
            with self._lock:
                auth = self._auth.get((host, scope))
            if auth:
                request.add_header("Authorization", auth)
            try:
                response: HTTPResponse = self._opener.open(request, timeout=self._config.timeout)
                return response
            except HTTPError as error:
                if error.code != 401 or attempt:
                    raise _status_error(error, host, credentials) from None
                challenges = parse_challenges(error.headers.get_all("WWW-Authenticate") or [])
                error.close()
                answer = self._answer(host, challenges, scope, credentials)
                with self._lock:
                    self._auth[(host, scope)] = answer
            except NETWORK_ERRORS as error:
                raise PullFailure(f"network error talking to {host}: {_reason(error)}") from None
        raise AssertionError("unreachable")

    def _answer(
        self,
        host: str,
        challenges: list[Challenge],
        scope: str,
        credentials: RegistryCredentials | None,
    ) -> str:
        if not challenges:
            raise PullFailure(f"unauthorized: {host} answered 401 without a challenge")
        challenge = challenges[0]
        if challenge.scheme == "basic":
            if credentials is None:
                raise PullFailure(f"unauthorized: {host} wants credentials and none are configured")
            return basic(credentials)
        if challenge.scheme != "bearer":
            raise PullFailure(f"{host} asks for unsupported authentication {challenge.scheme!r}")
        return "Bearer " + self._token(host, challenge, scope, credentials)

    def _token(
        self,
        host: str,
        challenge: Challenge,
        scope: str,
        credentials: RegistryCredentials | None,
    ) -> str:
        realm = challenge.params.get("realm", "")
        parts = urllib.parse.urlsplit(realm)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PullFailure(f"{host} names an invalid token endpoint {realm!r}")
        query = [("service", challenge.params["service"])] if "service" in challenge.params else []
        query.append(("scope", challenge.params.get("scope") or scope))
        separator = "&" if parts.query else "?"
        request = urllib.request.Request(realm + separator + urllib.parse.urlencode(query))
        # Credentials travel only over TLS, or to a host the config lets speak plain HTTP.
        if credentials and (parts.scheme == "https" or parts.netloc in self._config.plain_http):
            request.add_header("Authorization", basic(credentials))
        try:
            with self._opener.open(request, timeout=self._config.timeout) as response:
                body = json.loads(response.read(1 << 20))
        except HTTPError as error:
            who = "with the configured credentials" if credentials else "anonymously"
            error.close()
            raise PullFailure(
                f"unauthorized: the token endpoint of {host} refused a token {who} "
                f"(HTTP {error.code})"
            ) from None
        except NETWORK_ERRORS as error:
            raise PullFailure(
                f"network error getting a token for {host}: {_reason(error)}"
            ) from None
        except ValueError:
            raise PullFailure(f"the token endpoint of {host} answered invalid JSON") from None
        token = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise PullFailure(f"the token endpoint of {host} answered no token")
        return token


def read_limited(response: HTTPResponse, limit: int, what: str) -> bytes:
    """The whole body, refused past `limit` bytes."""
    try:
        data = response.read(limit + 1)
    except NETWORK_ERRORS as error:
        raise PullFailure(f"network error reading {what}: {_reason(error)}") from None
    if len(data) > limit:
        raise PullFailure(f"{what} is larger than {limit} bytes")
    return data


def chunks(response: HTTPResponse, what: str, cancelled: threading.Event) -> Iterator[bytes]:
    """The body in chunks, a network failure mid-way a `PullFailure`."""
    while True:
        if cancelled.is_set():
            raise PullFailure(f"{what}: the pull was abandoned")
        try:
            data = response.read(CHUNK)
        except NETWORK_ERRORS as error:
            raise PullFailure(f"network error reading {what}: {_reason(error)}") from None
        if not data:
            return
        yield data


def _status_error(
    error: HTTPError, host: str, credentials: RegistryCredentials | None
) -> PullFailure:
    detail = _registry_errors(error)
    if error.code in (401, 403):
        who = "the configured credentials" if credentials else "no credentials"
        return PullFailure(
            f"unauthorized: {host} refused access with {who} (HTTP {error.code}{detail})"
        )
    if error.code == 404:
        return PullFailure(f"not found on {host} (HTTP 404{detail})")
    return PullFailure(f"{host} answered HTTP {error.code}{detail}")


def _registry_errors(error: HTTPError) -> str:
    """The registry's own error codes and messages, if its body has them."""
    try:
        body = json.loads(error.read(64 << 10))
        items = body.get("errors") or []
        text = "; ".join(
            f"{e.get('code')}: {e.get('message')}" for e in items if isinstance(e, dict)
        )
    except (ValueError, AttributeError, OSError, HTTPException):
        return ""
    finally:
        error.close()
    return f": {text}" if text else ""


def _reason(error: BaseException) -> str:
    if isinstance(error, URLError) and not isinstance(error, HTTPError):
        return str(error.reason)
    return str(error) or type(error).__name__
