"""What the app reads of the provenance slime-backend writes on every sample, in this one place.

slime-backend writes ``metadata["agent_rl"]`` and reads it through a typed reader beside its
writers, private to it. Publicly it offers two readers whose types say what the app needs most:
``EpisodeOutcome.from_sample`` (the final outcome: status, reason, reward, the app's artifacts)
and ``EpisodeHealth.from_sample`` (what the silent-failure gates read: trained tokens, tool
calls, refused routing). run.json and ``swe-rl check`` also show the episode's model calls and
the masked tokens of its samples, which no public type of slime-backend carries: those two are
read here by key, and nowhere else in the app (tests/test_provenance.py reads them back from
samples slime-backend's own writer made).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slime_backend import NAMESPACE, EpisodeHealth, EpisodeOutcome


@dataclass(frozen=True, slots=True)
class EpisodeFacts:
    """One episode, from its samples' provenance."""

    outcome: EpisodeOutcome
    """The final outcome (a graded episode left with nothing to train is aborted here)."""
    health: EpisodeHealth
    turns: int
    """Model calls the episode made, trained or not."""
    masked_tokens: int
    """Tokens of the episode's samples not trained, whatever the reason (none on the
    placeholder of an episode with nothing to train)."""


def episode_facts(samples: Sequence[Any]) -> EpisodeFacts:
    """The facts of the episode whose samples (at least one) slime-backend's generate function
    returned. Raises ``ValueError`` naming the key a sample's provenance lacks."""
    if not samples:
        raise ValueError("an episode has at least one sample")
    health = [EpisodeHealth.from_sample(sample) for sample in samples]  # each one whole
    return EpisodeFacts(
        outcome=EpisodeOutcome.from_sample(samples[0]),
        health=health[0],
        turns=_int(_value(samples[0], "episode", "turns"), _path("episode", "turns")),
        masked_tokens=sum(_masked_tokens(sample) for sample in samples),
    )


def _masked_tokens(sample: Any) -> int:
    record = sample.metadata[NAMESPACE]["sample"]  # a table: EpisodeHealth.from_sample read it
    if "placeholder" in record:  # an episode with nothing to train: its stand-in sample
        return 0
    where = _path("sample", "masked_tokens")
    counts = _value(sample, "sample", "masked_tokens")
    if not isinstance(counts, Mapping):
        raise ValueError(f"{where} is not a table")
    return sum(_int(n, f"{where}.{reason}") for reason, n in counts.items())


def _value(sample: Any, record: str, key: str) -> object:
    table = sample.metadata[NAMESPACE][record]  # a table: EpisodeHealth.from_sample read it
    if key not in table:
        raise ValueError(f"metadata[{NAMESPACE!r}].{record} has no {key!r}")
    value: object = table[key]
    return value


def _path(record: str, key: str) -> str:
    return f"metadata[{NAMESPACE!r}].{record}.{key}"


def _int(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} is {type(value).__name__} {value!r}, not an integer")
    return value
