"""A test and demo double of an SGLang server. It is NOT an inference engine.

It runs no model. It answers SGLang's native ``POST /generate`` (streaming and not),
``POST /abort_request``, ``GET /health``, ``GET /get_model_info`` and ``GET /server_info`` (and
its older name ``/get_server_info``) over real HTTP, in the wire format written down in
``docs/sglang-wire.md``, with replies taken from a script: each
:class:`ScriptedReply` is written out in Qwen3's output format and encoded with the real
tokenizer it is given, and every token gets the logprob the test chose. So the ids, counts and
finish reasons on the wire are exactly what an SGLang engine serving a Qwen3 model would send for
that reply, and a client can be tested against them byte for byte.

It records every request (ids, sampling parameters, rid, headers), every abort and every TCP
connection, and can inject faults: latency, per-chunk delay, hanging until aborted, HTTP errors
with SGLang's error body, malformed bodies and dropped connections.

MoE routing: a request with ``return_routed_experts`` gets ``meta_info.routed_experts`` on its
finishing answer or chunk, for positions ``[routed_experts_start_len, prompt + output - 1)``, as
base64 of little-endian int32 (or a JSON list, ``routing_as_list``). The experts are invented
but deterministic, :func:`expert_id` of the token at each position, so a test computes the rows
it expects without asking the double (:meth:`EngineDouble.expected_routing`).
:meth:`EngineDouble.update_weights` imitates slime pausing the engine for a weight update:
aborting everything running, or in place (running streams go on under the new version).

    async with EngineDouble(tokenizer, [ScriptedReply(text="hi")]) as engine:
        ...  # engine.url is http://127.0.0.1:<port>

It refuses what SGLang refuses: a prompt of ``context_length`` tokens or more, a prompt plus
``max_new_tokens`` of ``context_length`` or more, a sampling parameter SGLang does not have, more
than one of ``json_schema`` / ``regex`` / ``ebnf``, a ``json_schema`` that is not JSON.

Not simulated: stop strings and ``stop_token_ids`` (only ``max_new_tokens`` cuts a reply),
sampling itself (temperature etc. are recorded, not applied), the grammar of a ``json_schema``
(checked and recorded, not enforced: the scripted reply is what comes out), batch requests, text
prompts. With ``top_logprobs_num`` each position's alternatives are invented: the sampled token
with its logprob first, then byte tokens with lower logprobs.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import sys
import time
import uuid
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Literal, Self, TypeAlias

from aiohttp import web

from .scripted import Qwen3ReplyEncoder, ScriptedReply, Tokenizer

Script: TypeAlias = Sequence[ScriptedReply] | Callable[[Sequence[int]], ScriptedReply]
"""Replies in order of arrival, or a function of each request's input ids."""

Logprob: TypeAlias = float | Callable[[int, int], float]
"""One logprob for every token, or a function of (position in the output, token id)."""


class Malformation(StrEnum):
    """Ways to break a ``/generate`` answer that a client must catch."""

    NOT_JSON = "not_json"
    MISSING_LOGPROBS = "missing_logprobs"
    COUNT_MISMATCH = "count_mismatch"
    NULL_LOGPROB = "null_logprob"  # what SGLang's JSON encoder writes for NaN / inf
    BAD_TOKEN_ID = "bad_token_id"
    WRONG_RID = "wrong_rid"
    # These four corrupt the routing of the finishing answer or chunk.
    ROUTING_COUNT = "routing_count"  # one expert id too few
    ROUTING_NEGATIVE = "routing_negative"  # the first expert id is -1
    ROUTING_BAD_BASE64 = "routing_bad_base64"
    ROUTING_UNASKED = "routing_unasked"  # routing from position 0 though none was asked for


ROUTING_MALFORMATIONS = frozenset(
    (
        Malformation.ROUTING_COUNT,
        Malformation.ROUTING_NEGATIVE,
        Malformation.ROUTING_BAD_BASE64,
        Malformation.ROUTING_UNASKED,
    )
)


