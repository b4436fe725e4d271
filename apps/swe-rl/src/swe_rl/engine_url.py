"""`--engine-url`: an SGLang server's (or router's) address, checked and written one way.

slime names its router by host and port (`--sglang-router-ip`, `--sglang-router-port`) and
speaks plain HTTP to it, so the URL is `http://HOST:PORT`; a trailing slash, as a browser's
address bar leaves it, is dropped rather than carried into every request path.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import urlsplit


def engine_url(text: str) -> str:
    """`text` as `http://HOST:PORT`; anything else is refused saying what is wrong (an argparse
    type: the refusal is a usage error before the command does anything)."""
    example = "e.g. http://10.0.0.5:30000"
    parts = urlsplit(text.strip())
    if parts.scheme != "http" or not parts.netloc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http://HOST:PORT URL ({example}; slime speaks plain HTTP to "
            "its SGLang router)"
        )
    try:
        port = parts.port
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: the port is not a number ({example})"
        ) from None
    if port is None or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} names no host and port ({example})")
    if parts.path.strip("/") or parts.query or parts.fragment or parts.username:
        raise argparse.ArgumentTypeError(
            f"{text!r}: only the server's address, no path, query or credentials ({example})"
        )
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port}"


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """`--engine-url` and `--checkpoint`, the engine and what it serves, as every command that
    talks to a real engine takes them (`rollout`, `check`)."""
    parser.add_argument(
        "--engine-url",
        required=True,
        type=engine_url,
        metavar="URL",
        help="SGLang server (or router), e.g. http://10.0.0.5:30000",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        metavar="DIR",
        help="the Hugging Face checkpoint directory the engine serves "
        "(tokenizer and chat template)",
    )
