"""The three wire dialects, behind one interface the server can dispatch on.

Each dialect module (``anthropic``, ``openai_chat``, ``openai_responses``) reads and writes its
format with functions shaped by that format, and ends in one class implementing the
:class:`Dialect` protocol (``protocol.py``) over them: ``AnthropicDialect``,
``OpenAIChatDialect``, ``OpenAIResponsesDialect``. :data:`DIALECTS` holds one instance of each by
name, so the server handles every endpoint the same way::

    dialect = DIALECTS["anthropic"]
    request = dialect.parse_request(body)     # AdapterError(INVALID_REQUEST) on bad input
    encoder = dialect.stream_encoder(request, dialect.new_response_id())
    writer.write(encoder.start(Usage(prompt_tokens, 0)))
    for event in reply_events: writer.write(encoder.event(event))
    writer.write(encoder.logprobs(tokens))    # when the client asked for them
    writer.write(encoder.finish(stop, usage))
    recorded = dialect.echoed(reply)          # the reply as its client will send it back

What several dialects need is written once: ``json_shape`` (reading request JSON),
``sse_writer`` (event framing), ``structured_output`` (schemas), ``opaque`` (reasoning tokens);
for the two OpenAI dialects ``openai_tools``, ``openai_media``, ``openai_logprobs`` and
``openai_errors``.
"""

from __future__ import annotations

from .anthropic import AnthropicDialect
from .openai_chat import OpenAIChatDialect
from .openai_responses import OpenAIResponsesDialect
from .protocol import Dialect, StreamEncoder

DIALECTS: dict[str, Dialect] = {
    dialect.name: dialect
    for dialect in (AnthropicDialect(), OpenAIChatDialect(), OpenAIResponsesDialect())
}

__all__ = [
    "DIALECTS",
    "AnthropicDialect",
    "Dialect",
    "OpenAIChatDialect",
    "OpenAIResponsesDialect",
    "StreamEncoder",
]
