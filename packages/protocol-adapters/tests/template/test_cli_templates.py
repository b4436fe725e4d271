"""``protocol-adapters check-template`` (the audit's verdict for a file or a checkpoint) and
``serve`` with a checkpoint's template: its special tokens reach the template, a template the
bridge cannot serve exactly stops the start with the verdict unless ``--template-mode`` says how
to serve it, and then every turn records the mode."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import anthropic
import pytest
from template_session import SPECIAL, reference_ids, trait_template

from protocol_adapters.__main__ import _parser, _policy, main
from protocol_adapters._bridge.notes import TEMPLATE_MODE
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import Message, Prompt, SessionTree, loads

SMALL = Path(__file__).parent.parent / "fixtures" / "small_tokenizer.json"
ADMIN_TOKEN = "template-admin"
SERVING = re.compile(r"serving on (http://\S+); admin API on (http://\S+);")


def checkpoint(directory: Path, template: str) -> Path:
    """A checkpoint directory (small tokenizer) whose template needs bos and eos tokens."""
    directory.mkdir(parents=True)
    shutil.copy(SMALL, directory / "tokenizer.json")
    config = {**SPECIAL, "chat_template": template}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_check_template_prints_the_verdict_of_a_file_or_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exact = tmp_path / "exact.jinja"
    exact.write_text(trait_template())
    args = ["--bos-token", SPECIAL["bos_token"], "--eos-token", SPECIAL["eos_token"]]
    assert main(["check-template", str(exact), *args]) == 0
    assert "template 'exact': bridge-exact" in capsys.readouterr().out

    # Without the special tokens the template asks for, it refuses every conversation.
    assert main(["check-template", str(exact)]) == 1
    out = capsys.readouterr().out
    assert "unusable" in out
    assert "this template needs bos_token and eos_token" in out

    moving = tmp_path / "moving.jinja"
    moving.write_text(trait_template(tools_in_system="false"))
    assert main(["check-template", str(moving), *args]) == 1
    out = capsys.readouterr().out
    assert "full-render-only" in out
    assert "moves the tool list" in out
    assert "--template-mode full-render" in out

    directory = checkpoint(tmp_path / "ckpt", trait_template())
    assert main(["check-template", str(directory)]) == 0  # special tokens from the checkpoint
    assert "template 'ckpt': bridge-exact" in capsys.readouterr().out

    assert main(["check-template", str(tmp_path / "missing.jinja")]) == 2
    assert "missing.jinja" in capsys.readouterr().err


def test_serve_flags_name_the_tokens_a_template_and_a_reply_end_with(tmp_path: Path) -> None:
    """--tokenizer-json with --eos-token: the template sees the token, and it ends replies (the
    Qwen stop tokens are no default for another family's tokenizer); with --checkpoint the
    flags override the checkpoint's own."""
    small = Vocabulary.from_file(SMALL)
    template = tmp_path / "t.jinja"
    template.write_text(trait_template())
    engine = ["serve", "--engine-url", "http://127.0.0.1:1"]
    tokens = ["--bos-token", "<|endoftext|>", "--eos-token", "<|im_end|>"]
    args = _parser().parse_args(
        [*engine, "--tokenizer-json", str(SMALL), "--template-file", str(template), *tokens]
    )
    vocabulary, chat = _policy(args)
    assert vocabulary.stop_ids == {small.token_id("<|im_end|>")}
    assert dict(chat.variables) == SPECIAL
    directory = checkpoint(tmp_path / "ckpt", trait_template())
    args = _parser().parse_args([*engine, "--checkpoint", str(directory), "--bos-token", "<s>"])
    _, chat = _policy(args)
    assert chat.variables["bos_token"] == "<s>"
    assert chat.variables["eos_token"] == SPECIAL["eos_token"]


def serve_command(engine_url: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "protocol_adapters",
        "serve",
        "--engine-url",
        engine_url,
        "--port",
        "0",
        "--admin-port",
        "0",
        *extra,
    ]


@asynccontextmanager
async def serving(command: list[str]) -> AsyncIterator[tuple[str, str]]:
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        while True:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "server exited before serving"
            if match := SERVING.search(line):
                break
        yield match[1], match[2]
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0


async def one_call(url: str, admin_url: str) -> SessionTree:
    """Open a session, make one Messages call, return the session's tree."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{admin_url}/admin/sessions", json={}, headers=admin) as r:
            token = (await r.json())["token"]
        api = anthropic.AsyncAnthropic(base_url=url, api_key=token, max_retries=0)
        await api.messages.create(
            model="policy",
            max_tokens=32,
            system="You fix bugs.",
            messages=[{"role": "user", "content": "hi"}],
        )
        await api.close()
        async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=admin) as r:
            return loads(await r.text())


async def test_serve_renders_with_the_checkpoints_special_tokens(tmp_path: Path) -> None:
    small = Vocabulary.from_file(SMALL)
    template = trait_template()
    directory = checkpoint(tmp_path / "ckpt", template)
    (tmp_path / "admin").write_text(ADMIN_TOKEN)
    async with EngineDouble(VocabularyTokenizer(small), [ScriptedReply(text="Hello.")]) as double:
        command = serve_command(
            double.url,
            "--checkpoint",
            str(directory),
            "--admin-token-file",
            str(tmp_path / "admin"),
        )
        async with serving(command) as (url, admin_url):
            tree = await one_call(url, admin_url)
    sent = list(double.requests[0].input_ids)
    prompt = Prompt((Message.text("system", "You fix bugs."), Message.text("user", "hi")))
    assert sent == reference_ids(small, template, prompt)
    assert small.decode(sent).startswith(SPECIAL["bos_token"])
    assert tree.turns[0].meta.extra.get(TEMPLATE_MODE) is None  # exact: no mode to record


async def test_serve_refuses_a_full_render_only_template_unless_told_how_to_serve_it(
    tmp_path: Path,
) -> None:
    small = Vocabulary.from_file(SMALL)
    directory = checkpoint(tmp_path / "ckpt", trait_template(tools_in_system="false"))
    (tmp_path / "admin").write_text(ADMIN_TOKEN)
    async with EngineDouble(VocabularyTokenizer(small), [ScriptedReply(text="Hi.")]) as double:
        command = serve_command(
            double.url,
            "--checkpoint",
            str(directory),
            "--admin-token-file",
            str(tmp_path / "admin"),
        )
        process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
        try:
            _, stderr = await asyncio.wait_for(process.communicate(), 60)
        finally:  # a server that wrongly starts must not outlive the test
            if process.returncode is None:
                process.kill()
                await process.wait()
        assert process.returncode == 1
        message = stderr.decode()
        assert "full-render-only" in message
        assert "moves the tool list" in message

        async with serving([*command, "--template-mode", "full-render"]) as (url, admin_url):
            tree = await one_call(url, admin_url)
    assert tree.turns[0].meta.extra[TEMPLATE_MODE] == "full-render"
