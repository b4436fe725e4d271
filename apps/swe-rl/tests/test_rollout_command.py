"""`swe-rl rollout` as a user runs it, against an engine that speaks SGLang's wire.

The engine is the double (no GPU here) serving the demo's scripted policy from this test
process; everything in the child is what a real rollout runs: the task file read and
validated, the checkpoint's tokenizer, the episode built from the run's settings by
`configure`, slime's generate function, real Claude Code in real sandboxes, grading.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.checkpoint import write_checkpoint
from protocol_adapters.testing.stack import VocabularyTokenizer
from sandbox import LocalBackend
from swe_rl.cli import build_parser
from swe_rl.commands.rollout import sandbox_options
from swe_rl.demo.policy import DemoPolicy
from swe_rl.demo.repos import create_demo_tasks
from swe_rl.errors import UsageError
from swe_rl.rollout import sandbox_backend

from .app_process import swe_rl


@pytest.mark.slow
async def test_rollout_runs_a_task_file_against_an_sglang_wire_engine(
    qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    rows = create_demo_tasks(tmp_path / "repos")
    tasks = tmp_path / "tasks.jsonl"
    lines = [json.dumps(row) for row in rows[:2]] + ['{"prompt": "broken row"}']
    tasks.write_text("\n".join(lines) + "\n")
    checkpoint = write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    policy = DemoPolicy(qwen_vocabulary, plans=("fix", "skip"))
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary),
        policy,
        context_length=32768,
        incremental_streaming=True,
    ) as double:
        code, output = await swe_rl(
            "rollout",
            str(tasks),
            "--engine-url",
            double.url,
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(tmp_path / "run"),
            "-k",
            "2",
            "--concurrency",
            "2",
            "--budget",
            "120",
        )
    assert code == 0, output
    assert "skipped tasks.jsonl row 3: metadata: is required" in output
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert [e["status"] for e in run["episodes"]] == ["completed"] * 4
    assert sorted(e["reward"] for e in run["episodes"]) == [0.0, 0.0, 1.0, 1.0]
    assert run["checkpoint"] == str(checkpoint)
    assert (tmp_path / "run" / "viewer.html").is_file()
    for episode in run["episodes"]:
        assert (tmp_path / "run" / episode["dir"] / "tree.json").is_file()
    # Every engine request came with a session id as its routing key, none with a token.
    keys = {request.headers.get("x-smg-routing-key") for request in double.requests}
    assert None not in keys
    assert not any(key.startswith("sess-") for key in keys if key)


@pytest.mark.slow
async def test_rollout_settings_reach_every_engine_call_and_bound_the_episode(
    qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    """Non-default settings from the checkpoint, a settings file and flags: the engine gets the
    sampling in every /generate, each reply's cap, the episode's token cap, the turn cap and
    the wall clock bound the episode, and run.json records every value with its source."""
    rows = create_demo_tasks(tmp_path / "repos")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(rows[0]) + "\n")
    checkpoint = write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    generation.update(temperature=0.6, top_p=0.95, top_k=20)
    (checkpoint / "generation_config.json").write_text(json.dumps(generation))
    settings = tmp_path / "settings.toml"
    settings.write_text(
        'template_mode = "accept-deviations"\nsglang_tool_call_parser = "hermes"\n'
        "rollout_max_response_len = 4096\n"
    )
    policy = DemoPolicy(qwen_vocabulary, plans=("fix",))
    async with EngineDouble(
        VocabularyTokenizer(qwen_vocabulary), policy, context_length=32768
    ) as double:
        code, output = await swe_rl(
            "rollout",
            str(tasks),
            "--engine-url",
            double.url,
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(tmp_path / "run"),
            "-k",
            "1",
            "--settings",
            str(settings),
            "--rollout-temperature",
            "0.35",
            "--min-p",
            "0.02",
            "--rollout-max-response-len",
            "900",
            "--max-episode-new-tokens",
            "1000",
            "--rollout-stop",
            "</never>",
            "--max-turns",
            "2",
            "--wall-clock-s",
            "40",
            "--context-tokens",
            "30000",
        )
    assert code == 0, output
    assert "rollout settings" in output
    sent = [request.sampling_params for request in double.requests]
    assert 1 <= len(sent) <= 2, output  # the turn cap: a third call is refused before the engine
    for params in sent:
        assert params["temperature"] == 0.35  # the flag's, over the checkpoint's 0.6
        assert (params["top_p"], params["top_k"]) == (0.95, 20)  # the checkpoint's
        assert params["min_p"] == 0.02
        assert params["stop"] == ["</never>"]
    caps = [int(str(params["max_new_tokens"])) for params in sent]
    assert caps[0] == 900  # the flag's per-reply cap, over the file's 4096 and the CLI's 32000
    assert all(cap <= 900 for cap in caps)
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").open()]
    assert samples[0]["metadata"]["agent_rl"]["episode"]["generated_tokens"] <= 1000
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    (episode,) = run["episodes"]
    # The turn cap refused the third call (HTTP 429, which Claude Code retries) until the
    # wall clock ran out: aborted by the episode's own budget, never a finished fix.
    assert episode["status"] == "aborted", episode
    assert "the agent used its whole budget (40 s)" in episode["reason"]
    assert episode["turns"] <= 2
    recorded = run["settings"]
    assert recorded["rollout_temperature"] == {"value": 0.35, "source": "flag"}
    assert recorded["rollout_top_p"]["value"] == 0.95
    assert recorded["rollout_top_p"]["source"] == "checkpoint"
    assert recorded["template_mode"] == {"value": "accept-deviations", "source": "file"}
    assert recorded["sglang_tool_call_parser"] == {"value": "hermes", "source": "file"}
    assert recorded["rollout_max_context_len"] == {"value": 30000, "source": "flag"}
    assert recorded["wall_clock_s"] == {"value": 40.0, "source": "flag"}


async def test_rollout_never_runs_a_model_unsandboxed_unless_told(
    qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(create_demo_tasks(tmp_path / "repos")[0]) + "\n")
    checkpoint = write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    no_bwrap = tmp_path / "bin"
    no_bwrap.mkdir()
    for tool in ("git", "python3"):
        (no_bwrap / tool).symlink_to(f"/usr/bin/{tool}")
    code, output = await swe_rl(
        "rollout",
        str(tasks),
        "--engine-url",
        "http://127.0.0.1:9",
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(tmp_path / "run"),
        env={"PATH": str(no_bwrap)},
    )
    assert code == 2
    assert "a real model's commands never run unsandboxed" in output
    assert "--unsafe-no-sandbox" in output


def test_rollout_hands_its_image_cache_and_registry_settings_to_every_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a worker's backend is built from (swe_rl.rollout) carries the command's image
    cache, plain-HTTP hosts and credentials; a bad credentials file stops the command."""
    for name in ("SWE_RL_REGISTRY_PLAIN_HTTP", "SWE_RL_REGISTRY_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps({"127.0.0.1:5000": {"username": "u", "password": "p"}}))
    words = ["rollout", "tasks.jsonl", "--engine-url", "http://127.0.0.1:9", "--checkpoint", "c"]
    words += ["--out", "run", "--image-cache", str(tmp_path / "images")]
    words += ["--plain-http", "127.0.0.1:5000", "--registry-credentials", str(credentials)]
    options = sandbox_options(build_parser().parse_args(words), tmp_path / "run", "bwrap")
    backend = sandbox_backend("local", options)
    assert isinstance(backend, LocalBackend)
    images = backend.config.images
    assert images is not None
    assert images.root == tmp_path / "images"
    assert images.plain_http == ("127.0.0.1:5000",)
    assert images.credentials["127.0.0.1:5000"].username == "u"
    credentials.write_text('{"127.0.0.1:5000": {"username": "u"}}')
    with pytest.raises(UsageError, match="needs username and password"):
        sandbox_options(build_parser().parse_args(words), tmp_path / "run", "bwrap")
