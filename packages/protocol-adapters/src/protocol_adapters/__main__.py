"""``protocol-adapters serve``: the adapter as its own service in front of an SGLang engine;
``protocol-adapters check-template``: the verdict on a chat template before serving it.

    protocol-adapters serve --engine-url http://gpu-node:30000 --checkpoint /ckpt/Qwen3-8B \\
        --port 8400 --admin-token-file /run/secrets/adapter-admin --admin-port 8401
    protocol-adapters serve ... --processes 4 --port 8410 --admin-port 8401  # ports 8410-8413
    protocol-adapters check-template /ckpt/Qwen3-8B          # or a .jinja file

Sessions are opened and closed over ``/admin/sessions`` on the admin port, with the admin token
(see ``_server/admin.py``); the agent-facing port has no session API. With ``--processes N``,
N complete adapters run in processes of their own behind that one admin API, which answers
each opened session with the ``base_url`` of the one serving it (``_fleet/``). The context
length is the engine's unless ``--context-tokens`` sets a smaller one. The chat template is
audited at start and refused unless the bridge serves it exactly or ``--template-mode`` says
how to serve it.
Everything here maps flags onto typed configuration; nothing reads the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from tokenizers import Tokenizer

from protocol_adapters._audit.audit import audit_source
from protocol_adapters._audit.verdict import TemplateMode, TemplateRefused, Verdict
from protocol_adapters._bridge.renderer import Renderer, RendererConfig
from protocol_adapters._checkpoint import (
    CheckpointError,
    chat_template_source,
    load_checkpoint,
)
from protocol_adapters._engine import SGLangConfig, SGLangEngine
from protocol_adapters._fleet import (
    Failed,
    FleetConfig,
    FleetError,
    Serving,
    WorkerPlan,
    WorkerTarget,
    die_with_parent,
    serve_fleet,
    watch_parent,
)
from protocol_adapters._parsing import ParserConfig, ToolCallFormat
from protocol_adapters._server.config import (
    AdapterConfig,
    AdminConfig,
    RolloutSampling,
    RoutingCapture,
)
from protocol_adapters._server.ports import reply_parsers
from protocol_adapters._server.runner import AdapterServer
from protocol_adapters._server.sessions import ContextTooLarge, SessionLimits
from protocol_adapters._template.template import ChatTemplate, TemplateError, qwen3_template
from protocol_adapters._tokenizer import Vocabulary
from protocol_adapters._tokenizer.qwen import QwenTokenizerConfig, load_qwen3_vocabulary
from protocol_adapters._types import AdapterError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="protocol-adapters", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the three dialects in front of an SGLang engine")
    serve.add_argument("--engine-url", required=True, help="SGLang server or router base URL")
    serve.add_argument(
        "--engine-max-connections",
        type=int,
        default=512,
        help="pooled connections to the engine (one per concurrently generating session)",
    )
    defaults = SGLangConfig("http://engine")
    serve.add_argument(
        "--engine-connect-timeout",
        type=float,
        default=defaults.connect_timeout,
        help="seconds to open a connection to the engine (counted while the event loop runs)",
    )
    serve.add_argument(
        "--engine-request-timeout",
        type=float,
        default=defaults.request_timeout,
        help="seconds for a whole generation, from sending it to its last token",
    )
    serve.add_argument(
        "--engine-stream-idle-timeout",
        type=float,
        default=defaults.stream_idle_timeout,
        help="longest gap in seconds between two streamed chunks of a generation",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--port", type=int, default=8400, help="with --processes N: worker i on port + i"
    )
    serve.add_argument(
        "--processes",
        type=int,
        default=None,
        metavar="N",
        help="N adapter processes behind one admin API (needs --admin-token-file); sessions "
        "are pinned to one by their id, the open answer gives its base_url",
    )
    vocab = serve.add_mutually_exclusive_group(required=True)
    vocab.add_argument(
        "--checkpoint",
        type=Path,
        help="the policy's Hugging Face checkpoint directory: tokenizer, chat template, special "
        "tokens and stop tokens (slime's --hf-checkpoint)",
    )
    vocab.add_argument("--tokenizer-json", type=Path, help="the policy's tokenizer.json")
    vocab.add_argument("--qwen3-cache", type=Path, help="build the Qwen3 tokenizer offline here")
    serve.add_argument(
        "--template-file",
        type=Path,
        help="Jinja chat template (default: the checkpoint's, or ours)",
    )
    _special_token_flags(serve)
    serve.add_argument(
        "--template-mode",
        choices=[m.value for m in TemplateMode],
        default=TemplateMode.EXACT.value,
        help="how to serve a template the bridge cannot reproduce exactly (see check-template); "
        "every turn records the mode",
    )
    serve.add_argument(
        "--tool-format", choices=[f.value for f in ToolCallFormat], default="hermes_json"
    )
    serve.add_argument(
        "--context-tokens",
        type=int,
        default=None,
        help="most tokens per call, prompt and reply (default: the engine's context length)",
    )
    serve.add_argument("--max-turns", type=int, default=SessionLimits().max_turns)
    serve.add_argument("--max-new-tokens", type=int, default=None)
    serve.add_argument("--temperature", type=float, default=1.0)
    serve.add_argument("--top-p", type=float, default=1.0)
    serve.add_argument("--client-sampling-wins", action="store_true")
    serve.add_argument("--check-rate", type=float, default=RendererConfig().check_sample_rate)
    serve.add_argument("--model", action="append", default=None, help="name(s) for /v1/models")
    serve.add_argument(
        "--admin-token-file", type=Path, help="file holding the admin API token (enables it)"
    )
    serve.add_argument(
        "--routed-experts",
        type=_routing_shape,
        default=None,
        metavar="LAYERSxTOPK",
        help="capture MoE routing for replay, e.g. 48x8 (the engine needs "
        "--enable-return-routed-experts; the admin API hands it out with ?routing=1)",
    )
    serve.add_argument("--admin-host", default="127.0.0.1", help="the admin API's own address")
    serve.add_argument("--admin-port", type=int, default=8401, help="the admin API's own port")
    check = sub.add_parser(
        "check-template",
        help="audit a chat template: can the bridge serve it exactly, and if not, why",
    )
    check.add_argument("path", type=Path, help="a Jinja template file or a checkpoint directory")
    _special_token_flags(check)
    return parser


def _special_token_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bos-token", help="the bos_token the template renders (default: the checkpoint's)"
    )
    parser.add_argument(
        "--eos-token",
        help="the eos_token the template renders; with --tokenizer-json also the token that ends "
        "a reply (default: the checkpoint's)",
    )


def _special_tokens(args: argparse.Namespace) -> dict[str, str]:
    flags = {"bos_token": args.bos_token, "eos_token": args.eos_token}
    return {name: value for name, value in flags.items() if value is not None}


def engine_config(args: argparse.Namespace) -> SGLangConfig:
    """The SGLang client's configuration from the ``serve`` flags."""
    return SGLangConfig(
        base_url=args.engine_url,
        connect_timeout=args.engine_connect_timeout,
        request_timeout=args.engine_request_timeout,
        stream_idle_timeout=args.engine_stream_idle_timeout,
        max_connections=args.engine_max_connections,
    )


