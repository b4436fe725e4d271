"""`swe-rl check`: the preflight passes against the engine double (SGLang's wire, the demo's
scripted policy) with the real Claude Code, real sandboxes and real grading, and fails at a
named step, saying what to do, for each broken piece: the engine down, a chat template the
audit rejects, a CLI that cannot reach the adapter, a task whose reference does not pass."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from protocol_adapters import Vocabulary
from protocol_adapters.testing import EngineDouble
from protocol_adapters.testing.checkpoint import write_checkpoint
from protocol_adapters.testing.stack import VocabularyTokenizer
from slime_backend import AdapterSession, BackendSettings, Budgets, EpisodeOutcome, JsonValue
from slime_backend.testing import StandInSample
from swe_rl.check import StepFailed, run_check, trained_tokens_are_the_engines
from swe_rl.cli import build_parser
from swe_rl.demo.policy import DemoPolicy
from swe_rl.demo.repos import TASKS, create_demo_tasks
from swe_rl.engine_recorder import EngineReply
from swe_rl.rollout import ConfiguredEpisode
from trajectory_tree import SessionTree

from .app_process import swe_rl

STEPS = ["engine", "chat template", "sandbox", "grading", "agent", "token trust", "samples"]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def task_file(root: Path, *, wrong_reference: bool = False) -> Path:
    """The demo's calc task, with its fix (or a wrong one) as the reference solution."""
    row = create_demo_tasks(root / "repos")[0]
    fix = TASKS[0].fix
    repo = Path(row["metadata"]["repo"]["path"])
    source = (repo / fix.path).read_text()
    (repo / fix.path).write_text(source.replace(fix.old, fix.wrong if wrong_reference else fix.new))
    diff = ["git", "-C", str(repo), "diff", "--no-color"]
    patch = subprocess.run(diff, capture_output=True, text=True, check=True).stdout
    (repo / fix.path).write_text(source)
    path = root / "tasks.jsonl"
    path.write_text(json.dumps({**row, "reference": {"patch": patch}}) + "\n")
    return path


def unusable_checkpoint(directory: Path, vocabulary: Vocabulary) -> Path:
    """A checkpoint whose chat template renders only user messages: no mode can serve it."""
    write_checkpoint(directory, vocabulary)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}"
        "<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture
async def double(qwen_vocabulary: Vocabulary) -> AsyncIterator[EngineDouble]:
    policy = DemoPolicy(qwen_vocabulary, plans=("fix",))
    tokenizer = VocabularyTokenizer(qwen_vocabulary)
    async with EngineDouble(
        tokenizer, policy, context_length=32768, incremental_streaming=True
    ) as engine:
        yield engine


def check_words(tasks: Path, engine_url: str, checkpoint: Path, out: Path) -> list[str]:
    return [
        "check",
        str(tasks),
        "--engine-url",
        engine_url,
        "--checkpoint",
        str(checkpoint),
        "--out",
        str(out),
    ]


def report(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "check.json").read_text())
    return data


def failed_at(out: Path, step: str) -> dict[str, Any]:
    """The report's last step: the named one, failed, with a hint; every earlier one passed."""
    steps = report(out)["steps"]
    names = [s["name"] for s in steps]
    assert names == STEPS[: STEPS.index(step) + 1], names
    assert all(s["ok"] for s in steps[:-1])
    last: dict[str, Any] = steps[-1]
    assert not last["ok"]
    assert last["hint"]
    return last


@pytest.mark.slow
@needs_bwrap
async def test_check_passes_against_the_engine_double(
    qwen_vocabulary: Vocabulary, double: EngineDouble, tmp_path: Path
) -> None:
    tasks = task_file(tmp_path)
    checkpoint = write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    out = tmp_path / "check"
    code, output = await swe_rl(
        *check_words(tasks, double.url, checkpoint, out), "--wall-clock-s", "120"
    )
    assert code == 0, output
    assert "check passed" in output
    assert "rollout settings" in output
    steps = report(out)["steps"]
    assert [s["name"] for s in steps] == STEPS
    assert all(s["ok"] and s["seconds"] >= 0 for s in steps)
    detail = {s["name"]: s["detail"] for s in steps}
    assert "context 32768 tokens" in detail["engine"]
    assert "bridge-exact, served in exact mode" in detail["chat template"]
    assert "the empty change earns 0, the reference solution 1" in detail["grading"]
    assert "its change earned 1 (resolved)" in detail["agent"]
    assert "each the engine's" in detail["token trust"]
    assert (out / "samples.jsonl").is_file()
    assert report(out)["settings"]["rollout_max_context_len"]["source"] == "engine"


