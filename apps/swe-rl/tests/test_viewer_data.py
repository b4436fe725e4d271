"""The viewer's data, checked without a browser: what the page embeds is exactly what was
recorded and linearized, bad input is refused with the field that is wrong (or, for one
episode's files, shown as that episode's error), and nothing embedded can end its script."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol_adapters import Vocabulary
from slime_backend import (
    ConversionOptions,
    EpisodeHealth,
    EpisodeStatus,
    GateConfig,
    evaluate_gates,
)
from swe_rl.grading import Verdict
from swe_rl.viewer import RunDirError, write_viewer
from swe_rl.viewer.branches import layout
from swe_rl.viewer.embed import script_json
from swe_rl.viewer.episode_view import _flags
from swe_rl.viewer.legend import REASONS
from trajectory_tree import LossReason, RewardPolicy, assign_reward, dumps, linearize

from .test_viewer_kit import (
    CONFTEST_WHY,
    GRADING,
    INJECTED,
    INJECTED_PATH,
    SUB_AGENT,
    RecordedRun,
    record_run,
)

ASSETS = resources.files("swe_rl.viewer") / "assets"


@pytest.fixture(scope="module")
def recorded(qwen_vocabulary: Vocabulary, tmp_path_factory: pytest.TempPathFactory) -> RecordedRun:
    return record_run(tmp_path_factory.mktemp("run"), qwen_vocabulary)


@pytest.fixture
def decode(qwen_vocabulary: Vocabulary) -> Callable[[int], str]:
    return lambda token: qwen_vocabulary.decode([token])


class Blocks(HTMLParser):
    """The page's script elements: JSON blocks by id, and how many script elements there are."""

    def __init__(self) -> None:
        super().__init__()
        self.json: dict[str, Any] = {}
        self.scripts = 0
        self._current: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts += 1
            found = dict(attrs)
            if found.get("type") == "application/json":
                self._current = found["id"]

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self.json[self._current] = json.loads(data)
            self._current = None


def blocks(page: Path) -> Blocks:
    parser = Blocks()
    parser.feed(page.read_text(encoding="ascii"))
    return parser


def copy_run(recorded: RecordedRun, target: Path) -> Path:
    for path in recorded.directory.rglob("*"):
        if path.is_file() and path.name != "viewer.html":
            destination = target / path.relative_to(recorded.directory)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(path.read_bytes())
    return target


