"""The adapter inside a rollout process: started on the first episode, shared by all, closed once.

slime calls the generate function once per sample, concurrently, on one event loop per process
(its rollout process, or a Ray rollout worker). Each process gets one :class:`AdapterRuntime`:

- the checkpoint's tokenizer and chat template (``args.hf_checkpoint``), loaded once, off the
  loop;
- one SGLang client for slime's router (``args.sglang_router_ip/port``) behind an
  :class:`~slime_backend._engine_tap.EngineTap`;
- one adapter server per distinct rollout sampling (:mod:`slime_backend._sampling`): the rollout's
  settings win over the client's, and they are the adapter's configuration. A training run has
  one; an evaluation dataset with its own temperature gets its own listener, sharing the rest.
  With slime's routing replay on, every adapter captures MoE routing on every engine call
  (``RoutingCapture`` of the model's ``--num-layers`` x ``--moe-router-topk``).

Everything starts lazily under a lock, so concurrent first calls start it once. A start that
fails because the engine cannot be reached raises :class:`EngineUnavailable` (that episode is
aborted, the next call tries again); a configuration the engine or checkpoint refuses raises
:class:`~slime_backend.ConfigError`. :meth:`AdapterRuntime.aclose` stops the
servers (aborting what is still generating) and the client; it also runs at interpreter exit
when the loop is still alive in another thread, as slime's rollout loop is.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
from dataclasses import dataclass
from pathlib import Path

from protocol_adapters import (
    AdapterConfig,
    AdapterError,
    AdapterServer,
    Checkpoint,
    CheckpointError,
    ContextTooLarge,
    Renderer,
    RendererConfig,
    RolloutSampling,
    RoutingCapture,
    SessionLimits,
    SGLangConfig,
    SGLangEngine,
    TemplateRefused,
    load_checkpoint,
    reply_parsers,
)

from ._engine_tap import EngineTap
from ._rollout_args import RolloutArgs
from ._settings import BackendSettings
from ._typed_config import ConfigError

logger = logging.getLogger(__name__)

_EXIT_TIMEOUT = 10.0
"""How long interpreter exit waits for the adapter to close."""


class EngineUnavailable(RuntimeError):
    """slime's router could not be asked for its context length: no adapter could start."""


@dataclass(frozen=True, slots=True)
class RuntimeSetup:
    """Everything a process needs to start its adapter (plain data: it travels to Ray workers)."""

    args: RolloutArgs
    settings: BackendSettings


async def load_checkpoint_off_loop(path: str) -> Checkpoint:
    """The checkpoint's tokenizer and template; a bad directory is a config error."""
    try:
        return await asyncio.to_thread(load_checkpoint, Path(path))
    except CheckpointError as exc:
        raise ConfigError("args.hf_checkpoint", f"{exc} (slime's --hf-checkpoint)") from None


def engine_config(args: RolloutArgs, settings: BackendSettings) -> SGLangConfig:
    """The SGLang client for slime's router, with the adapter settings' pool and timeouts."""
    adapter = settings.adapter
    return SGLangConfig(
        base_url=args.router_url,
        connect_timeout=adapter.engine_connect_timeout,
        request_timeout=adapter.engine_request_timeout,
        stream_idle_timeout=adapter.engine_stream_idle_timeout,
        max_connections=adapter.engine_connections,
    )


class AdapterRuntime:
    """One process's adapter (see the module docstring)."""

    def __init__(self, setup: RuntimeSetup) -> None:
        self.setup = setup
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._checkpoint: Checkpoint | None = None
        self._engine: SGLangEngine | None = None
        self._tap: EngineTap | None = None
        self._servers: dict[RolloutSampling, AdapterServer] = {}

    @property
    def tap(self) -> EngineTap:
        if self._tap is None:
            raise RuntimeError("the adapter runtime has not started")
        return self._tap

    async def checkpoint(self) -> Checkpoint:
        self._check_loop()
        async with self._lock:
            if self._checkpoint is None:
                self._checkpoint = await load_checkpoint_off_loop(self.setup.args.hf_checkpoint)
            return self._checkpoint

    async def adapter(self, sampling: RolloutSampling) -> AdapterServer:
        """The running adapter for ``sampling``, started if needed."""
        checkpoint = await self.checkpoint()
        async with self._lock:
            server = self._servers.get(sampling)
            if server is None:
                server = await self._start(checkpoint, sampling)
                self._servers[sampling] = server
            return server

    async def _start(self, checkpoint: Checkpoint, sampling: RolloutSampling) -> AdapterServer:
        args, settings = self.setup.args, self.setup.settings
        if self._tap is None:
            self._engine = SGLangEngine(engine_config(args, settings))
            self._tap = EngineTap(self._engine)
            atexit.register(self._close_at_exit)
        replay = args.routing_replay
        config = AdapterConfig(
            host=settings.adapter.host,
            port=settings.adapter.port,
            sampling=sampling,
            client_sampling_wins=False,
            limits=SessionLimits(
                max_turns=settings.episode.max_turns, context_tokens=args.max_context_len
            ),
            routing=None if replay is None else RoutingCapture(replay.layers, replay.topk),
        )
        try:
            renderer = Renderer(
                checkpoint.vocabulary,
                checkpoint.template,
                RendererConfig(
                    check_sample_rate=settings.adapter.check_sample_rate,
                    mode=settings.adapter.template_mode,
                ),
            )
        except TemplateRefused as exc:
            raise ConfigError(
                "args.hf_checkpoint", f"{exc}\n(agent_rl.adapter.template_mode chooses the mode)"
            ) from None
        server = AdapterServer(
            config,
            self._tap,
            renderer,
            checkpoint.vocabulary,
            reply_parsers(args.parser_config()),
        )
        try:
            await server.start()
        except ContextTooLarge as exc:
            raise ConfigError(
                "args.rollout_max_context_len", f"{exc} (slime's --rollout-max-context-len)"
            ) from None
        except AdapterError as exc:
            raise EngineUnavailable(
                f"slime's router at {args.router_url} did not answer: {exc.message}"
            ) from None
        logger.info(
            "agent-rl adapter for %s at %s (sampling %s, context %d tokens)",
            checkpoint.directory,
            server.url,
            sampling,
            server.sessions.resolve_context(config.limits),
        )
        return server

    async def aclose(self) -> None:
        """Stop every adapter (in-flight generations are aborted) and the engine client."""
        async with self._lock:
            servers, self._servers = list(self._servers.values()), {}
            for server in servers:
                await server.stop()
            if self._engine is not None:
                await self._engine.aclose()
                self._engine = None
                self._tap = None
                atexit.unregister(self._close_at_exit)

    def _check_loop(self) -> None:
        """The runtime's sockets belong to the loop that started it."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            if not self._loop.is_closed():
                raise RuntimeError(
                    "the generate function is called from a second event loop while the first "
                    "still runs: its adapter belongs to the first"
                )
            self._loop = loop  # the old loop and everything on it are gone: start afresh
            self._lock = asyncio.Lock()
            self._checkpoint, self._engine, self._tap, self._servers = None, None, None, {}

    def _close_at_exit(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        future = asyncio.run_coroutine_threadsafe(self.aclose(), loop)
        try:
            future.result(_EXIT_TIMEOUT)
        except (concurrent.futures.TimeoutError, RuntimeError) as exc:
            logger.warning("agent-rl adapter did not close cleanly at exit: %r", exc)
