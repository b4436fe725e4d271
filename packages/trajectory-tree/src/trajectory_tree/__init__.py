"""trajectory-tree: token-faithful session trees for RL on LLM agents.

Route each model call of an agent session into a tree of messages, keep the engine's output ids
and logprobs verbatim, and linearize the tree into loss-masked training samples in which every
generated token is trained exactly once or excluded with a reason. Standard library only.

    tree = SessionTree("episode-1")
    route = tree.route(Prompt(messages, tools))
    ids = route.prefix_ids() + render(route.new_messages)   # the renderer's job
    tree.record(route, BridgedPrompt(segments, gen_prompt), completion, reply)
    samples = linearize(tree).samples
"""

from importlib.metadata import version as _distribution_version

from .bridge import BridgedPrompt, FullPrompt, Segment
from .canonical import canonical_json, same_message
from .errors import ForeignRoute, FormatError, InvalidTurn, TrajectoryError
from .linearize import (
    Exclusion,
    LengthLimit,
    LengthMode,
    Linearization,
    Sample,
    Span,
    linearize,
    turn_exclusions,
)
from .messages import Block, Media, Message, Prompt, Reasoning, Role, Text, ToolCall, ToolSpec
from .reasons import FinishReason, LossReason
from .render import render_tree
from .rewards import RewardPolicy, assign_reward
from .serialize import dumps, loads, tree_from_dict, tree_to_dict
from .summary import SessionSummary, summarize
from .tree import Node, Route, SessionTree
from .turns import Completion, Turn, TurnMeta

__version__ = _distribution_version("agent-rl-trajectory-tree")  # pyproject.toml is the one source

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
    "Sample",
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
    "assign_reward",
    "canonical_json",
    "dumps",
    "linearize",
    "loads",
    "render_tree",
    "same_message",
    "summarize",
    "tree_from_dict",
    "tree_to_dict",
    "turn_exclusions",
]
