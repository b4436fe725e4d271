"""The OpenAI tool fields (``tools``, ``tool_choice``, ``parallel_tool_calls``), read once.

Chat Completions nests a function's ``name``, ``description`` and ``parameters`` under a
``function`` key; Responses puts them on the tool (or ``tool_choice``) object itself. Everything
else (which tools are offered, which are only listed as ignored, what ``tool_choice`` may say,
every error message) is the same, so each dialect passes only where its definitions live:
:func:`nested` or :func:`flat`. Anthropic's tools differ in kind and shape (``custom`` tools,
``input_schema``, its own ``tool_choice`` types) and stay in ``anthropic.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from trajectory_tree import ToolSpec

from .json_shape import (
    JsonObject,
    at,
    compact_dumps,
    expect_list,
    expect_object,
    fail,
    optional_bool,
    optional_object,
    optional_str,
    require,
    required_str,
)

FunctionAt = Callable[[JsonObject, str], tuple[JsonObject, str]]
"""Given an object and its path, the function definition inside it and that definition's path."""


def nested(obj: JsonObject, path: str) -> tuple[JsonObject, str]:
    """Chat Completions: the definition is the object's ``function``."""
    function_path = at(path, "function")
    return expect_object(require(obj, "function", path), function_path), function_path


def flat(obj: JsonObject, path: str) -> tuple[JsonObject, str]:
    """Responses: the definition is the object itself."""
    return obj, path


def tool_fields(
    root: JsonObject, metadata: dict[str, str], function_at: FunctionAt
) -> list[ToolSpec]:
    """The request's function tools; ``tool_choice`` and ``parallel_tool_calls`` go to
    ``metadata`` (read in this order, so the first bad field is the one reported)."""
    tools = _function_tools(root.get("tools"), metadata, function_at)
    _tool_choice(root.get("tool_choice"), metadata, function_at)
    parallel = optional_bool(root, "parallel_tool_calls", "")
    if parallel is not None:
        metadata["parallel_tool_calls"] = "true" if parallel else "false"
    return tools


def _function_tools(
    raw: object, metadata: dict[str, str], function_at: FunctionAt
) -> list[ToolSpec]:
    """The ``type: "function"`` tools; other types go to ``metadata["ignored_tools"]``."""
    if raw is None:
        return []
    specs: list[ToolSpec] = []
    ignored: list[str] = []
    for i, item in enumerate(expect_list(raw, "tools")):
        path = at("tools", i)
        tool = expect_object(item, path)
        kind = required_str(tool, "type", path)
        if kind != "function":
            ignored.append(kind)
            continue
        function, function_path = function_at(tool, path)
        parameters = optional_object(function, "parameters", function_path) or {}
        specs.append(
            ToolSpec(
                required_str(function, "name", function_path),
                optional_str(function, "description", function_path) or "",
                compact_dumps(parameters),
            )
        )
    if ignored:
        metadata["ignored_tools"] = ",".join(ignored)
    return specs


def _tool_choice(raw: object, metadata: dict[str, str], function_at: FunctionAt) -> None:
    """``tool_choice`` into ``metadata["tool_choice"]`` (and ``tool_choice_name`` for one)."""
    if raw is None:
        return
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            fail("tool_choice", f"unknown tool_choice {raw!r}")
        metadata["tool_choice"] = raw
        return
    choice = expect_object(raw, "tool_choice")
    kind = required_str(choice, "type", "tool_choice")
    if kind != "function":
        fail("tool_choice.type", f"unsupported tool_choice type {kind!r}")
    function, function_path = function_at(choice, "tool_choice")
    metadata["tool_choice"] = "function"
    metadata["tool_choice_name"] = required_str(function, "name", function_path)
