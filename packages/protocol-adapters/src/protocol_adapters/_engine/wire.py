"""SGLang's ``/generate`` JSON, both directions, validated.

Pure functions, no I/O: the HTTP client and the tests share them. Every generated token is read
from ``meta_info.output_token_logprobs`` (``[logprob, token_id, text|null]`` per token); anything
inconsistent raises ``AdapterError(ENGINE_ERROR)`` naming the field, because a token we cannot
vouch for must never reach training. The same holds for MoE routing (``routed_experts.py``) and
weight versions. See ``docs/sglang-wire.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from protocol_adapters._types import AdapterError, ErrorKind
from trajectory_tree import FinishReason, RoutedExperts

from .routed_experts import routed_experts_of
from .types import GenerateChunk, GenerateRequest, GenerateResult, TopLogprobs

_MAX_MESSAGE_CHARS = 500


def request_fields(request: GenerateRequest, *, stream: bool) -> dict[str, object]:
    """The ``/generate`` body for ``request`` but its prompt ids.

    The three text switches keep the engine from trimming or rewriting anything: the stop token
    stays in the output (``no_stop_trim``) and special tokens are not dropped from text. Logprobs
    are requested for output tokens only (``logprob_start_len: -1``): prompt logprobs would cost a
    full pass over a long context. ``top_logprobs_num`` (a request field, not a sampling
    parameter) is sent only when the client asked for the most likely alternatives, and
    ``json_schema`` only when it asked for structured output. MoE routing is asked for (two
    request fields) from the position the request names: the positions before it were returned
    to earlier calls on the same branch.
    """
    s = request.sampling
    sampling: dict[str, object] = {
        "max_new_tokens": s.max_new_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
    }
    if s.stop:
        sampling["stop"] = list(s.stop)
    if s.stop_token_ids:
        sampling["stop_token_ids"] = list(s.stop_token_ids)
    if s.json_schema is not None:
        sampling["json_schema"] = s.json_schema
    body: dict[str, object] = {
        "rid": request.rid,
        "sampling_params": sampling,
        "return_logprob": True,
        "logprob_start_len": -1,
        "stream": stream,
    }
    if request.top_logprobs:
        body["top_logprobs_num"] = request.top_logprobs
    if request.routed_experts is not None:
        body["return_routed_experts"] = True
        body["routed_experts_start_len"] = request.routed_experts.start
    return body


def request_body(request: GenerateRequest, *, stream: bool) -> dict[str, object]:
    """The ``/generate`` body for ``request`` as the engine parses it (:func:`request_fields`
    and the prompt ids); what is sent is :func:`encoded_body`, the same JSON."""
    return {"input_ids": list(request.input_ids), **request_fields(request, stream=stream)}


def encoded_body(request: GenerateRequest, *, stream: bool, ids_text: str) -> bytes:
    """The body's bytes, with ``ids_text`` (the inside of the ids' JSON list, encoded
    incrementally by the caller: :mod:`.ids_json`) as ``input_ids``: the other fields are a few
    hundred bytes, the ids up to megabytes."""
    rest = json.dumps(request_fields(request, stream=stream), separators=(",", ":"))
    return f'{{"input_ids":[{ids_text}],{rest[1:]}'.encode()


def malformed(rid: str, detail: str) -> AdapterError:
    return AdapterError(ErrorKind.ENGINE_ERROR, f"malformed engine response for {rid}: {detail}")


@dataclass(frozen=True, slots=True)
class Step:
    """One response object (a whole reply, or one streamed chunk) after validation."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[TopLogprobs, ...]
    output_ids: tuple[int, ...] | None
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason | None
    matched_stop: int | str | None
    abort_message: str | None
    weight_version: str | None
    routed_experts: RoutedExperts | None


