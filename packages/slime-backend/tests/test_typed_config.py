"""Untyped mappings into frozen dataclasses: every rejection names the field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import pytest

from slime_backend import (
    AdapterSession,
    Budgets,
    ConfigError,
    EpisodeOutcome,
    EpisodeStatus,
    FieldError,
    from_mapping,
    to_mapping,
)
from trajectory_tree import LengthMode


@dataclass(frozen=True)
class Inner:
    count: int
    ratio: float = 0.5

    def __post_init__(self) -> None:
        if self.count < 0:
            raise FieldError("count", "must not be negative")


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    mode: LengthMode = LengthMode.TRUNCATE
    kind: Literal["a", "b"] = "a"
    flag: bool = False
    ids: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    limit: int | None = None


def load(data: object) -> Outer:
    return from_mapping(Outer, data, "run")


def test_a_full_table_loads_with_its_types() -> None:
    outer = load(
        {
            "name": "x",
            "inner": {"count": 2, "ratio": 1},
            "mode": "drop",
            "kind": "b",
            "flag": True,
            "ids": [1, 2],
            "env": {"K": "v"},
            "limit": None,
        }
    )
    assert outer == Outer("x", Inner(2, 1.0), LengthMode.DROP, "b", True, (1, 2), {"K": "v"}, None)
    assert isinstance(outer.inner.ratio, float)
    assert from_mapping(Outer, to_mapping(outer), "run") == outer


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "run: expected a table, got a list"),
        ({"inner": {"count": 1}}, "run.name: required setting is missing"),
        ({"name": "x", "inner": {"count": 1}, "nme": 1}, "run.nme: unknown setting; known: env,"),
        ({"name": 1, "inner": {"count": 1}}, "run.name: expected a string, got int 1"),
        ({"name": "x", "inner": {"count": True}}, "run.inner.count: expected an integer, got bool"),
        ({"name": "x", "inner": {"count": 1.0}}, "run.inner.count: expected an integer, got float"),
        ({"name": "x", "inner": {"count": -1}}, "run.inner.count: must not be negative"),
        ({"name": "x", "inner": {"count": 1, "ratio": "1"}}, "run.inner.ratio: expected a number"),
        ({"name": "x", "inner": {"count": 1}, "flag": 1}, "run.flag: expected true or false"),
        ({"name": "x", "inner": {"count": 1}, "mode": "cut"}, "run.mode: expected one of 'trunc"),
        ({"name": "x", "inner": {"count": 1}, "kind": "c"}, "run.kind: expected one of 'a', 'b'"),
        ({"name": "x", "inner": {"count": 1}, "ids": [1, "2"]}, "run.ids[1]: expected an integer"),
        ({"name": "x", "inner": {"count": 1}, "ids": "12"}, "run.ids: expected a list"),
        ({"name": "x", "inner": {"count": 1}, "env": {"K": 1}}, "run.env.K: expected a string"),
        ({"name": "x", "inner": 3}, "run.inner: expected a table, got int 3"),
    ],
)
def test_each_rejection_starts_with_the_fields_path(data: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(data)
    assert str(raised.value).startswith(message)


# -- the episode contract's own checks ---------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Budgets(0, 10, 100, 10), "wall_clock_s: must be a positive number"),
        (lambda: Budgets(math.inf, 10, 100, 10), "wall_clock_s: must be a positive number"),
        (lambda: Budgets(1.0, 0, 100, 10), "max_turns: must be positive"),
        (lambda: EpisodeOutcome(math.nan), "reward: must be a finite number"),
        (lambda: EpisodeOutcome(0.0, EpisodeStatus.ABORTED), "reason: an aborted episode must"),
        (lambda: EpisodeOutcome(0.0, "lost"), "'lost' is not a valid EpisodeStatus"),  # type: ignore[arg-type]
    ],
)
def test_episode_values_are_checked(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


def test_an_outcome_accepts_plain_status_names() -> None:
    assert EpisodeOutcome(1.0, "truncated").status is EpisodeStatus.TRUNCATED  # type: ignore[arg-type]
    aborted = EpisodeOutcome.aborted("boot failed", attempts=3)
    assert (aborted.status, aborted.reward, aborted.artifacts) == (
        EpisodeStatus.ABORTED,
        0.0,
        {"attempts": 3},
    )


def test_the_session_token_never_appears_in_reprs() -> None:
    session = AdapterSession("http://127.0.0.1:8000", "sess-secret", "episode-1")
    assert "sess-secret" not in repr(session)