async def test_check_stops_at_the_engine_when_it_is_down(
    qwen_vocabulary: Vocabulary, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = task_file(tmp_path)
    checkpoint = write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    out = tmp_path / "check"
    args = build_parser().parse_args(
        [*check_words(tasks, "http://127.0.0.1:9", checkpoint, out), "--unsafe-no-sandbox"]
    )
    assert await run_check(args) == 1
    last = failed_at(out, "engine")
    assert "http://127.0.0.1:9 does not answer as SGLang does" in last["detail"]
    assert "python -m sglang.launch_server" in last["hint"]
    printed = capsys.readouterr().out
    assert "check failed at step 'engine'" in printed
    assert "what to do:" in printed


async def test_check_stops_at_a_chat_template_no_mode_can_serve(
    qwen_vocabulary: Vocabulary, double: EngineDouble, tmp_path: Path
) -> None:
    tasks = task_file(tmp_path)
    checkpoint = unusable_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    out = tmp_path / "check"
    args = build_parser().parse_args(
        [*check_words(tasks, double.url, checkpoint, out), "--unsafe-no-sandbox"]
    )
    assert await run_check(args) == 1
    last = failed_at(out, "chat template")
    assert "is unusable, which 'exact' mode does not serve" in last["detail"]
    assert "check-template" in last["hint"]
    assert double.requests == []  # no episode ran


@needs_bwrap
async def test_check_stops_at_grading_when_the_reference_does_not_pass(
    qwen_vocabulary: Vocabulary, double: EngineDouble, tmp_path: Path
) -> None:
    tasks = task_file(tmp_path, wrong_reference=True)
    checkpoint = write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    out = tmp_path / "check"
    args = build_parser().parse_args(check_words(tasks, double.url, checkpoint, out))
    assert await run_check(args) == 1
    last = failed_at(out, "grading")
    assert "the reference solution earns 0" in last["detail"]
    assert "empty change 0, reference 0" in last["detail"]
    assert "swe-rl validate" in last["hint"]
    assert (out / "grading").is_dir()  # the grading logs the message names
    assert double.requests == []  # no episode ran


class Unreachable:
    """The app's episode, but its CLI is pointed at a port nothing listens on."""

    def __init__(self) -> None:
        self.inner = ConfiguredEpisode()

    def configure(self, settings: BackendSettings) -> None:
        self.inner.configure(settings)

    def finished(self, tree: SessionTree, outcome: EpisodeOutcome) -> None:
        self.inner.finished(tree, outcome)

    async def __call__(
        self,
        task: Mapping[str, JsonValue],
        session: AdapterSession,
        budgets: Budgets,
        *,
        evaluation: bool,
    ) -> EpisodeOutcome:
        nowhere = dataclasses.replace(session, base_url="http://127.0.0.1:9")
        return await self.inner(task, nowhere, budgets, evaluation=evaluation)


@pytest.mark.slow
@needs_bwrap
async def test_check_stops_at_the_agent_when_its_cli_cannot_reach_the_adapter(
    qwen_vocabulary: Vocabulary, double: EngineDouble, tmp_path: Path
) -> None:
    tasks = task_file(tmp_path)
    checkpoint = write_checkpoint(tmp_path / "checkpoint", qwen_vocabulary)
    out = tmp_path / "check"
    words = [*check_words(tasks, double.url, checkpoint, out), "--wall-clock-s", "20"]
    assert await run_check(build_parser().parse_args(words), episode=Unreachable()) == 1
    last = failed_at(out, "agent")
    assert "the agent CLI never reached the engine through the adapter" in last["detail"]
    assert "forwarded port" in last["hint"]
    assert double.requests == []


def test_check_runs_the_files_first_task_into_runs_check_by_default() -> None:
    words = ["check", "t.jsonl", "--engine-url", "http://e:1", "--checkpoint", "c"]
    args = build_parser().parse_args(words)
    assert (args.out, args.task, args.sandbox) == (Path("runs/check"), None, "local")
    assert args.settings is None  # rollout's settings flags, unset


def test_token_trust_names_each_way_a_trained_token_can_be_wrong() -> None:
    """The trust step's own check, on a sample made by hand: two turns of one branch, each
    engine output trained after exactly the prompt the engine was sent."""
    first = EngineReply((1, 2), (3, 4), (-0.5, -0.25), "stop")
    second = EngineReply((1, 2, 3, 4, 9), (5,), (-0.125,), "stop")

    def sample(tokens: list[int], logprobs: list[float]) -> StandInSample:
        return StandInSample(
            index=0,
            tokens=tokens,
            response_length=5,
            loss_mask=[1, 1, 0, 1, 0],
            rollout_log_probs=logprobs,
        )

    good = sample([1, 2, 3, 4, 9, 5, 7], [-0.5, -0.25, 0.0, -0.125, 0.0])
    trained, used = trained_tokens_are_the_engines([good], [first, second], "hint")
    assert (trained, used) == (3, [first, second])
    cases = [
        (
            sample([1, 2, 3, 6, 9, 5, 7], [-0.5, -0.25, 0.0, -0.125, 0.0]),
            "response tokens 0:2: the trained ids are not what the engine generated",
        ),
        (
            sample([1, 2, 3, 4, 9, 5, 7], [-0.5, -0.3, 0.0, -0.125, 0.0]),
            "response tokens 0:2: the trained logprobs are not the ones the engine returned",
        ),
        (
            sample([1, 2, 3, 4, 8, 5, 7], [-0.5, -0.25, 0.0, -0.125, 0.0]),
            "response tokens 3:4 are trained, but the engine was never sent the prompt",
        ),
    ]
    for bad, message in cases:
        with pytest.raises(StepFailed, match=message):
            trained_tokens_are_the_engines([bad], [first, second], "hint")
    removed = dataclasses.replace(cases[0][0], remove_sample=True)
    assert trained_tokens_are_the_engines([removed], [first], "hint") == (0, [])