def parse_step(payload: object, request: GenerateRequest) -> Step:
    """Validate one ``/generate`` response object; raise ``AdapterError`` if it is not one."""
    rid = request.rid
    if not isinstance(payload, Mapping):
        raise malformed(rid, f"expected a JSON object, got {type(payload).__name__}")
    if "error" in payload:
        raise engine_reported_error(payload, rid)
    meta = payload.get("meta_info")
    if not isinstance(meta, Mapping):
        raise malformed(rid, "missing meta_info object")
    echoed = meta.get("id")
    if echoed is not None and echoed != rid:
        raise malformed(rid, f"meta_info.id is {echoed!r}, not the request's rid")
    prompt_tokens = _count(meta, "prompt_tokens", rid)
    if prompt_tokens != len(request.input_ids):
        raise malformed(
            rid, f"prompt_tokens={prompt_tokens} but {len(request.input_ids)} input ids were sent"
        )
    completion_tokens = _count(meta, "completion_tokens", rid)
    ids, logprobs = _token_logprobs(meta.get("output_token_logprobs"), rid)
    top = (
        _top_logprobs(meta.get("output_top_logprobs"), len(ids), rid)
        if request.top_logprobs
        else ()
    )
    finish, matched, abort_message = _finish(meta.get("finish_reason"), rid)
    weight_version = meta.get("weight_version")
    if weight_version is not None and not isinstance(weight_version, str):
        raise malformed(rid, f"meta_info.weight_version is {weight_version!r}, not a string")
    try:
        routed = routed_experts_of(
            meta,
            request.routed_experts,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish=finish,
        )
    except ValueError as exc:
        raise malformed(rid, str(exc)) from None
    return Step(
        ids=ids,
        logprobs=logprobs,
        top_logprobs=top,
        output_ids=_optional_ids(payload.get("output_ids"), rid),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reason=finish,
        matched_stop=matched,
        abort_message=abort_message,
        weight_version=weight_version,
        routed_experts=routed,
    )


def parse_result(payload: object, request: GenerateRequest) -> GenerateResult:
    """A whole non-streaming ``/generate`` response."""
    step = parse_step(payload, request)
    rid = request.rid
    if step.finish_reason is None:
        raise malformed(rid, "meta_info.finish_reason is null in a finished response")
    if len(step.ids) != step.completion_tokens:
        raise malformed(
            rid,
            f"{len(step.ids)} entries in output_token_logprobs but "
            f"completion_tokens={step.completion_tokens}",
        )
    if step.output_ids is not None and step.output_ids != step.ids:
        raise malformed(rid, "output_ids disagree with the ids in output_token_logprobs")
    return GenerateResult(
        rid=rid,
        output_ids=step.ids,
        output_logprobs=step.logprobs,
        finish_reason=step.finish_reason,
        prompt_tokens=step.prompt_tokens,
        completion_tokens=step.completion_tokens,
        matched_stop=step.matched_stop,
        weight_version=step.weight_version,
        abort_message=step.abort_message,
        top_logprobs=step.top_logprobs,
        routed_experts=step.routed_experts,
    )


class StreamDecoder:
    """Turns SGLang's streamed chunks into chunks of only the new tokens.

    SGLang sends ``output_token_logprobs`` cumulatively by default and incrementally when the
    server runs with ``--incremental-streaming-output``; the client cannot see which. Each chunk
    also carries ``completion_tokens`` (cumulative in both modes), which tells them apart without
    ambiguity once any token has been seen: a cumulative list has ``completion_tokens`` entries, an
    incremental one has ``completion_tokens - seen``. A cumulative list must repeat the tokens
    already delivered exactly.
    """

    def __init__(self, request: GenerateRequest) -> None:
        self._request = request
        self._ids: list[int] = []
        self._logprobs: list[float] = []
        self._finished = False
        self._chunks = 0
        self.cumulative = False
        """True once a chunk repeated earlier tokens (the server streams cumulatively)."""

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def tokens_seen(self) -> int:
        return len(self._ids)

    def feed(self, payload: object) -> GenerateChunk:
        rid = self._request.rid
        if self._finished:
            raise malformed(rid, "data after the chunk that carried the finish reason")
        step = parse_step(payload, self._request)
        self._chunks += 1
        seen = len(self._ids)
        total = step.completion_tokens
        where = f"stream chunk {self._chunks}"
        if total < seen:
            raise malformed(rid, f"{where}: completion_tokens went back from {seen} to {total}")
        if seen > 0 and len(step.ids) == total:
            if tuple(self._ids) != step.ids[:seen] or tuple(self._logprobs) != step.logprobs[:seen]:
                raise malformed(rid, f"{where}: cumulative logprobs rewrite earlier tokens")
            new_ids, new_logprobs = step.ids[seen:], step.logprobs[seen:]
            new_top = step.top_logprobs[seen:]
            self.cumulative = True
        elif len(step.ids) == total - seen:
            new_ids, new_logprobs, new_top = step.ids, step.logprobs, step.top_logprobs
        else:
            raise malformed(
                rid,
                f"{where}: {len(step.ids)} token logprobs with completion_tokens={total} after "
                f"{seen} tokens: neither cumulative nor incremental",
            )
        if step.output_ids is not None and step.output_ids not in (new_ids, (*self._ids, *new_ids)):
            raise malformed(rid, f"{where}: output_ids disagree with output_token_logprobs")
        self._ids.extend(new_ids)
        self._logprobs.extend(new_logprobs)
        self._finished = step.finish_reason is not None
        return GenerateChunk(
            output_ids=new_ids,
            output_logprobs=new_logprobs,
            completion_tokens=total,
            prompt_tokens=step.prompt_tokens,
            finish_reason=step.finish_reason,
            matched_stop=step.matched_stop,
            weight_version=step.weight_version,
            abort_message=step.abort_message,
            top_logprobs=new_top,
            routed_experts=step.routed_experts,
        )


