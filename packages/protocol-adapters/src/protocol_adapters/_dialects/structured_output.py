"""Structured output: the JSON schema a client asks the reply to follow, in each dialect's shape.

It becomes SGLang's ``json_schema`` sampling constraint (the schema as JSON text), so the engine
can only generate JSON that matches it: what the provider APIs promise. Dropping it would let
the policy answer free text that the client then fails to parse.

- Anthropic: ``output_config.format = {"type": "json_schema", "schema": {...}}``.
- OpenAI Chat: ``response_format`` is ``{"type": "json_schema", "json_schema": {"name",
  "schema", "strict"}}``, ``{"type": "json_object"}`` or ``{"type": "text"}``.
- OpenAI Responses: ``text.format`` is ``{"type": "json_schema", "name", "schema",
  "strict"}``, ``{"type": "json_object"}`` or ``{"type": "text"}``.

``json_object`` (any JSON object) is the schema ``{"type": "object"}``; a ``json_schema`` without
a ``schema`` is ``{}`` (any JSON value).
"""

from __future__ import annotations

from .json_shape import (
    JsonObject,
    at,
    canonical_dumps,
    expect_object,
    fail,
    optional_object,
    require,
    required_str,
)

ANY_OBJECT = canonical_dumps({"type": "object"})


def anthropic_schema(output_config: JsonObject) -> str | None:
    """The schema in ``output_config.format``, if there is one."""
    path = "output_config.format"
    raw = output_config.get("format")
    if raw is None:
        return None
    fmt = expect_object(raw, path)
    kind = required_str(fmt, "type", path)
    if kind != "json_schema":
        fail(at(path, "type"), f"unsupported output format {kind!r}; expected 'json_schema'")
    return canonical_dumps(expect_object(require(fmt, "schema", path), at(path, "schema")))


def openai_schema(raw: object, path: str, *, nested: bool) -> str | None:
    """The schema of a Chat ``response_format`` (``nested``: the schema sits under
    ``json_schema``) or a Responses ``text.format`` (the schema sits on the format itself)."""
    if raw is None:
        return None
    fmt = expect_object(raw, path)
    kind = required_str(fmt, "type", path)
    if kind == "text":
        return None
    if kind == "json_object":
        return ANY_OBJECT
    if kind != "json_schema":
        fail(
            at(path, "type"),
            f"unsupported format type {kind!r}; expected 'text', 'json_object' or 'json_schema'",
        )
    definition = fmt
    definition_path = path
    if nested:
        definition_path = at(path, "json_schema")
        definition = expect_object(require(fmt, "json_schema", path), definition_path)
    schema = optional_object(definition, "schema", definition_path)
    return canonical_dumps(schema if schema is not None else {})
