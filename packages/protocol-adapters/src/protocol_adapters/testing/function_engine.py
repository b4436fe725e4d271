"""An in-process :class:`~protocol_adapters.Engine` that answers from a function, for tests.

Like httpx's ``MockTransport``: a function in, a response out. The function gets each
:class:`~protocol_adapters.GenerateRequest` and returns what the "model" generates: token ids,
or text that the given :class:`~protocol_adapters.Vocabulary` encodes (special-token text such
as ``<|im_end|>`` becomes its one id; :func:`qwen3_text` writes a :class:`ScriptedReply` out that
way)::

    engine = FunctionEngine(lambda request: "Hello!<|im_end|>", vocabulary=vocabulary)
    async with AdapterServer(AdapterConfig(), engine, renderer, vocabulary, reply_parsers()):
        ...
    assert list(engine.requests[0].input_ids) == expected_prompt_ids

What it is for: tests of the adapter's own logic (dialects, rendering, parsing, recording,
sessions) without HTTP between the server and the engine. No second server starts and no chunk
is encoded and parsed, so they run faster (a session of short turns in about 40% less time; the
server's own work still dominates long replies), and a failure points at the adapter, never at a
socket, a port or the wire format. The engine plays SGLang's part of the contract the server
relies on (``_engine/types.py``, read in ``_server/turn.py``):

- generation ends as SGLang ends it: with ``length`` once ``max_new_tokens`` tokens exist
  (checked first, as SGLang does, so a stop token at exactly that place still ends in
  ``length``), else with ``stop`` at the first of the request's ``stop_token_ids`` or stop
  strings (the stop token or string is kept in the output: the adapter sends ``no_stop_trim``;
  matching stop strings needs the vocabulary). Output that runs out before either ends with
  ``length``, as a generation cut short (the double's ``ScriptedReply(finish="length")``): end a
  reply with a stop token to have it stop;
- every token gets the logprob chosen here (one for all, or a function of position and id);
  with ``top_logprobs`` asked for, each position's alternatives are invented as the double
  invents them (the sampled token first, then byte tokens, each less likely);
- :meth:`stream` yields only the new tokens of each step, ``tokens_per_chunk`` at a time, the
  last chunk carrying the finish reason, as ``SGLangEngine.stream`` does; every chunk names the
  current :attr:`weight_version` (assign it between chunks to play an in-place weight update);
- :meth:`abort` stops a running generation: it finishes with ``abort`` ("Aborted by
  AbortReq.", SGLang's message) and no further tokens. A generation runs while its stream is
  being read or while an ``async`` function is awaited, so ``async def reply(request): await
  asyncio.Event().wait()`` hangs until aborted, like the double's ``Faults(hang=True)``;
- a prompt of ``context_length`` tokens or more, or a prompt plus ``max_new_tokens`` reaching
  it, is refused with SGLang's message, as the ``AdapterError`` ``SGLangEngine`` raises for it;
- MoE routing, when a request asks for it, is :func:`expert_id` of every position, as the
  double invents it, in the shape the request states.

A function that raises :class:`~protocol_adapters.AdapterError` plays an engine failure: the
server gets it as it would from ``SGLangEngine``. :attr:`requests` holds every request in order
of arrival (exact input ids, sampling, rid); :attr:`aborts` every rid the engine was told to
stop: by :meth:`abort`, or by a caller that cancelled its call or left a stream before the finish
(``SGLangEngine`` sends ``/abort_request`` for those).

What it is not: a test of the wire protocol. Nothing is encoded, sent or parsed here, so the
HTTP client, SGLang's JSON, streaming modes, connection faults and timeouts are not exercised:
that is the job of :class:`EngineDouble` behind the real ``SGLangEngine``
(``testing/stack.py``), which tests of the engine client and of failures on the wire keep
using. Sampling parameters other than ``max_new_tokens`` and the stops are recorded, not
applied (no temperature, no ``json_schema`` grammar); nothing stops at a model EOS of its own,
only at the request's stop ids (the server always sends the vocabulary's).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from array import array
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from protocol_adapters._engine.types import (
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    TopLogprobs,
)
from protocol_adapters._engine.wire import engine_reported_error, error_for_status
from protocol_adapters._tokenizer import Vocabulary
from trajectory_tree import FinishReason, RoutedExperts

from .engine_double import expert_id

Output: TypeAlias = Sequence[int] | str
"""What the model generates for one request: token ids, or text to encode with the vocabulary."""

Reply: TypeAlias = Callable[[GenerateRequest], Output | Awaitable[Output]]
"""The function behind the engine; an ``async`` one runs until it returns or is aborted."""

Logprob: TypeAlias = float | Callable[[int, int], float]
"""One logprob for every token, or a function of (position in the output, token id)."""

ABORT_MESSAGE = "Aborted by AbortReq."
"""What SGLang says of a generation stopped by ``/abort_request``."""


@dataclass(frozen=True, slots=True)
class _Generation:
    """One request's whole output once the stops are applied."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top: tuple[TopLogprobs, ...]
    finish: FinishReason
    matched: int | str | None


