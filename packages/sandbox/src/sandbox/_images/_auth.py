"""Registry authentication: the ``WWW-Authenticate`` challenge and what answers it.

A registry answers an unauthenticated request with 401 and a challenge. ``Basic`` wants the
credentials on every request. ``Bearer`` names a token endpoint (``realm``) and what to ask it
for (``service``, ``scope``); the token endpoint is asked anonymously, or with the
credentials as basic auth, and its token then goes with every request of that scope.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field

from sandbox._images._config import RegistryCredentials

_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*("(?:[^"\\]|\\.)*"|[^,\s]*)\s*,?')


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str
    params: dict[str, str] = field(default_factory=dict)


def parse_challenges(headers: list[str]) -> list[Challenge]:
    """Every challenge in the ``WWW-Authenticate`` headers (one per header, as registries
    send them), bearer first."""
    challenges = []
    for header in headers:
        scheme, _, rest = header.strip().partition(" ")
        params = {}
        for match in _PARAM.finditer(rest):
            value = match.group(2)
            if value.startswith('"'):
                value = re.sub(r"\\(.)", r"\1", value[1:-1])
            params[match.group(1).lower()] = value
        challenges.append(Challenge(scheme.lower(), params))
    return sorted(challenges, key=lambda c: c.scheme != "bearer")


def basic(credentials: RegistryCredentials) -> str:
    """The ``Authorization`` value of basic auth."""
    pair = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")
