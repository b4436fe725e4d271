"""What every sample carries about where its tokens came from, as plain data, and its reader.

Stored under ``metadata["agent_rl"]`` next to the task payload, so a researcher holding one sample
from a slime rollout dump can answer: which session and turns is this, why is each untrained token
untrained, what did the episode generate that no sample trains, and how did tool calling go. Plain
dicts, lists, strings and numbers only: slime pickles samples across Ray and ``torch.save``s them.

The layout, written by the functions of this module and by nothing else::

    metadata["agent_rl"] = {
        "episode": episode_record(...),      # identical on each of the episode's samples
        "sample": sample_record(...),        # or placeholder_record(reason): nothing to train
        "gates": GateReport.as_dict(),       # record_batch_reports, by the gate hook
        "weight_versions": VersionMetrics.as_dict(),   # likewise
    }

Code of this package reads it through :func:`read_provenance` only (code outside it through
``EpisodeOutcome.from_sample`` and ``EpisodeHealth.from_sample``): frozen dataclasses with
exactly the fields written (:class:`Provenance`, :class:`EpisodeProvenance`,
:class:`SampleProvenance`, ...), and a :class:`ProvenanceError` naming the key a record lacks or
holds the wrong kind of value in. Keys a record has beyond those are ignored (a dump written by a
newer version still reads); the tests write each record with these writers and read it back,
field for field, so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from trajectory_tree import Linearization, Sample, SessionSummary, SessionTree

from ._episode import EpisodeOutcome, EpisodeStatus, JsonValue
from ._slime_api import NAMESPACE, SlimeSample
from ._staleness import STALE_REASON, StaleAction, WeightReport

if TYPE_CHECKING:
    from ._routing_replay import RoutingReplay

T = TypeVar("T")

# -- writers ------------------------------------------------------------------------------------


def episode_record(
    tree: SessionTree,
    linearization: Linearization,
    summary: SessionSummary,
    outcome: EpisodeOutcome,
    *,
    rollout_id: int,
    samples: int,
    trained_tokens: int,
    graded_status: EpisodeStatus,
    weights: WeightReport,
    routing: dict[str, JsonValue],
    rollout: Mapping[str, JsonValue],
) -> dict[str, JsonValue]:
    """Facts about the whole episode, identical on each of its samples (:class:`EpisodeProvenance`).

    ``samples`` and ``trained_tokens`` describe what slime gets (0 for an aborted episode, whatever
    its tree holds); the tool-call counts cover every recorded turn, trained or not. ``status``,
    ``reason`` and ``reward`` are the final outcome (a graded episode with nothing to train is
    ``aborted`` with its graded reward); ``graded_status`` is the app's own status. ``weights`` is
    the staleness policy's verdict, ``routing`` is :func:`routing_record`, ``rollout`` is what the
    generate function knows about the run of the episode (worker, engine failures, timing).
    """
    return {
        "session_id": tree.session_id,
        "rollout_id": rollout_id,
        "status": outcome.status.value,
        "reason": outcome.reason,
        "reward": outcome.reward,
        "samples": samples,
        "turns": summary.turns,
        "branches": summary.branches,
        "generated_tokens": summary.generated_tokens,
        "trained_tokens": trained_tokens,
        "tool_calls": summary.tool_calls,
        "malformed_tool_calls": summary.malformed_tool_calls,
        "aborted_turns": summary.aborted_turns,
        "rerendered_turns": summary.rerendered_turns,
        "excluded_tokens": {str(r): n for r, n in sorted(summary.excluded_tokens.items())},
        "exclusions": [
            {"turn": e.turn, "reason": str(e.reason), "tokens": e.tokens}
            for e in linearization.exclusions
        ],
        "artifacts": dict(outcome.artifacts),
        "graded_status": graded_status.value,
        "weights": weights_record(weights),
        "routing": routing,
        "rollout": dict(rollout),
    }


def weights_record(report: WeightReport) -> dict[str, JsonValue]:
    """The versions of the episode's trained turns and the staleness policy's decision
    (:class:`WeightsProvenance`)."""
    return {
        "versions": list(report.versions),
        "span": report.span,
        "max_version_span": report.policy.max_version_span,
        "action": report.policy.action.value,
        "exceeded": report.exceeded,
        "stale_turns": sorted(report.stale_turns),
        "masked_turns": sorted(report.masked_turns),
        "unversioned_turns": report.unversioned_turns,
    }


def routing_record(
    replay: RoutingReplay | None, refused: Sequence[tuple[Sample, str]]
) -> dict[str, JsonValue]:
    """Whether routing replay was on, its shape, and the samples refused for it with why
    (:class:`RoutingProvenance`); only ``{"replay": false}`` when it was off."""
    if replay is None:
        return {"replay": False}
    return {
        "replay": True,
        "layers": replay.layers,
        "topk": replay.topk,
        "refused": [
            {"position": sample.index, "leaf_turn": sample.leaf_turn, "reason": reason}
            for sample, reason in refused
        ],
    }


def sample_record(
    sample: Sample,
    *,
    truncated_by: str | None,
    stale_turns: frozenset[int] = frozenset(),
    stale_tokens: int = 0,
    versions: dict[str, JsonValue] | None = None,
) -> dict[str, JsonValue]:
    """Facts about one sample (:class:`SampleProvenance`): its branch, its turns, a reason count
    for every masked token (``stale_turns`` were generated here but masked by the staleness
    policy), and the weight versions of its trained tokens (:func:`versions_record`)."""
    trained = set(sample.trained_turns) - stale_turns
    context_turns = sorted(
        {s.turn for s in sample.spans if s.turn is not None and s.turn not in trained}
    )
    masked = {str(r): n for r, n in sample.masked_tokens().items()}
    if stale_tokens:
        masked[STALE_REASON] = stale_tokens
    return {
        "position": sample.index,
        "leaf_turn": sample.leaf_turn,
        "trained_turns": [t for t in sample.trained_turns if t in trained],
        "context_turns": context_turns,
        "stale_turns": sorted(stale_turns),
        "prompt_tokens": sample.prompt_length,
        "trained_tokens": sample.trained_tokens - stale_tokens,
        "masked_tokens": dict(sorted(masked.items())),
        "truncated_by": truncated_by,
        "versions": versions,
    }


def versions_record(versions: Sequence[str], report: WeightReport) -> dict[str, JsonValue] | None:
    """``oldest``, ``newest``, ``span`` (updates between them) and ``max_lag`` (updates from
    ``oldest`` to the episode's newest) of a sample's trained versions
    (:func:`slime_backend._sample_versions.trained_versions`); None if it has none
    (:class:`SampleVersions`)."""
    if not versions:
        return None
    oldest = min(versions, key=report.positions.__getitem__)
    newest = max(versions, key=report.positions.__getitem__)
    return {
        "oldest": oldest,
        "newest": newest,
        "span": report.positions[newest] - report.positions[oldest],
        "max_lag": report.lag(oldest),
        "runs": len(versions),
    }


def placeholder_record(reason: str) -> dict[str, JsonValue]:
    """The sample record of the placeholder an episode with nothing to train returns
    (:class:`PlaceholderProvenance`)."""
    return {"placeholder": reason}


def provenance_metadata(
    payload: Mapping[Any, Any] | None,
    episode: dict[str, JsonValue],
    sample: dict[str, JsonValue],
) -> dict[Any, Any]:
    """A sample's ``metadata``: the task payload verbatim plus the provenance (``episode`` is
    one object shared by the episode's samples)."""
    return {**(payload or {}), NAMESPACE: {"episode": episode, "sample": sample}}


def carries_provenance(sample: SlimeSample) -> bool:
    """The sample's metadata has our key (made by our generate function, or a payload that
    already uses the key)."""
    return NAMESPACE in (sample.metadata or {})


def record_conversion_time(sample: SlimeSample, seconds: float) -> None:
    """Time the episode's conversion into its rollout facts (shared by the episode's samples)."""
    rollout = sample.metadata[NAMESPACE]["episode"]["rollout"]
    rollout["convert_s"] = seconds


def record_batch_reports(
    sample: SlimeSample,
    *,
    gates: dict[str, JsonValue],
    weight_versions: dict[str, JsonValue],
) -> None:
    """The gate hook's report on the sample's rollout batch: the gates (``GateReport.as_dict``)
    and the batch's weight-version metrics (``VersionMetrics.as_dict``)."""
    sample.metadata[NAMESPACE]["gates"] = gates
    sample.metadata[NAMESPACE]["weight_versions"] = weight_versions


# -- the reader ---------------------------------------------------------------------------------


class ProvenanceError(ValueError):
    """A sample's provenance lacks a key, or holds the wrong kind of value in one; names it."""


@dataclass(frozen=True, slots=True)
class ExclusionProvenance:
    """Generated tokens of ``turn`` that no sample trains, and why (a trajectory-tree
    ``LossReason``)."""

    turn: int
    reason: str
    tokens: int

    @classmethod
    def read(cls, record: object, path: str) -> ExclusionProvenance:
        table = _table(record, path)
        return cls(
            turn=_int(table, "turn", path),
            reason=_str(table, "reason", path),
            tokens=_int(table, "tokens", path),
        )


@dataclass(frozen=True, slots=True)
class WeightsProvenance:
    """Written by :func:`weights_record`."""

    versions: tuple[str, ...]
    span: int
    max_version_span: int
    action: StaleAction
    exceeded: bool
    stale_turns: tuple[int, ...]
    masked_turns: tuple[int, ...]
    unversioned_turns: int

    @classmethod
    def read(cls, record: object, path: str) -> WeightsProvenance:
        table = _table(record, path)
        return cls(
            versions=_items(table, "versions", path, _as_str),
            span=_int(table, "span", path),
            max_version_span=_int(table, "max_version_span", path),
            action=_enum(StaleAction, table, "action", path),
            exceeded=_bool(table, "exceeded", path),
            stale_turns=_items(table, "stale_turns", path, _as_int),
            masked_turns=_items(table, "masked_turns", path, _as_int),
            unversioned_turns=_int(table, "unversioned_turns", path),
        )


@dataclass(frozen=True, slots=True)
class RefusalProvenance:
    """A sample refused for routing replay: its position, its leaf turn, and why."""

    position: int
    leaf_turn: int
    reason: str

    @classmethod
    def read(cls, record: object, path: str) -> RefusalProvenance:
        table = _table(record, path)
        return cls(
            position=_int(table, "position", path),
            leaf_turn=_int(table, "leaf_turn", path),
            reason=_str(table, "reason", path),
        )


@dataclass(frozen=True, slots=True)
class RoutingProvenance:
    """Written by :func:`routing_record`: with replay off, ``layers`` and ``topk`` are None and
    nothing is refused (the record holds only ``replay``)."""

    replay: bool
    layers: int | None = None
    topk: int | None = None
    refused: tuple[RefusalProvenance, ...] = ()

    @classmethod
    def read(cls, record: object, path: str) -> RoutingProvenance:
        table = _table(record, path)
        if not _bool(table, "replay", path):
            return cls(replay=False)
        refused = _value(table, "refused", path)
        return cls(
            replay=True,
            layers=_int(table, "layers", path),
            topk=_int(table, "topk", path),
            refused=tuple(
                RefusalProvenance.read(item, f"{path}.refused[{i}]")
                for i, item in enumerate(_list(refused, f"{path}.refused"))
            ),
        )


@dataclass(frozen=True, slots=True)
class EpisodeProvenance:
    """Written by :func:`episode_record`: the episode, identical on each of its samples."""

    session_id: str
    rollout_id: int
    status: EpisodeStatus
    reason: str
    reward: float
    samples: int
    turns: int
    branches: int
    generated_tokens: int
    trained_tokens: int
    tool_calls: int
    malformed_tool_calls: int
    aborted_turns: int
    rerendered_turns: int
    excluded_tokens: Mapping[str, int]
    exclusions: tuple[ExclusionProvenance, ...]
    artifacts: Mapping[str, JsonValue]
    graded_status: EpisodeStatus
    weights: WeightsProvenance
    routing: RoutingProvenance
    rollout: Mapping[str, JsonValue]

    @property
    def outcome(self) -> EpisodeOutcome:
        """The episode's final outcome, as the conversion recorded it."""
        return EpisodeOutcome(self.reward, self.status, self.reason, self.artifacts)

    @classmethod
    def read(cls, record: object, path: str) -> EpisodeProvenance:
        table = _table(record, path)
        exclusions = _list(_value(table, "exclusions", path), f"{path}.exclusions")
        return cls(
            session_id=_str(table, "session_id", path),
            rollout_id=_int(table, "rollout_id", path),
            status=_enum(EpisodeStatus, table, "status", path),
            reason=_str(table, "reason", path),
            reward=_float(table, "reward", path),
            samples=_int(table, "samples", path),
            turns=_int(table, "turns", path),
            branches=_int(table, "branches", path),
            generated_tokens=_int(table, "generated_tokens", path),
            trained_tokens=_int(table, "trained_tokens", path),
            tool_calls=_int(table, "tool_calls", path),
            malformed_tool_calls=_int(table, "malformed_tool_calls", path),
            aborted_turns=_int(table, "aborted_turns", path),
            rerendered_turns=_int(table, "rerendered_turns", path),
            excluded_tokens=_counts(table, "excluded_tokens", path),
            exclusions=tuple(
                ExclusionProvenance.read(item, f"{path}.exclusions[{i}]")
                for i, item in enumerate(exclusions)
            ),
            artifacts=_plain_table(table, "artifacts", path),
            graded_status=_enum(EpisodeStatus, table, "graded_status", path),
            weights=WeightsProvenance.read(_value(table, "weights", path), f"{path}.weights"),
            routing=RoutingProvenance.read(_value(table, "routing", path), f"{path}.routing"),
            rollout=_plain_table(table, "rollout", path),
        )


@dataclass(frozen=True, slots=True)
class SampleVersions:
    """Written by :func:`versions_record`: the weight versions of a sample's trained tokens."""

    oldest: str
    newest: str
    span: int
    max_lag: int
    runs: int

    @classmethod
    def read(cls, record: object, path: str) -> SampleVersions:
        table = _table(record, path)
        return cls(
            oldest=_str(table, "oldest", path),
            newest=_str(table, "newest", path),
            span=_int(table, "span", path),
            max_lag=_int(table, "max_lag", path),
            runs=_int(table, "runs", path),
        )


@dataclass(frozen=True, slots=True)
class SampleProvenance:
    """Written by :func:`sample_record`: one sample slime trains."""

    position: int
    leaf_turn: int
    trained_turns: tuple[int, ...]
    context_turns: tuple[int, ...]
    stale_turns: tuple[int, ...]
    prompt_tokens: int
    trained_tokens: int
    masked_tokens: Mapping[str, int]
    truncated_by: str | None
    versions: SampleVersions | None

    @classmethod
    def read(cls, record: object, path: str) -> SampleProvenance:
        table = _table(record, path)
        truncated_by = _value(table, "truncated_by", path)
        versions = _value(table, "versions", path)
        return cls(
            position=_int(table, "position", path),
            leaf_turn=_int(table, "leaf_turn", path),
            trained_turns=_items(table, "trained_turns", path, _as_int),
            context_turns=_items(table, "context_turns", path, _as_int),
            stale_turns=_items(table, "stale_turns", path, _as_int),
            prompt_tokens=_int(table, "prompt_tokens", path),
            trained_tokens=_int(table, "trained_tokens", path),
            masked_tokens=_counts(table, "masked_tokens", path),
            truncated_by=None
            if truncated_by is None
            else _as_str(truncated_by, f"{path}.truncated_by"),
            versions=None
            if versions is None
            else SampleVersions.read(versions, f"{path}.versions"),
        )


@dataclass(frozen=True, slots=True)
class PlaceholderProvenance:
    """Written by :func:`placeholder_record`: the sample an episode with nothing to train
    returns, slime trains nothing from it; ``reason`` is the episode's."""

    reason: str

    @classmethod
    def read(cls, record: object, path: str) -> PlaceholderProvenance:
        return cls(_str(_table(record, path), "placeholder", path))


@dataclass(frozen=True, slots=True)
class Provenance:
    """Everything under a sample's ``metadata["agent_rl"]``; ``gates`` and ``weight_versions``
    are None until the gate hook has seen the sample's batch."""

    episode: EpisodeProvenance
    sample: SampleProvenance | PlaceholderProvenance
    gates: Mapping[str, JsonValue] | None = None
    weight_versions: Mapping[str, JsonValue] | None = None


def read_provenance(sample: SlimeSample) -> Provenance:
    """The provenance our generate function wrote on ``sample``; raises
    :class:`ProvenanceError` naming the first key missing or holding the wrong kind of value."""
    return provenance_of(sample.metadata)


def provenance_of(metadata: object) -> Provenance:
    """:func:`read_provenance` from a sample's ``metadata`` (a dict, or one read back from a
    dump's JSON)."""
    path = f"metadata[{NAMESPACE!r}]"
    if not isinstance(metadata, Mapping) or NAMESPACE not in metadata:
        raise ProvenanceError(
            f"the sample carries no {path} (not made by slime_backend's generate function)"
        )
    table = _table(metadata[NAMESPACE], path)
    episode = EpisodeProvenance.read(_value(table, "episode", path), f"{path}.episode")
    record = _value(table, "sample", path)
    sample_path = f"{path}.sample"
    sample: SampleProvenance | PlaceholderProvenance
    if isinstance(record, Mapping) and "placeholder" in record:
        sample = PlaceholderProvenance.read(record, sample_path)
    else:
        sample = SampleProvenance.read(record, sample_path)
    gates, versions = table.get("gates"), table.get("weight_versions")
    return Provenance(
        episode=episode,
        sample=sample,
        gates=None if gates is None else _plain_table(table, "gates", path),
        weight_versions=None if versions is None else _plain_table(table, "weight_versions", path),
    )


def _value(table: Mapping[str, object], key: str, path: str) -> object:
    if key not in table:
        present = ", ".join(sorted(map(str, table))) or "none"
        raise ProvenanceError(f"{path} has no {key!r} (its keys: {present})")
    return table[key]


def _table(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ProvenanceError(f"{path} is {_describe(value)}, not a table")
    return value


def _list(value: object, path: str) -> Sequence[object]:
    if not isinstance(value, list | tuple):
        raise ProvenanceError(f"{path} is {_describe(value)}, not a list")
    return value


def _as_int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProvenanceError(f"{path} is {_describe(value)}, not an integer")
    return value


def _as_str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ProvenanceError(f"{path} is {_describe(value)}, not a string")
    return value


def _int(table: Mapping[str, object], key: str, path: str) -> int:
    return _as_int(_value(table, key, path), f"{path}.{key}")


def _str(table: Mapping[str, object], key: str, path: str) -> str:
    return _as_str(_value(table, key, path), f"{path}.{key}")


def _float(table: Mapping[str, object], key: str, path: str) -> float:
    value = _value(table, key, path)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProvenanceError(f"{path}.{key} is {_describe(value)}, not a number")
    return float(value)


def _bool(table: Mapping[str, object], key: str, path: str) -> bool:
    value = _value(table, key, path)
    if not isinstance(value, bool):
        raise ProvenanceError(f"{path}.{key} is {_describe(value)}, not true or false")
    return value


E = TypeVar("E", EpisodeStatus, StaleAction)


def _enum(kind: type[E], table: Mapping[str, object], key: str, path: str) -> E:
    value = _value(table, key, path)
    if isinstance(value, str) and value in {m.value for m in kind}:
        return kind(value)
    known = ", ".join(repr(m.value) for m in kind)
    raise ProvenanceError(f"{path}.{key} is {_describe(value)}, not one of {known}")


def _items(
    table: Mapping[str, object], key: str, path: str, item: Callable[[object, str], T]
) -> tuple[T, ...]:
    where = f"{path}.{key}"
    values = _list(_value(table, key, path), where)
    return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(values))


def _counts(table: Mapping[str, object], key: str, path: str) -> dict[str, int]:
    where = f"{path}.{key}"
    counts = _table(_value(table, key, path), where)
    return {_as_str(k, where): _as_int(n, f"{where}.{k}") for k, n in counts.items()}


def _plain_table(table: Mapping[str, object], key: str, path: str) -> dict[str, JsonValue]:
    """A table of plain data whose keys are not ours to type (the app's artifacts, the rollout
    facts, a report's ``as_dict``)."""
    where = f"{path}.{key}"
    items = _table(_value(table, key, path), where).items()
    return {_as_str(k, where): cast(JsonValue, v) for k, v in items}


def _describe(value: object) -> str:
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "a list"
    return f"{type(value).__name__} {value!r}"
