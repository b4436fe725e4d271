"""References read the way Docker reads them, and registry challenges parsed."""

from __future__ import annotations

import pytest

from sandbox._images._auth import parse_challenges
from sandbox._images._errors import PullFailure
from sandbox._images._reference import parse_reference

DIGEST = "sha256:" + "ab" * 32
HUB = "registry-1.docker.io"


@pytest.mark.parametrize(
    ("text", "registry", "repository", "tag", "digest", "api_host"),
    [
        ("python", "docker.io", "library/python", "latest", None, HUB),
        ("python:3.11", "docker.io", "library/python", "3.11", None, HUB),
        ("user/app:v1", "docker.io", "user/app", "v1", None, HUB),
        ("docker.io/python", "docker.io", "library/python", "latest", None, HUB),
        ("index.docker.io/user/app", "docker.io", "user/app", "latest", None, HUB),
        ("ghcr.io/org/team/app:1.0", "ghcr.io", "org/team/app", "1.0", None, "ghcr.io"),
        ("localhost/app", "localhost", "app", "latest", None, "localhost"),
        ("127.0.0.1:5000/a/b:t", "127.0.0.1:5000", "a/b", "t", None, "127.0.0.1:5000"),
        (f"app@{DIGEST}", "docker.io", "library/app", None, DIGEST, HUB),
        (f"host:5000/app:v1@{DIGEST}", "host:5000", "app", "v1", DIGEST, None),
        ("a.b/c__d/e-f.g:T_1.x", "a.b", "c__d/e-f.g", "T_1.x", None, None),
    ],
)
def test_references_are_read_like_docker(
    text: str,
    registry: str,
    repository: str,
    tag: str | None,
    digest: str | None,
    api_host: str | None,
) -> None:
    reference = parse_reference(text)
    assert (reference.registry, reference.repository) == (registry, repository)
    assert (reference.tag, reference.digest) == (tag, digest)
    assert reference.target == (digest or tag)
    assert reference.api_host == (api_host or registry)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "UPPER/case",
        "app:bad tag",
        "app@sha256:short",
        "app@md5:" + "a" * 32,
        "host:5000/",
        "a//b",
        "-leading/x",
        "app:" + "t" * 129,
    ],
)
def test_invalid_references_are_refused(text: str) -> None:
    with pytest.raises(PullFailure, match="invalid reference"):
        parse_reference(text)


def test_challenges_are_parsed_bearer_first() -> None:
    challenges = parse_challenges(
        [
            'Basic realm="registry"',
            'Bearer realm="https://auth.example/token",service="reg.example",'
            'scope="repository:a/b:pull",error="insufficient_scope"',
        ]
    )
    assert [c.scheme for c in challenges] == ["bearer", "basic"]
    assert challenges[0].params == {
        "realm": "https://auth.example/token",
        "service": "reg.example",
        "scope": "repository:a/b:pull",
        "error": "insufficient_scope",
    }
    assert challenges[1].params == {"realm": "registry"}