def edit_run(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads((run / "run.json").read_text())
    change(data)
    (run / "run.json").write_text(json.dumps(data))


def test_every_sample_in_the_page_is_the_linearized_sample_token_for_token(
    recorded: RecordedRun, decode: Callable[[int], str]
) -> None:
    page = blocks(write_viewer(recorded.directory, decode))
    cards = page.json["run-data"]["episodes"]
    assert [c["episode_id"] for c in cards] == ["ep-rich", "ep-short", "ep-aborted", "ep-broken"]
    for number, card in enumerate(cards[:3]):
        tree = recorded.trees[card["episode_id"]]
        shown = page.json[f"episode-{number}"]
        lin = linearize(tree)
        assert len(shown["samples"]) == len(lin.samples) > 0
        for sample, expected in zip(shown["samples"], lin.samples, strict=True):
            # The page rebuilds a sample from its branch's node tokens: do the same here.
            tokens = [t for node in sample["path"] for t in shown["nodes"][node]["tokens"]]
            assert tokens[: sample["length"]] == expected.tokens.tolist()
            assert sample["spans"] == [
                [s.start, s.end, str(s.reason), s.node, s.turn] for s in expected.spans
            ]
            logprobs = [0.0] * sample["length"]
            for start, end, _, _, turn in sample["spans"]:
                if turn is not None:
                    logprobs[start:end] = shown["turns"][turn]["logprobs"][: end - start]
            assert logprobs == expected.logprobs.tolist()
        for token, text in shown["tokens"].items():
            assert text == decode(int(token))
        assert {int(t) for t in shown["tokens"]} == {
            t for node in tree.nodes if node.delta is not None for t in node.delta
        }


def test_the_page_shows_the_samples_the_run_trained_with_its_conversion_options(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    run = copy_run(recorded, tmp_path)
    tree = recorded.trees["ep-rich"]
    options = ConversionOptions(max_sample_tokens=300)
    shown = blocks(write_viewer(run, decode, options=options)).json["episode-0"]
    expected = linearize(tree, limit=options.limit)
    assert [s["length"] for s in shown["samples"]] == [len(s.tokens) for s in expected.samples]
    assert any(s["truncated"] for s in shown["samples"])
    over = [e for e in shown["exclusions"] if e["reason"] == "over_length"]
    assert over
    assert all(s["length"] <= 300 for s in shown["samples"])

    final = ConversionOptions(reward_policy=RewardPolicy.FINAL_BRANCH)
    shown = blocks(write_viewer(run, decode, options=final)).json["episode-0"]
    expected = assign_reward(linearize(tree), 1.0, rollout_id="x", policy=final.reward_policy)
    assert len(shown["samples"]) == 1
    assert shown["samples"][0]["spans"][-1][2] == "generated"
    assert shown["samples"][0]["trained_turns"] == list(expected.samples[0].trained_turns)


def test_each_turn_says_where_it_is_trained_or_why_not(
    recorded: RecordedRun, decode: Callable[[int], str]
) -> None:
    turns = blocks(write_viewer(recorded.directory, decode)).json["episode-0"]["turns"]
    tree = recorded.trees["ep-rich"]
    aborted, abandoned = turns[4], turns[6]
    assert aborted["finish"] == "abort"
    assert aborted["excluded"] == [["aborted", tree.turns[4].output_length]]
    assert abandoned["excluded"] == [["abandoned_retry", tree.turns[6].output_length]]
    assert aborted["trained_in"] is None
    assert abandoned["trained_in"] is None
    assert [t["trained_in"] for t in turns if not t["excluded"]] == [1, 1, 0, 0, 1, 1, 1, 2]
    assert turns[2]["agent"] == turns[3]["agent"] == SUB_AGENT
    assert turns[5]["retry_count"] == 1
    # Tool results are found under each reply, on whichever branch holds them.
    cat_result = tree.node(turns[0]["results"][tree.turns[0].reply.tool_calls[0].id]).message
    assert cat_result is not None
    assert INJECTED in cat_result.plain_text
    assert turns[8]["results"] == {}  # the summary calls no tool


def test_the_branch_layout_follows_the_lineage_the_client_kept(recorded: RecordedRun) -> None:
    places = layout(recorded.trees["ep-rich"])
    main = [t for t, p in enumerate(places) if p.lane == places[0].lane]
    assert main[:5] == [0, 1, 5, 7, 8], "the retry and the edit continue the main row"
    assert [p.parent for p in places] == [None, 0, None, 2, 1, 1, 5, 5, 7, None]
    assert [p.start for p in places] == [
        "main agent",
        None,
        f"sub-agent {SUB_AGENT}",
        None,
        "same prompt as turn 5",
        None,
        "same prompt as turn 7",
        None,
        None,
        "new history",
    ]
    assert len({p.lane for p in places}) <= 3


def test_cards_carry_outcome_accounting_and_the_gates_each_episode_trips(
    recorded: RecordedRun, decode: Callable[[int], str]
) -> None:
    index = blocks(write_viewer(recorded.directory, decode)).json["run-data"]
    rich, short, aborted, broken = index["episodes"]
    assert (rich["reward"], rich["advantage"], rich["status"]) == (1.0, 0.87, "completed")
    lin = linearize(recorded.trees["ep-rich"])
    assert rich["stats"]["trained_tokens"] == sum(s.trained_tokens for s in lin.samples)
    assert rich["stats"]["excluded_tokens"] == {
        str(k): v for k, v in sorted(lin.excluded_tokens().items())
    }
    assert rich["flags"] == []
    assert short["flags"] == []
    # An aborted episode trains nothing, whatever its tree holds.
    assert aborted["stats"]["trained_tokens"] == 0
    assert aborted["advantage"] is None
    assert [f["gate"] for f in aborted["flags"]] == ["zero_trainable", "aborts"]
    assert "tree.json" in broken["error"]
    assert broken["stats"] is None
    assert [f["gate"] for f in broken["flags"]] == ["zero_trainable"]
    assert index["alarms"][0]["gate"] == "zero_trainable"


def interrupted_run(recorded: RecordedRun, target: Path) -> Path:
    """The recorded run as an interrupt leaves it (swe_rl.run): marked interrupted, two more
    episodes stopped before they finished (no directory, nothing recorded), no alarm."""
    run = copy_run(recorded, target)

    def interrupt(data: dict[str, Any]) -> None:
        data["interrupted"] = True
        data["alarms"] = []
        for number in (1, 2):
            data["episodes"].append(
                {
                    "episode_id": f"ep-stopped-{number}",
                    "instance_id": "calc__sub-2",
                    "group": 1,
                    "reward": 0.0,
                    "advantage": None,
                    "status": "aborted",
                    "reason": "interrupted",
                    "dir": "",
                }
            )

    edit_run(run, interrupt)
    return run


def test_an_interrupted_run_says_so_and_its_stopped_episodes_trip_no_gate(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    index = blocks(write_viewer(interrupted_run(recorded, tmp_path / "run"), decode)).json[
        "run-data"
    ]
    assert index["interrupted"] is True
    assert index["alarms"] == []
    *finished, first, second = index["episodes"]
    for card in (first, second):
        assert card["stopped"] is True
        assert (card["status"], card["reason"]) == ("aborted", "interrupted")
        assert card["flags"] == []  # not "trains no token": nothing ran to an outcome
        assert card["error"] is None  # no directory is no fault of a stopped episode
        assert card["stats"] is None
    assert [card["stopped"] for card in finished] == [False] * 4
    # A run that was not interrupted says so too (older run.json files have no key).
    plain = blocks(write_viewer(recorded.directory, decode)).json["run-data"]
    assert plain["interrupted"] is False


def test_an_aborted_episode_that_says_interrupted_but_has_files_is_shown_as_recorded(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    run = copy_run(recorded, tmp_path / "run")

    def relabel(data: dict[str, Any]) -> None:
        data["episodes"][2]["reason"] = "interrupted"  # ep-aborted, whose tree is on disk

    edit_run(run, relabel)
    card = blocks(write_viewer(run, decode)).json["run-data"]["episodes"][2]
    assert card["stopped"] is True
    assert card["stats"] is not None  # its tree is shown, greyed: it trains nothing
    assert [f["gate"] for f in card["flags"]] == ["zero_trainable", "aborts"]


def test_the_legend_says_what_the_masked_context_is() -> None:
    context = REASONS[LossReason.CONTEXT].description
    assert "system prompt" in context
    assert "tool schemas" in context
    assert "never trained" in context


GRADING_KEYS = {"verdict", "reason", "timed_out", "refused_paths", "tests", "tests_passing"}


def test_each_card_carries_the_grading_run_json_recorded(
    recorded: RecordedRun, decode: Callable[[int], str]
) -> None:
    index = blocks(write_viewer(recorded.directory, decode)).json["run-data"]
    rich, short, aborted, broken = index["episodes"]
    for card in (rich, short, broken):
        written = GRADING[card["episode_id"]]
        assert set(written) > GRADING_KEYS  # grading writes more than the viewer reads ...
        assert card["grading"] == {k: written[k] for k in GRADING_KEYS}  # ... which is ignored
    assert rich["grading"]["verdict"] == "resolved"
    assert rich["grading"]["refused_paths"] == {"conftest.py": CONFTEST_WHY}
    assert short["grading"]["tests"] == {
        "tests/test_calc.py::test_add": "failed",
        f"tests/test_calc.py::test_name[{INJECTED}]": "missing",
    }
    assert short["grading"]["tests_passing"] == 4
    assert short["grading"]["refused_paths"][INJECTED_PATH] == "a test file the grader restores"
    assert (broken["grading"]["verdict"], broken["grading"]["timed_out"]) == (
        "tests_timed_out",
        True,
    )
    assert aborted["grading"] is None  # not graded: run.json has no grading for it


def test_a_run_without_grading_is_shown_as_before(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    run = copy_run(recorded, tmp_path / "run")
    before = blocks(write_viewer(run, decode)).json["run-data"]["episodes"]

    def strip(data: dict[str, Any]) -> None:
        for episode in data["episodes"]:
            episode.pop("grading", None)

    edit_run(run, strip)
    after = blocks(write_viewer(run, decode)).json["run-data"]["episodes"]
    assert [c["grading"] for c in after] == [None] * 4
    for card in (*before, *after):
        card.pop("grading")
    assert after == before


def test_unknown_keys_in_grading_are_ignored_and_bad_ones_refused(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    run = copy_run(recorded, tmp_path / "run")

    def add(data: dict[str, Any]) -> None:
        data["episodes"][0]["grading"]["judge"] = {"model": "a newer grader", "score": [1, 2]}
        data["episodes"][2]["grading"] = {"verdict": "no_report", "future_flag": True}

    edit_run(run, add)
    cards = blocks(write_viewer(run, decode)).json["run-data"]["episodes"]
    assert cards[0]["grading"] == {k: GRADING["ep-rich"][k] for k in GRADING_KEYS}
    assert cards[2]["grading"] == {
        "verdict": "no_report",
        "reason": "",
        "timed_out": False,
        "refused_paths": {},
        "tests": {},
        "tests_passing": 0,
    }
    cases: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (
            lambda d: d["episodes"][0]["grading"].update(tests_passing="many"),
            r"episodes\[0\]\.grading\.tests_passing: expected an integer",
        ),
        (
            lambda d: d["episodes"][1]["grading"]["refused_paths"].update({"x.py": 3}),
            r"episodes\[1\]\.grading\.refused_paths\.x\.py: expected a string",
        ),
        (
            lambda d: d["episodes"][0].update(grading=["resolved"]),
            r"episodes\[0\]\.grading: expected",
        ),
    ]
    original = (run / "run.json").read_text()
    for change, message in cases:
        (run / "run.json").write_text(original)
        edit_run(run, change)
        with pytest.raises(RunDirError, match=message):
            write_viewer(run, decode)


def test_the_page_has_words_for_every_verdict() -> None:
    js = (ASSETS / "viewer.js").read_text(encoding="ascii")
    for verdict in Verdict:
        assert f'["{verdict}", "{verdict.replace("_", " ")}", ' in js, verdict


def test_flag_names_are_the_gate_names() -> None:
    """The page links each episode's flags to the run's alarms by gate name: every gate has a
    flag, and every flag is a gate."""
    episodes = [
        EpisodeHealth(EpisodeStatus.COMPLETED, 0, 0, 3),
        EpisodeHealth(EpisodeStatus.ABORTED, 0, 0, 0, "environment: the image is gone"),
        EpisodeHealth(
            EpisodeStatus.ABORTED, 0, 0, 0, "nothing_trainable: length_drop: past the limit"
        ),
        EpisodeHealth(EpisodeStatus.COMPLETED, 10, 2, 0, routing_refused=1),
    ]
    report = evaluate_gates(episodes, GateConfig())
    gates = {r.name for r in report.results}
    assert gates == {
        "zero_trainable",
        "zero_tool_calls",
        "tool_call_parse_failures",
        "aborts",
        "environment_aborts",
        "length_drops",
        "routing_missing",
    }
    assert {f["gate"] for e in episodes for f in _flags(e)} == gates


def test_a_bad_run_index_is_refused_naming_the_field(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    with pytest.raises(RunDirError, match="no such file"):
        write_viewer(tmp_path, decode)
    run = copy_run(recorded, tmp_path / "run")
    cases: list[tuple[Callable[[dict[str, Any]], None], str]] = [
        (
            lambda d: d["episodes"][1].update(reward="high"),
            r"episodes\[1\]\.reward: expected a number",
        ),
        (
            lambda d: d["episodes"][0].update(reward=math.nan),
            r"episodes\[0\]\.reward: must be a finite",
        ),
        (
            lambda d: d["episodes"][2].update(status="lost"),
            r"episodes\[2\]\.status: expected one of",
        ),
        (
            lambda d: d["episodes"][0].update(group=True),
            r"episodes\[0\]\.group: expected an integer",
        ),
        (lambda d: d["alarms"][0].pop("gate"), r"alarms\[0\]\.gate: required"),
        (lambda d: d.update(episodes={}), r"episodes: expected a list"),
    ]
    original = (run / "run.json").read_text()
    for change, message in cases:
        (run / "run.json").write_text(original)
        edit_run(run, change)
        with pytest.raises(RunDirError, match=message):
            write_viewer(run, decode)
        assert not (run / "viewer.html").exists()
    (run / "run.json").write_text("{not json")
    with pytest.raises(RunDirError, match="not readable as JSON"):
        write_viewer(run, decode)


def test_unknown_keys_are_ignored_and_a_dir_outside_the_run_is_refused_for_its_episode(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    run = copy_run(recorded, tmp_path / "run")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "diff.patch").write_text("not for the page")

    def change(data: dict[str, Any]) -> None:
        data["created_by"] = "a newer writer"
        data["episodes"][0]["wall_clock_s"] = 12.5
        data["episodes"][1]["dir"] = "../secret"
        data["episodes"][2]["dir"] = str(tmp_path / "secret")
        data["episodes"][3]["dir"] = ""

    edit_run(run, change)
    page = blocks(write_viewer(run, decode))
    cards = page.json["run-data"]["episodes"]
    assert cards[0]["error"] is None
    assert cards[0]["stats"] is not None
    for number in (1, 2):
        assert "not a directory inside the run" in cards[number]["error"]
        assert page.json[f"episode-{number}"] == {"artifacts": {}}
    assert "records no directory" in cards[3]["error"]
    assert "not for the page" not in (run / "viewer.html").read_text()


def test_one_unreadable_episode_never_takes_the_page_down(
    recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    run = copy_run(recorded, tmp_path / "run")
    tree = json.loads(dumps(recorded.trees["ep-short"]))
    tree["nodes"][3]["turn"]["meta"]["started_at"] = math.inf  # JSON cannot carry it
    (run / "episodes" / "ep-short" / "tree.json").write_text(json.dumps(tree))
    (run / "episodes" / "ep-aborted" / "tree.json").unlink()
    cards = blocks(write_viewer(run, decode)).json["run-data"]["episodes"]
    assert cards[0]["error"] is None
    assert "cannot embed" in cards[1]["error"]
    assert "missing" in cards[2]["error"]

    not_text = blocks(write_viewer(run, lambda token: token)).json["run-data"]  # type: ignore[arg-type,return-value]
    assert "returned int, not text" in not_text["episodes"][0]["error"]


def test_a_failing_decode_leaves_no_half_written_page(
    recorded: RecordedRun, tmp_path: Path
) -> None:
    run = copy_run(recorded, tmp_path / "run")

    def broken(token: int) -> str:
        raise KeyError(token)

    with pytest.raises(KeyError):
        write_viewer(run, broken)
    assert sorted(p.name for p in run.iterdir()) == ["episodes", "run.json"]


def test_model_output_cannot_end_its_script_element(
    recorded: RecordedRun, decode: Callable[[int], str]
) -> None:
    page_path = write_viewer(recorded.directory, decode)
    text = page_path.read_text(encoding="ascii")
    parsed = blocks(page_path)
    assert text.lower().count("</script") == parsed.scripts == 4 + 1 + 1  # episodes, index, code
    assert "<img" not in text
    assert INJECTED not in text
    assert "<title>Viewer test run &lt;b&gt;bold?&lt;/b&gt; - trajectories</title>" in text
    # ... and yet the injected text is there, character for character, once the JSON is read.
    rich = parsed.json["episode-0"]
    assert INJECTED in rich["artifacts"]["grading_log"]["text"]
    reply = rich["nodes"][rich["turns"][9]["node"]]["message"]
    assert reply["content"][0]["text"].endswith(INJECTED)
    short = parsed.json["run-data"]["episodes"][1]["grading"]
    assert INJECTED_PATH in short["refused_paths"]
    assert f"tests/test_calc.py::test_name[{INJECTED}]" in short["tests"]


@settings(deadline=None)
@given(
    st.recursive(
        st.text() | st.integers() | st.floats(allow_nan=False, allow_infinity=False),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_script_json_reads_back_exactly_and_holds_no_markup(value: Any) -> None:
    encoded = script_json(value)
    assert encoded.isascii()
    assert not set(encoded) & set("<>&")
    assert json.loads(encoded) == value


def test_script_json_keeps_lone_surrogates_and_refuses_non_finite_numbers() -> None:
    assert json.loads(script_json("a\ud800</script>")) == "a\ud800</script>"
    with pytest.raises(ValueError, match="JSON compliant"):
        script_json([math.nan])


def test_every_loss_reason_has_words_a_colour_and_a_filter() -> None:
    css = (ASSETS / "viewer.css").read_text(encoding="ascii")
    assert set(REASONS) == set(LossReason)
    for reason in LossReason:
        assert re.search(rf"^\.r-{reason} \{{[^}}]*background", css, re.MULTILINE), reason
        assert f".hide-{reason} .sp.r-{reason}" in css
        assert f".hide-{reason} .fold.r-{reason}" in css
        assert f"--{reason}-bg:" in css


def test_the_script_never_parses_data_as_html() -> None:
    js = (ASSETS / "viewer.js").read_text(encoding="ascii")
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        'setAttribute("on',
        "fetch(",
        "XMLHttpRequest",
    ):
        assert sink not in js, sink
    assert "</script" not in js.lower()
    assert "<!--" not in js
