"""The real agent CLIs in a sandbox on a task's own root file system, through the real adapter,
as harness runs them: the install bind-mounted read-only, Claude Code started as it is where the
image's own libc runs it (as a deployment runs it: default tools) and through the host's loader
where it cannot (no libc there), Codex's static binary as it is, no shell in between.

In a Debian root (its own libc, bash, grep, git; the task's repository at /testbed, made the
workspace in place) each CLI searches with grep and find, reads and fixes calc.py with its own
tools, and Claude Code hands a check to a sub-agent. In a root that holds one static program
and nothing else (no libc, shell, Python or git), Claude Code still starts, talks to the
adapter and writes and reads a file with its own tools.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pytest

from harness import AgentEndpoint, AgentRun, ClaudeCode, CliMount, Codex, Harness, InstalledCli
from protocol_adapters import Vocabulary
from protocol_adapters.testing import ScriptedReply
from sandbox import (
    ForwardedEndpoint,
    ImageWorkspace,
    LocalBackend,
    LocalConfig,
    RootfsImage,
    SandboxSpec,
    testing,
)

from .cli_runs import serving
from .cli_session import CLI_TIMEOUT, POLICY_MODEL
from .reading import Prompt, ScriptedModel

TESTBED = PurePosixPath("/testbed")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOADER = "/run/sandbox/runtime/ld-linux-x86-64.so.2"
SEARCH = "grep -n 'return' calc.py; find . -name '*.py' -not -path './.git/*'"
FOUND = ("2:    return a - b", "./calc.py")
FIXED = "def add(a, b):\n    return a + b\n"
TASK = "calc.add subtracts; make it add."
FINAL = "Fixed: calc.add adds."
CODEX_PATCH = """apply_patch <<'PATCH'
*** Begin Patch
*** Update File: calc.py
@@
-    return a - b
+    return a + b
*** End Patch
PATCH
"""
NOTE = "written in an image with no libc, shell or Python\n"
_LIST = "import os, sys; print(*os.listdir(sys.argv[1]))"


def image_root(build: str, tmp_path: Path) -> Path:
    """A root of sandbox.testing's (the Debian one in the repository's shared cache, as the
    sandbox's own image tests use it), or a skip naming why this host cannot build it."""
    cache = os.environ.get("SANDBOX_TEST_IMAGE_CACHE")
    shared = Path(cache) if cache else Path(__file__).resolve().parents[1] / ".cache/test-images"
    try:
        return testing.debian_root(shared) if build == "debian" else testing.static_root(tmp_path)
    except testing.RootUnavailable as why:
        pytest.skip(str(why))


@dataclass(slots=True)
class Scripted(ScriptedModel):
    """Plays `steps` in order, each a method answering the prompt; `seen` keeps the tool
    results of the main agent's last request, `tools` the tool names it offered."""

    steps: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)
    tools: set[str] = field(default_factory=set)

    def answer(self, prompt: Prompt) -> ScriptedReply:
        first = prompt.first("user")
        if first is not None and "SUBTASK" in first.text:
            return self.sub_agent(prompt)
        step = prompt.replies_so_far
        if step >= len(self.steps):
            return self.problem(f"request after {step} replies: the session was over", FINAL)
        name = self.steps[step]
        reply = getattr(self, name)(prompt)
        assert isinstance(reply, ScriptedReply)
        return reply

    def call(self, prompt: Prompt, tool: str, arguments: Mapping[str, object]) -> ScriptedReply:
        if prompt.tool(tool) is None:
            offered = sorted(str(t.get("name")) for t in prompt.tools)
            return self.problem(f"{tool} is not among the offered tools: {offered}")
        return ScriptedReply(tool_calls=[(tool, arguments)])

    def sub_agent(self, prompt: Prompt) -> ScriptedReply:
        return self.problem("an unexpected sub-agent")

    def final(self, prompt: Prompt) -> ScriptedReply:
        self.seen = prompt.tool_results
        self.tools = {str(tool.get("name")) for tool in prompt.tools}
        return ScriptedReply(text=FINAL)


@dataclass(slots=True)
class ClaudeFixes(Scripted):
    """Bash (grep, find), Read, Edit, then an Agent whose sub-agent counts the fixed line."""

    def __post_init__(self) -> None:
        self.steps = ["search", "read", "edit", "delegate", "final"]

    def search(self, prompt: Prompt) -> ScriptedReply:
        return self.call(prompt, "Bash", {"command": SEARCH, "description": "Find the code"})

    def read(self, prompt: Prompt) -> ScriptedReply:
        return self.call(prompt, "Read", {"file_path": str(TESTBED / "calc.py")})

    def edit(self, prompt: Prompt) -> ScriptedReply:
        fix = {"old_string": "return a - b", "new_string": "return a + b"}
        return self.call(prompt, "Edit", {"file_path": str(TESTBED / "calc.py"), **fix})

    def delegate(self, prompt: Prompt) -> ScriptedReply:
        check = "SUBTASK check: count the fixed lines, then report the count."
        return self.call(
            prompt,
            "Agent",
            {"description": "Check the fix", "prompt": check, "run_in_background": False},
        )

    def sub_agent(self, prompt: Prompt) -> ScriptedReply:
        if prompt.replies_so_far == 0:
            count = {"command": "grep -c 'a + b' calc.py", "description": "Count"}
            return self.call(prompt, "Bash", count)
        return ScriptedReply(text=f"REPORT check: {prompt.tool_results[-1].strip()}")