def expert_id(token_id: int, position: int, layer: int, slot: int, num_experts: int) -> int:
    """The expert the double routes ``token_id`` at ``position`` to, in ``layer``'s ``slot``-th
    choice: a fixed mix of all four, so a row shifted by a position or taken from another token
    differs from the expected one."""
    return (token_id * 7919 + position * 104729 + layer * 613 + slot * 37) % num_experts


@dataclass(frozen=True, slots=True)
class Faults:
    """Faults applied to every ``/generate`` while set (assign ``double.faults`` to change).

    - ``latency``: seconds before the answer (non-streaming) or the first chunk.
    - ``latency_jitter``: each request's latency is drawn uniformly from
      ``latency * (1 ± latency_jitter)``. A real engine's time varies with the output's length;
      one fixed latency keeps concurrent agents in lockstep, all their requests arriving at once.
    - ``chunk_delay``: seconds between streamed chunks.
    - ``hang``: produce nothing until ``/abort_request`` names the rid (then finish as aborted),
      or the client goes away.
    - ``http_status``: answer with this status and SGLang's ``{"error": {"message": …}}`` body.
    - ``malformed``: corrupt the answer (non-streaming) or the first chunk.
    - ``drop_after_chunks``: close the TCP connection after this many chunks (0: before any
      byte of the answer; also applies to non-streaming answers, which have no chunks).
    - ``linger_after_done``: seconds to keep a stream open after ``data: [DONE]``.
    """

    latency: float = 0.0
    latency_jitter: float = 0.0
    chunk_delay: float = 0.0
    hang: bool = False
    http_status: int | None = None
    error_message: str = "engine double: injected failure"
    malformed: Malformation | None = None
    drop_after_chunks: int | None = None
    linger_after_done: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.latency_jitter <= 1.0:
            raise ValueError(f"latency_jitter must be within [0, 1], not {self.latency_jitter}")


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """One ``/generate`` call as it arrived. Header names are lower-cased."""

    rid: str
    input_ids: tuple[int, ...]
    sampling_params: Mapping[str, object]
    stream: bool
    return_logprob: bool
    headers: Mapping[str, str]
    body: Mapping[str, object]
    top_logprobs: int = 0
    routed_experts_start_len: int | None = None
    """The position routing was asked from; ``None`` when ``return_routed_experts`` was not set."""


@dataclass(slots=True)
class _Generation:
    rid: str
    ids: list[int]
    logprobs: list[float]
    finish: dict[str, object]
    prompt_tokens: int
    return_logprob: bool
    skip_special_tokens: bool
    top_logprobs: int = 0
    input_ids: tuple[int, ...] = ()
    routing_start: int | None = None
    started: float = field(default_factory=time.monotonic)


SAMPLING_PARAMS = frozenset(
    (
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    )
)
"""The keys of SGLang's ``SamplingParams``: anything else in ``sampling_params`` fails there."""

_GRAMMARS = ("json_schema", "regex", "ebnf")


class _Refusal(Exception):
    """A request SGLang would refuse with a 400 (or, when streaming, an SSE error event)."""


