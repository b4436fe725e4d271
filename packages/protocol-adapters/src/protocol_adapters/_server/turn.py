"""One model call, from a neutral request to a recorded turn.

The order matters for faithfulness: route in the tree, render only what the tree does not already
hold (off the event loop), refuse prompts over the context limit with the error that makes
clients compact, generate from ids, parse the output for the client, and record exactly the ids
sent and received, with the weight version of every output token and, when capturing, the MoE
routing of every position the call asked for (only positions its branch has none for yet). A
generation cut short by a client disconnect is still recorded (as aborted, never trained) so
nothing the engine produced disappears without a trace.

A generation the engine itself aborted (SGLang aborts every running request before a weight
update) is recorded the same way, and the client gets a retryable error in its dialect instead of
a cut-off answer it would carry on from: its retry is generated whole, against the new weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, replace

from protocol_adapters._bridge import PromptTooLong
from protocol_adapters._dialects import DIALECTS
from protocol_adapters._engine.protocol import Engine
from protocol_adapters._engine.types import (
    GenerateRequest,
    RoutingAsk,
    SamplingParams,
    TopLogprobs,
    new_rid,
)
from protocol_adapters._engine.versions import VersionRuns
from protocol_adapters._parsing.decode import IncrementalDecoder
from protocol_adapters._parsing.stream import events_of
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._types import (
    AdapterError,
    ClientSampling,
    ErrorKind,
    NeutralRequest,
    ParsedReply,
    ReplyEvent,
    StopReason,
    TokenLogprob,
    Usage,
    stop_reason,
)
from trajectory_tree import (
    Completion,
    FinishReason,
    Route,
    RoutedExperts,
    Turn,
    TurnMeta,
)

from .config import AdapterConfig, RolloutSampling
from .logprobs import token_logprobs
from .ports import ParserFactory, PromptRenderer, RenderedPrompt
from .sessions import Session
from .shortened import HISTORY_DROPPED, Refused, dropped_history
from .side_requests import side_request
from .workers import Workers

log = logging.getLogger(__name__)

AGENT_ID_HEADER = "x-claude-code-agent-id"
"""Claude Code marks a sub-agent's requests with this header; the main agent's carry none."""
RETRY_HEADER = "x-stainless-retry-count"
"""How many times the client's SDK has retried this request (0 on the first try)."""
KEPT_HEADERS = ("x-codex-turn-metadata", "x-claude-code-session-id", "session_id")
"""Headers kept verbatim in each turn's ``meta.extra``."""
READ_HEADERS = (*KEPT_HEADERS, AGENT_ID_HEADER, RETRY_HEADER)
"""Every request header that reaches the tree; the server checks they are valid UTF-8."""
SIDE_REQUEST = "side_request"
"""``meta.extra`` key naming the side-request rule a call matched (see ``side_requests.py``)."""

_ENGINE_INPUT_TOO_LONG = re.compile(
    r"The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"
)


CHUNKS_PER_STEP = 8
"""Engine chunks a streamed turn handles at most before it lets other tasks run."""


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    reply: ParsedReply
    usage: Usage
    stop: StopReason
    turn: Turn | None
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Every generated token's logprob, when the client asked for them."""


@dataclass(frozen=True, slots=True)
class Started:
    """The first event of a streamed turn: the real prompt size, for ``message_start`` usage."""

    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Finished:
    outcome: TurnOutcome


@dataclass(frozen=True, slots=True)
class Generated:
    """The logprobs of tokens just generated (only when the client asked for them), yielded
    before the reply events those tokens make."""

    tokens: tuple[TokenLogprob, ...]


StreamItem = Started | ReplyEvent | Generated | Finished