@dataclass(slots=True)
class CodexFixes(Scripted):
    """Its shell tool for grep and find, then apply_patch."""

    def __post_init__(self) -> None:
        self.steps = ["search", "patch", "final"]

    def shell(self, prompt: Prompt, line: str) -> ScriptedReply:
        tool = prompt.shell_tool
        if tool is None:
            return self.problem("no shell tool among the offered tools")
        return ScriptedReply(tool_calls=[tool.call(line)])

    def search(self, prompt: Prompt) -> ScriptedReply:
        return self.shell(prompt, SEARCH)

    def patch(self, prompt: Prompt) -> ScriptedReply:
        return self.shell(prompt, CODEX_PATCH)


@dataclass(slots=True)
class ClaudeWritesNote(Scripted):
    """Write a file, read it back: the file tools are the CLI's own, no shell needed."""

    def __post_init__(self) -> None:
        self.steps = ["write", "read", "final"]

    def write(self, prompt: Prompt) -> ScriptedReply:
        note = {"file_path": str(TESTBED / "note.txt"), "content": NOTE}
        return self.call(prompt, "Write", note)

    def read(self, prompt: Prompt) -> ScriptedReply:
        return self.call(prompt, "Read", {"file_path": str(TESTBED / "note.txt")})


@dataclass(frozen=True, slots=True)
class InImage:
    run: AgentRun
    command: tuple[str, ...]
    workspace: dict[str, str]


async def run_in_image(
    harness: Harness, installed: InstalledCli, agent: Scripted, image: RootfsImage, tmp: Path
) -> InImage:
    """`harness.run` in a sandbox on `image`, /testbed its workspace; the workspace's text
    files as the CLI left them."""
    state = tmp / "sandbox-state"
    state.mkdir()
    backend = LocalBackend(LocalConfig(state_root=state))
    mount = CliMount.under(installed)
    async with serving(agent, tmp) as served:
        session = served.stack.server.sessions.open(f"{harness.name}-in-image")
        host, port = served.proxy.url.removeprefix("http://").rsplit(":", 1)
        spec = SandboxSpec(
            image=image,
            workspace=ImageWorkspace(TESTBED),
            network=ForwardedEndpoint(host, int(port)),
            read_only_binds=(mount.bind,),
        )
        async with await backend.create(spec) as box:
            assert box.endpoint_url is not None
            endpoint = AgentEndpoint(box.endpoint_url, session.token, POLICY_MODEL, served.context)
            run = await harness.run(
                box, mount, endpoint, TASK, budget=CLI_TIMEOUT, output_dir=tmp / "run"
            )
            listing = await box.run_python(_LIST, [str(TESTBED)])
            names = set(listing.stdout.decode().split()) & {"calc.py", "note.txt"}
            files = {name: await box.read_text(str(TESTBED / name)) for name in names}
            command = box.host_program_argv(str(mount.program_path))
    return InImage(run, command, files)


def assert_clean(done: InImage, agent: Scripted) -> None:
    run = done.run
    assert agent.problems == [], (agent.problems, run.stderr_tail)
    assert (run.exit_code, run.timed_out, run.stats.error) == (0, False, None), run.stderr_tail
    assert run.stats.result_text == FINAL


@pytest.mark.slow
async def test_claude_code_fixes_the_task_in_a_debian_image(
    claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    image = RootfsImage(image_root("debian", tmp_path), env={"PATH": PATH}, working_dir=TESTBED)
    agent = ClaudeFixes(qwen_vocabulary)
    done = await run_in_image(ClaudeCode(), claude_code_cli, agent, image, tmp_path)
    assert_clean(done, agent)
    assert done.command[0] == LOADER  # what the sandbox offers; the image's libc was enough:
    assert done.run.argv[0] == str(CliMount.under(claude_code_cli).program_path)
    assert "--disallowedTools" not in done.run.argv
    search, read, edit, report = agent.seen
    assert all(line in search for line in FOUND), search  # the image's grep and find
    assert "return a - b" in read
    assert "calc.py" in edit
    assert "REPORT check: 1" in report  # the sub-agent ran in the same CLI, its grep too
    assert done.workspace["calc.py"] == FIXED
    assert agent.tools >= {"Agent", "Bash", "Edit", "Read", "Write"}


@pytest.mark.slow
async def test_codex_fixes_the_task_in_a_debian_image(
    codex_cli: InstalledCli, qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    image = RootfsImage(image_root("debian", tmp_path), env={"PATH": PATH}, working_dir=TESTBED)
    agent = CodexFixes(qwen_vocabulary)
    done = await run_in_image(Codex(), codex_cli, agent, image, tmp_path)
    assert_clean(done, agent)
    assert done.command == (str(CliMount.under(codex_cli).program_path),)  # static: as it is
    search, patch = agent.seen
    assert all(line in search for line in FOUND), search
    assert "calc.py" in patch
    assert done.workspace["calc.py"] == FIXED


@pytest.mark.slow
async def test_claude_code_answers_in_an_image_with_nothing_but_a_static_program(
    claude_code_cli: InstalledCli, qwen_vocabulary: Vocabulary, tmp_path: Path
) -> None:
    image = RootfsImage(image_root("static", tmp_path))
    agent = ClaudeWritesNote(qwen_vocabulary)
    done = await run_in_image(ClaudeCode(), claude_code_cli, agent, image, tmp_path)
    assert_clean(done, agent)
    assert done.command[0] == done.run.argv[0] == LOADER  # no libc in the image: the host's
    written, read = agent.seen
    assert "note.txt" in written
    assert NOTE.strip() in read
    assert done.workspace["note.txt"] == NOTE
