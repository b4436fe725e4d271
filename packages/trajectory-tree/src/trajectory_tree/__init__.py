"""trajectory-tree: token-faithful session trees for RL on LLM agents.

Route each model call of an agent session into a tree of messages, keep the engine's output ids
and logprobs verbatim, and linearize the tree into loss-masked training samples in which every
generated token is trained exactly once or excluded with a reason. Standard library only.

    tree = SessionTree("episode-1")
    route = tree.route(Prompt(messages, tools))
    ids = route.prefix_ids() + render(route.new_messages)   # the renderer's job
    tree.record(route, BridgedPrompt(segments, gen_prompt), completion, reply)
    samples = linearize(tree).samples

The public API is what this module exports; the modules behind it (``_tree``, ``_linearize``,
...) are internal and may change in any release.
"""

from typing import TYPE_CHECKING

from ._bridge import BridgedPrompt, FullPrompt, Segment
from ._canonical import canonical_json, same_message
from ._errors import ForeignRoute, FormatError, InvalidTurn, TrajectoryError
from ._linearize import (
    Exclusion,
    LengthLimit,
    LengthMode,
    Linearization,
    Sample,
    Span,
    linearize,
    turn_exclusions,
)
from ._messages import Block, Media, Message, Prompt, Reasoning, Role, Text, ToolCall, ToolSpec
from ._reasons import FinishReason, LossReason
from ._render import render_tree
from ._rewards import RewardPolicy, assign_reward
from ._routing import RoutedExperts, SampleRouting
from ._routing_sidecar import dump_routing
from ._serialize import dumps, loads, message_to_dict, tree_from_dict, tree_to_dict
from ._summary import SessionSummary, summarize
from ._tree import Node, Route, SessionTree
from ._turns import Completion, Turn, TurnMeta, VersionRun

__all__ = [
    "Block",
    "BridgedPrompt",
    "Completion",
    "Exclusion",
    "FinishReason",
    "ForeignRoute",
    "FormatError",
    "FullPrompt",
    "InvalidTurn",
    "LengthLimit",
    "LengthMode",
    "Linearization",
    "LossReason",
    "Media",
    "Message",
    "Node",
    "Prompt",
    "Reasoning",
    "RewardPolicy",
    "Role",
    "Route",
    "RoutedExperts",
    "Sample",
    "SampleRouting",
    "Segment",
    "SessionSummary",
    "SessionTree",
    "Span",
    "Text",
    "ToolCall",
    "ToolSpec",
    "TrajectoryError",
    "Turn",
    "TurnMeta",
    "VersionRun",
    "assign_reward",
    "canonical_json",
    "dump_routing",
    "dumps",
    "linearize",
    "loads",
    "message_to_dict",
    "render_tree",
    "same_message",
    "summarize",
    "tree_from_dict",
    "tree_to_dict",
    "turn_exclusions",
]


if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        # The version comes from the installed metadata (pyproject.toml is its one source), read
        # on first use: importing importlib.metadata costs more than importing this package.
        if name == "__version__":
            from importlib.metadata import version

            return version("agent-rl-trajectory-tree")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
