"""Chat templates rendered with jinja2 in the environment Hugging Face uses.

Why not ``transformers.apply_chat_template``: the renderer runs on every turn in a worker thread
of the adapter, and the default install must not pull transformers (and its import time) in for a
string render. This module reproduces the environment transformers compiles templates in (sandboxed,
``trim_blocks``/``lstrip_blocks``, loop controls, a non-escaping ``tojson``, ``raise_exception``,
``strftime_now``, a pass-through ``{% generation %}``), so any Hugging Face template renders the
same text here; a test pins that against ``apply_chat_template`` for our own template. As
transformers does, a render sees ``tools`` (``None`` when there are none), ``documents`` (``None``),
``add_generation_prompt``, the template's variables (the checkpoint's special tokens) and the
request's options.

Time: ``strftime_now`` reads the clock. A render given ``now`` sees that instant instead, which is
how the renderer freezes the date a template prints (Llama 3.1's system prompt) for a whole
session: a session that crosses midnight must not change its own earlier tokens.

Thread safety: a compiled :class:`ChatTemplate` is immutable and jinja2 renders are re-entrant.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from importlib import resources
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trajectory_tree import Message, ToolSpec

from .messages import (
    ToolResultNames,
    template_messages,
    template_options,
    template_tools,
)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant-mask markup) rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a mutable class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def frozen_clock(now: datetime) -> Callable[[str], str]:
    """A ``strftime_now`` that always answers for ``now``."""

    def strftime_now(fmt: str) -> str:
        return now.strftime(fmt)

    return strftime_now


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class TemplateError(ValueError):
    """The chat template refused the conversation (``raise_exception``) or failed to render."""


class ChatTemplate:
    """A compiled chat template and the variables it always sees (``bos_token``, ...)."""

    __slots__ = ("_compiled", "name", "source", "variables")

    def __init__(self, name: str, source: str, variables: Mapping[str, Any] | None = None) -> None:
        self.name = name
        self.source = source
        self.variables: Mapping[str, Any] = dict(variables or {})
        try:
            self._compiled = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template {name!r} does not compile: {exc}") from None

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        options: Mapping[str, str] | None = None,
        *,
        add_generation_prompt: bool = False,
        result_names: ToolResultNames = ToolResultNames.FROM_CALLS,
    ) -> str:
        """The template's text for ``messages`` (neutral form, converted here)."""
        return self.render_raw(
            template_messages(messages, result_names=result_names),
            template_tools(tuple(tools)),
            template_options(options or {}),
            add_generation_prompt=add_generation_prompt,
        )

    def render_raw(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        options: Mapping[str, Any],
        *,
        add_generation_prompt: bool,
        now: datetime | None = None,
    ) -> str:
        """Render already-converted template dicts (Hugging Face's message shape); ``now``
        freezes the clock ``strftime_now`` reads."""
        clock = {} if now is None else {"strftime_now": frozen_clock(now)}
        try:
            return self._compiled.render(
                **self.variables,
                **options,
                **clock,
                messages=messages,
                tools=tools or None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template {self.name!r}: {exc}") from None
        except Exception as exc:  # template code can fail like any code (None + str, ...)
            raise TemplateError(
                f"chat template {self.name!r}: {type(exc).__name__}: {exc}"
            ) from None

    def __repr__(self) -> str:
        return f"ChatTemplate({self.name!r})"


def qwen3_template() -> ChatTemplate:
    """Our Qwen3-style template (``templates/qwen3.jinja``)."""
    source = (
        resources.files("protocol_adapters._template") / "templates" / "qwen3.jinja"
    ).read_text("utf-8")
    return ChatTemplate("qwen3", source)