class EngineDouble:
    """An in-process HTTP server on 127.0.0.1 speaking SGLang's ``/generate`` wire format."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        script: Script,
        *,
        logprob: Logprob = -0.125,
        faults: Faults | None = None,
        incremental_streaming: bool = False,
        tokens_per_chunk: int = 1,
        chunks_per_write: int = 1,
        context_length: int = 32768,
        weight_version: str | None = "default",
        model_path: str = "engine-double/qwen3",
        report_context_length: bool = True,
        routed_layers: int = 3,
        routed_topk: int = 2,
        num_experts: int = 64,
        routing_as_list: bool = False,
        capture_routing: bool = True,
    ) -> None:
        if tokens_per_chunk < 1 or chunks_per_write < 1:
            raise ValueError("tokens_per_chunk and chunks_per_write must be >= 1")
        if min(routed_layers, routed_topk, num_experts) < 1:
            raise ValueError("routed_layers, routed_topk and num_experts must be >= 1")
        self.encoder = Qwen3ReplyEncoder(tokenizer)
        self.tokenizer = tokenizer
        self.script = script
        self.logprob = logprob
        self.faults = faults or Faults()
        self.incremental_streaming = incremental_streaming
        self.tokens_per_chunk = tokens_per_chunk
        self.chunks_per_write = chunks_per_write
        """Stream events written to the socket at once: more than one is an engine that ran ahead
        of a busy reader, whose reads then hold many events."""
        self.context_length = context_length
        self.report_context_length = report_context_length
        """Whether ``/server_info`` names ``context_length`` (SGLang reports ``null`` there
        unless ``--context-length`` was given; ``max_req_input_len`` then carries it)."""
        self.weight_version = weight_version
        self.model_path = model_path
        self.routed_layers = routed_layers
        self.routed_topk = routed_topk
        self.num_experts = num_experts
        self.routing_as_list = routing_as_list
        self.capture_routing = capture_routing
        """Whether routing is returned when asked for: SGLang started without
        ``--enable-return-routed-experts`` leaves it out."""
        self.sent_tokens: dict[str, int] = {}
        """Tokens streamed so far, by rid."""
        self.weight_updates: list[tuple[str, str]] = []
        """``(version, mode)`` of every :meth:`update_weights`."""
        self._running: dict[str, asyncio.Event] = {}
        self._abort_messages: dict[str, str] = {}
        self._progress = asyncio.Condition()
        self.requests: list[ReceivedRequest] = []
        self.aborts: list[str] = []
        self.disconnects: list[str] = []
        self.peers: set[tuple[str, int]] = set()
        self._served = 0
        self._abort_events: dict[str, asyncio.Event] = {}
        self._runner: web.AppRunner | None = None
        self._url: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("EngineDouble is not running (use `async with`)")
        return self._url

    @property
    def connection_count(self) -> int:
        """Distinct client TCP connections seen so far (by peer address)."""
        return len(self.peers)

    async def start(self) -> str:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/generate", self._generate)
        app.router.add_put("/generate", self._generate)
        app.router.add_post("/abort_request", self._abort)
        app.router.add_get("/health", self._health)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        # handler_cancellation: a client that goes away cancels its handler, as in SGLang.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self._url = f"http://{host}:{port}"
        return self._url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            self._url = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def reply_ids(self, reply: ScriptedReply) -> list[int]:
        """The ids the double generates for ``reply`` (before any ``max_new_tokens`` cut)."""
        return self.encoder.encode(reply)

    def logprob_at(self, position: int, token_id: int) -> float:
        if callable(self.logprob):
            return float(self.logprob(position, token_id))
        return float(self.logprob)

    def routed_row(self, token_id: int, position: int) -> list[int]:
        """The ``layers x topk`` experts of one position, layer by layer."""
        return [
            expert_id(token_id, position, layer, slot, self.num_experts)
            for layer in range(self.routed_layers)
            for slot in range(self.routed_topk)
        ]

    def expected_routing(self, sequence: Sequence[int], start: int) -> array[int]:
        """The routing of a call whose prompt and output together are ``sequence``, from
        ``start``: one row per position up to the last token, which no forward pass reads."""
        rows: array[int] = array("i")
        for position in range(start, len(sequence) - 1):
            rows.extend(self.routed_row(sequence[position], position))
        return rows

    # -- weight updates ------------------------------------------------------------------------

    async def update_weights(self, version: str, mode: Literal["abort", "in_place"]) -> None:
        """Load weights ``version``, as slime does between rollout steps.

        ``abort``: every running generation ends at once with finish reason ``abort`` (under
        the old version, as SGLang's pause does before the update); returns once they have.
        ``in_place``: generations keep running; every chunk from now on names ``version``.
        """
        if mode not in ("abort", "in_place"):
            raise ValueError(f"mode must be 'abort' or 'in_place', not {mode!r}")
        self.weight_updates.append((version, mode))
        if mode == "abort":
            running = dict(self._running)
            for rid in running:
                self._abort_messages[rid] = "Aborted by AbortReq."
                self._abort_event(rid).set()
            async with asyncio.timeout(10):
                await asyncio.gather(*(done.wait() for done in running.values()))
        self.weight_version = version

    async def wait_for_tokens(self, tokens: int) -> str:
        """Wait until a running stream has sent at least ``tokens`` tokens; return its rid."""

        def far() -> list[str]:
            return [r for r, n in self.sent_tokens.items() if n >= tokens and r in self._running]

        async with self._progress:
            await self._progress.wait_for(far)
        return far()[0]

    # -- handlers ------------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.StreamResponse:
        self._saw(request)
        return web.Response(status=200)

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        self._saw(request)
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": self.model_path,
                "is_generation": True,
                "weight_version": self.weight_version,
            }
        )

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        """Server arguments and scheduler limits, as SGLang reports them (a small subset).

        The KV pool (``max_total_num_tokens``) is larger than the context here, so the context
        length is what bounds a request.
        """
        self._saw(request)
        pool = self.context_length * 4
        return web.json_response(
            {
                "model_path": self.model_path,
                "context_length": self.context_length if self.report_context_length else None,
                "max_total_num_tokens": pool,
                "max_req_input_len": min(self.context_length, pool) - 1,
                "incremental_streaming_output": self.incremental_streaming,
                "weight_version": self.weight_version,
                "version": "engine-double",
            }
        )

    async def _abort(self, request: web.Request) -> web.StreamResponse:
        self._saw(request)
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "abort_request body is not JSON")
        rid = body.get("rid") if isinstance(body, dict) else None
        if not isinstance(rid, str):
            return _error(400, "abort_request needs a string rid")
        self.aborts.append(rid)
        self._abort_event(rid).set()
        return web.Response(status=200)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self._saw(request)
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        stream = bool(body.get("stream", False))
        try:
            received = self._receive(body, request)
        except _Refusal as refusal:
            return _error(400, str(refusal))
        self.requests.append(received)
        faults = self.faults
        if faults.drop_after_chunks == 0 or (faults.drop_after_chunks and not stream):
            _drop(request)
            return web.Response(status=200)
        if faults.http_status is not None:
            return _error(faults.http_status, faults.error_message)
        try:
            generation = self._generation(received)
        except _Refusal as refusal:
            if stream:  # SGLang reports these inside an SSE stream that already said 200
                return await self._stream_error(request, str(refusal))
            return _error(400, str(refusal))
        if faults.malformed is Malformation.ROUTING_UNASKED and generation.routing_start is None:
            generation.routing_start = 0
        done = self._running[received.rid] = asyncio.Event()
        try:
            if stream:
                return await self._stream(request, generation, faults)
            return await self._answer(generation, faults)
        except asyncio.CancelledError:
            self.disconnects.append(received.rid)
            raise
        finally:
            self._abort_events.pop(received.rid, None)
            self._running.pop(received.rid, None)
            done.set()

    # -- generation ----------------------------------------------------------------------------

    def _receive(self, body: Mapping[str, object], request: web.Request) -> ReceivedRequest:
        if "text" in body and body.get("input_ids") is None:
            raise _Refusal("this engine double accepts input_ids only, not text")
        input_ids = body.get("input_ids")
        if (
            not isinstance(input_ids, list)
            or not input_ids
            or set(map(type, input_ids)) != {int}  # bool is not a token id; at C speed
        ):
            raise _Refusal("input_ids must be a non-empty list of token ids")
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise _Refusal("sampling_params must be an object")
        unknown = sorted(set(sampling) - SAMPLING_PARAMS)
        if unknown:
            raise _Refusal(f"SamplingParams got unexpected keyword arguments: {unknown}")
        grammars = [name for name in _GRAMMARS if sampling.get(name) is not None]
        if len(grammars) > 1:
            raise _Refusal(f"only one of json_schema, regex, ebnf may be set, got {grammars}")
        schema = sampling.get("json_schema")
        if schema is not None and not _json_text(schema):
            raise _Refusal(f"json_schema must be a JSON schema as a string, got {schema!r}")
        top = body.get("top_logprobs_num", 0)
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise _Refusal(f"top_logprobs_num must be a non-negative int, got {top!r}")
        rid = body.get("rid")
        if rid is None:
            rid = uuid.uuid4().hex
        if not isinstance(rid, str):
            raise _Refusal("rid must be a string")
        routed = body.get("return_routed_experts", False)
        if not isinstance(routed, bool):
            raise _Refusal(f"return_routed_experts must be a bool, got {routed!r}")
        start = body.get("routed_experts_start_len", 0)
        if isinstance(start, bool) or not isinstance(start, int):
            raise _Refusal(f"routed_experts_start_len must be an int, got {start!r}")
        if routed and not 0 <= start <= len(input_ids):
            raise _Refusal(
                f"routed_experts_start_len {start} is outside [0, {len(input_ids)}] prompt tokens"
            )
        return ReceivedRequest(
            rid=rid,
            input_ids=tuple(input_ids),
            sampling_params=dict(sampling),
            stream=bool(body.get("stream", False)),
            return_logprob=bool(body.get("return_logprob", False)),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=dict(body),
            top_logprobs=top,
            routed_experts_start_len=start if routed else None,
        )

    def _generation(self, received: ReceivedRequest) -> _Generation:
        prompt = len(received.input_ids)
        if prompt >= self.context_length:
            raise _Refusal(
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )
        max_new = received.sampling_params.get("max_new_tokens")
        if max_new is None:
            max_new = self.context_length - 1 - prompt
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
            raise _Refusal(f"max_new_tokens must be a non-negative int, got {max_new!r}")
        if prompt + max_new >= self.context_length:  # SGLang's own comparison: >=, not >
            raise _Refusal(
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens. You requested a total of {prompt + max_new} "
                f"tokens: {prompt} tokens from the input messages and {max_new} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )
        reply = self._next_reply(received.input_ids)
        ids = self.encoder.encode(reply)
        finish: dict[str, object]
        if len(ids) > max_new:
            ids = ids[:max_new]
            finish = {"type": "length", "length": max_new}
        elif reply.finish == "stop":
            finish = {"type": "stop", "matched": self.encoder.end_of_turn_id}
        elif reply.finish == "length":
            finish = {"type": "length", "length": len(ids)}
        else:
            finish = _aborted("aborted by the script")
        skip = received.sampling_params.get("skip_special_tokens", True)
        return _Generation(
            rid=received.rid,
            ids=ids,
            logprobs=[self.logprob_at(i, t) for i, t in enumerate(ids)],
            finish=finish,
            prompt_tokens=prompt,
            return_logprob=received.return_logprob,
            skip_special_tokens=bool(skip),
            top_logprobs=received.top_logprobs,
            input_ids=received.input_ids,
            routing_start=received.routed_experts_start_len,
        )

    def _next_reply(self, input_ids: Sequence[int]) -> ScriptedReply:
        if callable(self.script):
            reply = self.script(input_ids)
        else:
            if self._served >= len(self.script):
                raise _Refusal(f"engine double: script exhausted after {len(self.script)} replies")
            reply = self.script[self._served]
        self._served += 1
        return reply

    async def _answer(self, gen: _Generation, faults: Faults) -> web.StreamResponse:
        if await self._stalled(gen.rid, _first_delay(faults)):
            gen.ids, gen.logprobs, gen.finish = [], [], self._aborted(gen.rid)
        body: dict[str, object] = {
            "text": self._text(gen, gen.ids),
            "output_ids": gen.ids,
            "meta_info": self._meta(gen, len(gen.ids), gen.finish),
        }
        return _json_or_malformed(body, faults.malformed)

    async def _stream(
        self, request: web.Request, gen: _Generation, faults: Faults
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        aborted = await self._stalled(gen.rid, _first_delay(faults))
        sent = 0
        chunks = 0
        unwritten = bytearray()
        while True:
            if chunks and not aborted:
                aborted = await self._stalled(gen.rid, faults.chunk_delay)
            end = sent if aborted else min(sent + self.tokens_per_chunk, len(gen.ids))
            last = aborted or end == len(gen.ids)
            finish = (self._aborted(gen.rid) if aborted else gen.finish) if last else None
            first = sent if self.incremental_streaming else 0
            chunk: dict[str, object] = {
                "text": self._text(gen, gen.ids[first:end]),
                "output_ids": gen.ids[first:end],
                "meta_info": self._meta(gen, end, finish, first),
            }
            how = faults.malformed
            hits = last if how in ROUTING_MALFORMATIONS else chunks == 0
            data = _chunk_bytes(chunk, how if hits else None)
            unwritten += b"data: " + data + b"\n\n"
            sent = end
            chunks += 1
            dropping = faults.drop_after_chunks is not None and chunks >= faults.drop_after_chunks
            if last or dropping or chunks % self.chunks_per_write == 0:
                if last and not dropping and self.chunks_per_write > 1:
                    unwritten += b"data: [DONE]\n\n"  # in the same write as the last event
                await response.write(bytes(unwritten))
                unwritten.clear()
            async with self._progress:
                self.sent_tokens[gen.rid] = sent
                self._progress.notify_all()
            if dropping:
                _drop(request)
                return response
            if last:
                break
        if self.chunks_per_write == 1:
            await response.write(b"data: [DONE]\n\n")
        if faults.linger_after_done > 0:
            await asyncio.sleep(faults.linger_after_done)
        await response.write_eof()
        return response

    async def _stream_error(self, request: web.Request, message: str) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: " + json.dumps({"error": {"message": message}}).encode())
        await response.write(b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _stalled(self, rid: str, delay: float | None) -> bool:
        """Wait ``delay`` seconds (``None``: until aborted); True if ``rid`` was aborted first."""
        event = self._abort_event(rid)
        if event.is_set():
            return True
        if delay is not None and delay <= 0:
            return False
        try:
            await asyncio.wait_for(event.wait(), delay)
        except TimeoutError:
            return False
        return True

    def _meta(
        self, gen: _Generation, count: int, finish: Mapping[str, object] | None, first: int = 0
    ) -> dict[str, object]:
        meta: dict[str, object] = {
            "id": gen.rid,
            "finish_reason": dict(finish) if finish is not None else None,
            "prompt_tokens": gen.prompt_tokens,
            "weight_version": self.weight_version,
            "completion_tokens": count,
            "cached_tokens": 0,
        }
        if gen.return_logprob:
            meta["output_token_logprobs"] = [
                [gen.logprobs[i], gen.ids[i], None] for i in range(first, count)
            ]
            meta["output_token_logprobs_length"] = count
            if gen.top_logprobs:
                meta["output_top_logprobs"] = [
                    _invented_top(gen.ids[i], gen.logprobs[i], gen.top_logprobs)
                    for i in range(first, count)
                ]
        if finish is not None:
            meta["e2e_latency"] = time.monotonic() - gen.started
            routing = self._routing(gen, count, finish)
            if routing is not None:
                meta["routed_experts"] = routing
                meta["routed_experts_start_len"] = gen.routing_start
        return meta

    def _routing(
        self, gen: _Generation, count: int, finish: Mapping[str, object]
    ) -> str | list[int] | None:
        """The finishing object's routing: none unless asked for (and captured); none for a
        generation aborted before its first token."""
        if gen.routing_start is None or not self.capture_routing:
            return None
        if finish.get("type") == "abort" and count == 0:
            return None
        rows = self.expected_routing([*gen.input_ids, *gen.ids[:count]], gen.routing_start)
        if self.routing_as_list:
            return rows.tolist()
        if sys.byteorder == "big":
            rows.byteswap()
        return base64.b64encode(rows.tobytes()).decode("ascii")

    def _aborted(self, rid: str) -> dict[str, object]:
        return _aborted(self._abort_messages.pop(rid, "Aborted by AbortReq."))

    def _text(self, gen: _Generation, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=gen.skip_special_tokens)

    def _abort_event(self, rid: str) -> asyncio.Event:
        event = self._abort_events.get(rid)
        if event is None:
            event = self._abort_events[rid] = asyncio.Event()
        return event

    def _saw(self, request: web.Request) -> None:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer is not None:
            self.peers.add((str(peer[0]), int(peer[1])))


def _invented_top(token_id: int, logprob: float, k: int) -> list[list[object]]:
    """The sampled token, then ``k - 1`` byte tokens (ids below 256 exist in every byte-level
    vocabulary), each less likely than the one before."""
    top: list[list[object]] = [[logprob, token_id, None]]
    other = token_id
    while len(top) < k:
        other = (other + 1) % 256
        if other != token_id:
            top.append([logprob - len(top), other, None])
    return top


def _json_text(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


def _first_delay(faults: Faults) -> float | None:
    if faults.hang:
        return None
    if faults.latency_jitter:
        spread = faults.latency * faults.latency_jitter
        return random.uniform(faults.latency - spread, faults.latency + spread)
    return faults.latency


def _aborted(message: str) -> dict[str, object]:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


def _corrupt(body: dict[str, object], how: Malformation) -> None:
    meta = body["meta_info"]
    assert isinstance(meta, dict)
    logprobs = meta.get("output_token_logprobs")
    if how in ROUTING_MALFORMATIONS:
        _corrupt_routing(meta, how)
    elif how is Malformation.MISSING_LOGPROBS:
        meta.pop("output_token_logprobs", None)
    elif how is Malformation.COUNT_MISMATCH:
        meta["completion_tokens"] = int(str(meta["completion_tokens"])) + 1
    elif how is Malformation.WRONG_RID:
        meta["id"] = "someone-else"
    elif isinstance(logprobs, list) and logprobs:
        if how is Malformation.NULL_LOGPROB:
            logprobs[0][0] = None
        elif how is Malformation.BAD_TOKEN_ID:
            logprobs[0][1] = str(logprobs[0][1])


def _corrupt_routing(meta: dict[str, object], how: Malformation) -> None:
    routing = meta.get("routed_experts")
    if how is Malformation.ROUTING_UNASKED or routing is None:
        return  # routing the client did not ask for is the fault itself
    if isinstance(routing, list):
        if how is Malformation.ROUTING_COUNT:
            routing.pop()
        elif how is Malformation.ROUTING_NEGATIVE:
            routing[0] = -1
        else:
            meta["routed_experts"] = "!" + json.dumps(routing)
        return
    assert isinstance(routing, str)
    ids: array[int] = array("i")
    ids.frombytes(base64.b64decode(routing))
    if how is Malformation.ROUTING_BAD_BASE64:
        meta["routed_experts"] = "!" + routing[1:]
        return
    if how is Malformation.ROUTING_COUNT:
        ids.pop()
    else:
        ids[0] = -1
    meta["routed_experts"] = base64.b64encode(ids.tobytes()).decode("ascii")


def _chunk_bytes(body: dict[str, object], how: Malformation | None) -> bytes:
    if how is Malformation.NOT_JSON:
        return b'{"meta_info": {"id": '
    if how is not None:
        _corrupt(body, how)
    return json.dumps(body, allow_nan=True).encode()


def _json_or_malformed(body: dict[str, object], how: Malformation | None) -> web.Response:
    if how is Malformation.NOT_JSON:
        return web.Response(
            status=200, text="<html>502 Bad Gateway</html>", content_type="text/html"
        )
    if how is not None:
        _corrupt(body, how)
    return web.Response(status=200, body=json.dumps(body), content_type="application/json")
