"""An episode's tree on disk keeps its MoE routing beside the JSON, and only when there is any."""

from __future__ import annotations

from array import array
from pathlib import Path

from swe_rl.episode import save_tree
from trajectory_tree import (
    Completion,
    FinishReason,
    FullPrompt,
    Message,
    Prompt,
    RoutedExperts,
    SessionTree,
    Text,
    loads,
)


def tree_with(routing: RoutedExperts | None) -> SessionTree:
    tree = SessionTree("episode")
    route = tree.route(Prompt((Message("user", (Text("fix it"),)),)))
    completion = Completion([9, 10], [-0.5, -0.25], FinishReason.STOP, routed_experts=routing)
    reply = Message("assistant", (Text("ok"),))
    tree.record(route, FullPrompt([5, 6, 7], 1, "first call"), completion, reply)
    return tree


def test_routing_is_saved_as_a_sidecar_the_json_points_into(tmp_path: Path) -> None:
    routing = RoutedExperts(0, 2, 2, array("i", range(4 * 4)))
    save_tree(tmp_path, tree_with(routing))
    back = loads(
        (tmp_path / "tree.json").read_text(), routing=(tmp_path / "tree.routing").read_bytes()
    )
    assert back.turns[0].routed_experts == routing


def test_no_routing_no_sidecar(tmp_path: Path) -> None:
    save_tree(tmp_path, tree_with(None))
    assert (tmp_path / "tree.json").is_file()
    assert not (tmp_path / "tree.routing").exists()