def choose_sampling(
    client: ClientSampling,
    rollout: RolloutSampling,
    *,
    client_wins: bool,
    room: int,
    stop_token_ids: tuple[int, ...],
) -> tuple[SamplingParams, dict[str, str]]:
    """Merge the client's and the rollout's settings; return what was used, for the record."""

    def pick(client_value: float | None, rollout_value: float) -> float:
        return client_value if client_wins and client_value is not None else rollout_value

    caps = [room]
    if client.max_tokens is not None:
        caps.append(client.max_tokens)
    if rollout.max_new_tokens is not None:
        caps.append(rollout.max_new_tokens)
    top_k = client.top_k if client_wins and client.top_k is not None else rollout.top_k
    params = SamplingParams(
        max_new_tokens=max(1, min(caps)),
        temperature=pick(client.temperature, rollout.temperature),
        top_p=pick(client.top_p, rollout.top_p),
        top_k=top_k,
        min_p=rollout.min_p,
        stop=tuple(dict.fromkeys((*client.stop, *rollout.stop))),
        stop_token_ids=stop_token_ids,
        json_schema=client.json_schema,
    )
    record = {
        "temperature": repr(params.temperature),
        "top_p": repr(params.top_p),
        "top_k": str(params.top_k),
        "max_new_tokens": str(params.max_new_tokens),
        "sampling_source": "client" if client_wins else "rollout",
    }
    if params.min_p:
        record["min_p"] = repr(params.min_p)
    if rollout.stop:
        record["rollout_stop"] = json.dumps(list(rollout.stop))
    if client.max_tokens is not None:
        record["client_max_tokens"] = str(client.max_tokens)
    if client.json_schema is not None:
        record["json_schema"] = client.json_schema
    if client.temperature is not None:
        record["client_temperature"] = repr(client.temperature)
    if client.top_p is not None:
        record["client_top_p"] = repr(client.top_p)
    return params, record


