"""The clients of the event-loop test (``test_server_event_loop.py``), run as a process of their
own as agents are on a node: ``python loop_agents.py URL ADMIN_URL ADMIN_TOKEN PLANS_JSON``.

Each plan is one session: its dialect (Anthropic, OpenAI Chat or Responses, through the official
SDKs), streamed or not, its turns and the size of its tool results; Anthropic sessions may run
several agents at once, each on a branch of its own. Every session is opened and closed over the
admin API, and its closed tree must hold every turn, each finished normally.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from dataclasses import asdict, dataclass
from typing import Any, Literal

import aiohttp
import anthropic
import openai
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

Dialect = Literal["anthropic", "openai_chat", "openai_responses"]
PATIENT = openai.Timeout(600.0, connect=120.0)
"""The SDKs connect within 5 s by default: on a machine whose cores are all busy, 50 sessions'
clients, starved themselves, can take longer than that to connect, which says nothing of the
server's loop (what the test measures); a stall that long still fails it."""
TURNS = 6
WORDS_PER_RESULT = 2500
KINDS: tuple[tuple[Dialect, bool], ...] = tuple(
    (dialect, stream)
    for dialect in ("anthropic", "openai_chat", "openai_responses")
    for stream in (True, False)
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
WORDS = (
    "def",
    "class",
    "return",
    "import",
    "self",
    "value",
    "error",
    "test",
    "assert",
    "file",
    "line",
    "path",
    "node",
    "tree",
    "token",
    "session",
    "branch",
    "sample",
    "reply",
    "render",
    "engine",
    "stream",
    "chunk",
    "logprob",
    "prompt",
    "context",
)


@dataclass(frozen=True, slots=True)
class Plan:
    """One session's shape: its dialect, streamed or not, turns and tool output size."""

    index: int
    turns: int = TURNS
    words: int = WORDS_PER_RESULT
    agents: int = 1
    """Anthropic only: agents of one session at once, each on a branch of its own."""

    @property
    def dialect(self) -> Dialect:
        return KINDS[self.index % len(KINDS)][0]

    @property
    def stream(self) -> bool:
        return KINDS[self.index % len(KINDS)][1]

    def tool_output(self, turn: int, agent: int = 0) -> str:
        """A different output every turn, so every render tokenizes new text."""
        rng = random.Random(f"{self.index} {agent} {turn}")
        return " ".join(rng.choice(WORDS) + str(rng.randrange(100)) for _ in range(self.words))


async def anthropic_turns(client: anthropic.AsyncAnthropic, plan: Plan) -> None:
    await asyncio.gather(*(anthropic_agent(client, plan, agent) for agent in range(plan.agents)))


async def anthropic_agent(client: anthropic.AsyncAnthropic, plan: Plan, agent: int) -> None:
    tools: Any = [{"name": "Bash", "description": "Run a command", "input_schema": SCHEMA}]
    system = f"You are agent {agent} of session {plan.index}."
    messages: list[Any] = [{"role": "user", "content": f"Fix issue {plan.index}."}]
    for turn in range(plan.turns):
        message: anthropic.types.Message
        if plan.stream:
            async with client.messages.stream(
                model="policy", max_tokens=256, system=system, messages=messages, tools=tools
            ) as events:
                message = await events.get_final_message()
        else:
            message = await client.messages.create(
                model="policy", max_tokens=256, system=system, messages=messages, tools=tools
            )
        call = next(block for block in message.content if block.type == "tool_use")
        messages.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        output = plan.tool_output(turn, agent)
        result = {"type": "tool_result", "tool_use_id": call.id, "content": output}
        messages.append({"role": "user", "content": [result]})


async def chat_turns(client: openai.AsyncOpenAI, plan: Plan) -> None:
    tools: Any = [{"type": "function", "function": {"name": "Bash", "parameters": SCHEMA}}]
    messages: list[Any] = [{"role": "user", "content": f"Fix issue {plan.index}."}]
    for turn in range(plan.turns):
        completion: ChatCompletion
        if plan.stream:
            async with client.chat.completions.stream(
                model="policy", messages=messages, tools=tools, max_tokens=256
            ) as events:
                completion = await events.get_final_completion()
        else:
            completion = await client.chat.completions.create(
                model="policy", messages=messages, tools=tools, max_tokens=256
            )
        message = completion.choices[0].message
        assert message.tool_calls
        call = message.tool_calls[0]
        messages.append(message.model_dump(exclude_none=True))
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": plan.tool_output(turn)}
        )


async def responses_turns(client: openai.AsyncOpenAI, plan: Plan) -> None:
    tools: Any = [{"type": "function", "name": "Bash", "parameters": SCHEMA, "strict": False}]
    items: list[Any] = [{"role": "user", "content": f"Fix issue {plan.index}."}]
    for turn in range(plan.turns):
        response: Response
        if plan.stream:
            async with client.responses.stream(
                model="policy", input=items, tools=tools, max_output_tokens=256
            ) as events:
                response = await events.get_final_response()
        else:
            response = await client.responses.create(
                model="policy", input=items, tools=tools, max_output_tokens=256
            )
        items.extend(item.model_dump(exclude_none=True) for item in response.output)
        call = next(item for item in response.output if item.type == "function_call")
        items.append(
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": plan.tool_output(turn),
            }
        )


class Admin:
    """The admin API, as a rollout driver in another process uses it."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str) -> None:
        self.http = http
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"}

    async def open(self, session_id: str) -> str:
        async with self.http.post(
            self.url + "/admin/sessions", json={"session_id": session_id}, headers=self.headers
        ) as response:
            assert response.status == 200, await response.text()
            token: str = (await response.json())["token"]
            return token

    async def close(self, token: str) -> dict[str, Any]:
        async with self.http.delete(
            f"{self.url}/admin/sessions/{token}", headers=self.headers
        ) as response:
            assert response.status == 200, await response.text()
            tree: dict[str, Any] = json.loads(await response.read())
            return tree


async def episode(url: str, admin: Admin, plan: Plan) -> None:
    """One session's turns, closed and its tree checked."""
    token = await admin.open(f"episode-{plan.index}")
    if plan.dialect == "anthropic":
        async with anthropic.AsyncAnthropic(
            base_url=url, api_key=token, max_retries=0, timeout=PATIENT
        ) as claude:
            await anthropic_turns(claude, plan)
    else:
        async with openai.AsyncOpenAI(
            base_url=url + "/v1", api_key=token, max_retries=0, timeout=PATIENT
        ) as client:
            turns = chat_turns if plan.dialect == "openai_chat" else responses_turns
            await turns(client, plan)
    tree = await admin.close(token)
    recorded = [node["turn"] for node in tree["nodes"] if "turn" in node]
    assert [turn["finish_reason"] for turn in recorded] == ["stop"] * plan.turns * plan.agents


def plans_json(plans: list[Plan]) -> str:
    return json.dumps([asdict(plan) for plan in plans])


async def run_all(url: str, admin_url: str, token: str, plans: list[Plan]) -> None:
    async with aiohttp.ClientSession() as http:
        admin = Admin(http, admin_url, token)
        await asyncio.gather(*(episode(url, admin, plan) for plan in plans))


if __name__ == "__main__":
    url, admin_url, token, plans = sys.argv[1:5]
    asyncio.run(run_all(url, admin_url, token, [Plan(**plan) for plan in json.loads(plans)]))
