"""``protocol-adapters serve --processes N``: N adapter processes behind one admin API, run as
real processes against the engine double with the real Qwen3 tokenizer.

Sessions are pinned to a worker by a stable hash of their id (the same worker in every run),
each agent talks to its worker's own port (``base_url`` in the open answer), trees come back
through the front unchanged, a killed worker's sessions say they are lost while the worker is
restarted, and stopping ``serve`` leaves no process behind.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anthropic
import pytest
from serve_process import serve_command

from protocol_adapters._fleet import worker_for
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters.testing import EngineDouble, ScriptedReply
from protocol_adapters.testing.stack import VocabularyTokenizer
from trajectory_tree import SessionTree, loads

ADMIN_TOKEN = "fleet-admin-s3cret"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
REPLY = "Hello from the policy."
WORKER = re.compile(r"worker (\d+) \(pid (\d+)\) serving on (http://\S+); admin API on")
FRONT = re.compile(r"(\d+) processes serving on (.+); admin API on (http://\S+); context (\d+)")
EXITED = re.compile(r"worker (\d+) \(pid (\d+)\) exited")


@dataclass
class Worker:
    index: int
    pid: int
    url: str


@dataclass
class Fleet:
    """A running ``serve --processes``: its admin URL and its workers as its log names them."""

    process: asyncio.subprocess.Process
    admin_url: str = ""
    workers: dict[int, Worker] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def index_of(self, base_url: str) -> int:
        (index,) = [w.index for w in self.workers.values() if w.url == base_url]
        return index

    async def follow(self) -> None:
        assert self.process.stderr is not None
        while line := (await self.process.stderr.readline()).decode():
            self.lines.append(line)
            if match := WORKER.search(line):
                index = int(match[1])
                self.workers[index] = Worker(index, int(match[2]), match[3])
            elif match := FRONT.search(line):
                self.admin_url = match[3]
            self.changed.set()

    async def wait_for(self, pattern: re.Pattern[str], timeout: float = 60) -> re.Match[str]:
        async def found() -> re.Match[str]:
            while True:
                for line in self.lines:
                    if match := pattern.search(line):
                        return match
                assert self.process.returncode is None, "serve exited:\n" + "".join(self.lines)
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(found(), timeout)


@asynccontextmanager
async def fleet(
    engine_url: str, tokenizer_cache: Path, token_file: Path, processes: int = 2
) -> AsyncIterator[Fleet]:
    command = serve_command(
        engine_url,
        tokenizer_cache,
        "--processes",
        str(processes),
        "--admin-token-file",
        str(token_file),
        "--admin-port",
        "0",
    )
    process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
    running = Fleet(process)
    follower = asyncio.create_task(running.follow())
    try:
        await running.wait_for(FRONT, 120)
        yield running
    finally:
        if process.returncode is None:
            process.kill()  # the tests stop it themselves; this is for a failed one
            await process.wait()
        follower.cancel()


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin-token"
    path.write_text(ADMIN_TOKEN + "\n")
    return path


def double(vocabulary: Vocabulary) -> EngineDouble:
    return EngineDouble(
        VocabularyTokenizer(vocabulary),
        lambda _ids: ScriptedReply(text=REPLY),
        context_length=20480,
    )


async def open_session(
    http: aiohttp.ClientSession, admin_url: str, session_id: str
) -> dict[str, str]:
    async with http.post(
        f"{admin_url}/admin/sessions", json={"session_id": session_id}, headers=ADMIN
    ) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, str] = await r.json()
    return answer


async def one_turn(base_url: str, token: str) -> None:
    api = anthropic.AsyncAnthropic(base_url=base_url, api_key=token, max_retries=0)
    try:
        reply = await api.messages.create(
            model="policy", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
    finally:
        await api.close()
    assert reply.content[0].text == REPLY  # type: ignore[union-attr]


async def close_tree(http: aiohttp.ClientSession, admin_url: str, token: str) -> SessionTree:
    async with http.delete(f"{admin_url}/admin/sessions/{token}", headers=ADMIN) as r:
        assert r.status == 200, await r.text()
        return loads(await r.text())


def alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's exit is reaped by whoever adopted it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            if f"\nPPid:\t{pid}\n" in status and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


async def gone(pids: list[int], timeout: float = 20) -> list[int]:
    """The pids still alive after up to ``timeout`` seconds."""
    for _ in range(int(timeout * 10)):
        if not any(alive(pid) for pid in pids):
            return []
        await asyncio.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


IDS = [f"episode-{i}" for i in range(8)]


def test_sessions_are_pinned_by_a_stable_hash_of_their_id() -> None:
    # BLAKE2b, not Python's salted hash(): these hold in every process of every run.
    assert [worker_for(i, 2) for i in IDS] == [1, 0, 0, 0, 0, 0, 1, 0]
    assert [worker_for(i, 3) for i in IDS] == [1, 2, 2, 2, 2, 0, 0, 1]
    assert all(worker_for(i, 1) == 0 for i in IDS)


async def admin_answers(http: aiohttp.ClientSession, running: Fleet, token: str) -> None:
    """The front answers as one process's admin API does: 401 for any other credential, 404
    for unknown tokens, the worker's own answer otherwise."""
    admin_url = running.admin_url
    for method, path in (
        ("POST", "/admin/sessions"),
        ("GET", f"/admin/sessions/{token}/tree"),
        ("DELETE", f"/admin/sessions/{token}"),
    ):
        for bearer in ("", ADMIN_TOKEN + "x", token):
            headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
            async with http.request(method, admin_url + path, headers=headers) as r:
                assert r.status == 401
                assert (await r.json())["error"]["message"] == "admin token required"
    for method in ("GET", "DELETE"):
        path = "/admin/sessions/sess-guess" + ("/tree" if method == "GET" else "")
        async with http.request(method, admin_url + path, headers=ADMIN) as r:
            assert r.status == 404
            assert (await r.json())["error"]["message"] == "no open session with this token"
    # The query reaches the worker, and the worker's error comes back as it gave it.
    url = f"{admin_url}/admin/sessions/{token}/tree?routing=2"
    async with http.get(url, headers=ADMIN) as r:
        assert r.status == 400
        assert (await r.json())["error"]["message"] == "routing must be 0 or 1"
    # An open without an id is given one, and pinned by it.
    async with http.post(f"{admin_url}/admin/sessions", headers=ADMIN) as r:
        fresh = await r.json()
    assert running.index_of(fresh["base_url"]) == worker_for(fresh["session_id"], 2)
    # The agent-facing ports have no admin API.
    for worker in running.workers.values():
        async with http.post(f"{worker.url}/admin/sessions", json={}, headers=ADMIN) as r:
            assert r.status == 404


