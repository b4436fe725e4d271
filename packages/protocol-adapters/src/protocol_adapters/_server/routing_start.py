"""Where a call asks the engine to start returning MoE routing: no position twice on a branch.

Positions the calls on a turn's branch already returned routing for are read from the engine's
cache this time, not computed again, so only later positions are asked for
(``SessionTree.routed_prefix``). The branch is the one the tree will record the turn on, which
for a prompt rendered in full is only known by applying the tree's own rule
(``SessionTree._attach_full``): ids that do not extend the path start a new lineage at the root,
whose calls returned nothing yet.
"""

from __future__ import annotations

from array import array

from trajectory_tree import FullPrompt, Route

from .ports import RenderedPrompt


def routing_start(route: Route, rendered: RenderedPrompt) -> int:
    """The first position of ``rendered``'s ids to ask routing for (O(context) for a full
    prompt: call it off the event loop)."""
    if isinstance(rendered.prompt, FullPrompt) and not _extends_path(route, rendered.prompt):
        return 0
    return min(len(rendered.ids), route.tree.routed_prefix(route.anchor))


def _extends_path(route: Route, prompt: FullPrompt) -> bool:
    """Whether the tree records ``prompt`` below ``route.anchor`` (``_attach_full``'s test)."""
    prefix = route.prefix_ids()
    split = len(prompt.ids) - prompt.generation_prompt_length
    if route.new_messages:
        return len(prefix) <= split and array("i", prompt.ids[: len(prefix)]) == prefix
    return split == len(prefix) and array("i", prompt.ids[:split]) == prefix