def _policy(args: argparse.Namespace) -> tuple[Vocabulary, ChatTemplate]:
    """The tokenizer and the chat template the flags name, the template seeing the checkpoint's
    special tokens (``--bos-token`` / ``--eos-token`` win)."""
    special = _special_tokens(args)
    if args.checkpoint:
        checkpoint = load_checkpoint(args.checkpoint)
        vocabulary, template = checkpoint.vocabulary, checkpoint.template
    elif args.tokenizer_json:
        eos = special.get("eos_token")
        tokenizer = Tokenizer.from_file(str(args.tokenizer_json))
        name = args.tokenizer_json.parent.name or args.tokenizer_json.stem
        vocabulary = Vocabulary(tokenizer, name, (eos,)) if eos else Vocabulary(tokenizer, name)
        template = qwen3_template()
    else:
        vocabulary = load_qwen3_vocabulary(QwenTokenizerConfig(args.qwen3_cache))
        template = qwen3_template()
    variables = {**template.variables, **special}
    if args.template_file:
        source = args.template_file.read_text("utf-8")
        return vocabulary, ChatTemplate(args.template_file.stem, source, variables)
    return vocabulary, ChatTemplate(template.name, template.source, variables)


def _routing_shape(text: str) -> RoutingCapture:
    layers, x, topk = text.lower().partition("x")
    try:
        if not x:
            raise ValueError(text)
        return RoutingCapture(int(layers), int(topk))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LAYERSxTOPK with both at least 1 (e.g. 48x8), got {text!r}"
        ) from None


def _renderer(args: argparse.Namespace) -> tuple[Vocabulary, Renderer]:
    """Load the policy and audit its template (off the event loop: both take a while)."""
    vocabulary, template = _policy(args)
    config = RendererConfig(
        check_sample_rate=args.check_rate, mode=TemplateMode(args.template_mode)
    )
    return vocabulary, Renderer(vocabulary, template, config)


def _adapter_config(
    args: argparse.Namespace, admin: AdminConfig | None, host: str, port: int
) -> AdapterConfig:
    return AdapterConfig(
        host=host,
        port=port,
        models=tuple(args.model or ["policy"]),
        sampling=RolloutSampling(args.temperature, args.top_p, max_new_tokens=args.max_new_tokens),
        client_sampling_wins=args.client_sampling_wins,
        limits=SessionLimits(max_turns=args.max_turns, context_tokens=args.context_tokens),
        admin=admin,
        routing=args.routed_experts,
    )


def _admin(args: argparse.Namespace) -> AdminConfig | None:
    if not args.admin_token_file:
        return None
    return AdminConfig(args.admin_token_file.read_text().strip(), args.admin_host, args.admin_port)