# -- server info ---------------------------------------------------------------------------------

_CONTEXT_BOUNDS = (
    ("context_length", 0),
    ("max_req_input_len", 1),
    ("max_total_num_tokens", 0),
)
"""Fields of SGLang's server info that bound one request's length, with what to add to each to
get a sequence length: ``context_length`` is the ``--context-length`` argument (``null`` unless
set), ``max_req_input_len`` is ``min(model context, KV pool) - 1``, ``max_total_num_tokens`` is
the KV pool."""


def context_length_of(info: object) -> int:
    """The longest sequence one request may hold, from a ``/server_info`` answer: the smallest of
    the bounds it names (top level, else in its first ``internal_states`` entry)."""
    if not isinstance(info, Mapping):
        raise AdapterError(ErrorKind.ENGINE_ERROR, "engine server info is not a JSON object")
    places: list[Mapping[str, object]] = [info]
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], Mapping):
        places.append(states[0])
    bounds: list[int] = []
    for key, extra in _CONTEXT_BOUNDS:
        value = next((place[key] for place in places if place.get(key) is not None), None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            bounds.append(value + extra)
    if not bounds:
        raise AdapterError(
            ErrorKind.ENGINE_ERROR,
            "engine server info names no context length "
            "(none of context_length, max_req_input_len, max_total_num_tokens)",
        )
    return min(bounds)


# -- errors --------------------------------------------------------------------------------------


def engine_message(body: str) -> str:
    """The human-readable message in an SGLang error body, whatever its shape."""
    try:
        data = json.loads(body)
    except ValueError:
        return _clip(body.strip()) or "(empty body)"
    return _clip(_message_in(data) or body.strip()) or "(empty body)"


def error_for_status(status: int, body: str, rid: str) -> AdapterError:
    """Map an HTTP error answer of the engine (or its gateway) to an ``AdapterError``.

    4xx means the engine refused the request as sent; a context-length refusal gets its own kind
    so the client can compact. 429 and 503 mean "busy, retry later" (the gateway's queue or an
    engine that is not ready); any other 5xx is an engine failure.
    """
    message = engine_message(body)
    text = f"engine answered HTTP {status} for {rid}: {message}"
    if status == 429:
        return AdapterError(ErrorKind.RATE_LIMITED, text)
    if status == 503:
        return AdapterError(ErrorKind.OVERLOADED, text)
    if 400 <= status < 500:
        if status == 413:
            return AdapterError(ErrorKind.REQUEST_TOO_LARGE, text)
        if is_context_length_message(message):
            return AdapterError(ErrorKind.CONTEXT_LENGTH, text)
        return AdapterError(ErrorKind.INVALID_REQUEST, text)
    return AdapterError(ErrorKind.ENGINE_ERROR, text)


def engine_reported_error(payload: Mapping[str, object], rid: str) -> AdapterError:
    """An ``{"error": ...}`` object in place of a result (SGLang streams its 400s this way)."""
    message = _clip(_message_in(payload) or "no message") or "no message"
    text = f"engine reported an error for {rid}: {message}"
    if is_context_length_message(message):
        return AdapterError(ErrorKind.CONTEXT_LENGTH, text)
    return AdapterError(ErrorKind.INVALID_REQUEST, text)


def is_context_length_message(message: str) -> bool:
    lowered = message.lower()
    return "context length" in lowered or "context_length" in lowered


def _message_in(data: object) -> str | None:
    if isinstance(data, str):
        return data
    if not isinstance(data, Mapping):
        return None
    for key in ("error", "message", "detail"):
        value = data.get(key)
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping):
            inner = _message_in(value.get("message"))
            if inner is not None:
                return inner
        if isinstance(value, list) and value:
            return json.dumps(value)[:_MAX_MESSAGE_CHARS]
    return None


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[:_MAX_MESSAGE_CHARS] + "…"


