"""slime's ``--rollout-sample-filter-path`` hook: the silent-failure gates, once per rollout batch.

slime calls ``check_rollout_batch(args, data)`` in its default rollout function after the batch is
complete and *before* the batch is dumped (``--save-debug-rollout-data``) and logged, with ``data``
the batch as generated: a list of groups, each a list of generate results, each a sample or (ours)
a list of samples. Its return value is ignored. That placement is why the gates live here and not
in the reward hook: the report written into each sample's ``metadata["agent_rl"]["gates"]`` is in
the dump a researcher opens.

The same pass reports the batch's weight-version metrics (:mod:`slime_backend._version_metrics`)
in the log and in each sample's ``metadata["agent_rl"]["weight_versions"]``.

A tripped gate raises :class:`SilentFailureAlarm` out of slime's rollout function, which fails
the step and stops the run (``gates.fail_step``, on by default); with ``fail_step = false`` it is
an error in the log and a mark in the dump, and the step trains. Limits come from
``args.agent_rl["gates"]`` (the launcher's custom config, see :mod:`slime_backend._settings`); a
run wired without it fails loudly on the first batch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ._gates import EpisodeHealth, SilentFailureAlarm, evaluate_gates, health_of
from ._provenance import (
    SampleProvenance,
    carries_provenance,
    read_provenance,
    record_batch_reports,
)
from ._settings import BackendSettings
from ._slime_api import episode_key
from ._version_metrics import version_metrics

logger = logging.getLogger(__name__)


def check_rollout_batch(args: Any, data: list[Any]) -> None:
    """The hook slime calls; raises :class:`SilentFailureAlarm` when a gate trips, unless
    ``fail_step = false``."""
    config = BackendSettings.from_args(args).gates
    leaves = list(_leaves(data))
    samples = [s for s in leaves if carries_provenance(s)]
    if len(samples) < len(leaves):
        logger.warning(
            "agent-rl gates: %d of %d samples carry no agent-rl provenance and are not checked "
            "(not made by slime_backend's generate function)",
            len(leaves) - len(samples),
            len(leaves),
        )
    records = [(sample, read_provenance(sample)) for sample in samples]
    episodes: dict[int, EpisodeHealth] = {}
    for sample, provenance in records:
        episodes.setdefault(episode_key(sample), health_of(provenance.episode))
    versions = version_metrics(
        p.sample.versions for _, p in records if isinstance(p.sample, SampleProvenance)
    ).as_dict()
    logger.info("agent-rl weight versions of %d samples: %s", len(samples), versions)
    report = evaluate_gates(episodes.values(), config)
    marks = report.as_dict()
    for sample in samples:
        record_batch_reports(sample, gates=marks, weight_versions=versions)
    if report.tripped:
        logger.error(
            "agent-rl SILENT-FAILURE GATE TRIPPED (%d episodes): %s",
            len(episodes),
            report.describe(),
        )
        if config.fail_step:
            raise SilentFailureAlarm(report)
        logger.warning(
            "agent-rl gates: gates.fail_step = false, so this step trains anyway (the report is "
            "in every sample's metadata)"
        )
    else:
        logger.info("agent-rl gates passed for %d episodes: %s", len(episodes), marks)


def _leaves(node: Any) -> Iterator[Any]:
    """Every sample of a nested rollout batch (iteratively: depth is slime's to choose)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            yield item
