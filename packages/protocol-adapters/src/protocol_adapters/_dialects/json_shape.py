"""Reading untrusted request JSON by hand, with errors that name the exact path.

Every dialect validates its request body with these helpers instead of a schema library, so a
client that sends something unexpected gets ``messages.3.content.0.type: unknown block type
'foo'`` rather than a traceback, and the package keeps no runtime dependency for it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import NoReturn

from protocol_adapters._types import AdapterError, ErrorKind

JsonObject = Mapping[str, object]


def at(path: str, key: str | int) -> str:
    """The path of ``key`` inside ``path`` (``messages`` + 3 -> ``messages.3``)."""
    return f"{path}.{key}" if path else str(key)


def fail(path: str, message: str) -> NoReturn:
    """Reject the request: ``path`` is where the problem is, ``message`` what it is."""
    raise AdapterError(ErrorKind.INVALID_REQUEST, f"{path or 'body'}: {message}")


def kind_of(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def expect_object(value: object, path: str) -> JsonObject:
    if not isinstance(value, dict):
        fail(path, f"expected an object, got {kind_of(value)}")
    return value


def expect_list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        fail(path, f"expected an array, got {kind_of(value)}")
    return value


def expect_str(value: object, path: str) -> str:
    if not isinstance(value, str):
        fail(path, f"expected a string, got {kind_of(value)}")
    return value


_MISSING = object()


def require(obj: JsonObject, key: str, path: str) -> object:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        fail(at(path, key), "field required")
    return value


def required_str(obj: JsonObject, key: str, path: str) -> str:
    # Hot path: the error path string is only built when there is an error.
    value = obj.get(key, _MISSING)
    if isinstance(value, str):
        return value
    if value is _MISSING:
        fail(at(path, key), "field required")
    fail(at(path, key), f"expected a string, got {kind_of(value)}")


def optional_str(obj: JsonObject, key: str, path: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    fail(at(path, key), f"expected a string, got {kind_of(value)}")


def optional_bool(obj: JsonObject, key: str, path: str) -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        fail(at(path, key), f"expected a boolean, got {kind_of(value)}")
    return value


def optional_int(obj: JsonObject, key: str, path: str, *, minimum: int = 0) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        fail(at(path, key), f"expected an integer, got {kind_of(value)}")
    if value < minimum:
        fail(at(path, key), f"must be >= {minimum}, got {value}")
    return value


def optional_number(obj: JsonObject, key: str, path: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        fail(at(path, key), f"expected a finite number, got {kind_of(value)}")
    return float(value)


def optional_object(obj: JsonObject, key: str, path: str) -> JsonObject | None:
    value = obj.get(key)
    return None if value is None else expect_object(value, at(path, key))


def string_list(value: object, path: str) -> tuple[str, ...]:
    return tuple(expect_str(item, at(path, i)) for i, item in enumerate(expect_list(value, path)))


def canonical_dumps(value: object) -> str:
    """Canonical JSON text (sorted keys, no whitespace, UTF-8 kept): what routing compares."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def compact_dumps(value: object) -> str:
    """JSON text for the wire: compact, key order kept."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def unknown_keys(obj: JsonObject, known: frozenset[str]) -> str:
    """Comma-joined sorted keys of ``obj`` this dialect does not read (kept for diagnostics)."""
    return ",".join(sorted(key for key in obj if key not in known))


# -- text that is not Unicode ------------------------------------------------------------------

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def may_hold_surrogates(raw: bytes | bytearray | memoryview) -> bool:
    """Whether JSON bytes could decode to a string that is not valid Unicode.

    Only a ``\\uD800``-``\\uDFFF`` escape can make a lone surrogate: UTF-8 cannot encode one
    and Python's decoder refuses the bytes that would. This scan runs at memory speed, so the
    walk over the parsed value (:func:`invalid_text_at`) is paid only by bodies that need it.
    """
    return _SURROGATE_ESCAPE.search(raw) is not None


def invalid_text_at(value: object) -> tuple[str, str] | None:
    """``(path, problem)`` of the first string or key in parsed JSON that is not valid Unicode.

    A lone surrogate cannot be encoded as UTF-8: tokenizing it fails, and so would writing it
    into a tree file or an HTTP body. Such text is refused at the door instead.
    """
    stack: list[tuple[object, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return path, problem
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                problem = text_problem(key)
                if problem is not None:
                    return path, f"has a key that {problem}"
                stack.append((child, at(path, key)))
        elif isinstance(item, list):
            stack.extend((child, at(path, i)) for i, child in reversed(list(enumerate(item))))
    return None


def text_problem(text: str) -> str | None:
    """None for valid Unicode, else what is wrong (the first lone surrogate, by code point)."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid Unicode (lone surrogate U+{ord(text[exc.start]):04X})"
    return None
