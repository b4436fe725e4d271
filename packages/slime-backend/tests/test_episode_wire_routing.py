"""A Ray worker's report keeps the tree's MoE routing: without it, replay would refuse the
episode (or, worse, a trainer would replay rows that are not the engine's)."""

from __future__ import annotations

import pickle
from array import array

from slime_backend._episode import EpisodeOutcome
from slime_backend._episode_run import EpisodeReport
from trajectory_tree import (
    Completion,
    FinishReason,
    FullPrompt,
    Message,
    Prompt,
    RoutedExperts,
    SessionTree,
    Text,
    linearize,
)


def routed_tree() -> SessionTree:
    tree = SessionTree("episode-routing")
    route = tree.route(Prompt((Message("user", (Text("fix it"),)),)))
    prompt_ids, output_ids = [5, 6, 7, 8], [9, 10, 11]
    rows = len(prompt_ids) + len(output_ids) - 1
    experts = array("i", [(p * 7 + k) % 16 for p in range(rows) for k in range(2 * 4)])
    completion = Completion(
        output_ids,
        [-0.5] * len(output_ids),
        FinishReason.STOP,
        "3",
        routed_experts=RoutedExperts(0, 2, 4, experts),
    )
    tree.record(
        route,
        FullPrompt(prompt_ids, 1, "first call"),
        completion,
        Message("assistant", (Text("ok"),)),
    )
    return tree


def test_the_report_carries_routing_across_the_wire() -> None:
    tree = routed_tree()
    report = EpisodeReport(tree, EpisodeOutcome(1.0))
    wire = pickle.loads(pickle.dumps(report.to_wire()))  # what Ray does with it
    back = EpisodeReport.from_wire(wire)
    assert back.tree.turns[0].routed_experts == tree.turns[0].routed_experts
    (sample,) = linearize(back.tree).samples
    assert sample.routing is not None
    assert sample.routing.complete
    assert sample.routing.experts == tree.turns[0].routed_experts.experts  # type: ignore[union-attr]
