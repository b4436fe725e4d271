"""The viewer in a real headless Chromium (Debian's `chromium`): the test loads the written file,
clicks and hovers with real mouse events over the DevTools protocol, and checks the rendered DOM
against the recorded trees and their linearization."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol_adapters import Vocabulary
from swe_rl.viewer import Chromium, ChromiumConfig, ChromiumError, screenshot, write_viewer
from swe_rl.viewer.chromium import READY, Page
from swe_rl.viewer.legend import REASONS
from trajectory_tree import LossReason, linearize

from .test_viewer_kit import (
    CONFTEST_WHY,
    INJECTED,
    INJECTED_PATH,
    SUB_AGENT,
    RecordedRun,
    record_run,
)

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="CHROMIUM IS MISSING: the viewer's browser tests need Debian's `chromium` package "
    "(apt-get install chromium; .ci/run installs it)",
)

EPISODES = ["ep-rich", "ep-short", "ep-aborted", "ep-broken"]


@pytest.fixture(scope="module")
def recorded(qwen_vocabulary: Vocabulary, tmp_path_factory: pytest.TempPathFactory) -> RecordedRun:
    return record_run(tmp_path_factory.mktemp("run"), qwen_vocabulary)


@pytest.fixture(scope="module")
def decode(qwen_vocabulary: Vocabulary) -> Callable[[int], str]:
    return lambda token: qwen_vocabulary.decode([token])


@pytest.fixture(scope="module")
def viewer(recorded: RecordedRun, decode: Callable[[int], str]) -> Path:
    return write_viewer(recorded.directory, decode)


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    with Chromium() as chromium:
        yield chromium


@pytest.fixture
def page(browser: Chromium, viewer: Path) -> Iterator[Page]:
    tab = browser.open(viewer)
    tab.wait_for(READY)
    yield tab
    assert tab.errors() == [], "the page reported errors"
    tab.close()


def open_episode(page: Page, episode_id: str) -> None:
    page.click(f'.episode[data-episode="{episode_id}"] .ep-head')
    page.wait_for(
        f'document.querySelector(\'.episode[data-episode="{episode_id}"]\').classList.contains("open")'
    )


def open_sample(page: Page, episode_id: str, sample: int) -> str:
    """Open a sample, render all its tokens; returns a selector for its token box."""
    scope = f'.episode[data-episode="{episode_id}"] .sample[data-sample="{sample}"]'
    page.click(f"{scope} .s-head")
    if page.evaluate(f"document.querySelector('{scope} .s-tools .link:nth-child(2)') !== null"):
        page.click(f"{scope} .s-tools .link:nth-child(2)")
    return f"{scope} .tokens"


def rendered_tokens(page: Page, box: str) -> list[list[Any]]:
    """[text, reason, mask] for every token element in a token box, in order."""
    value = page.evaluate(
        f"Array.from(document.querySelectorAll('{box} .sp > .t')).map(t => {{"
        " const w = t.parentNode;"
        " const reason = Array.from(w.classList).find(c => c.startsWith('r-')).slice(2);"
        " return [t.textContent, reason, w.classList.contains('m1') ? 1 : 0]; })"
    )
    assert isinstance(value, list)
    return value


def tooltip(page: Page) -> str:
    text = page.evaluate(
        "document.getElementById('tip').classList.contains('show') ? "
        "document.getElementById('tip').innerText : null"
    )
    assert isinstance(text, str), "no tooltip is showing"
    return text


def test_the_run_renders_from_the_file_alone(page: Page, viewer: Path) -> None:
    assert page.requested_urls() == [viewer.resolve().as_uri()], "the page fetched something"
    assert page.evaluate("document.querySelector('h1').textContent") == (
        "Viewer test run <b>bold?</b>"
    )
    cards = page.evaluate(
        "Array.from(document.querySelectorAll('.episode')).map(e => ["
        " e.dataset.episode, e.querySelector('.pill').textContent,"
        " Array.from(e.querySelectorAll('.flag')).map(f => f.textContent)])"
    )
    assert cards == [
        ["ep-rich", "completed", []],
        ["ep-short", "truncated", []],
        ["ep-aborted", "aborted", ["trains no token", "aborted (sandbox): no reward"]],
        ["ep-broken", "completed", ["error", "trains no token (no readable session tree)"]],
    ]
    alarm = page.evaluate("document.querySelector('.alarm').textContent")
    assert "zero_trainable" in alarm
    assert "50% of episodes > limit 20%" in alarm
    legend = page.evaluate(
        "Array.from(document.querySelectorAll('.chip.reason')).map(c => c.dataset.reason)"
    )
    assert legend == [str(reason) for reason in REASONS]  # every reason, in the legend's order
    assert legend[0] == "generated"
    # Nothing of an episode is built before it is opened.
    assert page.evaluate("document.querySelectorAll('.ep-body > *').length") == 0


def test_the_content_policy_forbids_network_and_injected_handlers(page: Page) -> None:
    outcome = page.evaluate("fetch('http://127.0.0.1:9/').then(() => 'fetched', () => 'blocked')")
    assert outcome == "blocked"
    ran = page.evaluate(
        "new Promise(done => { const d = document.createElement('div');"
        " d.innerHTML = '<img src=x onerror=\"window.__csp = 1\">'; document.body.append(d);"
        " setTimeout(() => done(window.__csp === 1), 300); })"
    )
    assert ran is False
    page.evaluate("document.querySelectorAll('img').forEach(i => i.remove())")
    errors = page.errors()
    assert errors
    assert all("Content Security Policy" in e for e in errors)
    page.browser.events(page.session).clear()  # expected: the policy says what it refused


def test_each_closed_cards_head_shows_its_verdict_and_refused_files(page: Page) -> None:
    heads = page.evaluate(
        "Array.from(document.querySelectorAll('.episode')).map(e => {"
        " const head = e.querySelector('.ep-head');"
        " const pill = head.querySelector('.pill.verdict');"
        " const refused = head.querySelector('.refused');"
        " const box = pill.getBoundingClientRect();"
        " return [e.dataset.episode, pill.textContent, pill.className, pill.title,"
        "  box.width > 0 && box.height > 0,"
        "  refused && [refused.textContent, refused.title]]; })"
    )
    assert heads == [
        [
            "ep-rich",
            "resolved",
            "pill verdict ok",
            "grading: all 2 wanted tests passed",
            True,
            [
                "1 refused",
                "The grader did not apply this file of the agent's change:\n"
                f"conftest.py: {CONFTEST_WHY}",
            ],
        ],
        [
            "ep-short",
            "unresolved",
            "pill verdict warn",
            "grading: 2 of 6 wanted tests did not pass: tests/test_calc.py::test_add failed",
            True,
            [
                "2 refused",
                "The grader did not apply these files of the agent's change:\n"
                f"conftest.py: {CONFTEST_WHY}\n"
                f"{INJECTED_PATH}: a test file the grader restores",
            ],
        ],
        [
            "ep-aborted",
            "not graded",
            "pill verdict none",
            "This episode was not graded.",
            True,
            None,
        ],
        [
            "ep-broken",
            "tests timed out",
            "pill verdict bad",
            "grading: the test run passed its 30 s limit (the test run timed out)",
            True,
            None,
        ],
    ]
    # All of it without opening anything.
    assert page.evaluate("document.querySelectorAll('.ep-body > *').length") == 0
    assert page.evaluate("document.querySelectorAll('img').length") == 0


def test_the_run_header_counts_verdicts_and_episodes_with_refused_files(page: Page) -> None:
    verdicts = page.evaluate(
        "(() => { const t = document.querySelector('.tile[data-tile=\"verdicts\"]');"
        " return [t.querySelector('.v').textContent, t.querySelector('.k').textContent,"
        " Array.from(t.querySelectorAll('.vc')).map(v => [v.dataset.verdict, v.className])]; })()"
    )
    assert verdicts == [
        "1 resolved \u00b7 1 unresolved \u00b7 1 tests timed out \u00b7 1 not graded",
        "grading verdicts",
        [
            ["resolved", "vc ok"],
            ["unresolved", "vc warn"],
            ["tests_timed_out", "vc bad"],
            ["", "vc none"],
        ],
    ]
    refused = page.evaluate(
        "(() => { const t = document.querySelector('.tile[data-tile=\"refused\"]');"
        " return [t.innerText, t.title, getComputedStyle(t.querySelector('.v')).color]; })()"
    )
    assert refused[0] == "2\nepisodes with refused files"
    assert refused[1].endswith(": ep-rich, ep-short")
    assert refused[2] == "rgb(192, 38, 45)"  # --bad: a refused file is a cheat stopped


def test_an_opened_episode_shows_its_grading_before_its_accounting(page: Page) -> None:
    open_episode(page, "ep-short")
    body = ".episode.open .ep-body"
    headings = page.evaluate(
        f"Array.from(document.querySelectorAll('{body} > h3')).map(h => h.textContent)"
    )
    assert headings[:2] == ["Grading", "Accounting"]
    grading = page.evaluate(
        f"(() => {{ const g = document.querySelector('{body} .grading');"
        " const rows = (sel) => Array.from(g.querySelectorAll(sel + ' tbody tr'))"
        "   .map(r => Array.from(r.cells).map(c => c.textContent));"
        " return {line: g.querySelector('.grade-line').textContent,"
        "  refused: rows('.refused-paths'), tests: rows('.tests'),"
        "  summary: g.querySelector('.tests-summary').textContent}; })()"
    )
    assert grading == {
        "line": "unresolved2 of 6 wanted tests did not pass: tests/test_calc.py::test_add failed",
        "refused": [
            ["conftest.py", CONFTEST_WHY],
            [INJECTED_PATH, "a test file the grader restores"],
        ],
        "tests": [  # failing first
            ["tests/test_calc.py::test_add", "failed"],
            [f"tests/test_calc.py::test_name[{INJECTED}]", "missing"],
        ],
        "summary": "Tests: 1 failed \u00b7 1 missing \u00b7 +4 passing not listed",
    }

    open_episode(page, "ep-rich")
    rich = page.evaluate(
        "document.querySelector('.episode[data-episode=\"ep-rich\"] .grading').innerText"
    )
    assert "resolved" in rich
    assert f"conftest.py\t{CONFTEST_WHY}" in rich
    assert "Tests: 2 passed" in rich
    notes = page.evaluate(
        "Array.from(document.querySelectorAll('.episode.open .ep-body > .note'))"
        ".map(n => [n.closest('.episode').dataset.episode, n.textContent])"
    )
    # The reason is said once: a completed episode's reason is its grading's reason.
    assert notes == [["ep-short", "truncated: wall-clock budget reached"]]

    open_episode(page, "ep-aborted")
    aborted = page.evaluate(
        "document.querySelector('.episode[data-episode=\"ep-aborted\"] .grading').innerText"
    )
    assert aborted == "Not graded: the run records no grading for this episode."

    open_episode(page, "ep-broken")  # no session tree: grading is still shown
    broken = page.evaluate(
        "Array.from(document.querySelector('.episode[data-episode=\"ep-broken\"] .ep-body')"
        ".children).map(e => e.className || e.tagName)"
    )
    assert broken[broken.index("H3") + 1] == "grading"
    text = page.evaluate(
        "document.querySelector('.episode[data-episode=\"ep-broken\"] .grading').innerText"
    )
    assert "tests timed out" in text
    assert "The test run passed its time limit." in text
    assert "tests/test_calc.py::test_sub\tmissing" in text


def test_a_refused_file_named_as_markup_renders_as_text(page: Page) -> None:
    open_episode(page, "ep-short")
    cells = page.evaluate(
        "Array.from(document.querySelectorAll('.episode.open .refused-paths td.path'))"
        ".map(td => [td.textContent, td.children.length])"
    )
    assert [INJECTED_PATH, 0] in cells
    title = page.evaluate(
        "document.querySelector('.episode[data-episode=\"ep-short\"] .refused').title"
    )
    assert INJECTED_PATH in title
    assert page.evaluate("document.querySelectorAll('img, iframe, object, embed').length") == 0
    assert page.evaluate("window.__pwned === undefined")


def test_an_opened_episode_draws_its_tree_as_branches(page: Page, recorded: RecordedRun) -> None:
    open_episode(page, "ep-rich")
    dots = page.evaluate(
        "Array.from(document.querySelectorAll('.episode.open .diagram .dot')).map(d => ["
        " Number(d.dataset.turn), d.getAttribute('class')])"
    )
    tree = recorded.trees["ep-rich"]
    assert [d[0] for d in dots] == list(range(len(tree.turns)))
    classes = {turn: set(cls.split()) for turn, cls in dots}
    assert "aborted" in classes[4]
    assert "abandoned_retry" in classes[6]
    assert [t for t, c in classes.items() if "root" in c] == [0, 2, 9]
    assert all("trained" in classes[t] for t in (0, 1, 2, 3, 5, 7, 8, 9))
    edges = page.evaluate("document.querySelectorAll('.episode.open .edge').length")
    assert edges == len(tree.turns) - 3  # every turn but the three roots continues one
    labels = page.evaluate(
        "Array.from(document.querySelectorAll('.episode.open .start')).map(t => t.textContent)"
    )
    assert labels[0] == "main agent"
    assert labels[-1] == "new history"
    assert any(label.startswith("sub-agent a1b2") for label in labels)
    samples = page.evaluate("document.querySelectorAll('.episode.open .sample').length")
    assert samples == len(linearize(tree).samples)

    page.hover('.episode.open .dot[data-turn="2"]')
    text = tooltip(page)
    assert f"turn 2 \u00b7 sub-agent {SUB_AGENT}" in text
    assert "trained in sample 0" in text


def test_every_token_of_every_sample_is_shown_with_its_reason_and_mask(
    page: Page, recorded: RecordedRun, decode: Callable[[int], str]
) -> None:
    for episode_id in EPISODES[:3]:
        open_episode(page, episode_id)
        lin = linearize(recorded.trees[episode_id])
        trains = episode_id != "ep-aborted"
        for sample in lin.samples:
            box = open_sample(page, episode_id, sample.index)
            shown = rendered_tokens(page, box)
            reasons = [""] * len(sample.tokens)
            for span in sample.spans:
                reasons[span.start : span.end] = [str(span.reason)] * len(span)
            expected = [
                [decode(token), reason, mask if trains else 0]
                for token, reason, mask in zip(
                    sample.tokens, reasons, sample.loss_mask, strict=True
                )
            ]
            assert shown == expected, f"{episode_id} sample {sample.index}"
            greyed = page.evaluate(
                f"document.querySelector('{box}').classList.contains('untrained')"
            )
            assert greyed is not trains


def test_the_tooltip_facts_are_the_samples_facts_at_every_position(
    page: Page, recorded: RecordedRun
) -> None:
    for number, episode_id in enumerate(EPISODES[:3]):
        lin = linearize(recorded.trees[episode_id])
        for sample in lin.samples:
            facts = page.evaluate(
                f"Array.from({{length: {len(sample.tokens)}}}, (_, i) => {{"
                f" const f = window.trajectoryViewer.tokenInfo({number}, {sample.index}, i);"
                " return [f.id, f.loss, f.logprob, f.generated]; })"
            )
            assert [f[0] for f in facts] == sample.tokens.tolist()
            expected_loss = (
                sample.loss_mask.tolist()
                if episode_id != "ep-aborted"
                else [0] * len(sample.tokens)
            )
            assert [f[1] for f in facts] == expected_loss
            generated = {
                i for s in sample.spans if s.turn is not None for i in range(s.start, s.end)
            }
            assert {i for i, f in enumerate(facts) if f[3]} == generated
            assert [f[2] if f[3] else 0.0 for f in facts] == sample.logprobs.tolist()


def test_hovering_a_token_shows_its_id_logprob_and_reason(
    page: Page, recorded: RecordedRun, decode: Callable[[int], str]
) -> None:
    open_episode(page, "ep-rich")
    sample = linearize(recorded.trees["ep-rich"]).samples[1]
    box = open_sample(page, "ep-rich", 1)
    first = sample.prompt_length
    page.hover(f'{box} .sp[data-start="{first}"] > .t:first-child')
    text = tooltip(page)
    token = sample.tokens[first]
    assert json.dumps(decode(token)) in text
    assert f"id {token} \u00b7 position {first:,} of {len(sample.tokens):,} in sample 1" in text
    assert "generated \u00b7 loss 1" in text
    logprob = float(text.split("logprob ")[1].split(" ")[0])
    assert logprob == sample.logprobs[first]

    tool = next(s for s in sample.spans if str(s.reason) == "tool_output")
    page.hover(f'{box} .sp[data-start="{tool.start}"] > .t:first-child')
    text = tooltip(page)
    assert "tool output \u00b7 loss 0" in text
    assert "logprob" not in text


def test_filtering_by_reason_folds_spans_and_the_mask_view_greys_all_loss_0(
    page: Page, recorded: RecordedRun
) -> None:
    open_episode(page, "ep-rich")
    box = open_sample(page, "ep-rich", 1)
    display = (
        f"Array.from(document.querySelectorAll('{box} .{{0}}.r-context'))"
        ".map(e => getComputedStyle(e).display)"
    )
    assert set(page.evaluate(display.format("sp"))) == {"inline"}
    assert set(page.evaluate(display.format("fold"))) == {"none"}
    page.click('.chip.reason[data-reason="context"]')
    assert set(page.evaluate(display.format("sp"))) == {"none"}
    assert set(page.evaluate(display.format("fold"))) == {"inline-block"}
    context = sum(
        len(s)
        for s in linearize(recorded.trees["ep-rich"]).samples[1].spans
        if str(s.reason) == "context"
    )
    folds = page.evaluate(
        f"Array.from(document.querySelectorAll('{box} .fold.r-context')).map(f => f.textContent)"
    )
    assert sum(int(f.split()[1].replace(",", "")) for f in folds) == context
    page.click('.chip.reason[data-reason="context"]')
    assert set(page.evaluate(display.format("sp"))) == {"inline"}

    background = f"getComputedStyle(document.querySelector('{box} .sp.{{0}}')).backgroundColor"
    by_reason = [page.evaluate(background.format(c)) for c in ("r-context", "r-tool_output", "m1")]
    assert len(set(by_reason)) == 3
    page.click('.chip.mode[data-mode="mask"]')
    by_mask = [page.evaluate(background.format(c)) for c in ("r-context", "r-tool_output", "m1")]
    assert by_mask[0] == by_mask[1] != by_mask[2]


def test_a_turn_shows_its_request_reply_tool_calls_and_results(
    page: Page, recorded: RecordedRun
) -> None:
    open_episode(page, "ep-rich")
    page.click('.episode.open .dot[data-turn="0"]')
    panel = page.evaluate("document.querySelector('.episode.open .turn-panel').innerText")
    assert "Turn 0" in panel
    assert "trained in sample 1" in panel
    assert "Fix the bug: add() in calc.py subtracts" in panel  # the request's user message
    assert "Read calc.py first." in panel  # reasoning
    assert '"command": "cat calc.py"' in panel
    assert INJECTED in panel
    page.click('.episode.open .dot[data-turn="6"]')
    panel = page.evaluate("document.querySelector('.episode.open .turn-panel').innerText")
    assert "excluded: abandoned retry" in panel
    assert "python -m pytest -q" in panel
    # Its output is in no sample, and still every token of it can be seen.
    page.click(".episode.open .turn-panel details.section summary")
    page.wait_for("document.querySelector('.episode.open .turn-panel .tokens') !== null")
    shown = rendered_tokens(page, ".episode.open .turn-panel .tokens")
    tree = recorded.trees["ep-rich"]
    output = tree.output_ids(tree.turns[6])
    assert [r for _, r, _ in shown][-len(output) :] == ["abandoned_retry"] * len(output)
    assert len(shown) == len(tree.node(tree.turns[6].node).delta or ())

    page.click('.episode.open .dot[data-turn="5"]')
    page.click(".episode.open .turn-panel .turn-title .link")
    page.wait_for("document.querySelector('.episode.open .tm.flash[data-turn=\"5\"]') !== null")
    opened = ".episode.open .sample[data-sample='1'].open"
    assert page.evaluate(f'document.querySelector("{opened}") !== null')


def test_model_output_is_text_wherever_it_appears(page: Page) -> None:
    for episode_id in EPISODES:
        open_episode(page, episode_id)
    page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
    for turn in range(10):
        page.click(f'.episode[data-episode="ep-rich"] .dot[data-turn="{turn}"]')
    box = open_sample(page, "ep-rich", 2)
    assert INJECTED in page.evaluate(f"document.querySelector('{box}').textContent")
    assert INJECTED in page.evaluate(
        "document.querySelector('pre.artifact').parentNode.parentNode.textContent"
    )
    assert page.evaluate("document.querySelectorAll('img, iframe, object, embed').length") == 0
    assert page.evaluate("window.__pwned === undefined")


def test_one_token_that_is_markup_renders_as_that_text(
    recorded: RecordedRun, decode: Callable[[int], str], browser: Chromium, tmp_path: Path
) -> None:
    tree = recorded.trees["ep-short"]
    sample = linearize(tree).samples[0]
    target = sample.tokens[sample.prompt_length]
    run = tmp_path / "run"
    shutil.copytree(recorded.directory, run)
    page_path = write_viewer(run, lambda t: INJECTED if t == target else decode(t))
    tab = browser.open(page_path)
    tab.wait_for(READY)
    open_episode(tab, "ep-short")
    box = open_sample(tab, "ep-short", 0)
    first = f'{box} .sp[data-start="{sample.prompt_length}"] > .t'
    token = tab.evaluate(f"document.querySelector('{first}').textContent")
    assert token == INJECTED
    assert tab.evaluate("document.querySelectorAll('img').length") == 0
    assert tab.evaluate("window.__pwned === undefined")
    assert tab.errors() == []
    tab.close()


def test_alarms_and_status_chips_filter_the_episodes(page: Page) -> None:
    visible = (
        "Array.from(document.querySelectorAll('.episode:not(.hidden)')).map(e => e.dataset.episode)"
    )
    page.click(".alarm")
    assert page.evaluate(visible) == ["ep-aborted", "ep-broken"]
    page.click('.chip.status[data-status="completed"]')
    assert page.evaluate(visible) == ["ep-broken"]
    page.click(".alarm")
    assert page.evaluate(visible) == ["ep-rich", "ep-broken"]
    page.click('.chip.status[data-status="all"]')
    assert page.evaluate(visible) == EPISODES


def test_masked_tokens_are_explained_by_reason_on_the_page_and_in_each_episode(
    page: Page, recorded: RecordedRun
) -> None:
    """Most of a sample is masked (the CLI's system prompt and tool schemas): the page says
    why in words, without hovering, with the run's counts; an episode's accounting splits its
    masked tokens by reason."""
    lins = {episode: linearize(tree) for episode, tree in recorded.trees.items()}
    masked: dict[str, int] = {}
    excluded: dict[str, int] = {}
    for lin in lins.values():
        for sample in lin.samples:
            for reason, n in sample.masked_tokens().items():
                masked[str(reason)] = masked.get(str(reason), 0) + n
        for reason, n in lin.excluded_tokens().items():
            excluded[str(reason)] = excluded.get(str(reason), 0) + n
    shown = page.evaluate(
        "Array.from(document.querySelectorAll('.masked-why dt')).map(d => ["
        " d.dataset.reason, d.textContent, d.nextElementSibling.textContent])"
    )
    order = [str(reason) for reason in REASONS]
    assert [code for code, _, _ in shown] == sorted({*masked, *excluded}, key=order.index)
    assert "generated" not in masked
    for code, label, words in shown:
        reason = LossReason(code)
        assert label == REASONS[reason].label
        counts = []
        if code in masked:
            counts.append(
                f"{masked[code]:,} masked (about {round(masked[code] / 3):,} per episode)"
            )
        if code in excluded:
            counts.append(f"{excluded[code]:,} generated tokens excluded")
        assert words == "; ".join(counts) + ". " + REASONS[reason].description
    context = next(words for code, _, words in shown if code == "context")
    assert "system prompt and tool schemas" in context
    head = page.evaluate("document.querySelector('.masked-why .mw-head').textContent")
    trained = sum(s.trained_tokens for s in lins["ep-rich"].samples) + sum(
        s.trained_tokens for s in lins["ep-short"].samples
    )  # ep-aborted trains nothing
    assert f"{trained:,} trained (loss 1" in head
    assert f"{sum(masked.values()):,} masked (loss 0)" in head

    open_episode(page, "ep-rich")
    facts = page.evaluate(
        "Array.from(document.querySelectorAll('.episode.open .fact[data-masked]'))"
        ".map(f => [f.dataset.masked, f.querySelector('.v').textContent, f.title])"
    )
    rich: dict[str, int] = {}
    for sample in lins["ep-rich"].samples:
        for reason, n in sample.masked_tokens().items():
            rich[str(reason)] = rich.get(str(reason), 0) + n
    assert facts == [
        [code, f"{n:,}", REASONS[LossReason(code)].description] for code, n in sorted(rich.items())
    ]


def test_an_interrupted_run_is_marked_and_raises_no_false_alarm(
    browser: Chromium, recorded: RecordedRun, decode: Callable[[int], str], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    for path in recorded.directory.rglob("*"):
        if path.is_file() and path.name != "viewer.html":
            (run / path.relative_to(recorded.directory)).parent.mkdir(parents=True, exist_ok=True)
            (run / path.relative_to(recorded.directory)).write_bytes(path.read_bytes())
    data = json.loads((run / "run.json").read_text())
    data["interrupted"] = True
    data["alarms"] = []  # swe_rl.run leaves stopped episodes out of the gates
    stopped = {
        "episode_id": "ep-stopped",
        "instance_id": "calc__sub-2",
        "group": 1,
        "reward": 0.0,
        "advantage": None,
        "status": "aborted",
        "reason": "interrupted",
        "dir": "",
    }
    data["episodes"].append(stopped)
    (run / "run.json").write_text(json.dumps(data))
    tab = browser.open(write_viewer(run, decode))
    tab.wait_for(READY)
    banner = tab.evaluate("document.querySelector('.interrupted').textContent")
    assert banner.startswith("Interrupted.")
    assert "1 episode was cut short" in banner
    assert "count towards no silent-failure alarm" in banner
    assert "the 4 others finished" in banner
    assert tab.evaluate("document.querySelectorAll('.alarm').length") == 0
    assert tab.evaluate("document.querySelector('.calm').textContent") == (
        "No silent-failure alarm tripped in the episodes that finished."
    )
    card = tab.evaluate(
        "(() => { const e = document.querySelector('.episode[data-episode=\"ep-stopped\"]');"
        " return [e.querySelector('.pill').textContent,"
        " Array.from(e.querySelectorAll('.flag')).map(f => f.textContent),"
        " e.querySelector('.ep-meta').textContent]; })()"
    )
    assert card == ["interrupted", [], "stopped before it finished"]
    tiles = tab.evaluate(
        "Array.from(document.querySelectorAll('.tile .k')).map(k => k.textContent)"
    )
    assert "aborted (1 interrupted)" in tiles
    open_episode(tab, "ep-stopped")
    notes = tab.evaluate(
        "Array.from(document.querySelectorAll('.episode.open .ep-body > .note'))"
        ".map(n => n.textContent)"
    )
    assert notes[0].startswith("Stopped by the interrupt before it finished")
    assert tab.errors() == []
    tab.close()


def test_a_broken_episode_shows_its_error_and_what_files_it_has(page: Page) -> None:
    open_episode(page, "ep-broken")
    body = page.evaluate("document.querySelector('.episode.open .ep-body').innerText")
    assert "tree.json" in body
    assert "No diff, grading log or summary" in body


def test_screenshot_writes_a_picture_of_the_rendered_page(viewer: Path, tmp_path: Path) -> None:
    png = screenshot(
        viewer,
        tmp_path / "run.png",
        width=1200,
        height=800,
        prepare=lambda tab: open_episode(tab, "ep-rich"),
    )
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 800)


def test_the_browser_leaves_no_process_or_profile_behind(viewer: Path) -> None:
    with Chromium() as chromium:
        pid = chromium.pid
        assert pid is not None
        tab = chromium.open(viewer)
        tab.wait_for(READY)
        members = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _group(p) == pid]
        assert len(members) > 1, "Chromium runs helpers in its own process group"
    assert [p for p in Path("/proc").iterdir() if p.name.isdigit() and _group(p) == pid] == []


def test_a_browser_that_is_not_there_is_a_clear_error() -> None:
    with pytest.raises(ChromiumError, match="'no-such-chromium' not found"):
        Chromium(ChromiumConfig(binary="no-such-chromium")).start()


def _group(process: Path) -> int | None:
    try:
        # The process group is the 5th field of /proc/<pid>/stat after the command's ")".
        return int((process / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None
