"""Typed configuration of the SGLang client (the library reads no environment)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlsplit

ROUTING_HEADER = "X-SMG-Routing-Key"
"""Header SGLang's model gateway hashes on to pin a session to one engine replica."""


@dataclass(frozen=True, slots=True)
class SGLangConfig:
    """Where the engine is and how long to wait for it.

    - ``connect_timeout``: opening a TCP connection; failing it means the engine is unreachable.
      Counted only in time the event loop ran (see ``connect.py``), from when the connect starts
      (not while waiting for a free pooled connection).
    - ``request_timeout``: the whole call, from sending to the last token.
    - ``stream_idle_timeout``: the longest gap between two streamed chunks (a stalled engine is
      noticed long before ``request_timeout``).
    - ``abort_timeout``: how long an ``/abort_request`` may take; aborts are best effort and
      never delay an error or a cancellation by more than this.
    - ``info_timeout``: how long asking the engine for its context length (at start) may take.
    - ``max_connections``: size of the one pooled connection set shared by all calls.
    - ``prompt_json_cache_bytes``: memory for each session's last prompt ids and their JSON text,
      so a prompt that extends the previous one encodes only its new ids (~1.2 MB per session at
      128k ids; least recently used sessions go first; 0 encodes every prompt whole).
    """

    base_url: str
    connect_timeout: float = 5.0
    request_timeout: float = 900.0
    stream_idle_timeout: float = 120.0
    abort_timeout: float = 2.0
    info_timeout: float = 10.0
    max_connections: int = 512
    routing_header: str = ROUTING_HEADER
    prompt_json_cache_bytes: int = 256 * 2**20

    def __post_init__(self) -> None:
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"base_url must not carry a query or fragment: {self.base_url!r}")
        for name in (
            "connect_timeout",
            "request_timeout",
            "stream_idle_timeout",
            "abort_timeout",
            "info_timeout",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.prompt_json_cache_bytes < 0:
            raise ValueError(
                f"prompt_json_cache_bytes must be >= 0, got {self.prompt_json_cache_bytes}"
            )
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")
        if not self.routing_header:
            raise ValueError("routing_header must not be empty")

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path
