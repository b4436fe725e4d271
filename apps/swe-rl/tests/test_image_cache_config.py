"""The app's image cache settings: where images go, plain-HTTP hosts and credentials, from
arguments, the environment or the rollout's sandbox options; Harbor's scratch directories."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from sandbox import LocalBackend, RegistryCredentials
from slime_backend import AgentSettings, BackendSettings, EpisodeSettings, SandboxSettings
from swe_rl.environment import (
    CREDENTIALS_ENV,
    IMAGE_CACHE_ENV,
    PLAIN_HTTP_ENV,
    image_cache_config,
    sandbox_spec,
)
from swe_rl.harbor import HarborOptions, convert_task
from swe_rl.rollout import ConfigurationError, build_episode
from swe_rl.task import parse_task

TASK = Path(__file__).resolve().parent / "fixtures" / "harbor" / "calc-task"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (IMAGE_CACHE_ENV, PLAIN_HTTP_ENV, CREDENTIALS_ENV):
        monkeypatch.delenv(name, raising=False)


def test_the_default_cache_is_under_the_users_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/someone")
    assert image_cache_config().root == Path("/home/someone/.cache/agent-rl/images")
    monkeypatch.setenv(IMAGE_CACHE_ENV, "/var/cache/images")
    assert image_cache_config().root == Path("/var/cache/images")
    assert image_cache_config(Path("/given")).root == Path("/given")


def test_plain_http_hosts_and_credentials_come_from_arguments_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "auth.json"
    secrets.write_text(json.dumps({"registry.lan:5000": {"username": "u", "password": "p"}}))
    monkeypatch.setenv(PLAIN_HTTP_ENV, "127.0.0.1:5000, registry.lan:5000")
    monkeypatch.setenv(CREDENTIALS_ENV, str(secrets))
    config = image_cache_config(tmp_path, plain_http=["registry.lan:5000"])
    assert config.plain_http == ("registry.lan:5000", "127.0.0.1:5000")
    assert dict(config.credentials) == {"registry.lan:5000": RegistryCredentials("u", "p")}


@pytest.mark.parametrize(
    "text", ["not json", "[]", '{"h": {"username": "u"}}'], ids=["text", "list", "no-password"]
)
def test_a_bad_credentials_file_is_named(tmp_path: Path, text: str) -> None:
    secrets = tmp_path / "auth.json"
    secrets.write_text(text)
    with pytest.raises(ValueError, match=r"registry credentials .*auth\.json"):
        image_cache_config(tmp_path, credentials=secrets)


def test_a_rollouts_local_backend_has_the_image_cache_its_options_name(tmp_path: Path) -> None:
    options = {
        "artifacts_root": str(tmp_path / "episodes"),
        "cache_dir": str(tmp_path / "cache"),
        "image_cache": str(tmp_path / "images"),
        "registry_plain_http": "127.0.0.1:5000",
    }
    backend = build_episode(settings(options)).backend
    assert isinstance(backend, LocalBackend)
    images = backend.config.images
    assert images is not None
    assert images.root == tmp_path / "images"
    assert images.plain_http == ("127.0.0.1:5000",)
    bad = {**options, "registry_credentials": str(tmp_path / "missing.json")}
    with pytest.raises(ConfigurationError, match="registry_credentials"):
        build_episode(settings(bad))


def settings(options: dict[str, str]) -> BackendSettings:
    return BackendSettings(
        EpisodeSettings("swe_rl.rollout.generate"),
        AgentSettings("claude-code"),
        SandboxSettings("local", options),
    )


def test_a_harbor_grading_sandbox_gets_tests_and_logs_as_scratch_directories() -> None:
    task = parse_task(convert_task(TASK, HarborOptions())["metadata"])
    spec = sandbox_spec(task, None, env={}, grading=True)
    assert spec.scratch_dirs == (PurePosixPath("/tests"), PurePosixPath("/logs"))
    assert sandbox_spec(task, None, env={}).scratch_dirs == ()  # the agent's has none
