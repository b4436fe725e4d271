"""`swe-rl rollout`'s inputs checked before anything runs or is written: the engine URL as a
user types it (a trailing slash is fine, a path or no port is not), an engine that does not
answer, and no output directory left behind by a rollout that never started."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.checkpoint import write_checkpoint
from protocol_adapters.testing.stack import VocabularyTokenizer
from swe_rl.demo.policy import DemoPolicy
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.engine_url import engine_url

from .app_process import swe_rl


@pytest.mark.parametrize(
    ("typed", "used"),
    [
        ("http://10.0.0.5:30000", "http://10.0.0.5:30000"),
        ("http://10.0.0.5:30000/", "http://10.0.0.5:30000"),
        (" http://Engine.local:30000// ", "http://engine.local:30000"),
        ("http://[::1]:30000/", "http://[::1]:30000"),
    ],
)
def test_an_engine_url_is_used_as_http_host_port(typed: str, used: str) -> None:
    assert engine_url(typed) == used


@pytest.mark.parametrize(
    ("typed", "why"),
    [
        ("https://10.0.0.5:30000", "is not an http://HOST:PORT URL"),
        ("10.0.0.5:30000", "is not an http://HOST:PORT URL"),
        ("http://10.0.0.5", "names no host and port"),
        ("http://:30000", "names no host and port"),
        ("http://10.0.0.5:port", "the port is not a number"),
        ("http://10.0.0.5:30000/generate", "no path, query or credentials"),
        ("http://10.0.0.5:30000/?x=1", "no path, query or credentials"),
        ("http://user:secret@10.0.0.5:30000", "no path, query or credentials"),
    ],
)
def test_an_engine_url_that_is_not_one_is_refused_saying_why(typed: str, why: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=why):
        engine_url(typed)


@pytest.fixture
def inputs(tmp_path: Path, qwen_vocabulary: Vocabulary) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(create_demo_tasks(tmp_path / "repos")[0]) + "\n")
    return tasks, write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)


async def test_a_bad_engine_url_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    tasks, checkpoint = inputs
    out = tmp_path / "run"
    code, output = await swe_rl(
        "rollout", str(tasks), "--engine-url", "http://127.0.0.1", "--checkpoint",
        str(checkpoint), "--out", str(out),
    )  # fmt: skip
    assert code == 2, output
    assert "--engine-url" in output
    assert "names no host and port" in output
    assert "Traceback" not in output
    assert not out.exists()


async def test_an_engine_that_does_not_answer_leaves_no_output_directory(
    tmp_path: Path, inputs: tuple[Path, Path]
) -> None:
    tasks, checkpoint = inputs
    out = tmp_path / "runs" / "first"
    code, output = await swe_rl(
        "rollout", str(tasks), "--engine-url", "http://127.0.0.1:9", "--checkpoint",
        str(checkpoint), "--out", str(out), "--unsafe-no-sandbox",
    )  # fmt: skip
    assert code == 2, output
    assert "http://127.0.0.1:9" in output
    assert "Traceback" not in output
    assert not out.exists()
    assert not out.parent.exists()


@pytest.mark.slow
async def test_a_trailing_slash_on_the_engine_url_runs_the_episode(
    tmp_path: Path, inputs: tuple[Path, Path], qwen_vocabulary: Vocabulary
) -> None:
    tasks, checkpoint = inputs
    policy = DemoPolicy(qwen_vocabulary, plans=("fix",))
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), policy, context_length=32768
    ) as double:
        code, output = await swe_rl(
            "rollout", str(tasks), "--engine-url", double.url + "/", "--checkpoint",
            str(checkpoint), "--out", str(tmp_path / "run"), "-k", "1", "--budget", "120",
        )  # fmt: skip
        generated = len(double.requests)  # every one a /generate call
    assert code == 0, output
    (episode,) = json.loads((tmp_path / "run" / "run.json").read_text())["episodes"]
    assert (episode["status"], episode["reward"]) == ("completed", 1.0), output
    assert generated >= 2
