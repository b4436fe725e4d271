"""Opaque tokens we hand to clients alongside reasoning, and read back when they echo them.

Providers attach signed or encrypted blobs to reasoning so a later request can prove (or
restore) what the model thought. We have nothing to hide from the client, so our blobs are
deterministic: the same reasoning text always yields the same token, streamed or not.

- Anthropic ``thinking.signature``: a digest of the thinking text. Routing ignores signatures;
  the digest only lets a reader see which text a signature was made for.
- OpenAI Responses ``reasoning.encrypted_content``: the reasoning text itself, base64 behind a
  prefix. Codex echoes it verbatim, so the exact reasoning comes back even when a client drops
  or rewrites the human-readable summary, and the tree does not fork.
"""

from __future__ import annotations

import base64
import binascii
import hashlib

_SIGNATURE_DOMAIN = b"protocol-adapters/thinking-signature/v1\x00"
_ENCRYPTED_PREFIX = "pa-reasoning-v1:"


def thinking_signature(text: str) -> str:
    """The opaque signature we attach to a thinking block with this text."""
    digest = hashlib.sha256(_SIGNATURE_DOMAIN + text.encode()).digest()
    return base64.b64encode(digest).decode("ascii")


def encode_reasoning(text: str) -> str:
    """The ``encrypted_content`` we attach to a reasoning item with this text."""
    return _ENCRYPTED_PREFIX + base64.b64encode(text.encode()).decode("ascii")


def decode_reasoning(encrypted: str) -> str | None:
    """The text inside one of our ``encrypted_content`` tokens; None for anyone else's."""
    if not encrypted.startswith(_ENCRYPTED_PREFIX):
        return None
    try:
        raw = base64.b64decode(encrypted[len(_ENCRYPTED_PREFIX) :], validate=True)
        return raw.decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