class TurnRunner:
    """Runs model calls for the sessions of one server."""

    def __init__(
        self,
        config: AdapterConfig,
        engine: Engine,
        renderer: PromptRenderer,
        vocabulary: Vocabulary,
        parsers: ParserFactory,
        workers: Workers,
    ) -> None:
        self._config = config
        self._engine = engine
        self._renderer = renderer
        self._vocabulary = vocabulary
        self._parsers = parsers
        self._workers = workers
        self._stop_ids = tuple(sorted(vocabulary.stop_ids))

    async def count_tokens(self, session: Session, request: NeutralRequest) -> int:
        """The prompt's tokens; the session's "prompt is too long" error past its limit (the
        count stops there, so a huge body costs no more than the limit)."""
        maximum = session.max_prompt_tokens
        try:
            return await self._workers.run(
                request.body_bytes, self._renderer.count_tokens, request.prompt, maximum
            )
        except PromptTooLong as exc:
            raise prompt_too_long(exc.tokens, maximum) from None

    async def run(
        self, session: Session, request: NeutralRequest, headers: Mapping[str, str]
    ) -> TurnOutcome:
        """A whole turn, for non-streaming responses."""
        session.admit()
        answered = False
        try:
            outcome = await self._run(session, request, headers)
            answered = outcome.turn is not None
            return outcome
        finally:
            session.settle(answered=answered)

    async def stream(
        self, session: Session, request: NeutralRequest, headers: Mapping[str, str]
    ) -> AsyncGenerator[StreamItem, None]:
        """A turn as it is generated: ``Started``, reply events as they become certain, then
        ``Finished``. Errors before ``Started`` are raised for a plain error response."""
        session.admit()
        answered = False
        try:
            async with contextlib.aclosing(self._stream(session, request, headers)) as items:
                async for item in items:
                    if isinstance(item, Finished):
                        answered = item.outcome.turn is not None
                    yield item
        finally:
            session.settle(answered=answered)

    async def _prepare(
        self, session: Session, request: NeutralRequest, headers: Mapping[str, str]
    ) -> tuple[Route, RenderedPrompt, GenerateRequest, dict[str, str]]:
        route = session.tree.route(request.prompt)
        agent = headers.get(AGENT_ID_HEADER)
        try:
            rendered, engine_request, record = await self._workers.run(
                request.body_bytes, self._build, session, request, route
            )
        except AdapterError as exc:
            if exc.kind is ErrorKind.CONTEXT_LENGTH:
                session.refused[agent] = Refused.of(request.prompt)
            raise
        dropped = dropped_history(session.refused.pop(agent, None), request.prompt)
        if dropped is not None:
            record[HISTORY_DROPPED] = dropped
        return route, rendered, engine_request, record

    def _build(
        self, session: Session, request: NeutralRequest, route: Route
    ) -> tuple[RenderedPrompt, GenerateRequest, dict[str, str]]:
        """Render and build the engine request: O(context) work, so it runs off the loop."""
        maximum = session.max_prompt_tokens
        try:
            rendered = self._renderer.render(route, maximum)
        except PromptTooLong as exc:
            raise prompt_too_long(exc.tokens, maximum) from None
        prompt_tokens = len(rendered.ids)
        if prompt_tokens > maximum:  # a renderer that does not stop at the limit
            raise prompt_too_long(prompt_tokens, maximum)
        params, record = choose_sampling(
            request.sampling,
            self._config.sampling,
            client_wins=self._config.client_sampling_wins,
            room=session.room(prompt_tokens),
            stop_token_ids=self._stop_ids,
        )
        client = request.sampling
        capture = self._config.routing
        engine_request = GenerateRequest(
            input_ids=rendered.ids,
            sampling=params,
            routing_key=session.tree.session_id,  # never the token: it is a credential
            rid=new_rid(),
            top_logprobs=client.top_logprobs if client.logprobs else 0,
            routed_experts=None
            if capture is None
            else RoutingAsk(
                # Past the rows the branch holds; 0 on a full prompt's new lineage.
                route.tree.routing_start(route, rendered.prompt),
                capture.layers,
                capture.topk,
            ),
        )
        side = side_request(self._config.side_requests, request)
        if side is not None:
            record[SIDE_REQUEST] = side
        record.update(rendered.notes)
        return rendered, engine_request, record

    def _record(
        self,
        session: Session,
        request: NeutralRequest,
        route: Route,
        rendered: RenderedPrompt,
        completion: Completion,
        reply: ParsedReply,
        meta: TurnMeta,
    ) -> Turn:
        message = DIALECTS[request.dialect].echoed(reply.message)
        return session.tree.record(route, rendered.prompt, completion, message, meta)

    def _logprobs(
        self,
        request: NeutralRequest,
        ids: Sequence[int],
        logprobs: Sequence[float],
        top: Sequence[TopLogprobs],
    ) -> tuple[TokenLogprob, ...] | None:
        if not request.sampling.logprobs:
            return None
        return token_logprobs(self._vocabulary, ids, logprobs, top)

    def _replayed(self, route: Route, turn: Turn, request: NeutralRequest) -> TurnOutcome:
        """The recorded answer again. Its logprobs are the engine's; the alternatives were not
        recorded, so a replay lists none."""
        reply = ParsedReply(turn.reply, turn.meta.malformed_tool_calls)
        usage = Usage(turn.prompt_length, turn.output_length)
        ids = route.tree.output_ids(turn)
        logprobs = self._logprobs(request, ids, turn.output_logprobs, ())
        return TurnOutcome(
            reply, usage, stop_reason(turn.finish_reason, turn.reply), None, logprobs
        )

    def _replay(self, route: Route, headers: Mapping[str, str]) -> Turn | None:
        """The recorded answer to send again, when this request is its agent's retry.

        Only the same agent asking again is a retry: two sub-agents may send identical requests,
        and each must get (and train on) its own generation.
        """
        if not self._config.replay_retries:
            return None
        agent_id = headers.get(AGENT_ID_HEADER)
        done = [
            t
            for t in route.recorded
            if t.finish_reason is not FinishReason.ABORT and t.meta.agent_id == agent_id
        ]
        return done[-1] if done else None

    async def _run(
        self, session: Session, request: NeutralRequest, headers: Mapping[str, str]
    ) -> TurnOutcome:
        started = time.time()
        route, rendered, engine_request, record = await self._prepare(session, request, headers)
        replay = self._replay(route, headers)
        if replay is not None:
            return self._replayed(route, replay, request)
        session.in_flight.add(engine_request.rid)
        try:
            result = await self._engine.generate(engine_request)
        except AdapterError as exc:
            raise _as_client_error(exc) from exc
        finally:
            session.in_flight.discard(engine_request.rid)
        parser = self._parsers(request.prompt.tools)
        try:
            reply = await self._workers.run(
                0, parser.parse_ids, result.output_ids, self._vocabulary
            )
        except asyncio.CancelledError:
            # The engine answered but the client is gone: keep the output as an aborted turn.
            if result.output_ids:
                reply = parser.parse_ids(result.output_ids, self._vocabulary)
                meta = _meta(request, headers, engine_request.rid, started, record, reply)
                aborted = replace(result.to_completion(), finish_reason=FinishReason.ABORT)
                self._record(session, request, route, rendered, aborted, reply, meta)
            raise
        meta = _meta(request, headers, engine_request.rid, started, record, reply)
        if result.finish_reason is FinishReason.ABORT:
            if result.output_ids:
                self._record(session, request, route, rendered, result.to_completion(), reply, meta)
            raise _engine_aborted(session, result.abort_message)
        turn = self._record(session, request, route, rendered, result.to_completion(), reply, meta)
        usage = Usage(len(engine_request.input_ids), len(result.output_ids))
        stop = stop_reason(result.finish_reason, reply.message)
        logprobs = self._logprobs(
            request, result.output_ids, result.output_logprobs, result.top_logprobs
        )
        return TurnOutcome(reply, usage, stop, turn, logprobs)

    async def _stream(
        self, session: Session, request: NeutralRequest, headers: Mapping[str, str]
    ) -> AsyncGenerator[StreamItem, None]:
        started = time.time()
        route, rendered, engine_request, record = await self._prepare(session, request, headers)
        replay = self._replay(route, headers)
        if replay is not None:
            outcome = self._replayed(route, replay, request)
            yield Started(outcome.usage.prompt_tokens)
            if outcome.logprobs is not None:
                yield Generated(outcome.logprobs)
            for event in events_of(outcome.reply.message):
                yield event
            yield Finished(replace(outcome, logprobs=None))
            return
        parser = self._parsers(request.prompt.tools)
        decoder = IncrementalDecoder(self._vocabulary)
        reply_stream = parser.stream()
        ids: list[int] = []
        logprobs: list[float] = []
        finish: FinishReason | None = None
        abort_message: str | None = None
        versions = VersionRuns()
        routed: RoutedExperts | None = None  # on the last chunk only

        def completion(reason: FinishReason) -> Completion:
            return Completion(
                ids, logprobs, reason, versions.version, versions.runs, routed_experts=routed
            )

        def keep_aborted() -> None:
            # Client gone or engine failed or aborted before the client had the whole reply:
            # keep what the engine produced, as an aborted turn that is never trained.
            if ids:
                partial = completion(FinishReason.ABORT)
                reply = parser.parse_ids(ids, self._vocabulary)
                meta = _meta(request, headers, engine_request.rid, started, record, reply)
                self._record(session, request, route, rendered, partial, reply, meta)

        session.in_flight.add(engine_request.rid)
        chunks = self._engine.stream(engine_request)
        announced = False
        try:
            handled = 0
            async for chunk in chunks:
                handled += 1
                if handled % CHUNKS_PER_STEP == 0:
                    # Chunks the engine sent faster than the client reads arrive buffered, and
                    # reading them never suspends: give the loop back now and then, so one long
                    # reply cannot hold every other session's turns.
                    await asyncio.sleep(0)
                versions.add(len(chunk.output_ids), chunk.weight_version)
                ids.extend(chunk.output_ids)
                logprobs.extend(chunk.output_logprobs)
                routed = chunk.routed_experts
                finish = chunk.finish_reason
                if finish is FinishReason.ABORT:
                    abort_message = chunk.abort_message
                    break
                if not announced:
                    # Only once the engine answers: an engine that is down, overloaded, refuses
                    # the prompt or aborts it at once gets a real HTTP status, which clients
                    # retry or compact on.
                    announced = True
                    yield Started(len(engine_request.input_ids))
                tokens = self._logprobs(
                    request, chunk.output_ids, chunk.output_logprobs, chunk.top_logprobs
                )
                if tokens:
                    yield Generated(tokens)
                for event in reply_stream.feed(decoder.feed(chunk.output_ids)):
                    yield event
        except AdapterError as exc:
            keep_aborted()
            raise _as_client_error(exc) from exc
        except BaseException:
            keep_aborted()
            raise
        finally:
            session.in_flight.discard(engine_request.rid)
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        if finish is not FinishReason.STOP and finish is not FinishReason.LENGTH:
            keep_aborted()
            if finish is FinishReason.ABORT:
                raise _engine_aborted(session, abort_message)
            raise AdapterError(
                ErrorKind.ENGINE_ERROR,
                f"the engine's stream for {engine_request.rid} ended without a finish reason",
            )
        if not announced:
            yield Started(len(engine_request.input_ids))
        try:
            for event in reply_stream.feed(decoder.finish()) + reply_stream.finish():
                yield event
        except BaseException:  # the engine is done, but the client left before the last events
            keep_aborted()
            raise
        reply = reply_stream.reply()
        meta = _meta(request, headers, engine_request.rid, started, record, reply)
        turn = self._record(session, request, route, rendered, completion(finish), reply, meta)
        usage = Usage(len(engine_request.input_ids), len(ids))
        yield Finished(TurnOutcome(reply, usage, stop_reason(finish, reply.message), turn))