# -- field parsers -------------------------------------------------------------------------------


def _count(meta: Mapping[str, object], key: str, rid: str) -> int:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise malformed(rid, f"meta_info.{key} is {value!r}, not a token count")
    return value


def _token_logprobs(value: object, rid: str) -> tuple[tuple[int, ...], tuple[float, ...]]:
    if value is None:
        raise malformed(rid, "meta_info.output_token_logprobs is missing (return_logprob ignored?)")
    if not isinstance(value, list):
        raise malformed(rid, f"meta_info.output_token_logprobs is a {type(value).__name__}")
    ids: list[int] = []
    logprobs: list[float] = []
    for i, entry in enumerate(value):
        if not isinstance(entry, list) or len(entry) < 2:
            raise malformed(rid, f"output_token_logprobs[{i}] is {entry!r}, not [logprob, id, ...]")
        logprob, token_id = entry[0], entry[1]
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise malformed(rid, f"output_token_logprobs[{i}] has token id {token_id!r}")
        if isinstance(logprob, bool) or not isinstance(logprob, int | float):
            raise malformed(rid, f"output_token_logprobs[{i}] has logprob {logprob!r}")
        if not math.isfinite(logprob):
            raise malformed(
                rid, f"output_token_logprobs[{i}] (token {token_id}) has non-finite logprob"
            )
        ids.append(token_id)
        logprobs.append(float(logprob))
    return tuple(ids), tuple(logprobs)


def _top_logprobs(value: object, count: int, rid: str) -> tuple[TopLogprobs, ...]:
    """``output_top_logprobs``: per output token, a list of ``[logprob, token_id, text|null]``.

    Alternatives whose logprob is not a finite number (SGLang writes -inf, a token a grammar
    ruled out, as ``null``) are dropped: they were never candidates.
    """
    if value is None and count == 0:
        return ()
    if not isinstance(value, list):
        raise malformed(rid, "meta_info.output_top_logprobs is missing (top_logprobs_num ignored?)")
    if len(value) != count:
        raise malformed(
            rid, f"{len(value)} entries in output_top_logprobs for {count} output tokens"
        )
    positions: list[TopLogprobs] = []
    for i, alternatives in enumerate(value):
        if not isinstance(alternatives, list):
            raise malformed(rid, f"output_top_logprobs[{i}] is {alternatives!r}, not a list")
        row: list[tuple[int, float]] = []
        for entry in alternatives:
            if not isinstance(entry, list) or len(entry) < 2:
                raise malformed(rid, f"output_top_logprobs[{i}] holds {entry!r}")
            logprob, token_id = entry[0], entry[1]
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise malformed(rid, f"output_top_logprobs[{i}] has token id {token_id!r}")
            if isinstance(logprob, bool) or not isinstance(logprob, int | float):
                if logprob is None:
                    continue
                raise malformed(rid, f"output_top_logprobs[{i}] has logprob {logprob!r}")
            if math.isfinite(logprob):
                row.append((token_id, float(logprob)))
        positions.append(tuple(row))
    return tuple(positions)


def _optional_ids(value: object, rid: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise malformed(rid, f"output_ids is a {type(value).__name__}, not a list")
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise malformed(rid, f"output_ids[{i}] is {t!r}, not a token id")
    return tuple(value)


_FINISH_TYPES = {r.value: r for r in FinishReason}


def _finish(value: object, rid: str) -> tuple[FinishReason | None, int | str | None, str | None]:
    if value is None:
        return None, None, None
    if not isinstance(value, Mapping):
        raise malformed(rid, f"meta_info.finish_reason is {value!r}, not an object")
    kind = value.get("type")
    reason = _FINISH_TYPES.get(kind) if isinstance(kind, str) else None
    if reason is None:
        raise malformed(rid, f"meta_info.finish_reason.type is {kind!r}")
    matched = value.get("matched")
    if isinstance(matched, list) and len(matched) == 1:
        matched = matched[0]
    if isinstance(matched, bool) or not isinstance(matched, int | str):
        matched = None
    message = value.get("message") if reason is FinishReason.ABORT else None
    return reason, matched, message if isinstance(message, str) else None
