"""The generate function slime calls for every sample: one agent episode -> a list of samples.

The app makes it from its :class:`~slime_backend.Episode` and exposes it as a module
attribute, which slime loads with ``--custom-generate-function-path``::

    # swe_rl/rollout.py
    generate = make_generate(run_episode)

slime awaits ``generate(args, sample, sampling_params, evaluation=...)`` (the ``evaluation``
keyword is passed because the signature names it). Each call:

1. on the first call, refuses by name the slime features it cannot serve (a group reward model,
   partial rollout, a dynamic-sampling filter that does not handle lists of samples, our hooks
   missing, ...: :mod:`slime_backend._fan_out`), whatever launched slime; then reads the run's
   settings from ``args.agent_rl`` (the launcher's custom config) and the rest from slime's own
   ``args`` (:mod:`slime_backend._rollout_args`), and turns ``sampling_params`` into the
   adapter's sampling (:mod:`slime_backend._sampling`); a bad value raises one
   :class:`~slime_backend.ConfigError` naming it, before any episode runs;
2. runs the episode in this process (``workers.mode = "local"``, :mod:`slime_backend._runtime`)
   or on the least-loaded Ray rollout worker (``"ray"``, :mod:`slime_backend._ray_workers`),
   with ``sample.session_id`` as the engine's routing key (a fresh one for evaluation samples,
   which slime leaves without);
3. converts the session tree into samples off the event loop (a million-token episode takes
   ~0.1 s to convert), with the staleness policy applied to weight versions and, when slime
   replays routing (``--use-rollout-routing-replay``), each training sample's routing rows
   (evaluation samples are never trained: they carry none).

It always returns a non-empty ``list``: an aborted episode (whatever the fault) is one
``ABORTED`` placeholder whose metadata says why. An evaluation episode returns exactly one
sample (the branch holding its last turn): slime averages evaluation rewards over samples.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from protocol_adapters import Checkpoint
from trajectory_tree import RewardPolicy, SessionTree

from ._conversion import ConversionError, ConversionOptions, check_base, episode_samples
from ._episode import Episode, EpisodeOutcome, JsonValue
from ._episode_run import EpisodeReport, EpisodeRequest, aborted_report, run_episode
from ._fan_out import check_slime_args
from ._provenance import record_conversion_time
from ._ray_workers import RayWorkerPool
from ._rollout_args import RolloutArgs
from ._routing_replay import RoutingReplay
from ._runtime import AdapterRuntime, RuntimeSetup, load_checkpoint_off_loop
from ._sampling import rollout_sampling
from ._settings import BackendSettings
from ._slime_api import sample_class as slime_sample_class
from ._typed_config import ConfigError

logger = logging.getLogger(__name__)

LOCAL_WORKER = "local"


class SlimeGenerate:
    """The generate function (an async callable with slime's signature); see the module doc."""

    def __init__(self, episode: Episode, *, sample_class: type[Any] | None = None) -> None:
        self.episode = episode
        self._sample_class = sample_class
        self._setup: RuntimeSetup | None = None
        self._runtime: AdapterRuntime | None = None
        self._pool: RayWorkerPool | None = None
        self._checkpoint: Checkpoint | None = None
        self._checkpoint_lock: asyncio.Lock | None = None

    async def __call__(
        self,
        args: Any,
        sample: Any,
        sampling_params: dict[str, Any],
        evaluation: bool = False,
    ) -> list[Any]:
        started = time.perf_counter()
        setup = self._setup_for(args)
        check_base(sample)
        checkpoint = await self._checkpoint_for(setup)
        sampling = rollout_sampling(sampling_params, checkpoint.vocabulary.stop_ids)
        if sample.session_id is None:
            sample.session_id = f"eval-{uuid.uuid4()}" if evaluation else str(uuid.uuid4())
        request = EpisodeRequest(
            task=dict(sample.metadata or {}),
            session_id=sample.session_id,
            sampling=sampling,
            evaluation=evaluation,
        )
        report = await self._run(setup, request)
        options = setup.settings.conversion
        if evaluation:
            options = dataclasses.replace(options, reward_policy=RewardPolicy.FINAL_BRANCH)
        rollout = {**report.facts, "run_s": round(time.perf_counter() - started, 3)}
        replay = None if evaluation else setup.args.routing_replay
        return await asyncio.to_thread(
            self._samples, report, sample, options, checkpoint, rollout, replay
        )

    @property
    def pool(self) -> RayWorkerPool | None:
        """The Ray workers, once ``workers.mode = "ray"`` made them."""
        return self._pool

    async def aclose(self) -> None:
        """Stop the adapter (local) or the workers (Ray). The next call starts them again."""
        if self._runtime is not None:
            await self._runtime.aclose()
            self._runtime = None
        if self._pool is not None:
            await self._pool.aclose()
            self._pool = None

    # -- one call's pieces ---------------------------------------------------------------------

    def _setup_for(self, args: Any) -> RuntimeSetup:
        if self._setup is None:  # the first call (again after a refusal, which raises)
            check_slime_args(args)
        setup = RuntimeSetup(RolloutArgs.from_args(args), BackendSettings.from_args(args))
        if self._setup is not None and setup != self._setup:
            raise RuntimeError(
                "slime's args changed between generate calls; the adapter was built from the "
                "first ones (one adapter per process)"
            )
        self._setup = setup
        return setup

    async def _checkpoint_for(self, setup: RuntimeSetup) -> Checkpoint:
        """The checkpoint's tokenizer: stop ids for the sampling check, decoding responses."""
        if self._checkpoint_lock is None:
            self._checkpoint_lock = asyncio.Lock()
        async with self._checkpoint_lock:
            if self._checkpoint is None:
                if setup.settings.workers.mode == LOCAL_WORKER:
                    self._checkpoint = await self._local_runtime(setup).checkpoint()
                else:
                    self._checkpoint = await load_checkpoint_off_loop(setup.args.hf_checkpoint)
            return self._checkpoint

    def _local_runtime(self, setup: RuntimeSetup) -> AdapterRuntime:
        if self._runtime is None:
            self._runtime = AdapterRuntime(setup)
        return self._runtime

    async def _run(self, setup: RuntimeSetup, request: EpisodeRequest) -> EpisodeReport:
        try:
            if setup.settings.workers.mode == LOCAL_WORKER:
                runtime = self._local_runtime(setup)
                return await run_episode(runtime, self.episode, request, worker=LOCAL_WORKER)
            if self._pool is None:
                self._pool = RayWorkerPool(self.episode, setup, setup.settings.workers)
            return await self._pool.run(request)
        except ConfigError:
            raise
        except Exception as exc:  # ours, not the episode's: still only this episode fails
            logger.exception("agent-rl generate failed for %s", request.session_id)
            return aborted_report(
                request.session_id, f"the rollout machinery failed: {type(exc).__name__}: {exc}"
            )

    def _samples(
        self,
        report: EpisodeReport,
        sample: Any,
        options: ConversionOptions,
        checkpoint: Checkpoint,
        rollout: Mapping[str, JsonValue],
        replay: RoutingReplay | None,
    ) -> list[Any]:
        cls = self._sample_class or slime_sample_class()
        decode = checkpoint.vocabulary.decode
        started = time.perf_counter()
        try:
            samples = episode_samples(
                report.tree,
                sample,
                report.outcome,
                options,
                sample_class=cls,
                decode=decode,
                rollout=rollout,
                replay=replay,
            )
        except ConversionError as exc:
            logger.error("agent-rl episode %s not convertible: %s", sample.session_id, exc)
            outcome = EpisodeOutcome.aborted(f"the episode's samples are not valid: {exc}")
            samples = episode_samples(
                SessionTree(sample.session_id),
                sample,
                outcome,
                options,
                sample_class=cls,
                rollout=rollout,
                replay=replay,
            )
        # One record object is shared by the episode's samples: time the conversion into it.
        record_conversion_time(samples[0], round(time.perf_counter() - started, 4))
        return samples


def make_generate(episode: Episode, *, sample_class: type[Any] | None = None) -> SlimeGenerate:
    """slime's generate function running ``episode``; ``sample_class`` defaults to slime's
    ``Sample`` (tests pass :class:`slime_backend.testing.StandInSample`)."""
    return SlimeGenerate(episode, sample_class=sample_class)
