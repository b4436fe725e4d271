"""Samples carrying slime-backend's provenance, for runs whose sample source is a test's."""

from __future__ import annotations

from typing import Any

from slime_backend import NAMESPACE, ConversionOptions, EpisodeOutcome, episode_samples
from slime_backend.testing import StandInSample
from swe_rl.run import PlannedEpisode
from trajectory_tree import SessionTree


def provenance_sample(
    episode: PlannedEpisode, outcome: EpisodeOutcome, **facts: Any
) -> StandInSample:
    """The sample slime-backend's own writer makes for ``episode`` (a session without turns: a
    placeholder), recorded with ``outcome``'s status and reason as if the episode had run, and
    ``facts`` set over its episode record: keys the writer wrote, so a renamed one fails here."""
    sample: StandInSample
    (sample,) = episode_samples(
        SessionTree(episode.episode_id),
        StandInSample(index=episode.index, group_index=episode.group),
        outcome,
        ConversionOptions(),
        sample_class=StandInSample,
    )
    record: dict[str, Any] = sample.metadata[NAMESPACE]["episode"]
    unknown = sorted(set(facts) - set(record))
    assert not unknown, f"not keys of slime-backend's episode record: {unknown}"
    record.update(status=outcome.status.value, reason=outcome.reason, **facts)
    return sample