def _stop_on(*signals: signal.Signals) -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _run_adapter(
    args: argparse.Namespace,
    sglang: SGLangConfig,
    config: AdapterConfig,
    stop: asyncio.Event,
    serving: Callable[[AdapterServer, int], None],
) -> None:
    """Serve one adapter until ``stop``; ``serving`` is told once it listens (with its context)."""
    vocabulary, renderer = await asyncio.to_thread(_renderer, args)
    parsers = reply_parsers(ParserConfig(tool_format=ToolCallFormat(args.tool_format)))
    async with (
        SGLangEngine(sglang) as engine,
        AdapterServer(config, engine, renderer, vocabulary, parsers) as server,
    ):
        serving(server, server.sessions.resolve_context(config.limits))
        await stop.wait()


async def _serve(args: argparse.Namespace, sglang: SGLangConfig) -> None:
    config = _adapter_config(args, _admin(args), args.host, args.port)
    stop = _stop_on(signal.SIGINT, signal.SIGTERM)

    def serving(server: AdapterServer, context: int) -> None:
        admin_note = (
            f"admin API on {server.admin_url}"
            if server.admin_url
            else "admin API off (no --admin-token-file)"
        )
        logging.getLogger("protocol_adapters").warning(
            "serving on %s; %s; context %d tokens", server.url, admin_note, context
        )

    await _run_adapter(args, sglang, config, stop, serving)


async def _serve_fleet(args: argparse.Namespace, sglang: SGLangConfig, fleet: FleetConfig) -> None:
    # Spawned workers unpickle their entry by its module's name, and under ``python -m`` this
    # module is ``__main__``, which spawn does not re-import: name it by its import name.
    here = importlib.import_module("protocol_adapters.__main__")
    target: WorkerTarget = functools.partial(here._fleet_worker, args, sglang)
    stop = _stop_on(signal.SIGINT, signal.SIGTERM)
    await serve_fleet(fleet, target, stop)


def _fleet_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> FleetConfig:
    """``--processes`` checked against the other flags (usage errors, status 2)."""
    if not args.admin_token_file:
        parser.error("--processes needs --admin-token-file: sessions are opened there")
    try:
        admin = _admin(args)
        assert admin is not None
        return FleetConfig(args.processes, args.host, args.port, admin)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))


def _fleet_worker(
    args: argparse.Namespace, sglang: SGLangConfig, plan: WorkerPlan, conn: Connection
) -> None:
    """One worker of ``--processes``: the adapter above, its admin API the fleet's internal one
    on loopback, reporting over ``conn``. SIGINT is the ``serve`` process's to handle (a
    terminal's Ctrl-C reaches the whole group); SIGTERM or the parent's end stops it."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s worker-{plan.index} %(name)s %(message)s"
    )

    async def run() -> None:
        stop = _stop_on(signal.SIGTERM)
        watch_parent(conn, stop.set)
        config = _adapter_config(args, plan.admin, plan.host, plan.port)

        def serving(server: AdapterServer, context: int) -> None:
            assert server.admin_url is not None
            conn.send(Serving(server.url, server.admin_url, context, os.getpid()))

        await _run_adapter(args, sglang, config, stop, serving)

    try:
        asyncio.run(run())
    except _START_ERRORS as exc:
        with contextlib.suppress(OSError):  # the parent may be gone already
            conn.send(Failed(str(exc)))
        sys.exit(1)


_START_ERRORS = (
    ContextTooLarge,
    AdapterError,
    TemplateRefused,
    TemplateError,
    CheckpointError,
    OSError,
)
"""What stops ``serve`` from starting, with a reason for the operator (exit status 1)."""

_ADVICE = {
    Verdict.BRIDGE_EXACT: "serve it as is",
    Verdict.BRIDGE_WITH_DEVIATION: "serve it with --template-mode accept-deviations (bridged, "
    "with the deviations above) or full-render",
    Verdict.FULL_RENDER_ONLY: "serve it with --template-mode full-render (every turn rendered "
    "in full)",
    Verdict.UNUSABLE: "it cannot be served",
}


def check_template(args: argparse.Namespace) -> int:
    """Print the audit of a template file or a checkpoint's template: 0 when the bridge serves
    it exactly, 1 when it needs a mode or cannot be served, 2 when it cannot be read."""
    path: Path = args.path
    try:
        if path.is_dir():
            found = chat_template_source(path)
            source, variables = found.text, {**found.special_tokens, **_special_tokens(args)}
        else:
            source, variables = path.read_text("utf-8"), _special_tokens(args)
    except (CheckpointError, OSError, UnicodeDecodeError) as exc:
        print(f"protocol-adapters: {exc}", file=sys.stderr)
        return 2
    audit = audit_source(path.name if path.is_dir() else path.stem, source, variables)
    print(audit.report())
    print(f"  -> {_ADVICE[audit.verdict]}")
    return 0 if audit.verdict is Verdict.BRIDGE_EXACT else 1


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "check-template":
        return check_template(args)
    try:
        sglang = engine_config(args)
    except ValueError as exc:
        parser.error(str(exc))
    fleet = None if args.processes is None else _fleet_config(args, parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(_serve(args, sglang) if fleet is None else _serve_fleet(args, sglang, fleet))
    except (*_START_ERRORS, FleetError) as exc:
        print(f"protocol-adapters: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
