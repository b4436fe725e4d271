"""End to end: the real Claude Code and the real Codex in a local sandbox, on a tiny git
repository, served by the real protocol adapter (AdapterServer) in front of the SGLang-wire
engine double with the real Qwen3 tokenizer.

The scripted "model" edits a file through each CLI's own tool; the test then checks the
three things an RL user relies on: the agent's diff (captured inside the sandbox) is exactly
that edit, the CLI's event stream tells the same story, and every loss-1 token in the
session's samples is an id the engine produced, in order, with its logprob.
"""

from __future__ import annotations

import re
import subprocess
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from harness import AgentEndpoint, ClaudeCode, CliMount, Codex, Harness, InstalledCli
from protocol_adapters import AdapterConfig, SessionLimits
from protocol_adapters.testing import ScriptedReply
from protocol_adapters.testing.stack import LocalStack, local_stack
from protocol_adapters.testing.trust import check_engine_tokens_trained
from sandbox import (
    ForwardedEndpoint,
    GitWorkspace,
    LocalBackend,
    LocalConfig,
    SandboxSpec,
    capture_diff,
)
from trajectory_tree import SessionTree, linearize

# The engine double serves a 32768-token context; the adapter and the CLIs must agree with it.
CONTEXT_WINDOW = 32768
POLICY = "policy-e2e"
TASK = "Change the greeting in greeting.py to 'hello, world'."
EDIT = 'sed -i \'s/"hello"/"hello, world"/\' greeting.py'
CODEX_PATCH = """apply_patch <<'PATCH'
*** Begin Patch
*** Update File: greeting.py
@@
-GREETING = "hello"
+GREETING = "hello, world"
*** End Patch
PATCH
"""


@dataclass(frozen=True)
class Case:
    harness: Harness
    script: Sequence[ScriptedReply]
    request_path: str


CASES = {
    "claude-code": Case(
        ClaudeCode(max_turns=5),
        [
            ScriptedReply(
                reasoning="The greeting lives in greeting.py; one sed call changes it.",
                text="I'll update the greeting.",
                tool_calls=[("Bash", {"command": EDIT, "description": "Update the greeting"})],
            ),
            ScriptedReply(text="Done: greeting.py now says hello, world."),
        ],
        "/v1/messages",
    ),
    "codex": Case(
        Codex(),
        [
            ScriptedReply(
                reasoning="Patch greeting.py with apply_patch.",
                tool_calls=[("exec_command", {"cmd": CODEX_PATCH})],
            ),
            ScriptedReply(text="Done: greeting.py now says hello, world."),
        ],
        "/v1/responses",
    ),
}


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    root = tmp_path / "state"
    root.mkdir()
    return LocalBackend(LocalConfig(state_root=root))


@pytest.fixture
def tiny_repo(tmp_path: Path) -> tuple[Path, str]:
    """A real git repository with one commit: (path, commit)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "greeting.py").write_text('GREETING = "hello"\n')
    (repo / "README.md").write_text("A tiny repository for agent runs.\n")
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], [*identity, "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True)
    return repo, head.stdout.decode().strip()


def mount_for(backend: LocalBackend, installed: InstalledCli) -> CliMount:
    """A read-only bind at a unique sandbox path, or the host path without isolation."""
    if backend.isolated:
        return CliMount.under(installed, PurePosixPath(f"/opt/harness-e2e-{uuid.uuid4().hex}"))
    return CliMount.at_host_path(installed)


def changed_lines(patch: bytes) -> list[str]:
    lines = patch.decode().splitlines()
    return [
        line for line in lines if re.match(r"^[+-]", line) and not line.startswith(("+++", "---"))
    ]


def assert_trained_tokens_are_the_engines(stack: LocalStack, tree: SessionTree) -> None:
    """Loss-1 tokens are exactly the double's output ids with its logprobs, every turn trained
    once; every turn's prompt is exactly what the engine received."""
    assert len(stack.double.requests) == len(tree.turns)
    lin = linearize(tree)
    check_engine_tokens_trained(stack, tree, lin)
    assert lin.exclusions == ()
    assert all(
        lp == -0.125
        for sample in lin.samples
        for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True)
        if m
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
async def test_real_cli_edits_through_its_tool_and_trains_engine_tokens(
    name: str,
    backend: LocalBackend,
    tiny_repo: tuple[Path, str],
    tokenizer_cache: Path,
    claude_code_cli: InstalledCli,
    codex_cli: InstalledCli,
    tmp_path: Path,
) -> None:
    case = CASES[name]
    installed = claude_code_cli if name == "claude-code" else codex_cli
    repo, base = tiny_repo
    mount = mount_for(backend, installed)
    config = AdapterConfig(models=(POLICY,), limits=SessionLimits(context_tokens=CONTEXT_WINDOW))
    async with local_stack(case.script, tokenizer_cache=tokenizer_cache, config=config) as stack:
        session = stack.server.sessions.open(f"e2e-{name}")
        host, port = stack.server.config.host, int(stack.server.url.rsplit(":", 1)[1])
        spec = SandboxSpec(
            workspace=GitWorkspace(repo, base),
            network=ForwardedEndpoint(host, port),
            read_only_binds=(mount.bind,) if backend.isolated else (),
        )
        async with await backend.create(spec) as box:
            assert box.endpoint_url is not None
            endpoint = AgentEndpoint(box.endpoint_url, session.token, POLICY, CONTEXT_WINDOW)
            run = await case.harness.run(
                box, mount, endpoint, TASK, budget=120, output_dir=tmp_path / "run"
            )
            diff = await capture_diff(box, repo, base)

    assert (run.exit_code, run.timed_out) == (0, False), (run.stats.error, run.stderr_tail)
    assert run.stats.error is None, run.stats
    assert run.stats.result_text == "Done: greeting.py now says hello, world."
    assert run.stats.tool_calls == 1
    assert run.stats.malformed_lines == 0

    assert diff.changed_paths == ("greeting.py",)
    assert changed_lines(diff.patch) == ['-GREETING = "hello"', '+GREETING = "hello, world"']

    tree = session.tree
    assert len(tree.turns) == len(case.script)
    for turn, reply in zip(tree.turns, case.script, strict=True):
        assert list(tree.output_ids(turn)) == stack.double.reply_ids(reply)
    assert_trained_tokens_are_the_engines(stack, tree)