async def test_two_processes_behind_one_admin_api(
    tmp_path: Path, tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    tokens = token_file(tmp_path)
    placements: list[dict[str, int]] = []
    async with double(qwen_vocabulary) as engine, aiohttp.ClientSession() as http:
        for run in range(2):  # new processes each time: the same ids must land alike
            async with fleet(engine.url, tokenizer_cache, tokens) as running:
                admin_url = running.admin_url
                assert sorted(running.workers) == [0, 1]
                opened = {i: await open_session(http, admin_url, i) for i in IDS}
                placements.append({i: running.index_of(o["base_url"]) for i, o in opened.items()})
                assert {o["session_id"] for o in opened.values()} == set(IDS)
                turns = (one_turn(o["base_url"], o["token"]) for o in opened.values())
                await asyncio.gather(*turns)
                if run == 0:
                    await admin_answers(http, running, opened[IDS[0]]["token"])
                # Trees through the front: the turn each worker recorded, then closed for good.
                requests = {r.rid: r for r in engine.requests}
                for session_id, answer in opened.items():
                    session_url = f"{admin_url}/admin/sessions/{answer['token']}"
                    async with http.get(f"{session_url}/tree", headers=ADMIN) as r:
                        assert r.status == 200
                        assert loads(await r.text()).session_id == session_id
                    tree = await close_tree(http, admin_url, answer["token"])
                    (turn,) = tree.turns
                    assert tree.session_id == session_id
                    sent = requests[turn.meta.request_id].input_ids
                    assert list(tree.prompt_ids(turn)) == list(sent)
                    assert qwen_vocabulary.decode(list(tree.output_ids(turn))).startswith(REPLY)
                    async with http.delete(session_url, headers=ADMIN) as r:
                        assert r.status == 404
                running.process.terminate()
                assert await asyncio.wait_for(running.process.wait(), 60) == 0
    first, second = placements
    assert first == second
    assert first == {i: worker_for(i, 2) for i in IDS}
    assert set(first.values()) == {0, 1}


async def test_a_killed_worker_is_restarted_and_serve_stops_every_process(
    tmp_path: Path, tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    on_0 = next(i for i in IDS if worker_for(i, 2) == 0)
    on_1 = [i for i in IDS if worker_for(i, 2) == 1]
    async with (
        double(qwen_vocabulary) as engine,
        aiohttp.ClientSession() as http,
        fleet(engine.url, tokenizer_cache, token_file(tmp_path)) as running,
    ):
        admin_url = running.admin_url
        kept = await open_session(http, admin_url, on_0)
        doomed = await open_session(http, admin_url, on_1[0])
        await one_turn(kept["base_url"], kept["token"])
        await one_turn(doomed["base_url"], doomed["token"])
        victim = running.workers[1]
        os.kill(victim.pid, signal.SIGKILL)
        await running.wait_for(re.compile(rf"worker 1 \(pid {victim.pid}\) exited"))
        doomed_tree = f"{admin_url}/admin/sessions/{doomed['token']}/tree"
        async with http.get(doomed_tree, headers=ADMIN) as r:
            assert r.status == 410
            assert "exited" in (await r.json())["error"]["message"]
        async with http.delete(f"{admin_url}/admin/sessions/{doomed['token']}", headers=ADMIN) as r:
            assert r.status == 410
        # The other worker's session is untouched, and keeps going.
        await one_turn(kept["base_url"], kept["token"])
        # A new session for the restarted worker waits for it and works.
        fresh = await open_session(http, admin_url, on_1[1])
        # serve's log may reach this test after the front answered: wait for the new worker's line
        await running.wait_for(re.compile(rf"worker 1 \(pid (?!{victim.pid}\))\d+\) serving"))
        assert running.workers[1].pid != victim.pid
        assert fresh["base_url"] == running.workers[1].url
        await one_turn(fresh["base_url"], fresh["token"])
        assert len((await close_tree(http, admin_url, fresh["token"])).turns) == 1
        assert len((await close_tree(http, admin_url, kept["token"])).turns) == 2
        pids = children(running.process.pid)  # the workers, and multiprocessing's tracker
        assert {w.pid for w in running.workers.values()} <= set(pids)
        assert victim.pid not in pids
        running.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(running.process.wait(), 60) == 0
        assert await gone(pids, timeout=1) == []


async def test_workers_exit_when_serve_is_killed(
    tmp_path: Path, tokenizer_cache: Path, qwen_vocabulary: Vocabulary
) -> None:
    async with (
        double(qwen_vocabulary) as engine,
        fleet(engine.url, tokenizer_cache, token_file(tmp_path)) as running,
    ):
        pids = children(running.process.pid)
        assert {w.pid for w in running.workers.values()} <= set(pids)
        running.process.kill()  # no chance to stop anything: the kernel tells the workers
        await running.process.wait()
        assert await gone(pids) == []


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--processes", "2"], "--processes needs --admin-token-file"),
        (["--processes", "2", "--admin-token-file", "{token}"], "admin port 8401 is one of"),
        (["--processes", "0", "--admin-token-file", "{token}"], "processes must be >= 1"),
    ],
)
def test_processes_are_refused_with_flags_that_cannot_serve(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    token = token_file(tmp_path)
    command = [sys.executable, "-m", "protocol_adapters", "serve", "--engine-url", "http://x"]
    command += ["--qwen3-cache", str(tmp_path), *(f.format(token=token) for f in flags)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr
