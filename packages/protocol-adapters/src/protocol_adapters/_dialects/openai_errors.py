"""The OpenAI error shape, shared by Chat Completions and Responses.

``{"error": {"message", "type", "param", "code"}}``. Codes are the ones OpenAI clients branch
on: Codex treats ``context_length_exceeded`` as a context-window failure and
``rate_limit_exceeded`` as retryable.
"""

from __future__ import annotations

from protocol_adapters._types import ErrorKind

# kind -> (HTTP status, error type, error code)
_ERRORS: dict[ErrorKind, tuple[int, str, str | None]] = {
    ErrorKind.INVALID_REQUEST: (400, "invalid_request_error", None),
    ErrorKind.CONTEXT_LENGTH: (400, "invalid_request_error", "context_length_exceeded"),
    ErrorKind.AUTHENTICATION: (401, "invalid_request_error", "invalid_api_key"),
    ErrorKind.NOT_FOUND: (404, "invalid_request_error", "not_found"),
    ErrorKind.REQUEST_TOO_LARGE: (413, "invalid_request_error", "request_too_large"),
    ErrorKind.RATE_LIMITED: (429, "rate_limit_error", "rate_limit_exceeded"),
    ErrorKind.ENGINE_ERROR: (500, "server_error", "server_error"),
    ErrorKind.OVERLOADED: (503, "server_error", "server_overloaded"),
    ErrorKind.TIMEOUT: (504, "server_error", "timeout"),
}


def openai_error(
    kind: ErrorKind, message: str, param: str | None, *, context_param: str
) -> tuple[int, dict[str, object]]:
    """HTTP status and ``{"error": ...}`` body; ``param`` names the offending request field
    (a context-length error always names ``context_param``, where the prompt is)."""
    status, error_type, code = _ERRORS[kind]
    if kind is ErrorKind.CONTEXT_LENGTH:
        param = context_param
    error = {"message": message, "type": error_type, "param": param, "code": code}
    return status, {"error": error}


def error_code(kind: ErrorKind) -> str | None:
    return _ERRORS[kind][2]
