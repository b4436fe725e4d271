"""What the generate function reads from slime's ``args``, typed and checked once.

slime hands every generate call its parsed namespace. The adapter needs six things from it
(docs/slime-contract.md, section 2): the router to send ``/generate`` to, the checkpoint whose
tokenizer and chat template the policy was trained with, SGLang's parser names for the policy's
output format, the rollout's context length, and, when routing replay is on
(``--use-rollout-routing-replay``), the model's ``--num-layers`` and ``--moe-router-topk``: the
shape of the routing every engine call must capture. A missing or unusable value is a
:class:`~slime_backend.ConfigError` naming ``args.<field>`` and the slime flag that
sets it: the run is misconfigured, no episode can be trusted, so it fails loudly and at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._routing_replay import RoutingReplay
from ._typed_config import ConfigError, FieldError

ARGS_READ = (
    "hf_checkpoint",
    "sglang_router_ip",
    "sglang_router_port",
    "sglang_tool_call_parser",
    "sglang_reasoning_parser",
    "rollout_max_context_len",
    "use_rollout_routing_replay",
    "num_layers",
    "moe_router_topk",
)
"""Every attribute of slime's ``args`` the generate function reads (besides ``agent_rl``)."""

TOOL_CALL_PARSERS = {
    "qwen25": "hermes_json",
    "qwen": "hermes_json",
    "hermes": "hermes_json",
    "qwen3_coder": "qwen3_coder_xml",
    "glm45": "glm45",
    "glm": "glm45",
    "llama3": "llama_json",
    "llama4": "llama_json",
    "mistral": "mistral",
    "deepseekv3": "deepseek",
    "deepseekv31": "deepseek",
    "deepseekv32": "deepseek",
}
"""SGLang ``--tool-call-parser`` names -> the adapters' tool-call format (same markup)."""

REASONING_PARSERS = {"qwen3": False, "qwen3-thinking": True, "deepseek-r1": True}
"""SGLang ``--reasoning-parser`` names (``<think>...</think>``) -> whether the output starts
inside the reasoning (the template's generation prompt already opened ``<think>``)."""


def check_parsers(tool_call_parser: str | None, reasoning_parser: str | None) -> None:
    """Refuse parser names the adapters cannot read replies with."""
    if tool_call_parser not in TOOL_CALL_PARSERS:
        raise FieldError(
            "tool_call_parser",
            f"{tool_call_parser!r} is not a tool-call format the adapters parse; "
            f"use one of {', '.join(sorted(TOOL_CALL_PARSERS))}",
        )
    if reasoning_parser is not None and reasoning_parser not in REASONING_PARSERS:
        raise FieldError(
            "reasoning_parser",
            f"{reasoning_parser!r} is not a reasoning format the adapters parse; use one of "
            f"{', '.join(sorted(REASONING_PARSERS))}, or none",
        )


@dataclass(frozen=True, slots=True)
class RolloutArgs:
    """The part of slime's ``args`` the adapter is built from (plain data: it travels to Ray
    workers)."""

    hf_checkpoint: str
    router_url: str
    tool_call_parser: str
    reasoning_parser: str | None
    max_context_len: int | None
    routing_replay: RoutingReplay | None = None
    """The routing shape to capture and replay; None when replay is off."""

    @classmethod
    def from_args(cls, args: Any) -> RolloutArgs:
        checkpoint = _required(args, "hf_checkpoint", str)
        ip = _required(args, "sglang_router_ip", str)
        port = _required(args, "sglang_router_port", int)
        context = getattr(args, "rollout_max_context_len", None)
        if context is not None and (not _is(context, int) or context < 3):
            raise _error("rollout_max_context_len", f"must be at least 3 tokens, got {context!r}")
        tool = getattr(args, "sglang_tool_call_parser", None)
        reasoning = getattr(args, "sglang_reasoning_parser", None)
        try:
            check_parsers(tool, reasoning)
        except FieldError as exc:
            raise _error(f"sglang_{exc.path}", exc.message) from None
        assert tool is not None  # checked above
        replay = _routing_replay(args)
        return cls(checkpoint, f"http://{ip}:{port}", tool, reasoning, context, replay)

    def parser_config(self) -> Any:
        """The adapters' :class:`~protocol_adapters.ParserConfig` for these names."""
        from protocol_adapters import ParserConfig, ToolCallFormat

        reasoning = self.reasoning_parser
        return ParserConfig(
            tool_format=ToolCallFormat(TOOL_CALL_PARSERS[self.tool_call_parser]),
            sglang_tool_parser=self.tool_call_parser,
            reasoning=reasoning is not None,
            starts_in_reasoning=reasoning is not None and REASONING_PARSERS[reasoning],
        )


def _routing_replay(args: Any) -> RoutingReplay | None:
    if not getattr(args, "use_rollout_routing_replay", False):
        return None
    layers = _required(args, "num_layers", int)
    topk = _required(args, "moe_router_topk", int)
    try:
        return RoutingReplay(layers, topk)
    except FieldError as exc:
        raise _error(exc.path, f"{exc.message} (--use-rollout-routing-replay is on)") from None


def _required(args: Any, name: str, kind: type) -> Any:
    value = getattr(args, name, None)
    if value is None or (kind is str and value == ""):
        raise _error(name, "is not set")
    if not _is(value, kind):
        raise _error(name, f"expected {kind.__name__}, got {value!r}")
    return value


def _is(value: object, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def _error(name: str, message: str) -> ConfigError:
    flag = "--" + name.replace("_", "-")
    return ConfigError(f"args.{name}", f"{message} (slime's {flag})")