class FunctionEngine:
    """An :class:`~protocol_adapters.Engine` in this process, generating what ``reply`` returns.

    See the module docstring for what it plays of SGLang, and what it is not for.
    """

    def __init__(
        self,
        reply: Reply,
        *,
        vocabulary: Vocabulary | None = None,
        logprob: Logprob = -0.125,
        tokens_per_chunk: int = 1,
        weight_version: str | None = "default",
        context_length: int = 32768,
        num_experts: int = 64,
    ) -> None:
        if tokens_per_chunk < 1:
            raise ValueError(f"tokens_per_chunk must be >= 1, got {tokens_per_chunk}")
        if context_length < 2:
            raise ValueError(f"context_length must be >= 2, got {context_length}")
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        self.reply = reply
        self.vocabulary = vocabulary
        """Encodes text the function returns, checks its ids and matches stop strings."""
        self.logprob = logprob
        self.tokens_per_chunk = tokens_per_chunk
        self.weight_version = weight_version
        """The version every answer and chunk names from now on."""
        self.context_length_tokens = context_length
        """What :meth:`context_length` answers; longer requests are refused as SGLang refuses."""
        self.num_experts = num_experts
        self.requests: list[GenerateRequest] = []
        """Every request received, in order of arrival, refused ones included."""
        self.aborts: list[str] = []
        """Every rid the engine was told to stop (see the module docstring)."""
        self._running: dict[str, asyncio.Event] = {}

    # -- Engine --------------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        aborted = self._receive(request, stream=False)
        try:
            generation = await self._generate(request, aborted)
        except asyncio.CancelledError:
            self.aborts.append(request.rid)  # the caller left: SGLangEngine would abort it
            raise
        finally:
            del self._running[request.rid]
        return GenerateResult(
            rid=request.rid,
            output_ids=generation.ids,
            output_logprobs=generation.logprobs,
            finish_reason=generation.finish,
            prompt_tokens=len(request.input_ids),
            completion_tokens=len(generation.ids),
            matched_stop=generation.matched,
            weight_version=self.weight_version,
            abort_message=ABORT_MESSAGE if generation.finish is FinishReason.ABORT else None,
            top_logprobs=generation.top,
            routed_experts=self._routing(request, generation, len(generation.ids)),
        )

    async def stream(self, request: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        aborted = self._receive(request, stream=True)
        over = False  # True once the chunk with the finish reason is out
        try:
            generation = await self._generate(request, aborted)
            ids = generation.ids
            sent = 0
            while True:
                await asyncio.sleep(0)  # a step's wait, as for a network read: aborts land here
                stopped = aborted.is_set() and generation.finish is not FinishReason.ABORT
                end = sent if stopped else min(sent + self.tokens_per_chunk, len(ids))
                last = stopped or end == len(ids)
                finish = FinishReason.ABORT if stopped else generation.finish
                over = last
                yield GenerateChunk(
                    output_ids=ids[sent:end],
                    output_logprobs=generation.logprobs[sent:end],
                    completion_tokens=end,
                    prompt_tokens=len(request.input_ids),
                    finish_reason=finish if last else None,
                    matched_stop=generation.matched if last and not stopped else None,
                    weight_version=self.weight_version,
                    abort_message=ABORT_MESSAGE if last and finish is FinishReason.ABORT else None,
                    top_logprobs=generation.top[sent:end],
                    routed_experts=(
                        self._routing(request, generation, end, stopped) if last else None
                    ),
                )
                sent = end
                if last:
                    return
        except (asyncio.CancelledError, GeneratorExit):
            if not over:  # the caller left before the finish: SGLangEngine would abort it
                self.aborts.append(request.rid)
            raise
        finally:
            del self._running[request.rid]

    async def abort(self, rid: str) -> None:
        """Stop generation ``rid``: it ends with ``abort`` at its next step (no error if it is
        not running)."""
        self.aborts.append(rid)
        running = self._running.get(rid)
        if running is not None:
            running.set()

    async def context_length(self) -> int:
        return self.context_length_tokens

    # -- helpers -------------------------------------------------------------------------------

    def _receive(self, request: GenerateRequest, *, stream: bool) -> asyncio.Event:
        """Record the request, refuse it as SGLang would, and mark it running."""
        self.requests.append(request)
        refusal = self._refusal(request)
        if refusal is not None:
            body = {"error": {"message": refusal}}
            if stream:  # SGLang refuses inside the stream, under the 200 it already sent
                raise engine_reported_error(body, request.rid)
            raise error_for_status(400, json.dumps(body), request.rid)
        if request.rid in self._running:
            raise ValueError(f"FunctionEngine: {request.rid} is already generating")
        aborted = self._running[request.rid] = asyncio.Event()
        return aborted

    def _refusal(self, request: GenerateRequest) -> str | None:
        prompt = len(request.input_ids)
        context = self.context_length_tokens
        if prompt >= context:
            return (
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({context} tokens)."
            )
        total = prompt + request.sampling.max_new_tokens
        if total >= context:  # SGLang's own comparison: >=, not >
            return (
                "Requested token count exceeds the model's maximum context length of "
                f"{context} tokens. You requested a total of {total} tokens: {prompt} tokens "
                f"from the input messages and {request.sampling.max_new_tokens} tokens for the "
                "completion. Please reduce the number of tokens in the input messages or the "
                "completion to fit within the limit."
            )
        return None

    async def _generate(self, request: GenerateRequest, aborted: asyncio.Event) -> _Generation:
        answer = self.reply(request)
        output = await _unless(aborted, answer) if inspect.isawaitable(answer) else answer
        if output is None:
            return _Generation((), (), (), FinishReason.ABORT, None)
        ids = self._ids(output, request.rid)
        ids, finish, matched = self._stopped(ids, request)
        logprobs = tuple(self._logprob_at(i, t) for i, t in enumerate(ids))
        top: tuple[TopLogprobs, ...] = ()
        if request.top_logprobs:
            top = tuple(
                _invented_top(t, lp, request.top_logprobs)
                for t, lp in zip(ids, logprobs, strict=True)
            )
        return _Generation(ids, logprobs, top, finish, matched)

    def _ids(self, output: Output, rid: str) -> tuple[int, ...]:
        if isinstance(output, str):
            if self.vocabulary is None:
                raise TypeError(
                    f"FunctionEngine: the reply to {rid} is text; give a vocabulary to encode it"
                )
            ids = tuple(self.vocabulary.encode(output))
        else:
            ids = tuple(output)
        if not ids:
            raise ValueError(f"FunctionEngine: the reply to {rid} is empty (SGLang generates >= 1)")
        size = None if self.vocabulary is None else self.vocabulary.size
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                raise ValueError(f"FunctionEngine: output[{i}] = {t!r} of {rid} is not a token id")
            if size is not None and t >= size:
                raise ValueError(f"FunctionEngine: output[{i}] = {t} of {rid} is not in the vocab")
        return ids

    def _stopped(
        self, ids: tuple[int, ...], request: GenerateRequest
    ) -> tuple[tuple[int, ...], FinishReason, int | str | None]:
        """The output as SGLang ends it, checking after each token as its scheduler does:
        ``max_new_tokens`` first, then the stop token ids, then the stop strings."""
        sampling = request.sampling
        stop_ids = frozenset(sampling.stop_token_ids)
        strings = sampling.stop
        if strings and self.vocabulary is None:
            raise ValueError(
                f"FunctionEngine: {request.rid} has stop strings {strings!r}; give a vocabulary "
                "to match them"
            )
        # Tokens enough to hold the longest stop string (a character is at most 4 byte tokens).
        tail = 4 * max((len(s) for s in strings), default=0) + 1
        for n, token in enumerate(ids, 1):
            if n >= sampling.max_new_tokens:
                return ids[:n], FinishReason.LENGTH, None
            if token in stop_ids:
                return ids[:n], FinishReason.STOP, token
            if strings and self.vocabulary is not None:
                text = self.vocabulary.decode(ids[max(0, n - tail) : n])
                matched = next((s for s in strings if s in text), None)
                if matched is not None:
                    return ids[:n], FinishReason.STOP, matched
        return ids, FinishReason.LENGTH, None

    def _logprob_at(self, position: int, token_id: int) -> float:
        if callable(self.logprob):
            return float(self.logprob(position, token_id))
        return float(self.logprob)

    def _routing(
        self, request: GenerateRequest, generation: _Generation, count: int, stopped: bool = False
    ) -> RoutedExperts | None:
        """The call's routing, as the double invents it: one row per position from the asked
        start up to the last token; none unless asked for, or for an abort before any token."""
        ask = request.routed_experts
        aborted = stopped or generation.finish is FinishReason.ABORT
        if ask is None or (aborted and count == 0):
            return None
        sequence = (*request.input_ids, *generation.ids[:count])
        rows: array[int] = array("i")
        for position in range(ask.start, len(sequence) - 1):
            token = sequence[position]
            rows.extend(
                expert_id(token, position, layer, slot, self.num_experts)
                for layer in range(ask.layers)
                for slot in range(ask.topk)
            )
        return RoutedExperts(ask.start, ask.layers, ask.topk, rows)


async def _unless(aborted: asyncio.Event, output: Awaitable[Output]) -> Output | None:
    """Await the function's answer; ``None`` if the generation is aborted first (the function's
    task is then cancelled, as it is when the caller is)."""
    answer = asyncio.ensure_future(output)
    abort = asyncio.ensure_future(aborted.wait())
    try:
        await asyncio.wait((answer, abort), return_when=asyncio.FIRST_COMPLETED)
    finally:
        abort.cancel()
        if not answer.done():
            answer.cancel()
            await asyncio.gather(answer, return_exceptions=True)
    return answer.result() if answer.done() and not answer.cancelled() else None


def _invented_top(token_id: int, logprob: float, k: int) -> TopLogprobs:
    """The sampled token, then ``k - 1`` byte tokens, each less likely than the one before: the
    alternatives the engine double invents, as the SGLang client reads them."""
    top: list[tuple[int, float]] = [(token_id, logprob)]
    other = token_id
    while len(top) < k:
        other = (other + 1) % 256
        if other != token_id:
            top.append((other, logprob - len(top)))
    return tuple(top)
