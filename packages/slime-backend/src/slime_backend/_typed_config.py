"""Plain mappings (TOML tables, slime's custom-config YAML) into frozen dataclasses.

Configuration arrives as untyped nested dicts twice: the launcher reads a TOML file, and the
hooks running inside slime read the same settings back from ``args``. Both go through
:func:`from_mapping`, so a bad value fails the same way everywhere: one :class:`ConfigError`
whose message starts with the dotted path of the field (``rollout.n_samples_per_prompt: ...``).

Supported field types: ``bool``, ``int``, ``float``, ``str``, ``Literal`` of strings, ``StrEnum``
subclasses, ``tuple[T, ...]``, ``dict[str, str]``, ``X | None`` and nested dataclasses. Range
checks belong in each dataclass's ``__post_init__``, raising :class:`FieldError`.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type or out of range; names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


class FieldError(ConfigError):
    """Raised by a dataclass's own checks; :func:`from_mapping` prefixes the table's path."""


def from_mapping(cls: type[T], data: object, path: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, refusing unknown keys and wrong types."""
    if not isinstance(data, Mapping):
        raise ConfigError(path, f"expected a table, got {_describe(data)}")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            _join(path, str(unknown[0])), f"unknown setting; known: {', '.join(sorted(fields))}"
        )
    values: dict[str, object] = {}
    for name, field in fields.items():
        if name in data:
            values[name] = _convert(hints[name], data[name], _join(path, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(_join(path, name), "required setting is missing")
    try:
        return cls(**values)
    except FieldError as exc:
        raise ConfigError(_join(path, exc.path), exc.message) from None


def to_mapping(value: object) -> object:
    """The inverse of :func:`from_mapping`: plain dicts, lists and scalars (JSON-ready)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_mapping(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [to_mapping(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): to_mapping(v) for k, v in value.items()}
    return value


def _convert(hint: Any, value: object, path: str) -> object:
    origin = get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _convert(options[0], value, path)
    if origin is Literal:
        allowed = get_args(hint)
        if value not in allowed:
            names = ", ".join(map(repr, allowed))
            raise ConfigError(path, f"expected one of {names}, got {value!r}")
        return value
    if origin is tuple:
        item = get_args(hint)[0]
        if not isinstance(value, list | tuple):
            raise ConfigError(path, f"expected a list, got {_describe(value)}")
        return tuple(_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"expected a table, got {_describe(value)}")
        return {
            _convert(str, k, path): _convert(str, v, _join(path, str(k))) for k, v in value.items()
        }
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, path)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            names = ", ".join(repr(m.value) for m in hint)
            raise ConfigError(path, f"expected one of {names}, got {value!r}") from None
    return _scalar(hint, value, path)


def _scalar(hint: Any, value: object, path: str) -> object:
    # bool is an int subclass: a ``true`` must never pass as 1, nor 1 as ``true``.
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value  # type: ignore[arg-type]
    elif hint is str:
        ok = isinstance(value, str)
    else:  # pragma: no cover - a dataclass declared a type this loader does not support
        raise TypeError(f"{path}: unsupported field type {hint!r}")
    if not ok:
        raise ConfigError(path, f"expected {_NAMES[hint]}, got {_describe(value)}")
    return value


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path and name else path or name
