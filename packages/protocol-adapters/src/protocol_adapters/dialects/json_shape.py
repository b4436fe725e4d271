"""Reading untrusted request JSON by hand, with errors that name the exact path.

Every dialect validates its request body with these helpers instead of a schema library, so a
client that sends something unexpected gets ``messages.3.content.0.type: unknown block type
'foo'`` rather than a traceback, and the package keeps no runtime dependency for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import NoReturn

from protocol_adapters.types import AdapterError, ErrorKind

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
