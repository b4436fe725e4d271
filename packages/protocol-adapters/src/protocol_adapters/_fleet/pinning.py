"""Which worker owns a session: a stable hash of its session id.

Stable across processes and runs (BLAKE2b, never Python's ``hash()``, which is salted per
process), so a session id always lands on the same worker of an N-worker fleet: the caller can
count on it, and a worker's sticky engine routing sees every turn of its sessions.
"""

from __future__ import annotations

import hashlib


def worker_for(session_id: str, workers: int) -> int:
    """The index, in ``range(workers)``, of the worker that owns ``session_id``."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % workers