def prompt_too_long(tokens: int, maximum: int) -> AdapterError:
    """The error that makes Claude Code compact (Codex reads it as ``context_length_exceeded``).
    ``tokens`` must really exceed ``maximum``: a client that compacts on a false claim loses its
    history for nothing."""
    return AdapterError(
        ErrorKind.CONTEXT_LENGTH, f"prompt is too long: {tokens} tokens > {maximum} maximum"
    )


def _engine_aborted(session: Session, message: str | None) -> AdapterError:
    """An engine-side abort, as the error clients retry (Anthropic 529 ``overloaded_error``,
    OpenAI 503): the partial reply is recorded as aborted, never shown as a whole answer."""
    if session.closed:
        return AdapterError(ErrorKind.AUTHENTICATION, "session is closed")
    reason = message or "no reason given"
    return AdapterError(
        ErrorKind.OVERLOADED,
        f"the engine aborted this generation ({reason}); retry the request",
    )


def _as_client_error(exc: AdapterError) -> AdapterError:
    """The engine refusing a request's length means its context is smaller than the session's
    (the adapter checks prompts against the session's own limit first). Only a prompt the engine
    itself calls too long becomes "prompt is too long", with the engine's numbers: that message
    makes Claude Code compact, so it must be true. Anything else is the adapter's fault."""
    if exc.kind is not ErrorKind.CONTEXT_LENGTH:
        return exc
    log.warning("the engine refused a request the adapter's limit let through: %s", exc.message)
    found = _ENGINE_INPUT_TOO_LONG.search(exc.message)
    if found is not None:
        return prompt_too_long(int(found[1]), int(found[2]) - 2)
    return AdapterError(
        ErrorKind.ENGINE_ERROR,
        "the engine's context is smaller than this session's context_tokens "
        f"(start the adapter against this engine so it learns it): {exc.message}",
    )


def _meta(
    request: NeutralRequest,
    headers: Mapping[str, str],
    rid: str,
    started: float,
    record: dict[str, str],
    reply: ParsedReply,
) -> TurnMeta:
    extra = dict(record)
    extra["dialect"] = request.dialect
    extra["model"] = request.model
    for header in KEPT_HEADERS:
        if header in headers:
            extra[header] = headers[header]
    retry = headers.get(RETRY_HEADER, "0")
    return TurnMeta(
        request_id=rid,
        retry_count=int(retry) if retry.isascii() and retry.isdigit() else 0,
        started_at=started,
        finished_at=time.time(),
        agent_id=headers.get(AGENT_ID_HEADER),
        side_request=SIDE_REQUEST in record,
        malformed_tool_calls=reply.malformed_tool_calls,
        extra=extra,
    )
